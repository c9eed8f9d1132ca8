package history

import (
	"time"

	cheetah "github.com/cheetahbroker/cheetah"
)

// writePlan is a batch of ops sorted by kind and folded, ready for a
// dialect's write path: the rows to insert, one status change per command,
// the messages in enqueue order and one delivery state per command.
type writePlan struct {
	cmds       []commandRow
	statuses   []statusChange
	msgs       []messageRow // Seq is the message's place among its command's messages in this batch, 1, 2, 3…
	deliveries []SetDelivery
	leases     []leaseChange // one per lease, the last op's
	leaseAt    map[[32]byte]int
	insertedAt map[string]int // see inserted

	// msgs split by splitMessages: those of commands this batch inserts,
	// and the others.
	freshMsgs, storedMsgs []*messageRow

	// What plan keeps track of while it folds a batch's ops, by command id.
	statusAt, deliveryAt map[string]int
	msgCount             map[string]int64
}

// statusChange is what the SetStatus ops of one command in one batch amount
// to. Run one by one, each applies only where the stored rank is lower than
// its own, so of a command's ops only those that rank higher than every one
// before them in the batch can ever apply (a later op of the same or a lower
// rank finds the row already there or beyond), and each of those applies
// exactly when it ranks higher than the stored status. So: status and rank
// are the highest such op's, which applies where the stored rank is lower;
// at[k] is the time of the op of rank k, set where the stored rank is below
// k; the error is the last such op's that carried one, set where the stored
// rank is below errRank.
type statusChange struct {
	commandID string
	status    string
	rank      int
	at        [4]*time.Time // by rank: 1 dispatched_at, 2 acked_at, 3 finished_at
	errRank   int           // -1: no error to set
	err       *cheetah.ErrorInfo
}

// errCols returns the error columns as SetStatus stores them.
func (c *statusChange) errCols() (code, message, data *string) {
	if c.err == nil {
		return nil, nil, nil
	}
	e := c.err
	code = &e.Code
	return code, text(e.Message), jsonText(e.Data)
}

func (p *writePlan) empty() bool {
	return len(p.cmds) == 0 && len(p.statuses) == 0 && len(p.msgs) == 0 && len(p.deliveries) == 0 && len(p.leases) == 0
}

// plan makes p the plan of ops. The writer keeps one plan and plans every
// batch into it: a batch's rows, and the maps that fold them, reuse the room
// the batches before grew instead of growing it again.
func (p *writePlan) plan(ops []Op) {
	p.reset()
	for _, op := range ops {
		switch o := op.(type) {
		case InsertCommand:
			p.cmds = append(p.cmds, newCommandRow(o))
		case SetStatus:
			if p.statusAt == nil {
				p.statusAt = make(map[string]int)
			}
			i, ok := p.statusAt[o.CommandID]
			if !ok {
				i = len(p.statuses)
				p.statusAt[o.CommandID] = i
				p.statuses = append(p.statuses, statusChange{commandID: o.CommandID, errRank: -1})
			}
			c := &p.statuses[i]
			rank := o.Status.Rank()
			if rank <= c.rank {
				// Admitted (rank 0) never applies, and nothing applies
				// after an op of its rank or higher.
				continue
			}
			at := o.At
			if at.IsZero() {
				at = time.Now()
			}
			u := utc(at)
			c.status, c.rank, c.at[rank] = string(o.Status), rank, &u
			if o.Error != nil {
				c.errRank, c.err = rank, o.Error
			}
		case AppendMessage:
			if p.msgCount == nil {
				p.msgCount = make(map[string]int64)
			}
			p.msgCount[o.CommandID]++
			p.msgs = append(p.msgs, newMessageRow(o, p.msgCount[o.CommandID]))
		case SetDelivery:
			// Each overwrites the last: only the last of a command's counts.
			if p.deliveryAt == nil {
				p.deliveryAt = make(map[string]int)
			}
			if i, ok := p.deliveryAt[o.CommandID]; ok {
				p.deliveries[i] = o
				continue
			}
			p.deliveryAt[o.CommandID] = len(p.deliveries)
			p.deliveries = append(p.deliveries, o)
		case PutLease:
			p.planLease(o.TokenDigest, leaseChange{put: o})
		case DeleteLease:
			p.planLease(o.TokenDigest, leaseChange{put: PutLease{TokenDigest: o.TokenDigest}, delete: true})
		}
	}
	// Commands whose only status ops were admitted: nothing to change. A
	// command inserted by this batch takes its change in its row: the
	// statements insert before they update, so the update would find that
	// row, and an UPDATE would write every index of the row a second time.
	kept := p.statuses[:0]
	for _, c := range p.statuses {
		if c.rank <= 0 {
			continue
		}
		if i, ok := p.inserted(c.commandID); ok {
			c.applyTo(&p.cmds[i])
			continue
		}
		kept = append(kept, c)
	}
	clear(p.statuses[len(kept):]) // so that past len all is zero, for reset
	p.statuses = kept
}

