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
	if err := cheetah.CheckID("user_id", userID); err != nil {
		return nil, err
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
	if err := cheetah.CheckID("user_id", userID); err != nil {
		return nil, err
	}
	// No task id is no task: an empty list.
	if taskID != "" {
		if err := cheetah.CheckTaskID("task_id", taskID); err != nil {
			return nil, err
		}
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
	if err := cheetah.CheckID("user_id", userID); err != nil {
		return cheetah.CommandRecord{}, err
	}
	if !protocol.ValidID(commandID) {
		// No command has such an id, as the HTTP API answers.
		return cheetah.CommandRecord{}, cheetah.NotFoundf("no command with that id")
	}
	return r.store.Get(ctx, userID, commandID)
}

// ListCommands pages through a user's commands, newest first.
func (r *Registry) ListCommands(ctx context.Context, userID string, q cheetah.ListQuery) (cheetah.CommandPage, error) {
	if err := cheetah.CheckID("user_id", userID); err != nil {
		return cheetah.CommandPage{}, err
	}
	if q.TaskID != "" {
		if err := cheetah.CheckTaskID("task_id", q.TaskID); err != nil {
			return cheetah.CommandPage{}, err
		}
	}
	if err := cheetah.CheckText("cursor", q.Cursor); err != nil {
		return cheetah.CommandPage{}, err
	}
	return r.store.List(ctx, userID, q)
}
