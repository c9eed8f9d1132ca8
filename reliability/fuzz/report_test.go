package fuzz

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/reliability/internal/rig"
)

// recConn records frames for the checker and answers nothing.
type recConn struct {
	prefix string
	chk    *rig.Checker
}

func (c *recConn) Send(f protocol.Frame) bool {
	c.chk.See(c.prefix, f)
	return true
}
func (c *recConn) Close(protocol.CloseCode, string) {}

var inputs atomic.Int64

// newRegistry opens a registry on a SQLite store of its own for this fuzz
// target (one per fuzzing process), closed when the target ends.
func newRegistry(f *testing.F) *registry.Registry {
	dir := f.TempDir()
	store, err := history.Open(context.Background(), history.Config{DataDir: dir})
	if err != nil {
		f.Fatal(err)
	}
	reg, err := registry.New(context.Background(), registry.Config{Store: store, ReconnectGrace: time.Hour})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		reg.Close()
		_ = store.Close()
	})
	return reg
}

// FuzzStateReport drives the reconciler: a program of state reports (any
// subset of six contexts, each worker- or human-owned), acquires, releases,
// sends, revokes, disconnects and reconnects. After every step the
// registry's views must agree with the last report: a context absent from
// it is gone and so is its lease (context_gone); a human context keeps its
// lease but refuses sends (not_worker); only live worker contexts without
// a lease are idle; one lease per context; the client's frames pass the
// epoch checker. At the end, with no contexts and no client, the
// bookkeeping is empty.
func FuzzStateReport(f *testing.F) {
	reg := newRegistry(f)
	f.Add([]byte{0, 0x3f, 0x00, 1, 1, 3, 0, 0, 0x01, 0x00, 2, 0})
	f.Add([]byte{0, 0x0f, 0x02, 1, 1, 1, 0, 0x0f, 0x0f, 3, 0, 3, 1, 2, 1})
	f.Add([]byte{0, 0x03, 0x00, 1, 3, 0, 4, 3, 0, 5, 0, 0x03, 0x00, 3, 0, 2, 0})
	f.Add([]byte{0, 0x07, 0x00, 1, 1, 6, 1, 3, 0, 3, 1, 0, 0x00, 0x00, 1})
	f.Add([]byte{0, 0x3f, 0x15, 1, 1, 1, 1, 4, 5, 0, 0x2a, 0x00, 1, 1, 4, 4, 5, 0, 0x3f, 0x3f})
	f.Fuzz(func(t *testing.T, prog []byte) {
		if len(prog) > 256 {
			prog = prog[:256]
		}
		user := fmt.Sprintf("usr_fz_%d_%d", os.Getpid(), inputs.Add(1))
		chk := rig.NewChecker()
		prefix := user + "/cl/"
		connect := func() *registry.Attachment {
			chk.Reconnected(prefix)
			return reg.Connect(registry.ClientInfo{UserID: user, ClientID: "cl", Type: cheetah.Console}, &recConn{prefix: prefix, chk: chk})
		}
		ctx := context.Background()
		att := connect()
		connected := true
		reported := false            // a report since the last (re)connect
		current := map[string]bool{} // context id → human, as last reported
		var leases []cheetah.Lease
		next := func(i *int) byte {
			if *i >= len(prog) {
				return 0
			}
			b := prog[*i]
			*i++
			return b
		}
		for i := 0; i < len(prog); {
			switch op := next(&i) % 7; op {
			case 0: // a state report
				present, human := next(&i), next(&i)
				var reps []protocol.ContextReport
				cur := map[string]bool{}
				for k := range 6 {
					if present&(1<<k) == 0 {
						continue
					}
					id := fmt.Sprintf("x%d", k)
					owner := protocol.OwnerWorker
					if human&(1<<k) != 0 {
						owner = protocol.OwnerHuman
					}
					reps = append(reps, protocol.ContextReport{ContextID: id, TabID: fmt.Sprint(k), Owner: owner, Labels: map[string]string{"k": fmt.Sprint(k % 2)}})
					cur[id] = owner == protocol.OwnerHuman
				}
				if connected {
					reg.Report(att, reps)
					current, reported = cur, true
				}
			case 1: // acquire
				l, err := reg.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "t", ClientType: cheetah.Console, TTL: time.Hour})
				if err == nil {
					if human, ok := current[l.ContextID]; !ok || human || !connected || !reported {
						t.Fatalf("acquired %s, which is not a live worker context (%v)", l.ContextID, current)
					}
					leases = append(leases, l)
				} else if !errors.Is(err, cheetah.ErrNoContextAvailable) {
					t.Fatalf("acquire: %v", err)
				}
			case 2: // release
				if len(leases) > 0 {
					_, _ = reg.Release(ctx, leases[int(next(&i))%len(leases)])
				}
			case 3: // send
				if len(leases) > 0 {
					l := leases[int(next(&i))%len(leases)]
					_, err := reg.Send(ctx, l, cheetah.Command{Name: "noop"}, cheetah.SendOptions{})
					var lost *cheetah.LeaseLostError
					if err != nil && !errors.As(err, &lost) {
						t.Fatalf("send: %v", err)
					}
				}
			case 4: // disconnect
				if connected {
					reg.Disconnect(att)
					connected, reported = false, false
				}
			case 5: // reconnect
				if !connected {
					att = connect()
					connected = true
				}
			case 6: // revoke
				_, _ = reg.Revoke(context.Background(), user, "cl", fmt.Sprintf("x%d", next(&i)%6))
			}
			verify(t, reg, user, current, connected && reported, leases, chk)
		}
		// Everything goes: no contexts, no client.
		if !connected {
			att = connect()
		}
		reg.Report(att, nil)
		reg.Disconnect(att)
		for _, l := range leases {
			if _, err := reg.Renew(ctx, l, 0); err == nil {
				t.Fatalf("lease on %s survived its client", l.ContextID)
			}
		}
		if st := reg.Stats(); st.Leases|st.Heap|st.Commands|st.Waiters|st.Preserving|st.Clients|st.Contexts != 0 {
			t.Fatalf("bookkeeping after every context and client went: %+v", st)
		}
		if errs := chk.Errors(); len(errs) > 0 {
			t.Fatalf("client's view: %v", errs)
		}
	})
}

