package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/jonboulle/clockwork"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/internal/heldconn"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/server/auth"
)

// CodeTooManyContexts answers a state report over the per-client bound.
const CodeTooManyContexts protocol.ErrorCode = "too_many_contexts"

// session is one client WebSocket. Its reader runs in a goroutine of its
// own (run), and that is all an idle session runs: frames wait in a queue
// guarded by mu, a writer goroutine exists only while there is something to
// write, and the server's one heartbeat loop pings every session. The
// registry hands frames to Send under its lock, so Send never blocks; a
// client that does not read is cut off once its queue passes the bound,
// instead of slowing anyone else.
type session struct {
	srv  *Server
	ws   *websocket.Conn
	held *heldconn.Conn // ws's connection, when the server holds writes (HoldWrites)
	id   string
	log  *slog.Logger

	mu sync.Mutex
	// queue holds the frames not yet taken by a writer; queued and
	// queuedBytes count them and the batch a writer is writing.
	queue       []outItem
	queued      int
	queuedBytes int
	// ctx is the session's context, set when the connection is ready to
	// write (ready); a writer started before that would have no socket.
	ctx      context.Context
	ready    bool
	writing  bool // a writer goroutine runs
	closeSet bool // a close is queued: nothing is queued after it
	dead     bool // cut off or ended: nothing is queued or started any more
	// closed is closed by the writer once it has written the close, or
	// has given up, and then dropped; it exists only once a close is
	// queued.
	closed chan struct{}
	// bg counts the goroutines the session starts (writer, pings, cuts);
	// they start under mu while !dead, and the session waits for them.
	bg sync.WaitGroup

	// writeTimer cuts the connection when a write takes longer than the
	// write timeout. Made by the first writer and kept, stopped, between
	// writes: writers come and go with every burst of frames. Only the
	// writer touches it.
	writeTimer *time.Timer

	lastSeen atomic.Int64 // unix nanoseconds of the last frame or pong
	att      *registry.Attachment
	// beating is set once hello succeeded: the heartbeat loop pings only
	// sessions that said hello (the hello timer covers the others).
	beating atomic.Bool
	// helloed is set once the session no longer counts among the
	// connections waiting to say hello (Server.pendingHellos).
	helloed atomic.Bool
	// helloDone ends the reads of a hello under way (helloContext): once
	// the session is closed, they are for nobody.
	helloDone context.CancelFunc
}

// leavePending gives back the session's place among the connections
// waiting to say hello, once: when its hello arrives, when the broker closes
// it, or when it ends without either.
func (s *session) leavePending() {
	if s.helloed.CompareAndSwap(false, true) {
		s.srv.pendingHellos.Add(-1)
	}
}

// outItem is a frame to write, or, with close set, the close to perform
// after writing the frame that explains it. size is what the frame counts
// against the queue's byte bound.
type outItem struct {
	frame protocol.Frame
	// notices, instead of a frame, is a batch of assignment notices whose
	// frames are taken when the writer comes to it (registry.NoticeConn).
	notices *registry.Notices
	close   *closeReq
	size    int
}

type closeReq struct {
	code   protocol.CloseCode
	reason string
}

// frameSize estimates the encoded size of f from its variable parts, without
// encoding it: Send runs under the registry's lock.
func frameSize(f protocol.Frame) int {
	const overhead = 160 // type, names, ids
	switch f := f.(type) {
	case *protocol.Command:
		return overhead + len(f.CommandID) + len(f.ContextID) + len(f.TaskID) + len(f.Name) +
			len(f.Params) + len(f.Target) + len(f.Options) + len(f.Traceparent)
	case *protocol.Error:
		return overhead + len(f.CommandID) + len(f.Message) + len(f.Data)
	case *protocol.Assignment:
		return overhead + len(f.ContextID) + len(f.TaskID)
	case *protocol.Cancel:
		return overhead + len(f.CommandID) + len(f.Reason)
	}
	return overhead
}

// Send queues f without blocking. When the queue is over its bound the
// client is not reading: the connection is dropped and Send answers false.
func (s *session) Send(f protocol.Frame) bool {
	return s.enqueue(outItem{frame: f, size: frameSize(f)})
}

// noticesSize is what a batch of assignment notices counts against the
// queue's byte bound: it holds at most two small frames per context.
const noticesSize = 512

