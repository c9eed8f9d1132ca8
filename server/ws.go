package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/jonboulle/clockwork"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/server/auth"
)

// CodeTooManyContexts answers a state report over the per-client bound.
const CodeTooManyContexts protocol.ErrorCode = "too_many_contexts"

// session is one client WebSocket. Its reader runs in the handler's
// goroutine; a writer goroutine drains a bounded outbound queue, so the
// registry can hand it frames under its lock without ever blocking, and a
// client that does not read is cut off instead of slowing anyone else.
type session struct {
	srv  *Server
	ws   *websocket.Conn
	id   string
	log  *slog.Logger
	out  chan outItem
	done chan struct{} // closed when the writer has finished

	closeOnce sync.Once
	closing   chan struct{} // closed once a close is queued for the writer
	lastSeen  atomic.Int64  // unix nanoseconds of the last frame or pong
	att       *registry.Attachment
	// helloed is set once the session no longer counts among the
	// connections waiting to say hello (Server.pendingHellos).
	helloed atomic.Bool
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
// after writing the frame that explains it.
type outItem struct {
	frame   protocol.Frame
	notices *registry.Notices // assignment notices, taken when written
	close   *closeReq
}

type closeReq struct {
	code   protocol.CloseCode
	reason string
}

// Send queues f without blocking. When the queue is full the client is not
// reading: the connection is dropped and Send answers false.
func (s *session) Send(f protocol.Frame) bool { return s.enqueue(outItem{frame: f}) }

// Notify queues a batch of assignment notices (registry.NoticeConn): the
// writer takes its frames when it comes to it, so a context's changes
// decided meanwhile go out as one frame.
func (s *session) Notify(n *registry.Notices) bool { return s.enqueue(outItem{notices: n}) }

func (s *session) enqueue(item outItem) bool {
	select {
	case <-s.done:
		return false
	default:
	}
	select {
	case s.out <- item:
		return true
	default:
		// Said once per client, not once per refused frame.
		s.closeOnce.Do(func() {
			s.log.Warn("client does not read its frames; disconnecting", "queue", cap(s.out))
			go s.ws.CloseNow()
		})
		return false
	}
}

// Close sends an error frame saying why, then closes with code. It does not
// block.
func (s *session) Close(code protocol.CloseCode, reason string) {
	// Before the error frame is queued: a client that reads it finds the
	// place it held among those waiting to say hello given back.
	s.leavePending()
	s.closeOnce.Do(func() {
		item := outItem{
			frame: &protocol.Error{Code: code.ErrorCode(), Message: reason},
			close: &closeReq{code: code, reason: reason},
		}
		select {
		case s.out <- item:
			close(s.closing)
		default:
			// The queue is full, so no error frame can get through in time.
			go s.ws.CloseNow()
		}
	})
}

// handleClient serves GET /ws/v1/client. The caller has taken the
// connection's place among those waiting to say hello (admitHello); the
// session gives it back.
func (s *Server) handleClient(w http.ResponseWriter, r *http.Request) {
	sess := &session{
		srv: s, id: newID(), out: make(chan outItem, s.cfg.OutboundQueue),
		done: make(chan struct{}), closing: make(chan struct{}),
	}
	sess.log = s.log.With("session_id", sess.id)
	sess.lastSeen.Store(s.clock.Now().UnixNano())
	defer sess.leavePending()
	// The hello deadline runs from before the upgrade: once a client has
	// its 101, the timer that will close it is there (it queues the close
	// for the writer, which starts below).
	hello := s.clock.AfterFunc(s.cfg.HelloTimeout, func() {
		sess.Close(protocol.CloseTimeout, "no hello within "+s.cfg.HelloTimeout.String())
	})
	defer hello.Stop()
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		// The token travels in hello, never in a cookie, so a foreign origin
		// gains nothing from opening a socket; extensions connect from
		// chrome-extension:// origins.
		InsecureSkipVerify: true,
	})
	if err != nil {
		s.log.Debug("websocket accept", "err", err)
		return
	}
	// The broker enforces max_message_bytes itself, so that an oversized
	// frame is answered with 4413 and an error frame rather than the
	// library's own 1009.
	ws.SetReadLimit(-1)
	sess.ws = ws
	if !s.track(sess) {
		ws.Close(websocket.StatusGoingAway, "shutting down")
		return
	}
	defer s.untrack(sess)

	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	defer cancel()
	go sess.writeLoop(ctx)
	sess.readLoop(ctx, hello)
	select {
	case <-sess.closing:
		// The writer owes the client an error frame and a close frame; give
		// it the time a write may take before cutting the connection.
		t := s.clock.NewTimer(s.cfg.WriteTimeout + 5*time.Second)
		select {
		case <-sess.done:
		case <-t.Chan():
		}
		t.Stop()
	default:
	}
	cancel()
	<-sess.done
	if sess.att != nil {
		s.reg.Disconnect(sess.att)
	}
}

