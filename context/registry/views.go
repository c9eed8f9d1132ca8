package registry

import (
	"context"
	"sort"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/protocol"
)

// The registry is the in-process backend of the SDK.
var _ cheetah.Backend = (*Registry)(nil)

// ListAvailable returns the user's idle contexts in selection order (longest
// idle first); an empty clientType lists both types, browsers first.
func (r *Registry) ListAvailable(_ context.Context, userID string, clientType cheetah.ClientType) ([]cheetah.ContextSnapshot, error) {
	if !protocol.ValidUserID(userID) {
		return nil, cheetah.Invalidf("user_id %q is not a valid id", userID)
	}
	types := []cheetah.ClientType{cheetah.Browser, cheetah.Console}
	if clientType != "" {
		if !clientType.Valid() {
			return nil, cheetah.Invalidf("client_type %q is not browser or console", clientType)
		}
		types = []cheetah.ClientType{clientType}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out := []cheetah.ContextSnapshot{}
	p := r.users[userID]
	if p == nil {
		return out, nil
	}
	for _, t := range types {
		if lst := p.idle[t]; lst != nil {
			for w := lst.head; w != nil; w = w.idleNext {
				out = append(out, w.snapshot())
			}
		}
	}
	return out, nil
}

// TaskContexts returns the active leases of a task, without tokens, ordered
// by epoch.
func (r *Registry) TaskContexts(_ context.Context, userID, taskID string) ([]cheetah.Lease, error) {
	if !protocol.ValidUserID(userID) {
		return nil, cheetah.Invalidf("user_id %q is not a valid id", userID)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out := []cheetah.Lease{}
	if p := r.users[userID]; p != nil {
		for _, c := range p.clients {
			for _, w := range c.contexts {
				if w.lease != nil && w.lease.taskID == taskID {
					out = append(out, w.lease.view(""))
				}
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Epoch < out[j].Epoch })
	return out, nil
}

// ReadCommand reads one command of a user from history.
func (r *Registry) ReadCommand(ctx context.Context, userID, commandID string) (cheetah.CommandRecord, error) {
	if !protocol.ValidUserID(userID) {
		return cheetah.CommandRecord{}, cheetah.Invalidf("user_id %q is not a valid id", userID)
	}
	return r.store.Get(ctx, userID, commandID)
}

// ListCommands pages through a user's commands, newest first.
func (r *Registry) ListCommands(ctx context.Context, userID string, q cheetah.ListQuery) (cheetah.CommandPage, error) {
	if !protocol.ValidUserID(userID) {
		return cheetah.CommandPage{}, cheetah.Invalidf("user_id %q is not a valid id", userID)
	}
	return r.store.List(ctx, userID, q)
}
