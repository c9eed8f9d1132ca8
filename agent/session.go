package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/cheetahbroker/cheetah/internal/heldconn"
	"github.com/cheetahbroker/cheetah/protocol"
)

// writeTimeout bounds one frame write. A broker that does not take a frame
// in that time is stuck; the session then closes the connection and the
// agent reconnects.
const writeTimeout = 10 * time.Second

// handshakeReadLimit is the read limit until the welcome states the broker's
// own. The library's default of 32 KiB would be enough for a welcome, but a
// broker may put an error frame with a long message first.
const handshakeReadLimit = 1 << 20

// silentPings is how many ping intervals may pass without any frame from the
// broker before the agent takes the connection for dead. The broker answers
// every ping, so on a healthy connection frames never stop for that long.
const silentPings = 3

// Sentinel errors of Output and of sending in general.
var (
	// ErrNotConnected: the agent had no connection, so the message was
	// dropped. A command keeps running when the connection drops; what it
	// sends until the agent has reconnected is lost.
	ErrNotConnected = errors.New("agent: not connected; message dropped")
	// ErrTooLarge: the frame would exceed the broker's max_message_bytes, and
	// the broker closes connections that send such frames.
	ErrTooLarge = errors.New("frame larger than the broker's max_message_bytes")
	// ErrCommandDone: the handler already returned; its Output is closed.
	ErrCommandDone = errors.New("agent: command already finished")
)

// CloseError reports that the broker closed the connection with a status
// code. Run returns it for the codes after which a retry cannot succeed:
// 4401, 4403 and 4409.
type CloseError struct {
	Code   protocol.CloseCode // the WebSocket close status
	Reason string             // the reason of the close frame
	// ErrorCode and Message come from the error frame the broker sends
	// before it closes with a 44xx code, when it sent one.
	ErrorCode string
	Message   string
	err       error
}

func (e *CloseError) Error() string {
	msg := fmt.Sprintf("agent: broker closed the connection with %d", e.Code)
	if e.Reason != "" {
		msg += " (" + e.Reason + ")"
	}
	if e.ErrorCode != "" {
		msg += ": " + e.ErrorCode
		if e.Message != "" {
			msg += ": " + e.Message
		}
	}
	return msg
}

func (e *CloseError) Unwrap() error { return e.err }

// permanent reports whether reconnecting is pointless: the key is bad or
// revoked, an admin disconnected the client, or another connection with the
// same client id took over (reconnecting would only evict it in turn).
func (e *CloseError) permanent() bool {
	switch e.Code {
	case protocol.CloseUnauthorized, protocol.CloseForbidden, protocol.CloseReplaced:
		return true
	}
	return false
}

// session is one WebSocket connection to the broker.
type session struct {
	conn    *websocket.Conn
	held    *heldconn.Conn // conn's connection; nil when the dial reused one
	log     *slog.Logger
	welcome protocol.Welcome

	writeMu sync.Mutex // one frame at a time, in the order the writers got here
	wbuf    []byte     // the frame being written, under writeMu
	// stuck closes the connection once a write has taken writeTimeout. It
	// is armed around each write, under writeMu: a context with a deadline
	// per frame would cost a timer, a context and the library's watch of
	// that context on every frame.
	stuck        *time.Timer
	writeTimeout time.Duration // writeTimeout; shorter in tests
	rbuf         []byte        // the frame being read, by the reading goroutine only

	born     time.Time
	lastSeen atomic.Int64 // time since born of the last frame read, in ns
	silent   atomic.Bool  // the heartbeat gave up on the broker

	// lastError is the last error frame the broker sent, which before a
	// 44xx close says why. Only the reading goroutine touches it.
	lastError *protocol.Error
}

