package registry

import (
	"context"
	"fmt"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/protocol"
)

// A graceful stop is Drain, then WaitIdle until a deadline, then Interrupt
// for whatever is still in flight, then Close:
//
//	r.Drain()
//	if err := r.WaitIdle(ctx); err != nil {
//		n, err := r.Interrupt(graceCtx)
//	}
//	r.Close()

// Drain stops admitting work: acquires and sends fail with overloaded ("the
// broker is shutting down"), and acquires waiting for a context fail the same
// way now. Commands in flight run on to their end; renew, release, reads and
// the clients' messages go on as before. Draining twice changes nothing.
func (r *Registry) Drain() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.draining {
		return
	}
	r.draining = true
	r.idle = make(chan struct{})
	if len(r.commands) == 0 {
		close(r.idle)
		r.idle = nil
	}
	for _, p := range r.users {
		for e := p.waiters.Front(); e != nil; e = e.Next() {
			wt := e.Value.(*waiter)
			wt.elem = nil
			wt.ch <- acquireResult{err: errShuttingDown}
		}
		p.waiters.Init()
	}
	r.quotas.waiters.Init()
	r.failCreations(nil, errShuttingDown)
}

// WaitIdle waits until no command is in flight, or ctx ends. It is for
// after Drain, when no command can start any more; before Drain it fails at
// once.
func (r *Registry) WaitIdle(ctx context.Context) error {
	r.mu.Lock()
	draining, idle := r.draining, r.idle
	r.mu.Unlock()
	if !draining {
		return fmt.Errorf("registry: wait idle: not draining")
	}
	if idle == nil {
		return nil
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("registry: wait idle: %w", ctx.Err())
	}
}

// InFlight returns how many commands are admitted and not yet ended.
func (r *Registry) InFlight() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.commands)
}

// Interrupt ends every command still in flight with status interrupted,
// recorded in history like any other end, and hands their waiting callers
// that resolution (once their record is durable too). It returns how many
// commands it ended, once every
// one of those ends is durable, or when ctx ends first. It drains the
// registry first if Drain was not called.
//
// Commands of response mode none are never marked interrupted (DESIGN §5):
// one still queued is dropped from the registry and keeps the status it has
// in history.
func (r *Registry) Interrupt(ctx context.Context) (int, error) {
	r.Drain()
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return 0, nil // Close resolved whatever was left
	}
	n := 0
	for _, c := range r.commands {
		if c.rec.ResponseMode != cheetah.ModeNone {
			n++
		}
		// Every command in flight was dispatched at admission; one whose
		// record is not durable yet has its end written after it.
		r.interrupt(c)
	}
	idle := r.idle
	r.mu.Unlock()
	if idle != nil {
		select {
		case <-idle:
		case <-ctx.Done():
			return n, fmt.Errorf("registry: interrupt: %w", ctx.Err())
		}
	}
	if err := r.Flush(ctx); err != nil {
		return n, fmt.Errorf("registry: interrupt: %w", err)
	}
	return n, nil
}

// Flush returns once every write the registry decided before it is
// durable, or failed, or when ctx ends first: what a replica back from a
// fence writes before it gives its rows up (cluster.Config.Settle).
func (r *Registry) Flush(ctx context.Context) error {
	// The writes are handed to the store, and a write with no ops returns
	// once everything enqueued before it is written, held writes included.
	if err := r.handedOver(ctx); err != nil {
		return err
	}
	return r.store.Write(ctx)
}

// interrupt ends command c as interrupted; r.mu is held.
func (r *Registry) interrupt(c *command) {
	if c.rec.ResponseMode == protocol.ResponseNone {
		r.untrack(c)
		c.res = cheetah.Resolution{CommandID: c.rec.CommandID, TraceID: c.rec.TraceID, Status: c.rec.Status}
		c.endedAt = r.clock.Now()
		r.emitEndedUntracked(c)
		r.endSpansLater(c, c.rec.Status, nil, "")
		return
	}
	r.endCommand(c, cheetah.StatusInterrupted, &cheetah.ErrorInfo{Code: "interrupted", Message: "the broker shut down before the command ended"}, nil)
}
