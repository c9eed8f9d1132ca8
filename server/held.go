package server

import (
	"context"
	"net"
	"net/http"

	"github.com/cheetahbroker/cheetah/internal/heldconn"
)

// HoldWrites prepares hs to serve the connections of ln so that a client's
// session writes the frames it has at hand in one write of its connection
// (one system call, and one wake-up of the client, instead of one per
// frame). It sets hs.ConnContext and returns the listener to serve; a
// server that is not prepared writes frame by frame.
func HoldWrites(hs *http.Server, ln net.Listener) net.Listener {
	next := hs.ConnContext
	hs.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		if next != nil {
			ctx = next(ctx, c)
		}
		if tc, ok := c.(interface{ NetConn() net.Conn }); ok {
			c = tc.NetConn() // under TLS, the records are held
		}
		if hc, ok := c.(*heldconn.Conn); ok {
			ctx = context.WithValue(ctx, heldKey{}, hc)
		}
		return ctx
	}
	return heldListener{ln}
}

// heldKey is the context key of a request's held connection.
type heldKey struct{}

// heldOf returns the held connection a request came on, or nil.
func heldOf(ctx context.Context) *heldconn.Conn {
	hc, _ := ctx.Value(heldKey{}).(*heldconn.Conn)
	return hc
}

type heldListener struct{ net.Listener }

func (l heldListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return heldconn.New(c), nil
}