// Notify queues a batch of assignment notices (registry.NoticeConn) without
// blocking: the writer takes its frames when it comes to it, so the changes
// of a context decided meanwhile go out as one frame.
func (s *session) Notify(n *registry.Notices) bool {
	return s.enqueue(outItem{notices: n, size: noticesSize})
}

// enqueue queues it, or drops a client over the queue's bounds.
func (s *session) enqueue(it outItem) bool {
	size := it.size
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead || s.closeSet {
		return false
	}
	cfg := &s.srv.cfg
	if s.queued+1 > cfg.OutboundQueue || s.queuedBytes+size > cfg.OutboundBytes {
		// Said once per client, not once per refused frame.
		s.log.Warn("client does not read its frames; disconnecting",
			"queued_frames", s.queued, "queued_bytes", s.queuedBytes)
		s.dead = true
		s.queue = nil
		s.goLocked(func() { s.ws.CloseNow() })
		return false
	}
	s.pushLocked(it)
	return true
}

// Close sends an error frame saying why, then closes with code. It does not
// block.
func (s *session) Close(code protocol.CloseCode, reason string) {
	// Before the error frame is queued: a client that reads it finds the
	// place it held among those waiting to say hello given back.
	s.leavePending()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead || s.closeSet {
		return
	}
	// The close is queued whatever the bound: it is one small frame, and
	// a client that reads nothing is cut by the write timeout instead.
	s.closeSet = true
	s.closed = make(chan struct{})
	if s.helloDone != nil {
		s.helloDone()
	}
	s.pushLocked(outItem{
		frame: &protocol.Error{Code: code.ErrorCode(), Message: reason},
		close: &closeReq{code: code, reason: reason},
	})
}

// closing reports whether the broker has queued a close.
func (s *session) closing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closeSet
}

// pushLocked queues it and starts a writer if none runs.
func (s *session) pushLocked(it outItem) {
	s.queue = append(s.queue, it)
	s.queued++
	s.queuedBytes += it.size
	s.startWriterLocked()
}

func (s *session) startWriterLocked() {
	if s.ready && !s.writing && len(s.queue) > 0 && !s.dead {
		s.writing = true
		s.bg.Add(1)
		go s.writeLoop()
	}
}

// goLocked starts f as one of the session's goroutines, once there is a
// connection. s.mu is held, and the caller has checked that the session has
// not ended (dead), so end's wait covers f.
func (s *session) goLocked(f func()) {
	if s.ws == nil {
		return
	}
	s.bg.Go(f)
}

// start makes the session writable: frames queued before (a hello timeout's
// close) go out now.
func (s *session) start(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ctx = ctx
	s.ready = true
	s.startWriterLocked()
}

// end stops everything the session started and waits for it. Nothing
// starts afterwards.
func (s *session) end() {
	s.mu.Lock()
	s.dead = true
	s.queue = nil
	s.mu.Unlock()
	s.bg.Wait()
}

// writeLoop writes what is queued, batch after batch, and returns when the
// queue is empty; the next Send starts another. Frames of one batch go out
// back to back with one encode buffer and one write deadline timer.
func (s *session) writeLoop() {
	defer s.bg.Done()
	buf := s.srv.getBuf()
	defer s.srv.putBuf(buf)
	// The write timeout cuts the connection, as a write context's would;
	// writes themselves take a context that is never done, which spares
	// the library arming a cancellation for each one.
	if s.writeTimer == nil {
		s.writeTimer = time.AfterFunc(s.srv.cfg.WriteTimeout, func() {
			if s.held != nil {
				// First the socket itself: a TLS close would wait for the
				// stuck flush to send its alert.
				_ = s.held.Conn.Close()
			}
			s.ws.CloseNow()
		})
		s.writeTimer.Stop()
	}
	timer := s.writeTimer
	for {
		s.mu.Lock()
		batch := s.queue
		if len(batch) == 0 || s.dead {
			s.writing = false
			s.mu.Unlock()
			return
		}
		s.queue = nil
		s.mu.Unlock()

		bytes := 0
		// A batch of several items goes out in one write of the
		// connection; the write timer covers the flush.
		hold := s.held != nil && (len(batch) > 1 || batch[0].notices != nil)
		if hold {
			// Hold waits for a write of the library's own (a ping) that
			// may be stuck: within the write timeout too.
			timer.Reset(s.srv.cfg.WriteTimeout)
			s.held.Hold()
			timer.Stop()
		}
		for i := range batch {
			it := &batch[i]
			bytes += it.size
			if it.notices != nil {
				for _, f := range it.notices.Take() {
					if !s.write(timer, f, buf) {
						s.fail()
						return
					}
				}
				continue
			}
			if it.close != nil && hold {
				hold = false
				if !s.flushHeld(timer) {
					return
				}
			}
			if !s.write(timer, it.frame, buf) {
				s.fail()
				return
			}
			if it.close != nil {
				s.closeWritten(it.close)
				return
			}
		}
		if hold && !s.flushHeld(timer) {
			return
		}
		s.mu.Lock()
		s.queued -= len(batch)
		s.queuedBytes -= bytes
		if s.queue == nil && cap(batch) <= 8 {
			clear(batch)
			s.queue = batch[:0] // reused by the next Send
		}
		s.mu.Unlock()
	}
}

