package syncbuf_test

import (
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cheetahbroker/cheetah/internal/syncbuf"
)

func TestWritersAndAReader(t *testing.T) {
	t.Parallel()
	var b syncbuf.Buffer
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for range 100 {
				_, err := b.Write([]byte("line\n"))
				require.NoError(t, err)
				_ = b.String() // read while others write
			}
		})
	}
	wg.Wait()
	require.Equal(t, 32*100, strings.Count(b.String(), "line\n"))
}
