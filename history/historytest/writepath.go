package historytest

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/history"
)

// The writer folds a batch's status changes per command and writes each kind
// of op set-wise; these tests hold it to what running the ops one by one
// gives.

var allStatuses = []cheetah.Status{
	cheetah.StatusAdmitted, cheetah.StatusDispatched, cheetah.StatusAcknowledged,
	cheetah.StatusCompleted, cheetah.StatusFailed, cheetah.StatusTimedOut,
	cheetah.StatusDisconnected, cheetah.StatusCancelled, cheetah.StatusInterrupted,
}

// deliveryDue reads the column the webhook worker polls, which Get does not
// show.
func deliveryDue(t *testing.T, ctx context.Context, s *history.Store, db *sql.DB, id string) *time.Time {
	t.Helper()
	var due *time.Time
	require.NoError(t, db.QueryRowContext(ctx, Q(s, "SELECT delivery_next_at FROM commands WHERE command_id = ?"), id).Scan(&due))
	if due != nil {
		u := due.UTC()
		due = &u
	}
	return due
}

// testStatusFoldCases: several status changes of one command in one batch,
// against what is stored and against each other.
func testStatusFoldCases(t *testing.T, ctx context.Context, s *history.Store) {
	db := DB(t, s)
	t0 := time.Now().Add(-time.Hour)
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
	st := func(id string, status cheetah.Status, i int, e *cheetah.ErrorInfo) history.SetStatus {
		return history.SetStatus{CommandID: id, Status: status, At: at(i), Error: e}
	}
	fresh, acked, done, backwards, errKept, errLost, hooked, codeless :=
		newCommand("usr_1111", "t"), newCommand("usr_1111", "t"), newCommand("usr_1111", "t"), newCommand("usr_1111", "t"),
		newCommand("usr_1111", "t"), newCommand("usr_1111", "t"), newCommand("usr_1111", "t"), newCommand("usr_1111", "t")
	insert(t, ctx, s, acked, done, errLost)
	require.NoError(t, s.Write(ctx,
		st(acked.CommandID, cheetah.StatusDispatched, 1, nil),
		st(acked.CommandID, cheetah.StatusAcknowledged, 2, nil),
		st(done.CommandID, cheetah.StatusCompleted, 3, nil),
		st(errLost.CommandID, cheetah.StatusDispatched, 4, nil),
	))

	// One batch, several commands, each with several changes, interleaved.
	require.NoError(t, s.Write(ctx,
		history.InsertCommand{Rec: fresh},
		history.InsertCommand{Rec: backwards},
		history.InsertCommand{Rec: errKept},
		history.InsertCommand{Rec: hooked, CallbackURL: "https://hooks.example.com/x"},
		history.InsertCommand{Rec: codeless},
		// fresh: every rank in turn, each sets its own time.
		st(fresh.CommandID, cheetah.StatusDispatched, 10, nil),
		// acked (stored acknowledged at 2): lower ranks ignored, the first
		// terminal wins with its error, the second is ignored.
		st(acked.CommandID, cheetah.StatusDispatched, 11, nil),
		st(fresh.CommandID, cheetah.StatusAcknowledged, 12, nil),
		st(acked.CommandID, cheetah.StatusAcknowledged, 13, nil),
		st(acked.CommandID, cheetah.StatusFailed, 14, &cheetah.ErrorInfo{Code: "boom", Message: "first", Data: json.RawMessage(`{"a": 1}`)}),
		st(fresh.CommandID, cheetah.StatusCompleted, 15, nil),
		st(acked.CommandID, cheetah.StatusCompleted, 16, &cheetah.ErrorInfo{Code: "late"}),
		// done (stored completed): nothing applies, not even an error.
		st(done.CommandID, cheetah.StatusDispatched, 17, nil),
		st(done.CommandID, cheetah.StatusFailed, 18, &cheetah.ErrorInfo{Code: "late"}),
		// backwards: terminal first; what follows it in the batch is lower
		// and never applies.
		st(backwards.CommandID, cheetah.StatusCancelled, 19, nil),
		st(backwards.CommandID, cheetah.StatusDispatched, 20, nil),
		st(backwards.CommandID, cheetah.StatusAcknowledged, 21, &cheetah.ErrorInfo{Code: "nope"}),
		// errKept: an error set by an applied lower rank stays when a
		// higher rank without one follows.
		st(errKept.CommandID, cheetah.StatusDispatched, 22, &cheetah.ErrorInfo{Code: "slow", Message: "retrying"}),
		st(errKept.CommandID, cheetah.StatusAcknowledged, 23, nil),
		// errLost (stored dispatched at 4): a dispatched with an error does
		// not apply, so neither does its error.
		st(errLost.CommandID, cheetah.StatusDispatched, 24, &cheetah.ErrorInfo{Code: "ignored"}),
		st(errLost.CommandID, cheetah.StatusAcknowledged, 25, nil),
		// hooked: its terminal status makes its delivery due then.
		st(hooked.CommandID, cheetah.StatusDispatched, 26, nil),
		st(hooked.CommandID, cheetah.StatusTimedOut, 27, &cheetah.ErrorInfo{Code: "timed_out", Message: "no answer in 20s"}),
		// codeless: an error with no code still is an error.
		st(codeless.CommandID, cheetah.StatusAdmitted, 28, nil),
		st(codeless.CommandID, cheetah.StatusFailed, 29, &cheetah.ErrorInfo{Message: "só isto ✓"}),
	))

	got := get(t, ctx, s, fresh)
	require.Equal(t, cheetah.StatusCompleted, got.Status)
	require.Equal(t, micro(at(10)), *got.DispatchedAt)
	require.Equal(t, micro(at(12)), *got.AckedAt)
	require.Equal(t, micro(at(15)), *got.FinishedAt)
	require.Nil(t, got.Error)
	require.Nil(t, deliveryDue(t, ctx, s, db, fresh.CommandID), "no callback, no delivery")

	got = get(t, ctx, s, acked)
	require.Equal(t, cheetah.StatusFailed, got.Status)
	require.Equal(t, micro(at(1)), *got.DispatchedAt)
	require.Equal(t, micro(at(2)), *got.AckedAt)
	require.Equal(t, micro(at(14)), *got.FinishedAt)
	require.Equal(t, &cheetah.ErrorInfo{Code: "boom", Message: "first", Data: json.RawMessage(`{"a": 1}`)}, got.Error)

	got = get(t, ctx, s, done)
	require.Equal(t, cheetah.StatusCompleted, got.Status)
	require.Nil(t, got.DispatchedAt)
	require.Equal(t, micro(at(3)), *got.FinishedAt)
	require.Nil(t, got.Error)

	got = get(t, ctx, s, backwards)
	require.Equal(t, cheetah.StatusCancelled, got.Status)
	require.Nil(t, got.DispatchedAt)
	require.Nil(t, got.AckedAt)
	require.Equal(t, micro(at(19)), *got.FinishedAt)
	require.Nil(t, got.Error)

	got = get(t, ctx, s, errKept)
	require.Equal(t, cheetah.StatusAcknowledged, got.Status)
	require.Equal(t, micro(at(22)), *got.DispatchedAt)
	require.Equal(t, micro(at(23)), *got.AckedAt)
	require.Nil(t, got.FinishedAt)
	require.Equal(t, &cheetah.ErrorInfo{Code: "slow", Message: "retrying"}, got.Error)

	got = get(t, ctx, s, errLost)
	require.Equal(t, cheetah.StatusAcknowledged, got.Status)
	require.Equal(t, micro(at(4)), *got.DispatchedAt)
	require.Equal(t, micro(at(25)), *got.AckedAt)
	require.Nil(t, got.Error)

	got = get(t, ctx, s, hooked)
	require.Equal(t, cheetah.StatusTimedOut, got.Status)
	require.Equal(t, micro(at(26)), *got.DispatchedAt)
	require.Equal(t, micro(at(27)), *got.FinishedAt)
	require.Equal(t, &cheetah.ErrorInfo{Code: "timed_out", Message: "no answer in 20s"}, got.Error)
	require.Equal(t, ptr(micro(at(27))), deliveryDue(t, ctx, s, db, hooked.CommandID))

	got = get(t, ctx, s, codeless)
	require.Equal(t, cheetah.StatusFailed, got.Status)
	require.Equal(t, &cheetah.ErrorInfo{Message: "só isto ✓"}, got.Error)
}