// write encodes and writes one frame within the write timeout. It answers
// false when the connection is broken.
func (s *session) write(timer *time.Timer, f protocol.Frame, buf *[]byte) bool {
	var err error
	*buf, err = protocol.Append((*buf)[:0], f)
	if err != nil {
		s.log.Error("encode frame", "err", err)
		return true
	}
	timer.Reset(s.srv.cfg.WriteTimeout)
	err = s.ws.Write(context.Background(), websocket.MessageText, *buf)
	timer.Stop()
	if err != nil {
		s.log.Debug("write frame", "err", err)
		return false
	}
	s.srv.tel.frame(f.FrameType(), dirOut)
	return true
}

// flushHeld writes what the connection held, within the write timeout; on
// failure it ends the session and answers false.
func (s *session) flushHeld(timer *time.Timer) bool {
	timer.Reset(s.srv.cfg.WriteTimeout)
	err := s.held.Flush()
	timer.Stop()
	if err != nil {
		s.log.Debug("write frames", "err", err)
		s.fail()
		return false
	}
	return true
}

// fail ends a session whose connection broke while writing.
func (s *session) fail() {
	s.mu.Lock()
	s.dead = true
	s.writing = false
	s.queue = nil
	closed := s.closed
	s.closed = nil // closed once
	s.mu.Unlock()
	s.ws.CloseNow()
	if closed != nil {
		close(closed)
	}
}

// closeWritten performs the close whose error frame was just written.
func (s *session) closeWritten(c *closeReq) {
	// A close the broker decides is worth an operator's notice, except a
	// shutdown's, which is expected.
	level := slog.LevelInfo
	if c.code == protocol.CloseGoingAway {
		level = slog.LevelDebug
	}
	s.log.Log(context.Background(), level, "closing client", "code", int(c.code), "reason", c.reason)
	s.ws.Close(websocket.StatusCode(c.code), c.reason)
	s.fail()
}

// handleClient serves GET /ws/v1/client: it upgrades the connection and
// starts the session's goroutine. The caller has taken the connection's
// place among those waiting to say hello (admitHello); the session gives it
// back.
func (s *Server) handleClient(w http.ResponseWriter, r *http.Request) {
	sess := &session{srv: s, id: newID()}
	sess.log = s.log.With("session_id", sess.id)
	sess.lastSeen.Store(s.clock.Now().UnixNano())
	// The hello deadline runs from before the upgrade: once a client has
	// its 101, the timer that will close it is there (it queues the close
	// for the writer, which can start below).
	hello := s.clock.AfterFunc(s.cfg.HelloTimeout, func() {
		sess.Close(protocol.CloseTimeout, "no hello within "+s.cfg.HelloTimeout.String())
	})
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		// The token travels in hello, never in a cookie, so a foreign origin
		// gains nothing from opening a socket; extensions connect from
		// chrome-extension:// origins.
		InsecureSkipVerify: true,
	})
	if err != nil {
		hello.Stop()
		sess.leavePending()
		s.log.Debug("websocket accept", "err", err)
		return
	}
	// The broker enforces max_message_bytes itself, so that an oversized
	// frame is answered with 4413 and an error frame rather than the
	// library's own 1009.
	ws.SetReadLimit(-1)
	sess.mu.Lock()
	sess.ws, sess.held = ws, heldOf(r.Context())
	sess.mu.Unlock()
	if !s.track(sess) {
		hello.Stop()
		sess.leavePending()
		ws.Close(websocket.StatusGoingAway, "shutting down")
		return
	}
	// The connection is hijacked, so the HTTP handler returns and the
	// session goes on in a goroutine of its own: an idle session then
	// holds the reader's shallow stack, not one under the HTTP server's
	// and the router's frames. The server's wait group counts it (track).
	go sess.run(context.WithoutCancel(r.Context()), hello)
}

