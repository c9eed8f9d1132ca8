package registry

import (
	"time"

	cheetah "github.com/cheetahbroker/cheetah"
)

// EventKind names one kind of transition of the registry's state.
type EventKind string

// The kinds of Event. Each transition the registry decides emits exactly one
// event, in the order the registry decided them.
const (
	// LeaseAcquired: a context was assigned to a task (UserID, ClientID,
	// ContextID, ClientType, TaskID, Epoch; ExpiresAt).
	LeaseAcquired EventKind = "lease.acquired"
	// LeaseRenewed: a lease's deadline moved, by an explicit renew
	// (ExpiresAt is the new deadline). A send that renews on use does not
	// emit it: CommandAdmitted carries the lease's identity instead.
	LeaseRenewed EventKind = "lease.renewed"
	// LeaseEnded: a lease ended; Reason says how (released, expired,
	// revoked, context_gone).
	LeaseEnded EventKind = "lease.ended"
	// CommandAdmitted: a command admitted on a lease (CommandID,
	// CommandName, the lease's ids, HasCallback, AdmittedAt) has its record
	// durable. It is emitted then, not at admission, because nothing may
	// reveal a command id before its record is committed (invariant 9); a
	// command whose record could not be written is never announced.
	CommandAdmitted EventKind = "command.admitted"
	// CommandDispatched: the command frame was handed to the client's
	// connection (At says when). That happens at admission, before the
	// record is durable; the event is emitted right after CommandAdmitted,
	// so that no event names a command before its record is committed.
	CommandDispatched EventKind = "command.dispatched"
	// CommandEnded: the registry stopped tracking a command. Status is its
	// final status (a terminal one, or dispatched for response mode none,
	// which has no end), Error why it failed, Terminal the kind of the
	// client's terminal message when one ended it. It is emitted once the
	// terminal status was committed to the store (Durable), or once writing
	// it failed or was never attempted (the registry closed, response mode
	// none): then Durable is false. Every announced command ends once.
	CommandEnded EventKind = "command.ended"
	// ClientConnected: a client's connection was attached (ClientID,
	// ClientType, SessionID), replacing an older one if any.
	ClientConnected EventKind = "client.connected"
	// ClientDisconnected: a client's connection dropped or was cut; its
	// contexts are not live, and its leases wait out the reconnect grace.
	ClientDisconnected EventKind = "client.disconnected"
	// ClientGone: the registry forgot a client: it is away and has no
	// contexts left (the grace ran out, or it had none).
	ClientGone EventKind = "client.gone"
)

// Event is one transition of the registry's state, as the registry decided
// it. Events are produced under the registry's lock into one ordered queue
// and delivered outside it, in that order (Seq rises by one from event to
// event), to every subscriber (see Subscribe). Fields that do not apply to a
// kind are zero. An Event never carries a lease token: what it says may be
// shown to operators and sent to other processes.
type Event struct {
	Kind EventKind
	// Seq numbers the registry's events from 1, without gaps.
	Seq uint64
	// At is when the registry decided the transition (its clock).
	At time.Time

	UserID     string
	ClientID   string
	ClientType cheetah.ClientType
	// SessionID is the connection's session, on client events.
	SessionID string
	ContextID string
	TaskID    string
	Epoch     int64
	// ExpiresAt is the lease's deadline, on LeaseAcquired and LeaseRenewed.
	ExpiresAt time.Time
	// Reason is how a lease ended (LeaseEnded).
	Reason cheetah.LostReason
	// LeaseWebhook is the acquire's lease_webhook, on LeaseEnded, and
	// LeaseWebhookKeyID the key that signs its delivery ("" for the
	// broker's secret).
	LeaseWebhook      string
	LeaseWebhookKeyID string

	CommandID   string
	CommandName string
	// AdmittedAt is when the command was admitted, on command events: with
	// At it times a command's life.
	AdmittedAt time.Time
	// HasCallback says the command was sent with a callback URL, on command
	// events: its end is delivered by the webhook worker.
	HasCallback bool
	Status      cheetah.Status
	Error       *cheetah.ErrorInfo
	Terminal    cheetah.MessageKind
	// Durable says, on CommandEnded, that Status is committed in history.
	Durable bool
}
