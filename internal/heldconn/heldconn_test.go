package heldconn_test

import (
	"io"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cheetahbroker/cheetah/internal/heldconn"
)

// countingConn counts the writes that reach it.
type countingConn struct {
	net.Conn
	mu     sync.Mutex
	writes int
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.writes++
	c.mu.Unlock()
	return c.Conn.Write(p)
}

// pipe returns a held connection over a counted one, and what its peer
// reads until it is closed.
func pipe(t *testing.T) (*heldconn.Conn, *countingConn, chan []byte) {
	a, b := net.Pipe()
	t.Cleanup(func() { b.Close() })
	cc := &countingConn{Conn: a}
	got := make(chan []byte, 1)
	go func() {
		buf, _ := io.ReadAll(b)
		got <- buf
	}()
	return heldconn.New(cc), cc, got
}

func TestHeldWritesGoOutInOneWrite(t *testing.T) {
	t.Parallel()
	c, cc, got := pipe(t)

	_, err := c.Write([]byte("one "))
	require.NoError(t, err)
	c.Hold()
	for _, s := range []string{"two ", "three ", "four "} {
		n, err := c.Write([]byte(s))
		require.NoError(t, err)
		require.Equal(t, len(s), n)
	}
	require.Equal(t, 1, cc.writes, "nothing held is written before Flush")
	require.NoError(t, c.Flush())
	require.Equal(t, 2, cc.writes, "what was held goes out in one write")
	require.NoError(t, c.Flush(), "a Flush with nothing held writes nothing")
	_, err = c.Write([]byte("five"))
	require.NoError(t, err)
	require.Equal(t, 3, cc.writes, "after Flush, writes go out at once")
	require.NoError(t, c.Close())
	require.Equal(t, "one two three four five", string(<-got))
}

func TestFlushReportsTheWriteError(t *testing.T) {
	t.Parallel()
	a, b := net.Pipe()
	c := heldconn.New(a)
	c.Hold()
	_, err := c.Write([]byte("kept"))
	require.NoError(t, err)
	require.NoError(t, b.Close())
	require.Error(t, c.Flush())
}

// What is held past holdMax is written without waiting for Flush, in order.
func TestHoldingIsBounded(t *testing.T) {
	t.Parallel()
	c, cc, got := pipe(t)
	c.Hold()
	chunk := make([]byte, 40<<10)
	for i := range 3 {
		for j := range chunk {
			chunk[j] = byte('a' + i)
		}
		_, err := c.Write(chunk)
		require.NoError(t, err)
	}
	require.Equal(t, 2, cc.writes, "the first chunk, held, then the second, past the bound")
	require.NoError(t, c.Flush())
	require.NoError(t, c.Close())
	all := <-got
	require.Len(t, all, 3*len(chunk))
	for i := range 3 {
		require.Equal(t, byte('a'+i), all[i*len(chunk)], "in order")
		require.Equal(t, byte('a'+i), all[(i+1)*len(chunk)-1])
	}
}
