package protocol_test

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/require"

	"github.com/cheetahbroker/cheetah/protocol"
)

func TestReadMessage(t *testing.T) {
	t.Parallel()
	t.Run("reads to the end, reusing the buffer it is given", func(t *testing.T) {
		t.Parallel()
		buf := make([]byte, 0, 64)
		msg := strings.Repeat("m", 40)
		// One byte at a time: every short read is appended.
		b, err := protocol.ReadMessage(iotest.OneByteReader(strings.NewReader(msg)), buf, 1000)
		require.NoError(t, err)
		require.Equal(t, msg, string(b))
		require.Same(t, &buf[:1][0], &b[0], "a message that fits is read into the buffer given")
	})
	t.Run("grows past the buffer", func(t *testing.T) {
		t.Parallel()
		msg := strings.Repeat("g", 5000)
		b, err := protocol.ReadMessage(strings.NewReader(msg), make([]byte, 0, 16), 1<<20)
		require.NoError(t, err)
		require.Equal(t, msg, string(b))
	})
	t.Run("stops at the limit", func(t *testing.T) {
		t.Parallel()
		b, err := protocol.ReadMessage(strings.NewReader(strings.Repeat("l", 100)), nil, 11)
		require.NoError(t, err)
		require.Len(t, b, 11, "a message over the limit comes back one byte over a limit of 10, for the caller to refuse")
	})
	t.Run("appends to what the buffer holds", func(t *testing.T) {
		t.Parallel()
		b, err := protocol.ReadMessage(strings.NewReader("tail"), []byte("head-"), 100)
		require.NoError(t, err)
		require.Equal(t, "head-tail", string(b))
	})
	t.Run("passes a read error on, with what came before it", func(t *testing.T) {
		t.Parallel()
		boom := errors.New("boom")
		r := io.MultiReader(strings.NewReader("part"), iotest.ErrReader(boom))
		b, err := protocol.ReadMessage(r, nil, 100)
		require.ErrorIs(t, err, boom)
		require.Equal(t, "part", string(b))
	})
}

func TestEncodedLenIsTheEncodingsLength(t *testing.T) {
	t.Parallel()
	frames := []protocol.Frame{
		&protocol.Ping{},
		&protocol.Command{CommandID: "c1", ContextID: "x", TaskID: "t", Epoch: 7, Name: "echo",
			Params: []byte(`{"s":"` + strings.Repeat(`é\"<`, 400) + `"}`), ResponseMode: protocol.ResponseRPC, TimeoutMS: 1000},
		&protocol.Result{CommandID: "c2", Data: []byte("[1,2,3]")},
		&protocol.Result{CommandID: "c3", Data: []byte(`"` + strings.Repeat("z", 100000) + `"`)}, // past the kept scratch size
	}
	for _, f := range frames {
		want, err := protocol.Encode(f)
		require.NoError(t, err)
		for range 3 { // again, from a recycled buffer
			n, err := protocol.EncodedLen(f)
			require.NoError(t, err)
			require.Equal(t, len(want), n, "%s", f.FrameType())
		}
	}
	// A frame Encode refuses, EncodedLen refuses alike.
	bad := &protocol.Command{CommandID: "c4", Name: "echo", Params: []byte(`{`), ResponseMode: protocol.ResponseRPC, TimeoutMS: 1000}
	_, wantErr := protocol.Encode(bad)
	require.Error(t, wantErr)
	_, err := protocol.EncodedLen(bad)
	require.EqualError(t, err, wantErr.Error())
}

func TestKeepBuffer(t *testing.T) {
	t.Parallel()
	kept := make([]byte, 10, protocol.MaxKeptBuffer)
	require.Equal(t, kept, protocol.KeepBuffer(kept))
	require.Nil(t, protocol.KeepBuffer(make([]byte, 0, protocol.MaxKeptBuffer+1)), "a large frame's buffer is let go")
}