// testStatusFoldMatchesOneByOne runs random sequences of status changes on
// commands in the same state: one gets each sequence in one batch, another
// one op per transaction, and a third is inserted by the batch that brings
// its prior state and the sequence (folded into the row it inserts). All
// must end the same.
func testStatusFoldMatchesOneByOne(t *testing.T, ctx context.Context, s *history.Store) {
	db := DB(t, s)
	rng := rand.New(rand.NewPCG(7, 11))
	t0 := time.Now().Add(-time.Hour)
	const cases = 300
	type trio struct{ batched, single, inserted cheetah.CommandRecord }
	trios := make([]trio, cases)
	var setup, priors, batch []history.Op
	singles := make([][]history.Op, cases)
	for c := range trios {
		p := trio{newCommand("usr_1111", "t"), newCommand("usr_1111", "t"), newCommand("usr_1111", "t")}
		p.single.CreatedAt, p.inserted.CreatedAt = p.batched.CreatedAt, p.batched.CreatedAt
		url := ""
		if c%2 == 0 {
			url = "https://hooks.example.com/" + fmt.Sprint(c)
		}
		setup = append(setup, history.InsertCommand{Rec: p.batched, CallbackURL: url}, history.InsertCommand{Rec: p.single, CallbackURL: url})
		// A stored state to start from, the same for all three. The third
		// is inserted in it where a record can say it (as the registry
		// inserts a command already dispatched), or given it by the batch.
		prior := allStatuses[rng.IntN(len(allStatuses))]
		at := t0.Add(time.Duration(rng.IntN(1000)) * time.Millisecond)
		var priorOp []history.Op
		switch {
		case prior == cheetah.StatusAdmitted:
		case prior == cheetah.StatusDispatched && c%3 != 0:
			p.inserted.Status, p.inserted.DispatchedAt = prior, &at
		case prior == cheetah.StatusAcknowledged && c%3 != 0:
			p.inserted.Status, p.inserted.AckedAt = prior, &at
		default:
			priorOp = []history.Op{history.SetStatus{CommandID: p.inserted.CommandID, Status: prior, At: at}}
		}
		if prior != cheetah.StatusAdmitted {
			priors = append(priors,
				history.SetStatus{CommandID: p.batched.CommandID, Status: prior, At: at},
				history.SetStatus{CommandID: p.single.CommandID, Status: prior, At: at})
		}
		batch = append(append(batch, history.InsertCommand{Rec: p.inserted, CallbackURL: url}), priorOp...)
		trios[c] = p
		for range 1 + rng.IntN(6) {
			op := history.SetStatus{
				Status: allStatuses[rng.IntN(len(allStatuses))],
				At:     t0.Add(time.Duration(1000+rng.IntN(100000)) * time.Millisecond),
			}
			if rng.IntN(3) == 0 {
				op.Error = &cheetah.ErrorInfo{Code: fmt.Sprintf("e%d", rng.IntN(100)), Message: "m", Data: json.RawMessage(`[1, 2]`)}
			}
			b, one, ins := op, op, op
			b.CommandID, one.CommandID, ins.CommandID = p.batched.CommandID, p.single.CommandID, p.inserted.CommandID
			batch = append(batch, b, ins)
			singles[c] = append(singles[c], one)
		}
	}
	// Inserted, then given their prior state by an update of the stored row.
	require.NoError(t, s.Write(ctx, setup...))
	require.NoError(t, s.Write(ctx, priors...))
	// The batched ops of all commands shuffled together: each command's
	// keep their order.
	shuffled := make([]history.Op, 0, len(batch))
	next := make(map[string]int)
	byCmd := make(map[string][]history.Op)
	var order []string
	for _, op := range batch {
		var id string
		switch o := op.(type) {
		case history.SetStatus:
			id = o.CommandID
		case history.InsertCommand:
			id = o.Rec.CommandID
		}
		if _, ok := byCmd[id]; !ok {
			order = append(order, id)
		}
		byCmd[id] = append(byCmd[id], op)
	}
	for len(shuffled) < len(batch) {
		id := order[rng.IntN(len(order))]
		if i := next[id]; i < len(byCmd[id]) {
			shuffled = append(shuffled, byCmd[id][i])
			next[id] = i + 1
		}
	}
	require.NoError(t, s.Write(ctx, shuffled...))
	for _, ops := range singles {
		for _, op := range ops {
			require.NoError(t, s.Write(ctx, op))
		}
	}
	for c, p := range trios {
		b, one, ins := get(t, ctx, s, p.batched), get(t, ctx, s, p.single), get(t, ctx, s, p.inserted)
		b.CommandID, one.CommandID, ins.CommandID = "", "", ""
		require.Equal(t, one, b, "case %d: %+v", c, singles[c])
		require.Equal(t, one, ins, "case %d, inserted by the batch: %+v", c, singles[c])
		due := deliveryDue(t, ctx, s, db, p.single.CommandID)
		require.Equal(t, due, deliveryDue(t, ctx, s, db, p.batched.CommandID), "case %d", c)
		require.Equal(t, due, deliveryDue(t, ctx, s, db, p.inserted.CommandID), "case %d, inserted by the batch", c)
	}
}

