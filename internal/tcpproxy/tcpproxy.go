// Package tcpproxy is a TCP forwarder for tests that cut a process off
// from a server (a database, a replica) and heal the cut, without touching
// either end.
package tcpproxy

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy forwards the connections it accepts to a target until closed.
type Proxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	cut    bool
	closed bool
	wg     sync.WaitGroup
}

// Start listens on addr ("127.0.0.1:0" for any port) and forwards to
// target; the proxy closes when the test ends.
func Start(tb testing.TB, addr, target string) *Proxy {
	tb.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		tb.Fatalf("tcpproxy: %v", err)
	}
	p := &Proxy{l: l, target: target}
	p.wg.Go(p.accept)
	tb.Cleanup(p.Close)
	return p
}

// Addr is where the proxy listens.
func (p *Proxy) Addr() string { return p.l.Addr().String() }

func (p *Proxy) accept() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse, target := p.cut || p.closed, p.target
		p.mu.Unlock()
		if refuse {
			_ = c.Close()
			continue
		}
		up, err := net.Dial("tcp", target)
		if err != nil {
			_ = c.Close()
			continue
		}
		if !p.track(c, up) {
			return
		}
		p.wg.Go(func() { _, _ = io.Copy(up, c); _ = up.Close() })
		p.wg.Go(func() { _, _ = io.Copy(c, up); _ = c.Close() })
	}
}

func (p *Proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.cut {
		for _, c := range cs {
			_ = c.Close()
		}
		return !p.closed
	}
	p.conns = append(p.conns, cs...)
	return true
}

// Cut closes every forwarded connection and refuses new ones until Heal.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// Retarget sends the connections accepted from now on to target; those
// forwarded already stay where they are.
func (p *Proxy) Retarget(target string) {
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
}

// Heal forwards new connections again.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	_ = p.l.Close()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
