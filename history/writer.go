package history

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"gorm.io/gorm"

	cheetah "github.com/cheetahbroker/cheetah"
)

// Op is one write. The writer applies the ops of many callers in one
// transaction.
type Op interface{ isOp() }

// InsertCommand stores a new command. Its status is admitted unless
// Rec.Status is set. Rec.Messages and Rec.Delivery are ignored: messages are
// appended with AppendMessage, and a delivery starts at zero attempts.
// CallbackKeyID names the API key whose webhook secret signs the delivery
// to CallbackURL; empty means the broker's own secret. A command inserted
// with a terminal status and a callback URL has its first delivery attempt
// due at once (at FinishedAt, or CreatedAt without one).
type InsertCommand struct {
	Rec           cheetah.CommandRecord
	CallbackURL   string
	CallbackKeyID string
}

// SetStatus moves a command forward. It applies only where the stored
// status ranks lower than the new one, so a command never goes back and the
// first terminal status wins; a SetStatus that does not apply, or names an
// unknown command, changes nothing and is not an error. It sets dispatched_at
// for dispatched, acked_at for acknowledged and finished_at for a terminal
// status (At, or now when zero), and the error when Error is set. A terminal
// status of a command with a callback URL also makes its first webhook
// delivery attempt due at that time, in the same transaction.
type SetStatus struct {
	CommandID string
	Status    cheetah.Status
	Error     *cheetah.ErrorInfo
	At        time.Time
}

// AppendMessage records one message about a command. Msg.Seq is ignored: the
// store numbers each command's messages 1, 2, 3… in the order they are
// enqueued. For a capture, Bytes holds the decoded bytes and Msg.Data must
// be empty; other kinds must leave Bytes nil. Msg.Late is stored as given
// (the broker knows whether the command had ended). A zero Msg.At means now.
// A message for an unknown command fails its request.
type AppendMessage struct {
	CommandID string
	Msg       cheetah.Message
	Bytes     []byte
}

// SetDelivery records the state of a command's webhook delivery. NextAt is
// when the next attempt is due; zero means none is (delivered or given up).
type SetDelivery struct {
	CommandID string
	Attempts  int
	Delivered bool
	LastError string
	NextAt    time.Time
}

func (InsertCommand) isOp() {}
func (SetStatus) isOp()     {}
func (AppendMessage) isOp() {}
func (SetDelivery) isOp()   {}

// request is what one Write or WriteAsync call enqueued. Its ops commit
// together, in one transaction, or not at all.
type request struct {
	ops  []Op
	done func(error)
	// keep marks a WriteAsync: when the database does not answer, its ops
	// are held and written again once it does, rather than dropped. A
	// Write's caller learns of the failure and decides for itself.
	keep bool
}

// Stats counts what the writer committed, for metrics and for tests that
// check that group commit groups.
type Stats struct {
	Batches int64 // transactions committed
	Ops     int64 // ops committed
	Retries int64 // batches that failed and were retried one request at a time
	// Overlapped counts the batches that took off while another was in
	// flight (PostgreSQL; see dispatch).
	Overlapped int64
	// Held is how many ops of WriteAsync calls wait for the database to
	// answer again; Recovered counts the held ops written since, and
	// Dropped those lost: beyond MaxHeldBytes, refused by the database
	// when written again, or still held when the store closed.
	Held, Recovered, Dropped int64
	// Checkpoints counts the SQLite checkpoints run beside the writer.
	Checkpoints int64
}

type stats struct{ batches, ops, retries, overlapped, held, recovered, dropped atomic.Int64 }

// writerInstruments are the writer's OpenTelemetry metrics: how long each
// transaction took and how many ops it held, by outcome (ok or error).
type writerInstruments struct {
	latency metric.Float64Histogram
	size    metric.Int64Histogram
	// ok and error are built once: a fresh variadic slice per Record would
	// allocate on every commit.
	ok, error []metric.RecordOption
	reg       metric.Registration
}

