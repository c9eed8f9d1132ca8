package registry

import (
	"sync"

	"github.com/cheetahbroker/cheetah/protocol"
)

// NoticeConn is implemented by a Conn that carries assignment notices
// coalesced. The registry uses it when the connection has it, and sends one
// assignment frame per change through Send otherwise.
//
// Without it, every acquire and every release queues a frame, so a churn of
// leases fills a client's outbound queue however well the client reads. With
// it, a client has at most one open batch of notices queued: changes made
// before the connection comes to write that batch update it in place (one
// entry per context, its latest state), so the notice frames queued for a
// client are bounded by its contexts, not by the churn.
type NoticeConn interface {
	Conn
	// Notify queues n behind every frame sent before it, like Send, and
	// must not block. When the connection comes to write n, it calls
	// n.Take and writes the frames Take returns, in order, before any frame
	// sent after n. Until then the registry may still change n. A
	// connection whose queue is full answers false and closes itself, as
	// Send does.
	Notify(n *Notices) bool
}

// Notices is a batch of assignment notices for one client connection,
// coalesced per context. The client's view stays one it could have had from
// every frame (leases alternate, epochs rise), only shorter:
//
//   - the end of a lease the client was told of before the batch is always
//     told, so the client never believes two leases at once;
//   - an assignment made since is told in its latest state, after that end;
//   - a lease assigned and ended within the batch is not told at all: no
//     command of it was sent (a command closes the batch, see below), so
//     the client has nothing to fence on it, and its context is, for the
//     client, as it was.
//
// So a batch holds at most two frames per context. The registry closes a
// batch to further changes when it sends a command after it: a command for
// epoch E always follows, on the wire, the assignment of E, and any later
// news of its context follows the command.
type Notices struct {
	conn Conn // the connection it was handed to; r.mu guards it

	mu      sync.Mutex
	taken   bool
	entries []noticeEntry
	index   map[string]int // context id → position in entries, for large batches
}

// noticeEntry is what a batch says of one context: the end of the lease the
// client knew of, then the latest assignment, each when set.
type noticeEntry struct {
	contextID           string
	end, assigned       protocol.Assignment
	hasEnd, hasAssigned bool
}

// noticeIndexAt is the batch size from which a batch indexes its contexts
// instead of scanning them.
const noticeIndexAt = 16

// Take returns the batch's frames, in the order their contexts first joined
// the batch, and closes the batch: what the registry decides after goes into
// another one. The connection calls it once, when it comes to write the
// batch, and writes the frames in order.
func (n *Notices) Take() []protocol.Frame {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.taken {
		return nil
	}
	n.taken = true
	out := make([]protocol.Frame, 0, len(n.entries))
	for i := range n.entries {
		e := &n.entries[i]
		if e.hasEnd {
			out = append(out, &e.end)
		}
		if e.hasAssigned {
			out = append(out, &e.assigned)
		}
	}
	return out
}

// put records a change in the batch. It reports false when the batch was
// taken already.
func (n *Notices) put(a protocol.Assignment) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.taken {
		return false
	}
	e := n.entry(a.ContextID)
	switch {
	case a.State == protocol.AssignmentAssigned:
		e.assigned, e.hasAssigned = a, true
	case e.hasAssigned && e.assigned.Epoch == a.Epoch:
		// Assigned and ended within the batch: the client need not know.
		e.hasAssigned = false
	default:
		e.end, e.hasEnd = a, true
	}
	return true
}

// entry finds or adds the entry of a context; n.mu is held.
func (n *Notices) entry(contextID string) *noticeEntry {
	if n.index != nil {
		if i, ok := n.index[contextID]; ok {
			return &n.entries[i]
		}
	} else {
		for i := range n.entries {
			if n.entries[i].contextID == contextID {
				return &n.entries[i]
			}
		}
	}
	n.entries = append(n.entries, noticeEntry{contextID: contextID})
	if n.index == nil && len(n.entries) >= noticeIndexAt {
		n.index = make(map[string]int, 2*noticeIndexAt)
		for i := range n.entries {
			n.index[n.entries[i].contextID] = i
		}
	} else if n.index != nil {
		n.index[contextID] = len(n.entries) - 1
	}
	return &n.entries[len(n.entries)-1]
}

// notify tells w's client of an assignment change; r.mu is held. Commands
// are dispatched at admission, so no command of w waits for it: the
// notice joins the client's open batch at once.
func (r *Registry) notify(w *wctx, a protocol.Assignment) {
	r.sendNotice(w.client, a)
}

// sendNotice hands an assignment change to c's connection, if it is
// connected: into its open batch of notices when there is one; r.mu is
// held.
func (r *Registry) sendNotice(c *client, a protocol.Assignment) {
	conn := c.conn
	if conn == nil {
		return
	}
	nc := c.nconn
	if nc == nil {
		f := a // only this path allocates the frame
		conn.Send(&f)
		return
	}
	if b := c.notices; b != nil && b.conn == conn && b.put(a) {
		return
	}
	b := &Notices{conn: conn, entries: make([]noticeEntry, 0, 4)}
	b.put(a)
	c.notices = b
	if !nc.Notify(b) {
		c.notices = nil
	}
}

// sealNotices closes c's open batch of notices to further changes; r.mu is
// held. It is called before a command frame is sent to c, so that every
// notice decided after the command follows it.
func sealNotices(c *client) { c.notices = nil }