// richCommand is a command with every field the store keeps set, its JSON
// in odd spacing and key order, and its text in many scripts.
func richCommand(i int, bigJSON string) cheetah.CommandRecord {
	rec := newCommand("usr_ü"+fmt.Sprint(i%3), "tâche-"+fmt.Sprint(i%5))
	rec.ClientID = "ext-日本-" + fmt.Sprint(i)
	rec.ContextID = "tab-🦊-" + fmt.Sprint(i)
	rec.Name = "navigate/ناوبری"
	rec.Params = json.RawMessage(fmt.Sprintf(`{"url":"https://example.com/%d" ,  "q":"café ☕ \u00e9 \ud83d\ude00","z":[ 1,2 , {"ÿ":null}]}`, i))
	rec.Target = json.RawMessage(`{ "tab_id" : "12", "שלום": "עולם" }`)
	rec.Options = json.RawMessage(`{"timeout_ms":   20000}`)
	rec.TraceID = fmt.Sprintf("%032x", i)
	rec.CreatedAt = time.Date(2025, 3, 4, 5, 6, 7, 123456789+i*1000, time.FixedZone("CET", 3600))
	if bigJSON != "" {
		rec.Params = json.RawMessage(bigJSON)
	}
	return rec
}

// bigJSON is about n bytes of JSON with text in many scripts, spacing that
// a re-encoder would drop and keys out of order.
func bigJSON(n int) string {
	var b strings.Builder
	b.WriteString(`{"z": true,  "items" : [`)
	for i := 0; b.Len() < n; i++ {
		if i > 0 {
			b.WriteString(" ,\n\t")
		}
		fmt.Fprintf(&b, `{"n":%d, "s":"Ωμέγα ∑ 漢字 🚀 \"q\" \\ \u00e9", "a":[1.50, -0, 1e3]}`, i)
	}
	b.WriteString(`], "a": {} }`)
	return b.String()
}