// reset empties p for the next batch, keeping its room. What the rows
// held (the ops' params, messages, bytes) is let go at once, not when the
// room is next written. Only the rows in use are cleared: past them the
// room is zero already, and a batch of one row does not pay for the room a
// burst grew.
func (p *writePlan) reset() {
	clear(p.cmds)
	clear(p.statuses)
	clear(p.msgs)
	clear(p.deliveries)
	clear(p.leases)
	clear(p.freshMsgs)
	clear(p.storedMsgs)
	p.freshMsgs, p.storedMsgs = p.freshMsgs[:0], p.storedMsgs[:0]
	p.cmds, p.statuses, p.msgs, p.deliveries, p.leases = p.cmds[:0], p.statuses[:0], p.msgs[:0], p.deliveries[:0], p.leases[:0]
	clear(p.leaseAt)
	clear(p.insertedAt)
	clear(p.statusAt)
	clear(p.deliveryAt)
	clear(p.msgCount)
}

// inserted returns the index in p.cmds of the command id this batch
// inserts, if it does. Its index is made on first use.
func (p *writePlan) inserted(id string) (int, bool) {
	if len(p.cmds) == 0 {
		return 0, false
	}
	if len(p.insertedAt) == 0 {
		if p.insertedAt == nil {
			p.insertedAt = make(map[string]int, len(p.cmds))
		}
		for i := range p.cmds {
			p.insertedAt[p.cmds[i].CommandID] = i
		}
	}
	i, ok := p.insertedAt[id]
	return i, ok
}

// splitMessages sorts p.msgs, in order, into p.freshMsgs, the messages of
// commands this batch inserts, and p.storedMsgs, the others. A fresh
// message's Seq, its place among its command's messages in the batch, is
// its seq: the command has no other, or its insert, and the batch, fail.
// Only a stored message needs its command's last stored seq read.
func (p *writePlan) splitMessages() {
	p.freshMsgs, p.storedMsgs = p.freshMsgs[:0], p.storedMsgs[:0]
	for i := range p.msgs {
		if r := &p.msgs[i]; p.isInserted(r.CommandID) {
			p.freshMsgs = append(p.freshMsgs, r)
		} else {
			p.storedMsgs = append(p.storedMsgs, r)
		}
	}
}

func (p *writePlan) isInserted(id string) bool {
	_, ok := p.inserted(id)
	return ok
}

// applyTo makes row what the status statements (pgSetStatuses,
// sqliteSetStatus) make of it: the same change, for a row not yet stored.
func (c *statusChange) applyTo(row *commandRow) {
	stored := row.StatusRank
	if stored >= c.rank {
		return
	}
	row.Status, row.StatusRank = c.status, c.rank
	if c.at[1] != nil && stored < 1 {
		row.DispatchedAt = c.at[1]
	}
	if c.at[2] != nil && stored < 2 {
		row.AckedAt = c.at[2]
	}
	if c.at[3] != nil && stored < 3 {
		row.FinishedAt = c.at[3]
		if row.CallbackURL != nil {
			row.DeliveryNextAt = c.at[3]
		}
	}
	if c.errRank > stored {
		row.ErrorCode, row.ErrorMessage, row.ErrorData = c.errCols()
	}
}