func (w *writerInstruments) init(mp metric.MeterProvider, st *stats) error {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	m := mp.Meter("github.com/cheetahbroker/cheetah/history")
	var err error
	w.latency, err = m.Float64Histogram("cheetah.history.write.duration", metric.WithUnit("s"),
		metric.WithDescription("Time one group-commit transaction of the history writer took, by outcome."),
		metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
	if err != nil {
		return err
	}
	w.size, err = m.Int64Histogram("cheetah.history.write.batch_size", metric.WithUnit("{op}"),
		metric.WithDescription("Ops in one group-commit transaction of the history writer, by outcome."),
		metric.WithExplicitBucketBoundaries(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096))
	if err != nil {
		return err
	}
	held, err := m.Int64ObservableGauge("cheetah.history.write.held", metric.WithUnit("{op}"),
		metric.WithDescription("Ops of asynchronous writes held while the database does not answer, to be written once it does."))
	if err != nil {
		return err
	}
	lost, err := m.Int64ObservableCounter("cheetah.history.write.dropped", metric.WithUnit("{op}"),
		metric.WithDescription("Ops of asynchronous writes given up: beyond the held bound, refused when written again, or held at close."))
	if err != nil {
		return err
	}
	w.reg, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(held, st.held.Load())
		o.ObserveInt64(lost, st.dropped.Load())
		return nil
	}, held, lost)
	if err != nil {
		return err
	}
	w.ok = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", "ok")))}
	w.error = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", "error")))}
	return nil
}

func (w *writerInstruments) record(d time.Duration, ops int, err error) {
	opts := w.ok
	if err != nil {
		opts = w.error
	}
	ctx := context.Background()
	w.latency.Record(ctx, d.Seconds(), opts...)
	w.size.Record(ctx, int64(ops), opts...)
}

// Stats returns the writer's counters since Open.
func (s *Store) Stats() Stats {
	return Stats{Batches: s.stats.batches.Load(), Ops: s.stats.ops.Load(), Retries: s.stats.retries.Load(), Overlapped: s.stats.overlapped.Load(),
		Held: s.stats.held.Load(), Recovered: s.stats.recovered.Load(), Dropped: s.stats.dropped.Load(),
		Checkpoints: s.checkpoints.count()}
}

// Health returns nil while the database answers the writer. From the first
// transaction that fails because the database does not answer until one
// commits again with nothing left held, it returns that failure (a
// store_unavailable error); after Close it returns ErrClosed. It costs an
// atomic load, so the broker asks it on every acquire: an acquire writes
// nothing, and without it a broker whose database is down would go on
// handing out leases that no send could use.
func (s *Store) Health() error {
	if d := s.down.Load(); d != nil {
		return d.err
	}
	return nil
}

// noteHealth records what the database's last answer says of its health;
// err is that answer's error. A refusal is an answer: the database is up.
// seen is s.marks as it was when the attempt began: an answer that began
// before someone else found the database away (markDown) is older news
// than theirs, and does not end the outage.
func (s *Store) noteHealth(err error, seen uint64) {
	switch {
	case unavailable(err):
		if s.down.Load() == nil {
			s.log.Warn("history: the database does not answer; asynchronous writes are held until it does", "error", err)
		}
		s.down.Store(&downState{err: err})
	case s.down.Load() != nil && len(s.held) == 0 && s.marks.Load() == seen:
		s.log.Info("history: the database answers again")
		s.down.Store(nil)
		// The outage is over; if it dropped writes with nothing held,
		// holding may start again.
		s.dropping = false
	}
}

type downState struct{ err error }

