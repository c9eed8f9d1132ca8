package sdktest

import (
	"errors"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
)

// doneWithin is how soon Handle.Done must close once the lease ended
// (DESIGN §10: at once in process, within a second over HTTP).
const doneWithin = time.Second

// requireDone waits for h.Done to close within doneWithin of ended and
// checks Err's reason.
func (s *suite) requireDone(h *cheetah.Handle, ended time.Time, want cheetah.LostReason) {
	s.t.Helper()
	select {
	case <-h.Done():
	case <-time.After(guard):
		s.t.Fatalf("Done did not close; the lease ended %s ago", time.Since(ended))
	}
	require.LessOrEqual(s.t, time.Since(ended), doneWithin, "Done closed late")
	var lost *cheetah.LeaseLostError
	require.True(s.t, errors.As(h.Err(), &lost), "Err is a *LeaseLostError: %v", h.Err())
	require.Equal(s.t, want, lost.Reason)
}

// watched acquires a handle and starts watching it: Done is open.
func (s *suite) watched(req cheetah.AcquireRequest) *cheetah.Handle {
	s.t.Helper()
	h := s.acquire(req)
	s.t.Cleanup(h.Close)
	select {
	case <-h.Done():
		s.t.Fatalf("Done closed on a live lease: %v", h.Err())
	default:
	}
	require.NoError(s.t, h.Err())
	return h
}

func doneRevoked(s *suite) {
	s.agent(userA, "agent-1", 1, nil)
	h := s.watched(cheetah.AcquireRequest{TaskID: "t"})
	time.Sleep(100 * time.Millisecond) // the watch is in place: the poll went out
	ended := time.Now()
	require.True(s.t, s.env.Revoke(userA, "agent-1", "flow-1"))
	s.requireDone(h, ended, cheetah.LostRevoked)
}

func doneExpired(s *suite) {
	s.agent(userA, "agent-1", 1, nil)
	h := s.watched(cheetah.AcquireRequest{TaskID: "t", TTL: time.Second})
	<-time.After(time.Until(h.ExpiresAt()))
	s.requireDone(h, h.ExpiresAt(), cheetah.LostExpired)
}

func doneContextGone(s *suite) {
	c := s.raw(userA, "raw-1", worker("c1"), worker("c2"))
	h := s.watched(cheetah.AcquireRequest{TaskID: "t"})
	require.Equal(s.t, "c1", h.ContextID())
	time.Sleep(100 * time.Millisecond)
	ended := time.Now()
	c.report(worker("c2")) // the tab closed
	s.requireDone(h, ended, cheetah.LostContextGone)
}

// A lease its holder released closes Done too, with reason released, and
// a handle watched after the lease ended closes at once.
func doneReleased(s *suite) {
	s.agent(userA, "agent-1", 1, nil)
	h := s.watched(cheetah.AcquireRequest{TaskID: "t"})
	ended := time.Now()
	ok, err := s.m.Release(s.ctx, h)
	require.NoError(s.t, err)
	require.True(s.t, ok)
	s.requireDone(h, ended, cheetah.LostReleased)

	h2 := s.acquire(cheetah.AcquireRequest{TaskID: "u"})
	s.t.Cleanup(h2.Close)
	require.True(s.t, s.env.Revoke(userA, "agent-1", "flow-1"))
	s.requireDone(h2, time.Now(), cheetah.LostRevoked)
}

// A client that does not come back within the reconnect grace takes its
// contexts with it: Done closes with context_gone once the grace ran out.
func doneClientGone(s *suite) {
	if s.env.ReconnectGrace <= 0 || s.env.ReconnectGrace > guard/2 {
		s.t.Fatalf("Env.ReconnectGrace is %s: set it to the broker's, a few seconds", s.env.ReconnectGrace)
	}
	c := s.raw(userA, "raw-1", worker("c1"))
	h := s.watched(cheetah.AcquireRequest{TaskID: "t"})
	require.Equal(s.t, "c1", h.ContextID())
	time.Sleep(100 * time.Millisecond) // the watch is in place: the poll went out
	c.conn.CloseNow()
	gone := time.Now()
	select {
	case <-h.Done():
		s.t.Fatalf("Done closed within the grace: %v", h.Err())
	case <-time.After(s.env.ReconnectGrace / 2):
	}
	s.requireDone(h, gone.Add(s.env.ReconnectGrace), cheetah.LostContextGone)
}