// testUnicodeAndLargeJSON: text in many scripts (without NUL, which
// PostgreSQL text cannot hold) and a large JSON document come back exactly,
// in a command, its error and its messages.
func testUnicodeAndLargeJSON(t *testing.T, ctx context.Context, s *history.Store) {
	big := bigJSON(2 << 20)
	require.True(t, json.Valid([]byte(big)))
	rec := richCommand(1, big)
	msgAt := time.Now()
	e := &cheetah.ErrorInfo{Code: "failed_🔥", Message: "Ошибка: ничего не вышло — 失败", Data: json.RawMessage(big)}
	require.NoError(t, s.Write(ctx,
		history.InsertCommand{Rec: rec, CallbackURL: "https://hooks.example.com/ü?x=ß", CallbackKeyID: "key_é"},
		history.AppendMessage{CommandID: rec.CommandID, Msg: cheetah.Message{Kind: cheetah.KindEvent, Name: "console·log",
			Data: json.RawMessage(`{"text":"नमस्ते दुनिया", "emoji":"👩‍👩‍👧‍👦"}`), At: msgAt}},
		history.AppendMessage{CommandID: rec.CommandID, Msg: cheetah.Message{Kind: cheetah.KindResult, Data: json.RawMessage(big), At: msgAt}},
		history.AppendMessage{CommandID: rec.CommandID, Msg: cheetah.Message{Kind: cheetah.KindError, Code: "érreur", Message: "😱 \u202ertl\u202c", At: msgAt}},
		history.SetStatus{CommandID: rec.CommandID, Status: cheetah.StatusFailed, At: msgAt, Error: e},
	))
	got := get(t, ctx, s, rec)
	want := rec
	want.Status = cheetah.StatusFailed
	want.CreatedAt = micro(rec.CreatedAt)
	want.FinishedAt = ptr(micro(msgAt))
	want.Error = e
	want.Delivery = &cheetah.Delivery{URL: "https://hooks.example.com/ü?x=ß"}
	want.Messages = []cheetah.Message{
		{Seq: 1, Kind: cheetah.KindEvent, Name: "console·log", Data: json.RawMessage(`{"text":"नमस्ते दुनिया", "emoji":"👩‍👩‍👧‍👦"}`), At: micro(msgAt)},
		{Seq: 2, Kind: cheetah.KindResult, Data: json.RawMessage(big), At: micro(msgAt)},
		{Seq: 3, Kind: cheetah.KindError, Code: "érreur", Message: "😱 \u202ertl\u202c", At: micro(msgAt)},
	}
	require.Equal(t, want, got)
	require.True(t, string(got.Params) == big && string(got.Messages[1].Data) == big && string(got.Error.Data) == big)
}