func (s *session) writeLoop(ctx context.Context) {
	defer close(s.done)
	defer s.ws.CloseNow()
	for {
		var item outItem
		select {
		case <-ctx.Done():
			return
		case item = <-s.out:
		}
		if item.notices != nil {
			for _, f := range item.notices.Take() {
				if !s.write(ctx, f) {
					return
				}
			}
		}
		if item.frame != nil && !s.write(ctx, item.frame) {
			return
		}
		if item.close != nil {
			// A close the broker decides is worth an operator's notice,
			// except a shutdown's, which is expected.
			level := slog.LevelInfo
			if item.close.code == protocol.CloseGoingAway {
				level = slog.LevelDebug
			}
			s.log.Log(ctx, level, "closing client", "code", int(item.close.code), "reason", item.close.reason)
			s.ws.Close(websocket.StatusCode(item.close.code), item.close.reason)
			return
		}
	}
}

// write writes one frame; false when the connection failed.
func (s *session) write(ctx context.Context, f protocol.Frame) bool {
	b, err := protocol.Encode(f)
	if err != nil {
		s.log.Error("encode frame", "err", err)
		return true
	}
	wctx, cancel := context.WithTimeout(ctx, s.srv.cfg.WriteTimeout)
	err = s.ws.Write(wctx, websocket.MessageText, b)
	cancel()
	if err != nil {
		s.log.Debug("write frame", "err", err)
		return false
	}
	s.srv.tel.frame(f.FrameType(), dirOut)
	return true
}

// readLoop reads frames until the connection ends. hello is the timer
// that closes a client that says no hello in time.
func (s *session) readLoop(ctx context.Context, hello clockwork.Timer) {
	max := int64(s.srv.cfg.MaxMessageBytes)
	limit := newLimiter(s.srv.cfg.FrameRateLimit)
	for {
		typ, rd, err := s.ws.Reader(ctx)
		if err != nil {
			s.logReadEnd(err)
			return
		}
		b, err := io.ReadAll(io.LimitReader(rd, max+1))
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
		var unknown *protocol.UnknownTypeError
		switch {
		case err == nil:
			s.srv.tel.frame(f.FrameType(), dirIn)
		case errors.As(err, &unknown):
			s.srv.tel.frame("unknown", dirIn)
			if s.att == nil {
				s.Close(protocol.CloseUnauthorized, "the first frame must be hello")
				return
			}
			s.Send(&protocol.Error{Code: protocol.CodeUnknownType, Message: err.Error()})
			continue
		case err != nil:
			if s.att == nil {
				if _, isHello := peekHello(b); !isHello {
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
			go s.heartbeat(ctx)
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
	select {
	case <-s.closing:
		s.log.Debug("client connection ended by the broker", "err", err)
		return
	default:
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

// hello authenticates the client and attaches it to the registry.
func (s *session) hello(ctx context.Context, h *protocol.Hello) bool {
	key, err := s.srv.keys.Verify(ctx, h.Token)
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
	s.att = s.srv.reg.Connect(registry.ClientInfo{
		UserID: key.UserID, ClientID: h.ClientID, Type: h.ClientType,
		Name: h.Name, Version: h.Version, Labels: h.Labels, KeyID: key.ID, SessionID: s.id,
	}, s)
	s.log.Info("client connected", "client_type", h.ClientType, "name", h.Name, "version", h.Version)
	return true
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
	default:
		// A broker-to-client frame sent by a client: known to the protocol,
		// but not a thing a client says.
		s.Send(&protocol.Error{Code: protocol.CodeUnknownType, Message: "a client does not send " + string(f.FrameType())})
	}
	return true
}

// heartbeat pings the client every heartbeat interval and closes it with
// 4408 once it has been silent, answering no ping, for three intervals.
// Each ping waits at most one interval for its pong.
func (s *session) heartbeat(ctx context.Context) {
	hb := s.srv.cfg.Heartbeat
	t := s.srv.clock.NewTicker(hb)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.Chan():
		}
		if s.srv.clock.Since(time.Unix(0, s.lastSeen.Load())) >= 3*hb {
			s.Close(protocol.CloseTimeout, "no frame or pong for three heartbeats")
			// A silent peer may take the close handshake's whole timeout:
			// its contexts stop being live now, not when that ends.
			s.srv.reg.Disconnect(s.att)
			return
		}
		go func() {
			pctx, cancel := context.WithTimeout(ctx, hb)
			defer cancel()
			if s.ws.Ping(pctx) == nil {
				s.lastSeen.Store(s.srv.clock.Now().UnixNano())
			}
		}()
	}
}
