package registry

import (
	"context"
	"errors"
	"time"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/protocol"
)

// ClientMessage records what a client sent about a command: ack, progress,
// event, capture, result or error. A frame about a command that was not
// dispatched to this client is answered unknown_command and recorded
// nowhere. The first terminal message wins; later ones are recorded as late
// messages and answered duplicate_terminal.
func (r *Registry) ClientMessage(ctx context.Context, a *Attachment, f protocol.Frame) {
	id, msg, bytes := toMessage(f, r.clock.Now())
	if id == "" {
		return
	}
	r.mu.Lock()
	if !a.current() {
		r.mu.Unlock()
		return
	}
	user, client := a.c.pool.userID, a.c.id
	c := r.commands[id]
	if c != nil && c.dispatched && c.user == user && c.client == client {
		r.onLive(c, msg, bytes)
		r.mu.Unlock()
		return
	}
	fin, known := r.endedCommands.get(id)
	r.mu.Unlock()
	if !known {
		// Older than the registry remembers: the store knows.
		ref, err := r.store.Lookup(ctx, id)
		if err != nil {
			if !errors.Is(err, cheetah.ErrNotFound) {
				r.log.Warn("look up command for a late message", "session_id", a.sessionID, "command_id", id, "err", err)
			}
			a.conn.Send(&protocol.Error{CommandID: id, Code: protocol.CodeUnknownCommand, Message: "no such command was dispatched to this client"})
			return
		}
		fin = endedCommand{user: ref.UserID, client: ref.ClientID, status: ref.Status, mode: ref.ResponseMode}
		// A command that was never dispatched went to no client.
		known = fin.status != cheetah.StatusAdmitted
	}
	if !known || fin.user != user || fin.client != client {
		a.conn.Send(&protocol.Error{CommandID: id, Code: protocol.CodeUnknownCommand, Message: "no such command was dispatched to this client"})
		return
	}
	r.onEnded(a, id, fin, msg, bytes)
}

// onLive handles a message about a command in flight; r.mu is held.
func (r *Registry) onLive(c *command, msg cheetah.Message, bytes []byte) {
	id := c.rec.CommandID
	app := history.AppendMessage{CommandID: id, Msg: msg, Bytes: bytes}
	switch msg.Kind {
	case cheetah.KindAck:
		if c.acked {
			r.writeFor(c, app)
			return
		}
		c.acked = true
		if c.traced {
			c.wallAcked = time.Now().UnixNano()
		}
		r.writeFor(c, app, history.SetStatus{CommandID: id, Status: cheetah.StatusAcknowledged, At: msg.At})
	case cheetah.KindResult:
		r.endCommand(c, cheetah.StatusCompleted, nil, &app)
	case cheetah.KindError:
		r.endCommand(c, cheetah.StatusFailed, &cheetah.ErrorInfo{Code: msg.Code, Message: msg.Message, Data: msg.Data}, &app)
	default:
		r.writeFor(c, app)
	}
}

// onEnded handles a message about a command that already ended (or is
// not tracked, response mode none): it is recorded, late when the command's
// status is terminal.
func (r *Registry) onEnded(a *Attachment, id string, fin endedCommand, msg cheetah.Message, bytes []byte) {
	terminal := msg.Kind == cheetah.KindResult || msg.Kind == cheetah.KindError
	msg.Late = fin.status.Terminal()
	ops := []history.Op{history.AppendMessage{CommandID: id, Msg: msg, Bytes: bytes}}
	if msg.Kind == cheetah.KindAck && !msg.Late {
		ops = append(ops, history.SetStatus{CommandID: id, Status: cheetah.StatusAcknowledged, At: msg.At})
	}
	// Through the outbox, so that it follows what was decided about the
	// command before (its terminal message among them).
	r.mu.Lock()
	r.write(nil, ops...)
	r.mu.Unlock()
	if terminal && (fin.status == cheetah.StatusCompleted || fin.status == cheetah.StatusFailed) {
		a.conn.Send(&protocol.Error{CommandID: id, Code: protocol.CodeDuplicateTerminal, Message: "the command already has a terminal message"})
	}
}

// toMessage turns a client frame into a history message.
func toMessage(f protocol.Frame, now time.Time) (string, cheetah.Message, []byte) {
	m := cheetah.Message{At: now.UTC()}
	switch f := f.(type) {
	case *protocol.Ack:
		m.Kind = cheetah.KindAck
		return f.CommandID, m, nil
	case *protocol.Progress:
		m.Kind, m.Data = cheetah.KindProgress, f.Data
		return f.CommandID, m, nil
	case *protocol.Event:
		m.Kind, m.Name, m.Data = cheetah.KindEvent, f.Name, f.Data
		return f.CommandID, m, nil
	case *protocol.Capture:
		m.Kind, m.Mime = cheetah.KindCapture, f.MIME
		b, _ := f.Bytes() // validated by the decoder
		return f.CommandID, m, b
	case *protocol.Result:
		m.Kind, m.Data = cheetah.KindResult, f.Data
		return f.CommandID, m, nil
	case *protocol.Error:
		m.Kind, m.Code, m.Message, m.Data = cheetah.KindError, string(f.Code), f.Message, f.Data
		return f.CommandID, m, nil
	}
	return "", m, nil
}