func dial(ctx context.Context, target string, hc *http.Client, log *slog.Logger) (*session, error) {
	var held atomic.Pointer[heldconn.Conn]
	conn, _, err := websocket.Dial(context.WithValue(ctx, heldSlot{}, &held), target, &websocket.DialOptions{HTTPClient: hc})
	if err != nil {
		return nil, fmt.Errorf("agent: dial %s: %w", target, err)
	}
	conn.SetReadLimit(handshakeReadLimit)
	s := &session{conn: conn, held: held.Load(), log: log, born: time.Now(), writeTimeout: writeTimeout}
	s.stuck = time.AfterFunc(writeTimeout, func() {
		if s.held != nil {
			_ = s.held.Conn.Close() // a TLS close would wait for a stuck flush
		}
		_ = conn.CloseNow()
	})
	s.stuck.Stop()
	s.touch()
	return s, nil
}

// handshake sends hello and waits for welcome.
func (s *session) handshake(ctx context.Context, hello *protocol.Hello) error {
	if err := s.write(ctx, hello); err != nil {
		return err
	}
	for {
		f, err := s.read(ctx)
		if err != nil {
			return s.readError("wait for welcome", err)
		}
		switch f := f.(type) {
		case nil: // a frame this agent does not understand
		case *protocol.Welcome:
			s.welcome = *f
			s.log = s.log.With("session_id", f.SessionID)
			s.conn.SetReadLimit(max(f.MaxMessageBytes, handshakeReadLimit))
			return nil
		case *protocol.Error:
			// The broker explains a refusal before it closes; keep reading
			// to get the close code.
			s.lastError = f
		default:
			return fmt.Errorf("agent: wait for welcome: the broker sent %s first", f.FrameType())
		}
	}
}

// serve reads frames and dispatches them to a until the connection ends. It
// returns only once every goroutine it started has stopped.
func (s *session) serve(ctx context.Context, a *Agent) error {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { s.closeWhenDone(ctx, done) })
	wg.Go(func() { s.heartbeat(a.cfg.PingInterval, done) })
	err := s.readLoop(ctx, a)
	close(done)
	wg.Wait()
	return err
}

// closeWhenDone closes the connection with a proper close handshake when the
// agent stops, so that the broker sees a normal closure instead of a drop.
func (s *session) closeWhenDone(ctx context.Context, done <-chan struct{}) {
	select {
	case <-ctx.Done():
		s.conn.Close(websocket.StatusNormalClosure, "agent stopping")
	case <-done:
	}
}

// heartbeat pings the broker, and drops the connection when the broker has
// been silent for too long: a broker that vanished without closing the TCP
// connection would otherwise leave the agent waiting forever.
func (s *session) heartbeat(every time.Duration, done <-chan struct{}) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		if quiet := s.quiet(); quiet > silentPings*every {
			s.log.Warn("agent: the broker is silent; dropping the connection", "silent_for", quiet)
			s.silent.Store(true)
			s.conn.CloseNow()
			return
		}
		if err := s.write(context.Background(), &protocol.Ping{}); err != nil {
			s.log.Debug("agent: ping failed", "err", err)
		}
	}
}

// readLoop runs for as long as the connection does. Reading is also what
// makes the WebSocket library answer the broker's pings, so a reader must
// always be running, whatever handlers are doing.
func (s *session) readLoop(ctx context.Context, a *Agent) error {
	for {
		// The read is not bound by ctx: closeWhenDone closes the connection
		// gracefully instead, and that ends the read.
		f, err := s.read(context.Background())
		if err != nil {
			return s.readError("read", err)
		}
		switch f := f.(type) {
		case nil:
		case *protocol.Command:
			a.onCommand(ctx, s, f)
		case *protocol.Cancel:
			a.onCancel(f)
		case *protocol.CreateContext:
			a.onCreate(s, f)
		case *protocol.HoldStateFrame:
			a.onHoldState(s, f)
		case *protocol.Assignment:
			// One comes with every acquire and release: box its attributes
			// only when they are logged.
			if s.log.Enabled(ctx, slog.LevelDebug) {
				s.log.Debug("agent: assignment", "context_id", f.ContextID, "task_id", f.TaskID,
					"epoch", f.Epoch, "state", f.State)
			}
		case *protocol.Error:
			s.lastError = f
			level := slog.LevelWarn
			if f.Code == protocol.CloseGoingAway.ErrorCode() {
				level = slog.LevelDebug // the broker is stopping: expected
			}
			s.log.Log(context.Background(), level, "agent: the broker reported an error", "code", f.Code,
				"message", f.Message, "command_id", f.CommandID)
		case *protocol.Pong:
		default:
			s.log.Debug("agent: ignoring an unexpected frame", "type", f.FrameType())
		}
	}
}