// markDown records, from outside the writer, that the database did not
// answer, and wakes the writer so that it starts probing.
func (s *Store) markDown(err error) {
	if !unavailable(err) {
		return
	}
	s.marks.Add(1)
	if s.down.CompareAndSwap(nil, &downState{err: err}) {
		s.log.Warn("history: the database does not answer", "error", err)
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// unavailable reports whether err means the database did not answer (and
// not that it refused an op, nor that the store is closed).
func unavailable(err error) bool {
	return errors.Is(err, cheetah.ErrStoreUnavailable) && !errors.Is(err, ErrClosed)
}

// Write enqueues ops and waits until the transaction holding them has
// committed or failed. The ops commit together or not at all, and after
// every earlier write of the same commands; Write with no ops, and any
// write of lease rows, after every earlier write. (On PostgreSQL the
// writes of other commands may commit beside them, in either order: see
// dispatch.) Write returns only once every write enqueued before it has
// committed or failed. ctx bounds only the wait: once enqueued, the ops are
// written even if ctx ends first.
func (s *Store) Write(ctx context.Context, ops ...Op) error {
	if err := validate(ops); err != nil {
		return err
	}
	res := make(chan error, 1)
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return cheetah.StoreUnavailable("history.Write", ErrClosed)
	}
	select {
	case s.queue <- request{ops: ops, done: func(err error) { res <- err }}:
		s.mu.RUnlock()
	case <-ctx.Done():
		s.mu.RUnlock()
		return fmt.Errorf("history.Write: %w", ctx.Err())
	}
	select {
	case err := <-res:
		return err
	case <-ctx.Done():
		return fmt.Errorf("history.Write: %w", ctx.Err())
	}
}

// WriteAsync enqueues ops and returns; it blocks only while the queue is
// full. done, if not nil, runs once the ops have committed or failed, on
// the writer goroutine or, on PostgreSQL, on the goroutine of the batch in
// flight that wrote them: the dones of one batch run one after the other,
// in enqueue order, and those of two batches in flight (which share no
// command) may run at the same time. When they failed because the database
// does not answer, done gets that error and the ops are held: they are
// written, in order and before anything enqueued after them, once the
// database answers again (up to MaxHeldBytes of them; Stats counts what was
// dropped). It must not block, and so must not call Write or
// WriteAsync: with the queue full, the writer would wait on itself. If the
// store is closed or an op is invalid, done runs on a goroutine of its own,
// so that a caller holding a lock that done takes cannot deadlock.
func (s *Store) WriteAsync(done func(error), ops ...Op) {
	if done == nil {
		done = func(error) {}
	}
	if err := validate(ops); err != nil {
		go done(err)
		return
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		go done(cheetah.StoreUnavailable("history.WriteAsync", ErrClosed))
		return
	}
	s.queue <- request{ops: ops, done: done, keep: true}
}

// validate refuses ops the writer could only fail on, before they can share
// a transaction with anyone.
func validate(ops []Op) error {
	for _, op := range ops {
		var id string
		switch o := op.(type) {
		case InsertCommand:
			id = o.Rec.CommandID
			if o.Rec.Status != "" && o.Rec.Status.Rank() < 0 {
				return cheetah.Invalidf("history: unknown status %q", o.Rec.Status)
			}
		case SetStatus:
			id = o.CommandID
			if o.Status.Rank() < 0 {
				return cheetah.Invalidf("history: unknown status %q", o.Status)
			}
		case AppendMessage:
			id = o.CommandID
			capture := o.Msg.Kind == cheetah.KindCapture
			if capture && len(o.Msg.Data) > 0 {
				return cheetah.Invalidf("history: a capture's bytes go in AppendMessage.Bytes, not Msg.Data")
			}
			if !capture && o.Bytes != nil {
				return cheetah.Invalidf("history: only a capture carries Bytes")
			}
		case SetDelivery:
			id = o.CommandID
		case PutLease, DeleteLease:
			continue // keyed by a digest, which cannot be empty
		default:
			return cheetah.Invalidf("history: unknown op %T", op)
		}
		if id == "" {
			return cheetah.Invalidf("history: %T without a command id", op)
		}
	}
	return nil
}

// Probing a database that stopped answering starts after probeMin and backs
// off to probeMax: recovery is noticed within half a second, and an outage
// costs a few connection attempts a second.
const (
	probeMin = 50 * time.Millisecond
	probeMax = 500 * time.Millisecond
)

// run is the writer goroutine. It takes whatever is queued, up to the batch
// size, commits it in one transaction, and repeats: while one commit is in
// flight the next batch accumulates, which is what makes group commit pay.
// On PostgreSQL two batches may be in flight at once (see dispatch); the
// next accumulates while both are.
// While the database does not answer it also probes it on a backoff, writing
// what is held, so that the store recovers without any caller's write. It
// returns when Close has closed the queue and everything queued is written.
func (s *Store) run() {
	defer close(s.stopped)
	var probe <-chan time.Time
	backoff := probeMin
	for {
		if s.down.Load() == nil {
			probe, backoff = nil, probeMin
		} else if probe == nil {
			probe = time.After(backoff)
			backoff = min(2*backoff, probeMax)
		}
		queue := s.queue
		if len(s.flying) == maxFlights {
			queue = nil // every flight is in the air: let the next batch grow
		}
		select {
		case first, ok := <-queue:
			if !ok {
				s.landAll()
				s.closeHeld()
				return
			}
			s.dispatch(s.fill(first))
		case f := <-s.landed:
			s.land(f)
		case <-probe:
			probe = nil
			s.landAll()
			s.probe()
		case <-s.wake:
		}
	}
}

// fill adds to first whatever else is queued, up to the batch size.
func (s *Store) fill(first request) []request {
	batch := []request{first}
	for n := len(first.ops); n < s.batch; {
		select {
		case r, ok := <-s.queue:
			if !ok {
				return batch
			}
			batch = append(batch, r)
			n += len(r.ops)
		default:
			return batch
		}
	}
	return batch
}

// commit writes a batch, after whatever an outage held. Nothing may overtake
// what is held: while that cannot be written, the batch fails with it.
func (s *Store) commit(batch []request) {
	err := s.drainHeld()
	n := 0
	if err == nil {
		seen := s.marks.Load()
		n, err = s.applyGroup(&s.plan, batch, s.finish)
		s.noteHealth(err, seen)
	}
	// Health says so before these callers hear store_unavailable.
	for _, r := range batch[n:] {
		s.finish(r, err)
	}
}

// applyGroup writes reqs in one transaction. If that fails for a reason of
// its ops' own, it writes each request alone, in order, so that one bad op
// (a duplicate id, a message for an unknown command) fails only its own
// request. each hears how every request went, in order, until the database
// is found not to answer: then applyGroup returns that error and how many
// requests each heard of; the rest are the caller's.
func (s *Store) applyGroup(p *writePlan, reqs []request, each func(request, error)) (int, error) {
	var ops []Op
	for _, r := range reqs {
		ops = append(ops, r.ops...)
	}
	err := s.apply(p, ops)
	if unavailable(err) {
		return 0, err
	}
	if err == nil || len(reqs) == 1 {
		for _, r := range reqs {
			each(r, err)
		}
		return len(reqs), nil
	}
	s.stats.retries.Add(1)
	s.log.Warn("history: group commit failed, retrying its requests one by one",
		"requests", len(reqs), "ops", len(ops), "error", err)
	for i, r := range reqs {
		err := s.apply(p, r.ops)
		if unavailable(err) {
			return i, err
		}
		each(r, err)
	}
	return len(reqs), nil
}

// finish tells a request's caller how it went, and holds the ops of a
// WriteAsync that failed because the database did not answer.
func (s *Store) finish(r request, err error) {
	if r.keep && unavailable(err) {
		s.hold(r)
	}
	r.done(err)
}

// hold keeps r's ops for drainHeld, unless that would pass MaxHeldBytes:
// then they are dropped, and counted, so that an outage costs bounded memory.
// Once one write is dropped, every later one is dropped too, however small,
// until the database answers again (the held queue has drained, or nothing
// was held and a write or probe went through): a small write kept after a
// large one dropped would leave a gap in the middle of a command's messages
// and number the rest around it. So what is written later stays a prefix of
// what was enqueued.
func (s *Store) hold(r request) {
	size := opsBytes(r.ops)
	if s.dropping || s.heldBytes+size > s.maxHeld {
		if !s.dropping {
			s.dropping = true
			s.log.Error("history: too much is held while the database does not answer; dropping asynchronous writes until it answers again",
				"held_ops", len(s.held), "held_bytes", s.heldBytes, "max_held_bytes", s.maxHeld)
		}
		s.stats.dropped.Add(int64(len(r.ops)))
		return
	}
	s.held = append(s.held, heldWrite{ops: r.ops, size: size})
	s.heldBytes += size
	s.stats.held.Add(int64(len(r.ops)))
}

// heldWrite is the ops of one WriteAsync held through an outage, and their
// estimated size.
type heldWrite struct {
	ops  []Op
	size int
}

// drainHeld writes what is held, oldest first, in transactions of up to a
// batch of ops each. It returns the database's error while it still does not
// answer. Held ops the database refuses on their own (a message whose
// command retention deleted meanwhile) are dropped with a warning; the rest
// still land. With nothing held it does nothing, and says nothing of the
// database's health: it has not asked.
func (s *Store) drainHeld() error {
	if len(s.held) == 0 {
		return nil
	}
	seen := s.marks.Load()
	for len(s.held) > 0 {
		n, size := 0, 0
		for n < len(s.held) && (n == 0 || size+len(s.held[n].ops) <= s.batch) {
			size += len(s.held[n].ops)
			n++
		}
		chunk := make([]request, n)
		for i, h := range s.held[:n] {
			chunk[i] = request{ops: h.ops}
		}
		done, err := s.applyGroup(&s.plan, chunk, func(r request, err error) {
			if err != nil {
				s.log.Warn("history: a write held through an outage was refused; dropping it", "ops", len(r.ops), "error", err)
				s.stats.dropped.Add(int64(len(r.ops)))
			} else {
				s.stats.recovered.Add(int64(len(r.ops)))
			}
		})
		s.release(done)
		if err != nil {
			s.noteHealth(err, seen)
			return err
		}
	}
	s.noteHealth(nil, seen)
	return nil
}

// release takes the n oldest held writes off the list, written or refused.
func (s *Store) release(n int) {
	for i := range n {
		s.heldBytes -= s.held[i].size
		s.stats.held.Add(-int64(len(s.held[i].ops)))
		s.held[i] = heldWrite{}
	}
	s.held = s.held[n:]
	if len(s.held) == 0 {
		s.held, s.heldBytes, s.dropping = nil, 0, false
	}
}

// probe checks a database that stopped answering: it writes what is held,
// or, with nothing held, runs an empty write transaction (on SQLite that
// takes the write lock, which is what another holder of it denies).
func (s *Store) probe() {
	if len(s.held) > 0 {
		_ = s.drainHeld()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	seen := s.marks.Load()
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error { return tx.Exec("SELECT 1").Error })
	s.noteHealth(fail("history.probe", err), seen)
}

// closeHeld makes a last attempt, at Close, to write what is held, and says
// what could not be: the next start marks those commands interrupted.
func (s *Store) closeHeld() {
	if len(s.held) == 0 {
		return
	}
	if err := s.drainHeld(); err != nil {
		ops := s.stats.held.Load()
		s.stats.dropped.Add(ops)
		s.stats.held.Add(-ops)
		s.log.Error("history: writes held through an outage were not written before close", "ops", ops, "error", err)
		s.held = nil
	}
}

// opsBytes estimates the memory the ops hold, for MaxHeldBytes: their
// variable parts plus a fixed overhead each.
func opsBytes(ops []Op) int {
	n := 0
	for _, op := range ops {
		n += 256
		switch o := op.(type) {
		case InsertCommand:
			n += len(o.Rec.Params) + len(o.Rec.Target) + len(o.Rec.Options) + len(o.CallbackURL)
		case SetStatus:
			if o.Error != nil {
				n += len(o.Error.Message) + len(o.Error.Data)
			}
		case AppendMessage:
			n += len(o.Msg.Data) + len(o.Msg.Message) + len(o.Bytes)
		case SetDelivery:
			n += len(o.LastError)
		}
	}
	return n
}

// apply runs ops in one transaction and returns the first error, wrapped
// with the failing op's name.
//
// Within the transaction, ops are grouped by kind rather than run one by one
// (see writePlan): all inserts, then the status changes folded to one per
// command, then all messages, then the delivery states. Nobody sees the
// transaction until it commits, so this gives the same result as running the
// ops in order: a command's insert precedes its status and messages, status
// changes keep their order (the first terminal wins), and messages keep
// their order (their seq). Each dialect has its own write path
// (applyPostgres, applySQLite); gorm is not on it.
func (s *Store) apply(p *writePlan, ops []Op) (err error) {
	start := time.Now()
	defer func() { s.inst.record(time.Since(start), len(ops), err) }()
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	p.plan(ops)
	defer p.reset()
	if s.dialect == DialectPostgres {
		err = s.applyPostgres(ctx, p)
	} else {
		err = s.applySQLite(ctx, p)
	}
	if err != nil {
		if !errors.Is(err, cheetah.ErrStoreUnavailable) && !errors.Is(err, cheetah.ErrInvalidRequest) && !isRefused(err) {
			// The commit itself failed, or BEGIN did: the database did not
			// answer.
			err = cheetah.StoreUnavailable("history.commit", err)
		}
		return err
	}
	s.stats.batches.Add(1)
	s.stats.ops.Add(int64(len(ops)))
	s.noteCommitTime(time.Since(start))
	return nil
}

// noteCommitTime adds one committed transaction's duration to the moving
// average CommitTime reports, weighing it an eighth: a load that changes
// shows within a few dozen commits, one slow commit barely. Flights in the
// air note theirs at once.
func (s *Store) noteCommitTime(d time.Duration) {
	for {
		old := s.commitTime.Load()
		avg := int64(d)
		if old != 0 {
			avg = old + (int64(d)-old)/8
		}
		if s.commitTime.CompareAndSwap(old, avg) {
			return
		}
	}
}

// CommitTime is how long the writer's recent transactions took to commit, a
// moving average; zero before the first. Under load it is also how long a
// write handed over now waits for the commit in flight, at most, before its
// own begins; the registry holds a waited command's record back that long
// for its terminal message (registry.Config.InsertDelay). It costs an atomic
// load.
func (s *Store) CommitTime() time.Duration { return time.Duration(s.commitTime.Load()) }
