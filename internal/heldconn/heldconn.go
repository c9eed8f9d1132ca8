// Package heldconn wraps a net.Conn so that a writer with several messages
// at hand can send them in one write. A WebSocket library flushes every
// message on its own; on loopback and on a LAN each write is a system call
// and, for the peer, a wake-up, which cost more than the bytes.
package heldconn

import (
	"errors"
	"net"
	"sync"
)

const (
	// keepMax is the largest held buffer kept for the next Hold: a
	// connection that once sent a large batch does not keep its memory
	// while idle.
	keepMax = 16 << 10
	// holdMax is how much is held before it is written anyway: past it, a
	// write costs less than the copy, and memory stays bounded.
	holdMax = 64 << 10
)

// Conn is a net.Conn whose writes, between Hold and Flush, are kept and
// then written together.
type Conn struct {
	net.Conn
	mu      sync.Mutex
	holding bool
	held    []byte
}

// New wraps c.
func New(c net.Conn) *Conn { return &Conn{Conn: c} }

// Hold keeps the writes that follow, whoever makes them, until Flush.
func (c *Conn) Hold() {
	c.mu.Lock()
	c.holding = true
	c.mu.Unlock()
}

// Flush writes what was held since Hold, in one write, and stops holding.
func (c *Conn) Flush() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.holding = false
	return c.writeHeld()
}

// Write writes p, or keeps it while held. A write kept reports success: its
// error, if any, is Flush's.
func (c *Conn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.holding {
		return c.Conn.Write(p)
	}
	if len(c.held)+len(p) > holdMax {
		if err := c.writeHeld(); err != nil {
			return 0, err
		}
		return c.Conn.Write(p)
	}
	c.held = append(c.held, p...)
	return len(p), nil
}

// writeHeld writes what is held; c.mu is held.
func (c *Conn) writeHeld() error {
	if len(c.held) == 0 {
		return nil
	}
	_, err := c.Conn.Write(c.held)
	if cap(c.held) > keepMax {
		c.held = nil
	} else {
		c.held = c.held[:0]
	}
	return err
}

// CloseWrite writes what is held and shuts the writing side down, when the
// wrapped connection can (as an HTTP server does before it closes).
func (c *Conn) CloseWrite() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.holding = false
	if err := c.writeHeld(); err != nil {
		return err
	}
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}