// testCopyBatch writes one batch with more new commands than any
// threshold for a bulk insert path (COPY on PostgreSQL), with their
// statuses and messages: every field comes back as written, and a
// duplicate among them fails the whole request, as a refusal.
func testCopyBatch(t *testing.T, ctx context.Context, s *history.Store) {
	db := DB(t, s)
	const n = 1200
	big := bigJSON(64 << 10)
	recs := make([]cheetah.CommandRecord, n)
	ops := make([]history.Op, 0, 4*n)
	at := time.Date(2025, 6, 7, 8, 9, 10, 987654321, time.UTC)
	for i := range recs {
		b := ""
		if i == n/2 {
			b = big
		}
		rec := richCommand(i, b)
		url, key := "", ""
		switch i % 4 {
		case 1:
			url = fmt.Sprintf("https://hooks.example.com/%d", i)
		case 2:
			url, key = fmt.Sprintf("https://hooks.example.com/%d", i), "key_"+fmt.Sprint(i)
		case 3:
			// Inserted already ended, with an error and its times.
			rec.Status = cheetah.StatusInterrupted
			rec.DispatchedAt = ptr(at.Add(-2 * time.Second))
			rec.AckedAt = ptr(at.Add(-time.Second))
			rec.FinishedAt = ptr(at)
			rec.Error = &cheetah.ErrorInfo{Code: "interrupted", Message: "le broker s'est arrêté", Data: json.RawMessage(`{"epoch": 17}`)}
			url = fmt.Sprintf("https://hooks.example.com/%d", i)
		}
		recs[i] = rec
		ops = append(ops, history.InsertCommand{Rec: rec, CallbackURL: url, CallbackKeyID: key})
	}
	for i, rec := range recs {
		ops = append(ops,
			history.SetStatus{CommandID: rec.CommandID, Status: cheetah.StatusDispatched, At: at.Add(time.Duration(i) * time.Millisecond)},
			progress(rec.CommandID, 0), progress(rec.CommandID, 1))
	}
	require.NoError(t, s.Write(ctx, ops...))
	for i, rec := range recs {
		want := rec
		if want.Status == "" {
			want.Status = cheetah.StatusDispatched
			want.DispatchedAt = ptr(micro(at.Add(time.Duration(i) * time.Millisecond)))
		}
		want.CreatedAt = micro(rec.CreatedAt)
		if i%4 == 3 {
			want.DispatchedAt, want.AckedAt, want.FinishedAt = ptr(micro(*rec.DispatchedAt)), ptr(micro(*rec.AckedAt)), ptr(micro(at))
		}
		if url := ops[i].(history.InsertCommand).CallbackURL; url != "" {
			want.Delivery = &cheetah.Delivery{URL: url}
		}
		got := get(t, ctx, s, rec)
		msgs := got.Messages
		got.Messages = nil
		require.Equal(t, want, got, "command %d", i)
		requireSeqInOrder(t, msgs, 2)
		if i%4 == 3 {
			require.Equal(t, ptr(at.Truncate(time.Microsecond)), deliveryDue(t, ctx, s, db, rec.CommandID), "command %d", i)
		} else {
			require.Nil(t, deliveryDue(t, ctx, s, db, rec.CommandID), "command %d", i)
		}
	}

	// A duplicate among many new commands fails its request as a refusal,
	// and nothing of that request is written.
	dup := make([]history.Op, 0, n)
	fresh := make([]cheetah.CommandRecord, n-1)
	for i := range fresh {
		fresh[i] = richCommand(i, "")
		dup = append(dup, history.InsertCommand{Rec: fresh[i]})
	}
	dup = append(dup, history.InsertCommand{Rec: recs[7]})
	err := s.Write(ctx, dup...)
	require.Error(t, err)
	require.NotErrorIs(t, err, cheetah.ErrStoreUnavailable)
	require.Contains(t, err.Error(), "history.InsertCommand")
	_, err = s.Get(ctx, fresh[0].UserID, fresh[0].CommandID)
	require.ErrorIs(t, err, cheetah.ErrNotFound)
}