// run serves the session until its connection ends, then lets go of all
// it holds.
func (sess *session) run(parent context.Context, hello clockwork.Timer) {
	s := sess.srv
	defer s.untrack(sess)
	defer sess.leavePending()
	defer hello.Stop()
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	defer func() {
		// The HTTP server's recovery no longer covers the session: a panic
		// ends this client, not the broker.
		if v := recover(); v != nil {
			sess.log.Error("client session panicked", "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			sess.ws.CloseNow()
			s.stopBeating(sess)
			sess.end()
			if sess.att != nil {
				s.reg.Disconnect(sess.att)
			}
		}
	}()
	sess.start(ctx)
	sess.readLoop(ctx, hello)
	s.stopBeating(sess)
	sess.mu.Lock()
	closed := sess.closed
	sess.mu.Unlock()
	if closed != nil {
		// The writer owes the client an error frame and a close frame; give
		// it the time a write may take before cutting the connection.
		t := s.clock.NewTimer(s.cfg.WriteTimeout + 5*time.Second)
		select {
		case <-closed:
		case <-t.Chan():
		}
		t.Stop()
	}
	cancel()
	// Cut whatever is still being written, then wait for the writer and
	// the pings.
	sess.ws.CloseNow()
	sess.end()
	if sess.att != nil {
		s.reg.Disconnect(sess.att)
	}
}

// getBuf and putBuf lend writers an encode buffer, so that an idle session
// holds none.
func (s *Server) getBuf() *[]byte {
	if b, ok := s.bufs.Get().(*[]byte); ok {
		*b = (*b)[:0]
		return b
	}
	b := make([]byte, 0, 1024)
	return &b
}

func (s *Server) putBuf(b *[]byte) {
	if protocol.KeepBuffer(*b) == nil {
		return // a large frame's buffer is not worth keeping
	}
	s.bufs.Put(b)
}

// readLoop reads frames until the connection ends. hello is the timer
// that closes a client that says no hello in time.
func (s *session) readLoop(ctx context.Context, hello clockwork.Timer) {
	max := int64(s.srv.cfg.MaxMessageBytes)
	limit := newLimiter(s.srv.cfg.FrameRateLimit)
	// The reader ends when the connection does; a context that is never
	// done spares the library arming a cancellation for each frame.
	rctx := context.WithoutCancel(ctx)
	for {
		typ, rd, err := s.ws.Reader(rctx)
		if err != nil {
			s.logReadEnd(err)
			return
		}
		bp := s.srv.getBuf()
		b, err := protocol.ReadMessage(rd, *bp, max+1)
		*bp = b
		if err != nil {
			s.logReadEnd(err)
			return
		}
		if int64(len(b)) > max {
			s.Close(protocol.CloseTooLarge, "frame larger than max_message_bytes")
			return
		}
		s.lastSeen.Store(s.srv.clock.Now().UnixNano())
		if limit != nil && !limit.AllowN(s.srv.clock.Now(), 1) {
			s.Close(protocol.CloseRateLimited, "more frames than the broker's per-client rate limit")
			return
		}
		if typ != websocket.MessageText {
			s.Close(protocol.CloseMalformed, "frames are JSON text")
			return
		}
		f, err := protocol.Decode(b)
		// A decoded frame does not refer to b; only a bad first frame is
		// looked at again.
		helloLike := false
		if err != nil && s.att == nil {
			_, helloLike = peekHello(b)
		}
		s.srv.putBuf(bp)
		_, unknown := errors.AsType[*protocol.UnknownTypeError](err)
		switch {
		case err == nil:
			s.srv.tel.frame(f.FrameType(), dirIn)
		case unknown:
			s.srv.tel.frame("unknown", dirIn)
			if s.att == nil {
				s.Close(protocol.CloseUnauthorized, "the first frame must be hello")
				return
			}
			s.Send(&protocol.Error{Code: protocol.CodeUnknownType, Message: err.Error()})
			continue
		case err != nil:
			if s.att == nil {
				if !helloLike {
					s.Close(protocol.CloseUnauthorized, "the first frame must be hello")
					return
				}
			}
			code, ok := protocol.CloseCodeFor(err)
			if !ok {
				code = protocol.CloseMalformed
			}
			s.Close(code, err.Error())
			return
		}
		if s.att == nil {
			h, ok := f.(*protocol.Hello)
			if !ok {
				s.Close(protocol.CloseUnauthorized, "the first frame must be hello")
				return
			}
			if !hello.Stop() {
				return // the hello timeout already fired and is closing
			}
			// Before the welcome goes out: a client that has it finds its
			// place given back.
			s.leavePending()
			if !s.hello(ctx, h) {
				return
			}
			s.srv.startBeating(s)
			continue
		}
		if !s.handle(ctx, f) {
			return
		}
	}
}

// peekHello tells whether a frame that failed to decode meant to be a hello,
// so a broken hello is malformed (4400) and anything else first is 4401.
func peekHello(b []byte) (string, bool) {
	var head struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(b, &head)
	return head.Type, head.Type == string(protocol.TypeHello)
}

// logReadEnd logs why reading stopped. Expected ends are at debug: the
// client closed normally or is going away (a browser's service worker
// restarts often), or the broker itself ended the connection. Anything else
// (a dropped TCP connection, a protocol error) is at info: a client lost.
func (s *session) logReadEnd(err error) {
	if s.closing() {
		s.log.Debug("client connection ended by the broker", "err", err)
		return
	}
	switch websocket.CloseStatus(err) {
	case websocket.StatusNormalClosure, websocket.StatusGoingAway:
		s.log.Debug("client closed", "err", err)
		return
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, io.EOF) {
		s.log.Debug("client gone", "err", err)
		return
	}
	s.log.Info("client connection lost", "err", err)
}

// helloContext is ctx, ended when the session is closed: a hello whose
// session a fence cut (Server.CutClients) stops waiting for the database
// or the other replicas, rather than act when they answer at last.
func (s *session) helloContext(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closeSet {
		cancel()
	}
	s.helloDone = cancel
	return ctx, cancel
}

// hello authenticates the client and attaches it to the registry.
func (s *session) hello(ctx context.Context, h *protocol.Hello) bool {
	// Before anything is read: a replica that fences meanwhile forgets
	// its clients, and what the hello read is another replica's by then
	// (registry.Registry.Forgets).
	forgets := s.srv.reg.Forgets()
	ctx, cancel := s.helloContext(ctx)
	defer cancel()
	key, err := s.srv.keys.Verify(ctx, h.Token)
	if ctx.Err() != nil {
		return false // the session was closed meanwhile
	}
	if err != nil || key.Kind != auth.Client {
		if err != nil && !errors.Is(err, cheetah.ErrUnauthorized) {
			s.log.Warn("verify client key", "err", err)
		}
		s.Close(protocol.CloseUnauthorized, "hello needs a valid client key")
		return false
	}
	s.log = s.log.With("user_id", key.UserID, "client_id", h.ClientID)
	s.Send(&protocol.Welcome{
		Protocol: protocol.ProtocolVersion, SessionID: s.id, UserID: key.UserID,
		HeartbeatS: int(s.srv.cfg.Heartbeat / time.Second), MaxMessageBytes: int64(s.srv.cfg.MaxMessageBytes),
	})
	// Among replicas, the client may have been held by another one until
	// now: it hands the client over, leases and all.
	floor, err := s.srv.adoptFromPeers(ctx, forgets, key.UserID, h.ClientID)
	if err == nil {
		s.att = s.srv.reg.Connect(registry.ClientInfo{
			UserID: key.UserID, ClientID: h.ClientID, Type: h.ClientType,
			Name: h.Name, Version: h.Version, Labels: h.Labels, KeyID: key.ID, SessionID: s.id,
			MaxContexts: maxContexts(h), EpochFloor: floor, Effects: h.Effects, Forgets: forgets,
		}, s)
		if s.att == nil {
			err = errForgotten
		}
	}
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return false // the session was closed meanwhile: a fence cut it
	case errors.Is(err, errForgotten):
		s.log.Info("cluster: this replica fenced while the client said hello", "err", err)
		s.Close(protocol.CloseGoingAway, fencedReason)
		return false
	default:
		s.log.Warn("cluster: could not read what the other replicas hold of this client", "err", err)
		s.Close(protocol.CloseGoingAway, "the broker cannot reach its database; connect again")
		return false
	}
	s.log.Info("client connected", "client_type", h.ClientType, "name", h.Name, "version", h.Version)
	return true
}

