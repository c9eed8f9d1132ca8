// Package linearize records concurrent acquire, release, renew, send and
// revoke histories against the registry (in process) and against the whole
// broker (over HTTP), and checks them with porcupine against a sequential
// model of DESIGN §2–3: one lease per context, longest idle first, epochs
// rising, ownership checked at every use with the reason the design gives,
// release idempotent and never lease_lost.
package linearize

import (
	"fmt"
	"slices"
	"strings"

	"github.com/anishathalye/porcupine"
)

// Kind is an operation of the model.
type Kind int

const (
	Acquire Kind = iota
	Release
	Renew
	Send
	Revoke
)

func (k Kind) String() string {
	return [...]string{"acquire", "release", "renew", "send", "revoke"}[k]
}

// Input is one call. Lease is the index of a lease an earlier acquire
// returned, or -1 for a token the broker never issued; Context is the
// context a revoke names.
type Input struct {
	Kind    Kind
	Lease   int
	Context int
}

// Output is what the call returned. For an acquire: OK, the Context and
// Epoch of the lease and its index; for release and revoke: OK is the
// boolean answer; for renew and send: OK, or Reason (lease_lost's).
type Output struct {
	OK      bool
	Context int
	Epoch   int64
	Lease   int
	Reason  string
	Err     string // anything else: never valid
}

// Lease statuses in the model.
const (
	never uint8 = iota
	active
	released
	revoked
)

// State is the sequential model: which lease holds each context, the idle
// contexts in the order they became idle, the highest epoch issued, and
// how each lease ended.
type State struct {
	Holder   []int // lease index + 1 per context, 0 when idle
	Idle     []int // idle contexts, longest idle first
	MaxEpoch int64
	Status   []uint8 // per lease index
	Ctx      []int   // per lease index
}

func (s State) clone() State {
	return State{Holder: slices.Clone(s.Holder), Idle: slices.Clone(s.Idle), MaxEpoch: s.MaxEpoch,
		Status: slices.Clone(s.Status), Ctx: slices.Clone(s.Ctx)}
}

func (s State) status(l int) uint8 {
	if l < 0 || l >= len(s.Status) {
		return never
	}
	return s.Status[l]
}

// lostReason is DESIGN §3's reason for a handle whose lease is not active,
// first match wins; contexts here are always live and worker-owned.
func (s State) lostReason(l int) string {
	if s.status(l) == never {
		return "unknown_lease"
	}
	if s.Holder[s.Ctx[l]] != 0 {
		return "reassigned"
	}
	if s.Status[l] == released {
		return "released"
	}
	return "revoked"
}

// Model returns the porcupine model for n contexts reported in order 0…n-1.
func Model(n int) porcupine.Model {
	return porcupine.Model{
		Init: func() any {
			s := State{Holder: make([]int, n)}
			for i := range n {
				s.Idle = append(s.Idle, i)
			}
			return s
		},
		Step: func(st, in, out any) (bool, any) {
			s, i, o := st.(State), in.(Input), out.(Output)
			if o.Err != "" {
				return false, s
			}
			switch i.Kind {
			case Acquire:
				if !o.OK {
					return len(s.Idle) == 0, s
				}
				if len(s.Idle) == 0 || s.Idle[0] != o.Context || o.Epoch <= s.MaxEpoch || s.status(o.Lease) != never {
					return false, s
				}
				n := s.clone()
				for len(n.Status) <= o.Lease {
					n.Status, n.Ctx = append(n.Status, never), append(n.Ctx, -1)
				}
				n.Holder[o.Context] = o.Lease + 1
				n.Idle = n.Idle[1:]
				n.MaxEpoch = o.Epoch
				n.Status[o.Lease], n.Ctx[o.Lease] = active, o.Context
				return true, n
			case Release:
				if s.status(i.Lease) != active {
					return !o.OK, s
				}
				if !o.OK {
					return false, s
				}
				return true, s.end(i.Lease, released)
			case Renew, Send:
				if s.status(i.Lease) == active {
					return o.OK, s
				}
				return !o.OK && o.Reason == s.lostReason(i.Lease), s
			case Revoke:
				l := s.Holder[i.Context] - 1
				if l < 0 {
					return !o.OK, s
				}
				if !o.OK {
					return false, s
				}
				return true, s.end(l, revoked)
			}
			return false, s
		},
		Equal: func(a, b any) bool {
			x, y := a.(State), b.(State)
			return x.MaxEpoch == y.MaxEpoch && slices.Equal(x.Holder, y.Holder) && slices.Equal(x.Idle, y.Idle) &&
				slices.Equal(x.Status, y.Status) && slices.Equal(x.Ctx, y.Ctx)
		},
		DescribeOperation: func(in, out any) string {
			i, o := in.(Input), out.(Output)
			switch i.Kind {
			case Acquire:
				if o.OK {
					return fmt.Sprintf("acquire → L%d ctx%d epoch %d", o.Lease, o.Context, o.Epoch)
				}
				return "acquire → none " + o.Err
			case Revoke:
				return fmt.Sprintf("revoke ctx%d → %v %s", i.Context, o.OK, o.Err)
			}
			if o.OK {
				return fmt.Sprintf("%s L%d → ok", i.Kind, i.Lease)
			}
			return fmt.Sprintf("%s L%d → %s%s", i.Kind, i.Lease, o.Reason, o.Err)
		},
		DescribeState: func(st any) string {
			s := st.(State)
			var b strings.Builder
			fmt.Fprintf(&b, "holders %v idle %v max epoch %d", s.Holder, s.Idle, s.MaxEpoch)
			return b.String()
		},
	}
}

func (s State) end(l int, how uint8) State {
	n := s.clone()
	c := n.Ctx[l]
	n.Status[l] = how
	n.Holder[c] = 0
	n.Idle = append(n.Idle, c)
	return n
}