// testInterleavedMessages: messages of several commands, interleaved in one
// batch and across batches, some after messages already stored, are
// numbered per command in enqueue order.
func testInterleavedMessages(t *testing.T, ctx context.Context, s *history.Store) {
	const cmds, per = 7, 5
	recs := make([]cheetah.CommandRecord, cmds)
	for i := range recs {
		recs[i] = newCommand("usr_1111", "t")
	}
	insert(t, ctx, s, recs[:3]...)
	// Some commands have messages stored already.
	require.NoError(t, s.Write(ctx, progress(recs[0].CommandID, 0), progress(recs[1].CommandID, 0), progress(recs[0].CommandID, 1)))
	count := map[string]int{recs[0].CommandID: 2, recs[1].CommandID: 1}
	// One batch: the other commands' inserts, then messages round-robin in
	// a shuffled order of commands, with status changes between them.
	rng := rand.New(rand.NewPCG(3, 5))
	var ops []history.Op
	for _, r := range recs[3:] {
		ops = append(ops, history.InsertCommand{Rec: r})
	}
	for round := range per {
		for _, i := range rng.Perm(cmds) {
			id := recs[i].CommandID
			ops = append(ops, progress(id, count[id]))
			count[id]++
			if round == 2 {
				ops = append(ops, history.SetStatus{CommandID: id, Status: cheetah.StatusAcknowledged})
			}
		}
	}
	require.NoError(t, s.Write(ctx, ops...))
	// And once more, in a batch of its own.
	ops = ops[:0]
	for _, i := range rng.Perm(cmds) {
		id := recs[i].CommandID
		ops = append(ops, progress(id, count[id]))
		count[id]++
	}
	require.NoError(t, s.Write(ctx, ops...))
	for _, r := range recs {
		got := get(t, ctx, s, r)
		requireSeqInOrder(t, got.Messages, count[r.CommandID])
		require.Equal(t, cheetah.StatusAcknowledged, got.Status)
	}
}