// maxContexts is how many contexts a client says it can hold (0: it
// opens none on request).
func maxContexts(h *protocol.Hello) int {
	if h.Capacity == nil {
		return 0
	}
	return h.Capacity.MaxContexts
}

// handle acts on one frame after hello.
func (s *session) handle(ctx context.Context, f protocol.Frame) bool {
	switch f := f.(type) {
	case *protocol.Hello:
		s.Close(protocol.CloseMalformed, "hello was already received")
		return false
	case *protocol.State:
		if n := len(f.Contexts); n > s.srv.cfg.MaxContextsPerClient {
			s.Send(&protocol.Error{Code: CodeTooManyContexts,
				Message: fmt.Sprintf("a client may report at most %d contexts; this report of %d was not applied", s.srv.cfg.MaxContextsPerClient, n)})
			return true
		}
		s.srv.reg.Report(s.att, f.Contexts)
		s.srv.console.Changed() // the registry emits no event for a state report
	case *protocol.Ping:
		s.Send(&protocol.Pong{})
	case *protocol.Pong:
	case *protocol.Error:
		if f.CommandID == "" {
			s.log.Info("client reported an error", "code", f.Code, "message", f.Message)
			return true
		}
		s.srv.reg.ClientMessage(ctx, s.att, f)
	case *protocol.Ack, *protocol.Progress, *protocol.Event, *protocol.Capture, *protocol.Result:
		s.srv.reg.ClientMessage(ctx, s.att, f)
	case *protocol.CreateFailed:
		s.srv.reg.CreateFailed(s.att, f)
	case *protocol.Hold:
		s.srv.reg.Hold(s.att, f.ContextID, time.Duration(f.TTLSeconds)*time.Second)
		s.srv.console.Changed()
	case *protocol.Unhold:
		s.srv.reg.Unhold(s.att, f.ContextID)
		s.srv.console.Changed()
	default:
		// A broker-to-client frame sent by a client: known to the protocol,
		// but not a thing a client says.
		s.Send(&protocol.Error{Code: protocol.CodeUnknownType, Message: "a client does not send " + string(f.FrameType())})
	}
	return true
}

