package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
)

// Overview is one snapshot of the fleet, as the event stream sends it.
// Leases never carry a token.
type Overview struct {
	// Now is the broker's clock when the snapshot was taken: the page
	// counts lease expiries down from it, whatever its own clock says.
	Now    time.Time       `json:"now"`
	Users  []UserOverview  `json:"users"`
	Leases []cheetah.Lease `json:"leases"`
}

// UserOverview is one user's pool: its clients, its contexts counted by
// state, and its idle contexts.
type UserOverview struct {
	UserID   string                    `json:"user_id"`
	Contexts map[string]int            `json:"contexts"`
	Leases   int                       `json:"leases"`
	Waiters  int                       `json:"waiters"`
	Clients  []registry.ClientView     `json:"clients"`
	Idle     []cheetah.ContextSnapshot `json:"idle"`
}

// overview reads the registry's views into one snapshot.
func (c *Console) overview(ctx context.Context) Overview {
	o := Overview{Now: c.clock.Now().UTC(), Users: []UserOverview{}, Leases: c.reg.Leases("", "")}
	clients := map[string][]registry.ClientView{}
	for _, cl := range c.reg.Clients("") {
		clients[cl.UserID] = append(clients[cl.UserID], cl)
	}
	for _, p := range c.reg.Pools() {
		u := UserOverview{UserID: p.UserID, Contexts: p.Contexts, Leases: p.Leases, Waiters: p.Waiters,
			Clients: clients[p.UserID]}
		if u.Clients == nil {
			u.Clients = []registry.ClientView{}
		}
		idle, err := c.reg.ListAvailable(ctx, p.UserID, "")
		if err != nil || idle == nil {
			idle = []cheetah.ContextSnapshot{}
		}
		u.Idle = idle
		o.Users = append(o.Users, u)
	}
	return o
}

// MaxStreams bounds the event streams one session keeps open (a tab each).
const MaxStreams = 8

// minGap is the least time between two snapshots of one stream.
const minGap = 200 * time.Millisecond

// watch registers a wake-up channel for Changed.
func (c *Console) watch() (chan struct{}, func()) {
	w := make(chan struct{}, 1)
	c.mu.Lock()
	c.watchers[w] = struct{}{}
	c.mu.Unlock()
	return w, func() {
		c.mu.Lock()
		delete(c.watchers, w)
		c.mu.Unlock()
	}
}

// events streams the overview as server-sent events: an "overview" event at
// once and after every change the registry reports, a comment every
// KeepAlive, and a "signed-out" event when the session ends. The stream does
// not keep the session alive: only the page's requests do.
func (c *Console) events(ctx *gin.Context) {
	s := c.session(ctx)
	if s == nil {
		return
	}
	if s.streams.Add(1) > MaxStreams {
		s.streams.Add(-1)
		c.fail(ctx, &cheetah.Error{Code: cheetah.CodeRateLimited,
			Message: fmt.Sprintf("a session may keep at most %d event streams open", MaxStreams)})
		return
	}
	defer s.streams.Add(-1)
	wake, stop := c.watch()
	defer stop()
	w := ctx.Writer
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	tick := c.clock.NewTicker(c.keepAlive)
	defer tick.Stop()
	rctx := ctx.Request.Context()
	send := func(event string, v any) bool {
		b, err := json.Marshal(v)
		if err != nil {
			return false
		}
		if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b); err != nil {
			return false
		}
		w.Flush()
		return true
	}
	if !send("overview", c.overview(rctx)) {
		return
	}
	// After a snapshot the stream waits minGap before it takes the next
	// wake-up: a churn of changes costs each stream a few snapshots a
	// second, each showing everything up to its moment.
	wakes, gap := (<-chan struct{})(wake), (<-chan time.Time)(nil)
	for {
		select {
		case <-rctx.Done():
			return
		case <-c.closed:
			return
		case <-s.done:
			send("signed-out", gin.H{})
			return
		case <-gap:
			wakes, gap = wake, nil
		case <-wakes:
			if !send("overview", c.overview(rctx)) {
				return
			}
			wakes, gap = nil, c.clock.After(minGap)
		case <-tick.Chan():
			if c.sessions.get(s.id, c.clock.Now(), c.idle, c.maxAge, false) == nil {
				// get ended it: s.done is closed, the next turn says so.
				continue
			}
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return
			}
			w.Flush()
		}
	}
}