// testRefusedInSharedBatch: requests that share a batch, with their status
// changes folded together, and one of them refused: only that one fails,
// and its status changes are not applied, while the others' are.
func testRefusedInSharedBatch(t *testing.T, ctx context.Context, s *history.Store) {
	for round := range 5 {
		a := newCommand("usr_1111", "t")
		// A large write first keeps the writer busy so that the small
		// ones queue up behind it and share a batch.
		var filler []history.Op
		for range 400 {
			r := newCommand("usr_1111", "filler")
			filler = append(filler, history.InsertCommand{Rec: r}, progress(r.CommandID, 0))
		}
		type outcome struct {
			i   int
			err error
		}
		results := make(chan outcome, 4)
		at := time.Now()
		s.WriteAsync(func(err error) { results <- outcome{0, err} }, filler...)
		s.WriteAsync(func(err error) { results <- outcome{1, err} },
			history.InsertCommand{Rec: a}, history.SetStatus{CommandID: a.CommandID, Status: cheetah.StatusDispatched, At: at})
		s.WriteAsync(func(err error) { results <- outcome{2, err} },
			history.SetStatus{CommandID: a.CommandID, Status: cheetah.StatusAcknowledged, At: at.Add(time.Second)},
			progress(uuid.Must(uuid.NewV7()).String(), 0)) // unknown command: refused
		s.WriteAsync(func(err error) { results <- outcome{3, err} },
			progress(a.CommandID, 0),
			history.SetStatus{CommandID: a.CommandID, Status: cheetah.StatusCompleted, At: at.Add(2 * time.Second)})
		errs := make([]error, 4)
		for range 4 {
			o := <-results
			errs[o.i] = o.err
		}
		require.NoError(t, errs[0], "round %d", round)
		require.NoError(t, errs[1], "round %d", round)
		require.Error(t, errs[2], "round %d", round)
		require.NotErrorIs(t, errs[2], cheetah.ErrStoreUnavailable, "round %d", round)
		require.Contains(t, errs[2].Error(), "history.AppendMessage", "round %d", round)
		require.NoError(t, errs[3], "round %d", round)
		got := get(t, ctx, s, a)
		require.Equal(t, cheetah.StatusCompleted, got.Status)
		require.Equal(t, micro(at), *got.DispatchedAt)
		require.Nil(t, got.AckedAt, "round %d: the refused request's status change is not applied", round)
		require.Equal(t, micro(at.Add(2*time.Second)), *got.FinishedAt)
		requireSeqInOrder(t, got.Messages, 1)
	}
	t.Logf("batches retried one by one: %d", s.Stats().Retries)
	require.Positive(t, s.Stats().Retries, "the refused request shared a batch at least once")
}

