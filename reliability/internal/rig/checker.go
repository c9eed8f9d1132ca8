package rig

import (
	"encoding/json"
	"fmt"
	"sync"

	"github.com/cheetahbroker/cheetah/protocol"
)

// Checker is the independent view of fake clients: it sees only the frames
// the broker sent them and checks, per context, that
//
//   - a command never carries an epoch older than one the context has seen
//     (a stale handle never acts through a later lease);
//   - commands of an epoch arrive only between that epoch's assigned frame
//     and the frame that ends it (never two leases interleaved);
//   - assignments alternate: no assigned while another epoch holds it, and
//     each new epoch is above every earlier one;
//   - per (context, epoch), the commands' "seq" params rise (admission
//     order, invariant 7) when the sender numbered them.
//
// It is deliberately not built on anything of the broker's own.
type Checker struct {
	mu       sync.Mutex
	contexts map[string]*ctxView
	cmds     map[string]Received // every command frame received, by id
	errs     []string
	Frames   int64
}

type ctxView struct {
	holder  int64 // epoch assigned now as far as the client knows, 0 none, -1 unknown (after a reconnect)
	max     int64 // highest epoch seen in any frame
	lastSeq map[int64]int64
}

// Received is what a client was sent for one command.
type Received struct {
	Key       string // user/client/context
	CommandID string
	Epoch     int64
	Count     int // how many frames carried this id (must be 1)
}

// NewChecker returns an empty checker.
func NewChecker() *Checker {
	return &Checker{contexts: map[string]*ctxView{}, cmds: map[string]Received{}}
}

func (k *Checker) failf(format string, args ...any) {
	if len(k.errs) < 100 {
		k.errs = append(k.errs, fmt.Sprintf(format, args...))
	}
}

func (k *Checker) view(key string) *ctxView {
	v := k.contexts[key]
	if v == nil {
		v = &ctxView{lastSeq: map[int64]int64{}}
		k.contexts[key] = v
	}
	return v
}

// Reconnected tells the checker that the client of prefix (user/client/)
// has a new connection: ends of leases that happened while it was away are
// not replayed, so what it believed held is forgotten (the highest epoch
// is not).
func (k *Checker) Reconnected(prefix string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for key, v := range k.contexts {
		if len(key) > len(prefix) && key[:len(prefix)] == prefix {
			v.holder = -1
		}
	}
}

// See checks one frame sent to the client prefix (user/client/).
func (k *Checker) See(prefix string, f protocol.Frame) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.Frames++
	switch f := f.(type) {
	case *protocol.Assignment:
		key := prefix + f.ContextID
		v := k.view(key)
		if f.State == protocol.AssignmentAssigned {
			switch {
			case v.holder == f.Epoch:
			case v.holder == -1 && f.Epoch <= v.max:
				// Sent again after a reconnect.
			case v.holder > 0:
				// Two leases interleaved, or the end of the older one
				// reaching the client after the newer one's assignment:
				// either way the client cannot tell who holds the context.
				k.failf("%s: assigned epoch %d while epoch %d holds it", key, f.Epoch, v.holder)
			case f.Epoch <= v.max:
				k.failf("%s: assigned epoch %d after epoch %d was seen", key, f.Epoch, v.max)
			}
			v.holder, v.max = f.Epoch, max(v.max, f.Epoch)
			return
		}
		switch {
		case v.holder == -1:
			// After a reconnect the client does not know what it held: an
			// assigned frame sent on the old connection may never have been
			// read, and the lease may end between the new hello and the
			// report that would have sent it again. Any end is plausible.
			v.max = max(v.max, f.Epoch)
		case v.holder != f.Epoch:
			k.failf("%s: %s for epoch %d while epoch %d holds it", key, f.State, f.Epoch, v.holder)
		}
		v.holder = 0
	case *protocol.Command:
		key := prefix + f.ContextID
		v := k.view(key)
		if f.Epoch < v.max {
			k.failf("%s: command %s of epoch %d after epoch %d was seen", key, f.CommandID, f.Epoch, v.max)
		}
		if v.holder != f.Epoch && v.holder != -1 {
			// After a reconnect a command admitted before it may arrive
			// ahead of the assignment sent again; otherwise commands come
			// only between their epoch's assigned and its end.
			k.failf("%s: command %s of epoch %d while epoch %d holds it", key, f.CommandID, f.Epoch, v.holder)
		}
		v.max = max(v.max, f.Epoch)
		var p struct {
			Seq int64 `json:"seq"`
		}
		if json.Unmarshal(f.Params, &p) == nil && p.Seq > 0 {
			if last := v.lastSeq[f.Epoch]; p.Seq <= last {
				k.failf("%s: command seq %d after seq %d in epoch %d (admission order)", key, p.Seq, last, f.Epoch)
			}
			v.lastSeq[f.Epoch] = p.Seq
		}
		r := k.cmds[f.CommandID]
		if r.Count > 0 {
			k.failf("command %s delivered twice (to %s and %s)", f.CommandID, r.Key, key)
		}
		k.cmds[f.CommandID] = Received{Key: key, CommandID: f.CommandID, Epoch: f.Epoch, Count: r.Count + 1}
	}
}

// SeeCommand checks a command seen through the agent library, which shows
// commands but not assignment frames: only the epoch order and the
// uniqueness of delivery are checked.
func (k *Checker) SeeCommand(prefix string, f *protocol.Command) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.Frames++
	key := prefix + f.ContextID
	v := k.view(key)
	if f.Epoch < v.max {
		k.failf("%s: command %s of epoch %d after epoch %d was seen", key, f.CommandID, f.Epoch, v.max)
	}
	v.max = max(v.max, f.Epoch)
	r := k.cmds[f.CommandID]
	if r.Count > 0 {
		k.failf("command %s delivered twice (to %s and %s)", f.CommandID, r.Key, key)
	}
	k.cmds[f.CommandID] = Received{Key: key, CommandID: f.CommandID, Epoch: f.Epoch, Count: r.Count + 1}
}

// Errors returns the violations found.
func (k *Checker) Errors() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.errs...)
}

// Commands returns every command frame received.
func (k *Checker) Commands() map[string]Received {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make(map[string]Received, len(k.cmds))
	for id, r := range k.cmds {
		out[id] = r
	}
	return out
}