// verify checks the registry's views against the last report.
func verify(t *testing.T, reg *registry.Registry, user string, current map[string]bool, live bool, held []cheetah.Lease, chk *rig.Checker) {
	t.Helper()
	ctx := context.Background()
	avail, err := reg.ListAvailable(ctx, user, cheetah.Console)
	if err != nil {
		t.Fatal(err)
	}
	active := map[string]cheetah.Lease{}
	for _, l := range reg.Leases(user, "") {
		if _, dup := active[l.ContextID]; dup {
			t.Fatalf("two leases on %s", l.ContextID)
		}
		if _, ok := current[l.ContextID]; !ok {
			t.Fatalf("a lease on %s, which the last report does not list", l.ContextID)
		}
		active[l.ContextID] = l
	}
	var idle, want []string
	for _, s := range avail {
		idle = append(idle, s.ContextID)
	}
	if live {
		for id, human := range current {
			if _, leased := active[id]; !human && !leased {
				want = append(want, id)
			}
		}
	}
	sort.Strings(idle)
	sort.Strings(want)
	if fmt.Sprint(idle) != fmt.Sprint(want) {
		t.Fatalf("idle contexts %v, want %v (report %v, leases %v, live %v)", idle, want, current, active, live)
	}
	for _, l := range held {
		_, err := reg.Renew(ctx, l, 0)
		var lost *cheetah.LeaseLostError
		errors.As(err, &lost)
		human, present := current[l.ContextID]
		switch a, isActive := active[l.ContextID]; {
		case !present:
			if lost == nil || lost.Reason != cheetah.LostContextGone {
				t.Fatalf("renew of a lease on %s, gone from the report: %v", l.ContextID, err)
			}
		case isActive && a.Epoch == l.Epoch && !live:
			if lost == nil || lost.Reason != cheetah.LostNotLive {
				t.Fatalf("renew of a lease on %s while the client is away: %v", l.ContextID, err)
			}
		case isActive && a.Epoch == l.Epoch && human:
			if lost == nil || lost.Reason != cheetah.LostNotWorker {
				t.Fatalf("renew of a lease on human context %s: %v", l.ContextID, err)
			}
		case isActive && a.Epoch == l.Epoch:
			if err != nil {
				t.Fatalf("renew of the active lease on %s: %v", l.ContextID, err)
			}
		default:
			if lost == nil {
				t.Fatalf("renew of an ended lease on %s succeeded", l.ContextID)
			}
		}
	}
	st := reg.Stats()
	if st.Heap > st.Leases {
		t.Fatalf("deadline heap %d > leases %d", st.Heap, st.Leases)
	}
	if errs := chk.Errors(); len(errs) > 0 {
		t.Fatalf("client's view: %v", errs)
	}
}