// testStoredNulls: what is absent is stored as NULL and what is empty but
// present as empty, column by column, as the reads expect.
func testStoredNulls(t *testing.T, ctx context.Context, s *history.Store) {
	db := DB(t, s)
	bare := newCommand("usr_1111", "t")
	bare.Params = nil
	hooked := newCommand("usr_1111", "t")
	require.NoError(t, s.Write(ctx,
		history.InsertCommand{Rec: bare, CallbackKeyID: "key_without_url"},
		history.InsertCommand{Rec: hooked, CallbackURL: "https://hooks.example.com/h"},
		history.AppendMessage{CommandID: bare.CommandID, Msg: cheetah.Message{Kind: cheetah.KindCapture, Mime: "image/png"}, Bytes: []byte{}},
		history.AppendMessage{CommandID: bare.CommandID, Msg: cheetah.Message{Kind: cheetah.KindAck}},
		history.SetStatus{CommandID: bare.CommandID, Status: cheetah.StatusFailed, Error: &cheetah.ErrorInfo{Code: "x"}},
		history.SetDelivery{CommandID: hooked.CommandID, Attempts: 2},
	))
	var params, keyID, url, errMsg, errData, lastErr *string
	var due *time.Time
	require.NoError(t, db.QueryRowContext(ctx, Q(s, `SELECT params, callback_key_id, callback_url, error_message, error_data,
		delivery_last_error, delivery_next_at FROM commands WHERE command_id = ?`), bare.CommandID).
		Scan(&params, &keyID, &url, &errMsg, &errData, &lastErr, &due))
	require.Nil(t, params)
	require.Nil(t, keyID, "a key id without a URL is not stored")
	require.Nil(t, url)
	require.Nil(t, errMsg)
	require.Nil(t, errData)
	require.Nil(t, lastErr)
	require.Nil(t, due)

	var attempts int
	require.NoError(t, db.QueryRowContext(ctx, Q(s, `SELECT delivery_attempts, delivery_last_error, delivery_next_at
		FROM commands WHERE command_id = ?`), hooked.CommandID).Scan(&attempts, &lastErr, &due))
	require.Equal(t, 2, attempts)
	require.Nil(t, lastErr)
	require.Nil(t, due)

	type msgCols struct {
		blobNull, dataNull bool
		blobLen            int
	}
	rows, err := db.QueryContext(ctx, Q(s, `SELECT blob IS NULL, data IS NULL, COALESCE(length(blob), -1)
		FROM messages WHERE command_id = ? ORDER BY seq`), bare.CommandID)
	require.NoError(t, err)
	defer rows.Close()
	var got []msgCols
	for rows.Next() {
		var m msgCols
		require.NoError(t, rows.Scan(&m.blobNull, &m.dataNull, &m.blobLen))
		got = append(got, m)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []msgCols{
		{blobNull: false, dataNull: true, blobLen: 0}, // an empty capture: empty bytes, no data
		{blobNull: true, dataNull: true, blobLen: -1}, // an ack: neither bytes nor data
	}, got)
}

// testEmptyWriteAsks: a Write with no ops, which waits for every write
// before it, also asks the database, so that it fails while the database
// does not answer and succeeds once it does.
func testEmptyWriteAsks(t *testing.T, ctx context.Context, s *history.Store) {
	require.NoError(t, s.Write(ctx))
	restore := Outage(t, s)
	require.ErrorIs(t, s.Write(ctx), cheetah.ErrStoreUnavailable)
	// Status changes that can never apply make no write either.
	require.ErrorIs(t, s.Write(ctx, history.SetStatus{CommandID: "c-unknown", Status: cheetah.StatusAdmitted}), cheetah.ErrStoreUnavailable)
	restore()
	waitHealthy(t, s)
	require.NoError(t, s.Write(ctx))
}

// testDeliveryFold: of a command's delivery states in one batch, the last
// is what stays, as if each were written in turn.
func testDeliveryFold(t *testing.T, ctx context.Context, s *history.Store) {
	db := DB(t, s)
	a, b := newCommand("usr_1111", "t"), newCommand("usr_1111", "t")
	next := time.Now().Add(time.Minute)
	require.NoError(t, s.Write(ctx,
		history.InsertCommand{Rec: a, CallbackURL: "https://hooks.example.com/a"},
		history.InsertCommand{Rec: b, CallbackURL: "https://hooks.example.com/b"},
		history.SetStatus{CommandID: a.CommandID, Status: cheetah.StatusCompleted},
		history.SetDelivery{CommandID: a.CommandID, Attempts: 1, LastError: "503", NextAt: next},
		history.SetDelivery{CommandID: b.CommandID, Attempts: 1, LastError: "timeout", NextAt: next},
		history.SetDelivery{CommandID: a.CommandID, Attempts: 2, Delivered: true},
	))
	require.Equal(t, &cheetah.Delivery{URL: "https://hooks.example.com/a", Attempts: 2, Delivered: true}, get(t, ctx, s, a).Delivery)
	require.Nil(t, deliveryDue(t, ctx, s, db, a.CommandID))
	require.Equal(t, &cheetah.Delivery{URL: "https://hooks.example.com/b", Attempts: 1, LastError: "timeout"}, get(t, ctx, s, b).Delivery)
	require.Equal(t, ptr(micro(next)), deliveryDue(t, ctx, s, db, b.CommandID))
}
