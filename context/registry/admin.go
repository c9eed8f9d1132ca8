package registry

import (
	"sort"
	"time"

	cheetah "github.com/cheetahbroker/cheetah"
)

// PoolView counts one user's clients and contexts by state.
type PoolView struct {
	UserID   string         `json:"user_id"`
	Clients  int            `json:"clients"`
	Contexts map[string]int `json:"contexts"` // idle, leased, not_live, human
	Leases   int            `json:"leases"`
	Waiters  int            `json:"waiters"`
}

// ClientView describes one client for operators.
type ClientView struct {
	UserID      string             `json:"user_id"`
	ClientID    string             `json:"client_id"`
	ClientType  cheetah.ClientType `json:"client_type"`
	Name        string             `json:"name"`
	Version     string             `json:"version"`
	Labels      map[string]string  `json:"labels"`
	Connected   bool               `json:"connected"`
	SessionID   string             `json:"session_id,omitempty"`
	ConnectedAt *time.Time         `json:"connected_at,omitempty"`
	Contexts    int                `json:"contexts"`
	// Replica is the replica the client is connected to, among several on
	// one PostgreSQL; the server fills it in.
	Replica string `json:"replica,omitempty"`
}

// Pools returns every user's pool, ordered by user id.
func (r *Registry) Pools() []PoolView {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := []PoolView{}
	for uid, p := range r.users {
		own, _ := p.waiting()
		v := PoolView{UserID: uid, Clients: len(p.clients), Waiters: own,
			Contexts: map[string]int{cheetah.StateIdle: 0, cheetah.StateLeased: 0, cheetah.StateNotLive: 0, cheetah.StateHuman: 0}}
		for _, c := range p.clients {
			for _, w := range c.contexts {
				v.Contexts[w.state()]++
				if w.lease != nil {
					v.Leases++
				}
			}
		}
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].UserID < out[j].UserID })
	return out
}

// Clients returns the clients of one user, or of every user when userID is
// empty, ordered by user and client id.
func (r *Registry) Clients(userID string) []ClientView {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := []ClientView{}
	for uid, p := range r.users {
		if userID != "" && uid != userID {
			continue
		}
		for _, c := range p.clients {
			v := ClientView{UserID: uid, ClientID: c.id, ClientType: c.typ, Name: c.name, Version: c.version,
				Labels: c.labels, Connected: c.conn != nil, Contexts: len(c.contexts)}
			if v.Labels == nil {
				v.Labels = map[string]string{}
			}
			if c.conn != nil {
				t := c.connectedAt.UTC()
				v.SessionID, v.ConnectedAt = c.sessionID, &t
			}
			out = append(out, v)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].UserID != out[j].UserID {
			return out[i].UserID < out[j].UserID
		}
		return out[i].ClientID < out[j].ClientID
	})
	return out
}

// Leases returns the active leases, never with tokens, filtered by user and
// task when given, ordered by epoch.
func (r *Registry) Leases(userID, taskID string) []cheetah.Lease {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := []cheetah.Lease{}
	for _, l := range r.leases {
		v := l.view("")
		if (userID == "" || v.UserID == userID) && (taskID == "" || v.TaskID == taskID) {
			out = append(out, v)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Epoch < out[j].Epoch })
	return out
}