// read returns the next frame, or nil for a frame this agent cannot use (an
// unknown type, a binary message, a malformed frame), which it logs: an
// unknown type is how a newer broker probes for features, and dropping the
// connection over one bad frame would lose every command in flight with it.
func (s *session) read(ctx context.Context) (protocol.Frame, error) {
	typ, r, err := s.conn.Reader(ctx)
	if err != nil {
		return nil, err
	}
	// One buffer serves every frame: no decoded frame refers to it.
	b, err := protocol.ReadMessage(r, s.rbuf[:0], math.MaxInt64) // the library enforces the read limit
	s.rbuf = protocol.KeepBuffer(b)
	if err != nil {
		return nil, err
	}
	s.touch()
	if typ != websocket.MessageText {
		s.log.Warn("agent: ignoring a binary message")
		return nil, nil
	}
	f, err := protocol.Decode(b)
	if err != nil {
		s.log.Warn("agent: ignoring a frame from the broker", "err", err)
		return nil, nil
	}
	return f, nil
}

func (s *session) touch() { s.lastSeen.Store(int64(time.Since(s.born))) }

func (s *session) quiet() time.Duration {
	return time.Since(s.born) - time.Duration(s.lastSeen.Load())
}

// readError explains why reading stopped. A close status from the broker
// becomes a *CloseError, which tells Run whether to reconnect.
func (s *session) readError(op string, err error) error {
	var ce websocket.CloseError
	if errors.As(err, &ce) {
		e := &CloseError{Code: protocol.CloseCode(ce.Code), Reason: ce.Reason, err: err}
		if s.lastError != nil {
			e.ErrorCode, e.Message = string(s.lastError.Code), s.lastError.Message
		}
		return e
	}
	if s.silent.Load() {
		return fmt.Errorf("agent: %s: the broker was silent for too long: %w", op, err)
	}
	return fmt.Errorf("agent: %s: %w", op, err)
}

// write sends frames, in order, in one write of the connection when there
// are several. It stops at the first that fails; it refuses, with
// ErrTooLarge, a frame larger than the broker accepts, since the broker
// would close the connection over it.
func (s *session) write(ctx context.Context, frames ...protocol.Frame) error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.stuck.Reset(s.writeTimeout)
	defer s.stuck.Stop()
	if len(frames) > 1 && s.held != nil {
		s.held.Hold()
	}
	var err error
	for _, f := range frames {
		if err = s.writeFrame(ctx, f); err != nil {
			break
		}
	}
	if len(frames) > 1 && s.held != nil {
		if ferr := s.held.Flush(); err == nil && ferr != nil {
			err = fmt.Errorf("agent: send %s: %w", frames[len(frames)-1].FrameType(), ferr)
		}
	}
	return err
}

// writeFrame writes f; s.writeMu is held.
func (s *session) writeFrame(ctx context.Context, f protocol.Frame) error {
	// One buffer serves every frame: the library has copied a frame out by
	// the time Write returns.
	b, err := protocol.Append(s.wbuf[:0], f)
	if err != nil {
		return fmt.Errorf("agent: encode %s: %w", f.FrameType(), err)
	}
	s.wbuf = protocol.KeepBuffer(b)
	if limit := s.welcome.MaxMessageBytes; limit > 0 && int64(len(b)) > limit {
		return fmt.Errorf("agent: send %s of %d bytes (limit %d): %w",
			f.FrameType(), len(b), limit, ErrTooLarge)
	}
	if err := s.conn.Write(ctx, websocket.MessageText, b); err != nil {
		return fmt.Errorf("agent: send %s: %w", f.FrameType(), err)
	}
	return nil
}
