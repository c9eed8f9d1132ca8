package console

import (
	"fmt"
	"testing"
	"time"
)

// TestSessionTableBound: a full table drops its expired sessions to make
// room, and only when none has expired, the oldest one, which is ended.
func TestSessionTableBound(t *testing.T) {
	const idle, maxAge = time.Minute, time.Hour
	t0 := time.Unix(1_700_000_000, 0)
	tab := sessions{byID: map[string]*session{}}
	made := 0
	fill := func(n int, at time.Time) []*session {
		var out []*session
		for i := range n {
			made++
			s := &session{id: fmt.Sprint(made), created: at.Add(time.Duration(i)), seen: at, done: make(chan struct{})}
			tab.add(s, at, idle, maxAge)
			out = append(out, s)
		}
		return out
	}
	stale := fill(maxSessions/2, t0)
	fresh := fill(maxSessions-len(stale), t0.Add(50*time.Second))
	// At t0+70s the first half has been idle 70 s: expired.
	now := t0.Add(70 * time.Second)
	fill(1, now)
	if len(tab.byID) != len(fresh)+1 {
		t.Fatalf("%d sessions held, want the %d fresh ones and the new one", len(tab.byID), len(fresh)+1)
	}
	for _, s := range stale {
		select {
		case <-s.done:
		default:
			t.Fatalf("expired session %s was not ended", s.id)
		}
	}
	// Full of live sessions: the oldest goes.
	fill(maxSessions-len(tab.byID), now)
	fill(1, now.Add(time.Second))
	if len(tab.byID) != maxSessions {
		t.Fatalf("%d sessions held, want %d", len(tab.byID), maxSessions)
	}
	select {
	case <-fresh[0].done:
	default:
		t.Fatal("the oldest session was not the one ended")
	}
	for _, s := range fresh[1:] {
		if tab.byID[s.id] != s {
			t.Fatalf("session %s was dropped too", s.id)
		}
	}
}