// The server runs one heartbeat loop for all its sessions, while any
// session has said hello: every heartbeat interval it pings each one, from a
// short-lived goroutine, and closes with 4408 a session that has been
// silent, answering no ping, for three intervals. Each ping waits at most
// one interval for its pong.

// startBeating adds a session that said hello to the heartbeat loop,
// starting the loop if it is the first.
func (s *Server) startBeating(sess *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !sess.beating.CompareAndSwap(false, true) {
		return
	}
	s.beating++
	if s.beatStop == nil {
		s.beatStop = make(chan struct{})
		stop := s.beatStop
		// The session is tracked, so the wait group is above zero here.
		s.wg.Go(func() { s.heartbeatLoop(stop) })
	}
}

// stopBeating takes a session out of the heartbeat loop, and stops the loop
// with the last one.
func (s *Server) stopBeating(sess *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !sess.beating.CompareAndSwap(true, false) {
		return
	}
	s.beating--
	if s.beating == 0 && s.beatStop != nil {
		close(s.beatStop)
		s.beatStop = nil
	}
}

func (s *Server) heartbeatLoop(stop chan struct{}) {
	hb := s.cfg.Heartbeat
	t := s.clock.NewTicker(hb)
	defer t.Stop()
	var batch []*session
	for {
		select {
		case <-stop:
			return
		case <-t.Chan():
		}
		s.mu.Lock()
		for sess := range s.sessions {
			if sess.beating.Load() {
				batch = append(batch, sess)
			}
		}
		s.mu.Unlock()
		for _, sess := range batch {
			sess.beat(hb)
		}
		clear(batch)
		batch = batch[:0]
	}
}

// beat is one heartbeat of a session.
func (s *session) beat(hb time.Duration) {
	if s.srv.clock.Since(time.Unix(0, s.lastSeen.Load())) >= 3*hb {
		s.srv.stopBeating(s)
		s.Close(protocol.CloseTimeout, "no frame or pong for three heartbeats")
		// A silent peer may take the close handshake's whole timeout: its
		// contexts stop being live now, not when that ends.
		s.srv.reg.Disconnect(s.att)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead || s.ctx == nil {
		return
	}
	ctx := s.ctx
	s.goLocked(func() {
		pctx, cancel := context.WithTimeout(ctx, hb)
		defer cancel()
		if s.ws.Ping(pctx) == nil {
			s.lastSeen.Store(s.srv.clock.Now().UnixNano())
		}
	})
}
