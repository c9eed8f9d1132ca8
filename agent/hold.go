package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/cheetahbroker/cheetah/protocol"
)

// Human control (DESIGN §10): a person at the agent's machine takes over
// one of its flows, so that applications' mutations are refused held while
// the person works, and gives it back. Hold and Unhold send the hold and
// unhold frames and wait for the broker's hold_state; the control socket
// (ServeControl) lets `cheetah agent hold <context>` reach a running agent.

// holdWaitTimeout bounds the wait for the broker's answer to hold or unhold.
const holdWaitTimeout = 10 * time.Second

// holdWaiters are the Hold and Unhold calls waiting for a hold_state, by
// context id, first come first served. An Unhold waits for ended alone, so
// that news of an earlier hold turning active is not taken for its answer.
type holdWaiters struct {
	mu sync.Mutex
	by map[string][]*holdWaiter
}

type holdWaiter struct {
	ch        chan protocol.HoldState
	endedOnly bool
}

func (h *holdWaiters) add(contextID string, endedOnly bool) *holdWaiter {
	w := &holdWaiter{ch: make(chan protocol.HoldState, 1), endedOnly: endedOnly}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.by == nil {
		h.by = map[string][]*holdWaiter{}
	}
	h.by[contextID] = append(h.by[contextID], w)
	return w
}

// take removes and returns the first waiter for contextID that state
// answers, if any.
func (h *holdWaiters) take(contextID string, state protocol.HoldState) *holdWaiter {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, w := range h.by[contextID] {
		if !w.endedOnly || state == protocol.HoldEnded {
			h.drop(contextID, w)
			return w
		}
	}
	return nil
}

func (h *holdWaiters) remove(contextID string, w *holdWaiter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.drop(contextID, w)
}

func (h *holdWaiters) drop(contextID string, w *holdWaiter) {
	q := h.by[contextID]
	for i, x := range q {
		if x == w {
			h.by[contextID] = append(q[:i:i], q[i+1:]...)
			break
		}
	}
	if len(h.by[contextID]) == 0 {
		delete(h.by, contextID)
	}
}

// onHoldState hands the broker's answer to the first waiter for its
// context that it answers; a state nobody waits for (a hold turning active,
// or ending by its TTL) is logged.
func (a *Agent) onHoldState(s *session, f *protocol.HoldStateFrame) {
	s.log.Info("agent: hold", "context_id", f.ContextID, "state", f.State)
	if w := a.holds.take(f.ContextID, f.State); w != nil {
		w.ch <- f.State
	}
}

// Hold takes a hold on flow contextID for ttl (the broker's default, 300 s,
// when zero) and returns the state the broker answered: pending while
// mutations admitted before it run, active, or ended when the broker knows
// no such context.
func (a *Agent) Hold(ctx context.Context, contextID string, ttl time.Duration) (protocol.HoldState, error) {
	return a.holdCall(ctx, contextID, &protocol.Hold{ContextID: contextID, TTLSeconds: int64(ttl / time.Second)}, false)
}

// Unhold gives flow contextID back.
func (a *Agent) Unhold(ctx context.Context, contextID string) (protocol.HoldState, error) {
	return a.holdCall(ctx, contextID, &protocol.Unhold{ContextID: contextID}, true)
}

func (a *Agent) holdCall(ctx context.Context, contextID string, f protocol.Frame, endedOnly bool) (protocol.HoldState, error) {
	if _, err := protocol.Encode(f); err != nil {
		return "", err
	}
	w := a.holds.add(contextID, endedOnly)
	defer a.holds.remove(contextID, w)
	if err := a.send(f); err != nil {
		return "", err
	}
	t := time.NewTimer(holdWaitTimeout)
	defer t.Stop()
	select {
	case st := <-w.ch:
		return st, nil
	case <-t.C:
		return "", fmt.Errorf("agent: no hold_state from the broker within %s", holdWaitTimeout)
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// ControlRequest is one line a control socket client writes: op "hold"
// (with ttl_s, 0 for the default) or "unhold".
type ControlRequest struct {
	Op         string `json:"op"`
	ContextID  string `json:"context_id"`
	TTLSeconds int64  `json:"ttl_s,omitempty"`
}

// ControlAnswer is the line the agent answers: the hold's state, or why it
// failed.
type ControlAnswer struct {
	State string `json:"state,omitempty"`
	Error string `json:"error,omitempty"`
}

// DefaultControlSocket is where an agent with clientID listens for
// `cheetah agent hold`: $XDG_RUNTIME_DIR/cheetah/agent-<client id>.sock,
// or, without XDG_RUNTIME_DIR, <temp dir>/cheetah-<uid>/agent-<client
// id>.sock.
func DefaultControlSocket(clientID string) string {
	dir := os.Getenv("XDG_RUNTIME_DIR")
	if dir != "" {
		dir = filepath.Join(dir, "cheetah")
	} else {
		dir = filepath.Join(os.TempDir(), "cheetah-"+strconv.Itoa(os.Getuid()))
	}
	return filepath.Join(dir, "agent-"+clientID+".sock")
}

// ServeControl listens on the unix socket path (its directory made 0700,
// the socket 0600, so only this user reaches it) and serves hold and
// unhold requests, one JSON line each, until ctx ends; then it removes the
// socket. A stale socket left by an agent that died is replaced; a live
// one (another agent with this client id) is an error.
func (a *Agent) ServeControl(ctx context.Context, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("agent: control socket: %w", err)
	}
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		return fmt.Errorf("agent: control socket %s: another agent listens there", path)
	}
	_ = os.Remove(path)
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "unix", path)
	if err != nil {
		return fmt.Errorf("agent: control socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return fmt.Errorf("agent: control socket: %w", err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	defer ln.Close()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("agent: control socket: %w", err)
		}
		wg.Go(func() { a.serveControlConn(ctx, c) })
	}
}

func (a *Agent) serveControlConn(ctx context.Context, c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(holdWaitTimeout + 5*time.Second))
	line, err := bufio.NewReader(c).ReadBytes('\n')
	var ans ControlAnswer
	var req ControlRequest
	switch {
	case err != nil:
		ans.Error = "read the request: " + err.Error()
	case json.Unmarshal(line, &req) != nil:
		ans.Error = "the request is not JSON"
	default:
		var st protocol.HoldState
		switch req.Op {
		case "hold":
			st, err = a.Hold(ctx, req.ContextID, time.Duration(req.TTLSeconds)*time.Second)
		case "unhold":
			st, err = a.Unhold(ctx, req.ContextID)
		default:
			err = fmt.Errorf("op must be hold or unhold, not %q", req.Op)
		}
		if err != nil {
			ans.Error = err.Error()
		}
		ans.State = string(st)
	}
	b, _ := json.Marshal(ans)
	_, _ = c.Write(append(b, '\n'))
}

// Control sends one request to the control socket at path and returns the
// agent's answer: what `cheetah agent hold` and `unhold` run.
func Control(ctx context.Context, path string, req ControlRequest) (ControlAnswer, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return ControlAnswer{}, fmt.Errorf("no agent listens on %s: %w", path, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	b, _ := json.Marshal(req)
	if _, err := c.Write(append(b, '\n')); err != nil {
		return ControlAnswer{}, err
	}
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		return ControlAnswer{}, fmt.Errorf("read the agent's answer: %w", err)
	}
	var ans ControlAnswer
	if err := json.Unmarshal(line, &ans); err != nil {
		return ControlAnswer{}, fmt.Errorf("the agent's answer is not JSON")
	}
	return ans, nil
}
