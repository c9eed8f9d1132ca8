package historytest

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/history"
)

// Run is the conformance suite every dialect of the store must pass. open
// returns a new, empty, migrated store for one test. The restart tests
// reopen it with Reopen, so open must use NewSQLite or NewPostgres.
func Run(t *testing.T, open func(t *testing.T) *history.Store) {
	tests := []conformanceTest{
		{"RoundTrip", testRoundTrip},
		{"StatusForwardOnly", testStatusForwardOnly},
		{"MessageSeq", testMessageSeq},
		{"CaptureBytes", testCaptureBytes},
		{"LateFlag", testLateFlag},
		{"UserBoundary", testUserBoundary},
		{"ListPaging", testListPaging},
		{"ListInvalid", testListInvalid},
		{"MarkInterrupted", testMarkInterrupted},
		{"Restart", testRestart},
		{"Epochs", testEpochs},
		{"Keys", testKeys},
		{"PurgeBefore", testPurge},
		{"GroupCommit", testGroupCommit},
		{"CommitTime", testCommitTime},
		{"FailingOpIsolated", testFailingOp},
		{"Closed", testClosed},
		{"StatusFoldInBatch", testStatusFoldCases},
		{"StatusFoldMatchesOneByOne", testStatusFoldMatchesOneByOne},
		{"UnicodeAndLargeJSON", testUnicodeAndLargeJSON},
		{"CopyBatch", testCopyBatch},
		{"InterleavedMessages", testInterleavedMessages},
		{"RefusedInSharedBatch", testRefusedInSharedBatch},
		{"StoredNulls", testStoredNulls},
		{"DeliveryFold", testDeliveryFold},
	}
	run(t, open, tests)
}

type conformanceTest struct {
	name string
	fn   func(t *testing.T, ctx context.Context, s *history.Store)
}

func run(t *testing.T, open func(t *testing.T) *history.Store, tests []conformanceTest) {
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := open(t) // each test its own database: the setup
			tc.fn(t, t.Context(), s)
		})
	}
}

// newCommand returns a command record as the broker would admit it.
func newCommand(userID, taskID string) cheetah.CommandRecord {
	return cheetah.CommandRecord{
		CommandID:    uuid.Must(uuid.NewV7()).String(),
		UserID:       userID,
		ClientID:     "ext-7f3a",
		ContextID:    "tab-12",
		TaskID:       taskID,
		Epoch:        17,
		Name:         "navigate",
		Params:       json.RawMessage(`{"url":"https://example.com/"}`),
		ResponseMode: cheetah.ModeRPC,
		TraceID:      "4bf92f3577b34da6a3ce929d0e0e4736",
		CreatedAt:    time.Now(),
	}
}

// CommandIDAt returns a new command id, a UUIDv7 whose time is at's
// millisecond: the id the broker would have minted at that time.
func CommandIDAt(at time.Time) string {
	id := uuid.Must(uuid.NewV7())
	ms := uint64(at.UnixMilli())
	for i := range 6 {
		id[i] = byte(ms >> (40 - 8*i))
	}
	return id.String()
}

func insert(t *testing.T, ctx context.Context, s *history.Store, recs ...cheetah.CommandRecord) {
	t.Helper()
	ops := make([]history.Op, 0, len(recs))
	for _, r := range recs {
		ops = append(ops, history.InsertCommand{Rec: r})
	}
	require.NoError(t, s.Write(ctx, ops...))
}

func get(t *testing.T, ctx context.Context, s *history.Store, rec cheetah.CommandRecord) cheetah.CommandRecord {
	t.Helper()
	got, err := s.Get(ctx, rec.UserID, rec.CommandID)
	require.NoError(t, err)
	return got
}

func setStatus(t *testing.T, ctx context.Context, s *history.Store, id string, st cheetah.Status, at time.Time, e *cheetah.ErrorInfo) {
	t.Helper()
	require.NoError(t, s.Write(ctx, history.SetStatus{CommandID: id, Status: st, At: at, Error: e}))
}

func micro(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }

func ptr[T any](v T) *T { return &v }

func testRoundTrip(t *testing.T, ctx context.Context, s *history.Store) {
	rec := newCommand("usr_1111", "task-1")
	// Odd spacing and key order: JSON must come back as sent, not re-encoded.
	rec.Params = json.RawMessage(`{"url":"https://example.com/catalog/42",  "b":[1, 2 ,3],"a":{"z":null}}`)
	rec.Target = json.RawMessage(`{ "tab_id" : "12" }`)
	rec.Options = json.RawMessage(`{}`)
	rec.CreatedAt = time.Date(2025, 3, 4, 5, 6, 7, 123456789, time.FixedZone("CET", 3600))
	insert(t, ctx, s, rec)

	want := rec
	want.Status = cheetah.StatusAdmitted
	want.CreatedAt = micro(rec.CreatedAt)
	want.Messages = []cheetah.Message{}
	got := get(t, ctx, s, rec)
	require.Equal(t, want, got)
	require.Equal(t, time.UTC, got.CreatedAt.Location())
	require.NotNil(t, got.Messages, "messages is an empty list, not null")

	// A terminal error with data, and a webhook delivery.
	hooked := newCommand("usr_1111", "task-1")
	hooked.Params = nil
	require.NoError(t, s.Write(ctx, history.InsertCommand{Rec: hooked, CallbackURL: "https://hooks.example.com/cheetah"}))
	got = get(t, ctx, s, hooked)
	require.Nil(t, got.Params)
	require.Equal(t, &cheetah.Delivery{URL: "https://hooks.example.com/cheetah"}, got.Delivery)
	errData := json.RawMessage(`{"why" : "dns",  "host":"example.com"}`)
	setStatus(t, ctx, s, hooked.CommandID, cheetah.StatusFailed, time.Now(),
		&cheetah.ErrorInfo{Code: "navigation_failed", Message: "could not resolve", Data: errData})
	require.NoError(t, s.Write(ctx, history.SetDelivery{CommandID: hooked.CommandID, Attempts: 2, LastError: "503 Service Unavailable"}))
	got = get(t, ctx, s, hooked)
	require.Equal(t, &cheetah.ErrorInfo{Code: "navigation_failed", Message: "could not resolve", Data: errData}, got.Error)
	require.Equal(t, string(errData), string(got.Error.Data))
	require.Equal(t, &cheetah.Delivery{URL: "https://hooks.example.com/cheetah", Attempts: 2, LastError: "503 Service Unavailable"}, got.Delivery)

	// A record inserted with a status keeps it and its times.
	done := newCommand("usr_1111", "task-1")
	done.Status = cheetah.StatusCompleted
	done.DispatchedAt = ptr(time.Now().Add(-time.Second))
	done.FinishedAt = ptr(time.Now())
	insert(t, ctx, s, done)
	got = get(t, ctx, s, done)
	require.Equal(t, cheetah.StatusCompleted, got.Status)
	require.Equal(t, micro(*done.DispatchedAt), *got.DispatchedAt)
	require.Equal(t, micro(*done.FinishedAt), *got.FinishedAt)
	require.Nil(t, got.AckedAt)
}

func testStatusForwardOnly(t *testing.T, ctx context.Context, s *history.Store) {
	rec := newCommand("usr_1111", "task-1")
	insert(t, ctx, s, rec)
	t0 := time.Now()
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }

	setStatus(t, ctx, s, rec.CommandID, cheetah.StatusDispatched, at(1), nil)
	got := get(t, ctx, s, rec)
	require.Equal(t, cheetah.StatusDispatched, got.Status)
	require.Equal(t, micro(at(1)), *got.DispatchedAt)
	require.Nil(t, got.AckedAt)

	setStatus(t, ctx, s, rec.CommandID, cheetah.StatusAcknowledged, at(2), nil)
	setStatus(t, ctx, s, rec.CommandID, cheetah.StatusDispatched, at(3), nil) // backwards: ignored
	setStatus(t, ctx, s, rec.CommandID, cheetah.StatusAdmitted, at(3), nil)   // backwards: ignored
	got = get(t, ctx, s, rec)
	require.Equal(t, cheetah.StatusAcknowledged, got.Status)
	require.Equal(t, micro(at(1)), *got.DispatchedAt)
	require.Equal(t, micro(at(2)), *got.AckedAt)
	require.Nil(t, got.FinishedAt)

	setStatus(t, ctx, s, rec.CommandID, cheetah.StatusCompleted, at(4), nil)
	// A second terminal status loses, whatever it is.
	setStatus(t, ctx, s, rec.CommandID, cheetah.StatusFailed, at(5), &cheetah.ErrorInfo{Code: "late_error"})
	setStatus(t, ctx, s, rec.CommandID, cheetah.StatusTimedOut, at(6), &cheetah.ErrorInfo{Code: "timed_out"})
	setStatus(t, ctx, s, rec.CommandID, cheetah.StatusAcknowledged, at(7), nil)
	got = get(t, ctx, s, rec)
	require.Equal(t, cheetah.StatusCompleted, got.Status)
	require.Equal(t, micro(at(4)), *got.FinishedAt)
	require.Equal(t, micro(at(2)), *got.AckedAt)
	require.Nil(t, got.Error)

	// Straight from admitted to terminal: only finished_at is set.
	direct := newCommand("usr_1111", "task-1")
	insert(t, ctx, s, direct)
	setStatus(t, ctx, s, direct.CommandID, cheetah.StatusTimedOut, at(8), &cheetah.ErrorInfo{Code: "timed_out", Message: "no answer in 20s"})
	got = get(t, ctx, s, direct)
	require.Equal(t, cheetah.StatusTimedOut, got.Status)
	require.Nil(t, got.DispatchedAt)
	require.Nil(t, got.AckedAt)
	require.Equal(t, micro(at(8)), *got.FinishedAt)
	require.Equal(t, &cheetah.ErrorInfo{Code: "timed_out", Message: "no answer in 20s"}, got.Error)

	// Within one batch the first terminal status wins too.
	race := newCommand("usr_1111", "task-1")
	require.NoError(t, s.Write(ctx,
		history.InsertCommand{Rec: race},
		history.SetStatus{CommandID: race.CommandID, Status: cheetah.StatusCompleted, At: at(9)},
		history.SetStatus{CommandID: race.CommandID, Status: cheetah.StatusDisconnected, At: at(10), Error: &cheetah.ErrorInfo{Code: "disconnected"}},
	))
	got = get(t, ctx, s, race)
	require.Equal(t, cheetah.StatusCompleted, got.Status)
	require.Equal(t, micro(at(9)), *got.FinishedAt)
	require.Nil(t, got.Error)

	// An unknown status is refused before it reaches the database.
	err := s.Write(ctx, history.SetStatus{CommandID: rec.CommandID, Status: "finished"})
	require.ErrorIs(t, err, cheetah.ErrInvalidRequest)
}

func progress(id string, i int) history.AppendMessage {
	return history.AppendMessage{CommandID: id, Msg: cheetah.Message{
		Kind: cheetah.KindProgress, Data: json.RawMessage(fmt.Sprintf(`{"i": %d}`, i)), At: time.Now(),
	}}
}

func requireSeqInOrder(t *testing.T, msgs []cheetah.Message, n int) {
	t.Helper()
	require.Len(t, msgs, n)
	for i, m := range msgs {
		require.Equal(t, int64(i+1), m.Seq)
		require.Equal(t, fmt.Sprintf(`{"i": %d}`, i), string(m.Data))
	}
}

func testMessageSeq(t *testing.T, ctx context.Context, s *history.Store) {
	rec := newCommand("usr_1111", "task-1")
	insert(t, ctx, s, rec)
	// Three batches of three: numbering continues across transactions, and
	// a caller's Seq is ignored.
	for b := range 3 {
		ops := make([]history.Op, 0, 3)
		for i := range 3 {
			m := progress(rec.CommandID, 3*b+i)
			m.Msg.Seq = 99
			ops = append(ops, m)
		}
		require.NoError(t, s.Write(ctx, ops...))
	}
	requireSeqInOrder(t, get(t, ctx, s, rec).Messages, 9)

	// Concurrent writers to different commands, each enqueuing in order
	// without waiting: every command's messages are 1..n in enqueue order.
	const writers, perWriter = 8, 50
	recs := make([]cheetah.CommandRecord, writers)
	for i := range recs {
		recs[i] = newCommand("usr_1111", "task-2")
	}
	insert(t, ctx, s, recs...)
	var wg sync.WaitGroup
	errs := make(chan error, writers*perWriter)
	for _, r := range recs {
		wg.Go(func() {
			var done sync.WaitGroup
			for i := range perWriter {
				done.Add(1)
				s.WriteAsync(func(err error) {
					if err != nil {
						errs <- err
					}
					done.Done()
				}, progress(r.CommandID, i))
			}
			done.Wait()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for _, r := range recs {
		requireSeqInOrder(t, get(t, ctx, s, r).Messages, perWriter)
	}
}

func testCaptureBytes(t *testing.T, ctx context.Context, s *history.Store) {
	rec := newCommand("usr_1111", "task-1")
	insert(t, ctx, s, rec)
	raw := []byte{0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0x00, 0xff, 0xfe, 0x00}
	require.NoError(t, s.Write(ctx,
		history.AppendMessage{CommandID: rec.CommandID, Msg: cheetah.Message{Kind: cheetah.KindCapture, Mime: "image/png"}, Bytes: raw},
		history.AppendMessage{CommandID: rec.CommandID, Msg: cheetah.Message{Kind: cheetah.KindResult, Data: json.RawMessage(`{"ok":true}`)}},
	))
	got := get(t, ctx, s, rec)
	require.Len(t, got.Messages, 2)
	capture := got.Messages[0]
	require.Equal(t, cheetah.KindCapture, capture.Kind)
	require.Equal(t, "image/png", capture.Mime)
	require.JSONEq(t, `"`+base64.StdEncoding.EncodeToString(raw)+`"`, string(capture.Data))
	require.Equal(t, `{"ok":true}`, string(got.Messages[1].Data))

	// The column holds the raw bytes, not base64 text.
	var blob []byte
	var data *string
	err := DB(t, s).QueryRowContext(ctx, Q(s, "SELECT blob, data FROM messages WHERE command_id = ? AND seq = 1"), rec.CommandID).Scan(&blob, &data)
	require.NoError(t, err)
	require.Equal(t, raw, blob)
	require.Nil(t, data)

	// A capture passed as base64 JSON instead of bytes is refused, and so
	// are bytes on another kind.
	err = s.Write(ctx, history.AppendMessage{CommandID: rec.CommandID, Msg: cheetah.Message{Kind: cheetah.KindCapture, Data: capture.Data}})
	require.ErrorIs(t, err, cheetah.ErrInvalidRequest)
	err = s.Write(ctx, history.AppendMessage{CommandID: rec.CommandID, Msg: cheetah.Message{Kind: cheetah.KindEvent}, Bytes: raw})
	require.ErrorIs(t, err, cheetah.ErrInvalidRequest)
}

func testLateFlag(t *testing.T, ctx context.Context, s *history.Store) {
	rec := newCommand("usr_1111", "task-1")
	insert(t, ctx, s, rec)
	at := time.Now()
	require.NoError(t, s.Write(ctx,
		history.AppendMessage{CommandID: rec.CommandID, Msg: cheetah.Message{Kind: cheetah.KindResult, Data: json.RawMessage(`1`), At: at}},
		history.SetStatus{CommandID: rec.CommandID, Status: cheetah.StatusCompleted, At: at},
	))
	require.NoError(t, s.Write(ctx, history.AppendMessage{CommandID: rec.CommandID, Msg: cheetah.Message{
		Kind: cheetah.KindEvent, Name: "console", Data: json.RawMessage(`{"text":"hi"}`), Late: true, At: at.Add(time.Second),
	}}))
	got := get(t, ctx, s, rec)
	require.Equal(t, []cheetah.Message{
		{Seq: 1, Kind: cheetah.KindResult, Data: json.RawMessage(`1`), At: micro(at)},
		{Seq: 2, Kind: cheetah.KindEvent, Name: "console", Data: json.RawMessage(`{"text":"hi"}`), Late: true, At: micro(at.Add(time.Second))},
	}, got.Messages)
}

func testUserBoundary(t *testing.T, ctx context.Context, s *history.Store) {
	rec := newCommand("usr_1111", "task-1")
	insert(t, ctx, s, rec)

	_, err := s.Get(ctx, "usr_2222", rec.CommandID)
	require.ErrorIs(t, err, cheetah.ErrNotFound)
	_, err = s.Get(ctx, "usr_1111", uuid.Must(uuid.NewV7()).String())
	require.ErrorIs(t, err, cheetah.ErrNotFound)
	page, err := s.List(ctx, "usr_2222", cheetah.ListQuery{})
	require.NoError(t, err)
	require.Empty(t, page.Commands)

	ref, err := s.Lookup(ctx, rec.CommandID)
	require.NoError(t, err)
	require.Equal(t, history.CommandRef{
		UserID: "usr_1111", ClientID: "ext-7f3a", ContextID: "tab-12",
		Status: cheetah.StatusAdmitted, ResponseMode: cheetah.ModeRPC,
	}, ref)
	_, err = s.Lookup(ctx, "nope")
	require.ErrorIs(t, err, cheetah.ErrNotFound)
}

func ids(page cheetah.CommandPage) []string {
	out := make([]string, 0, len(page.Commands))
	for _, c := range page.Commands {
		out = append(out, c.CommandID)
	}
	return out
}

// listAll pages through a list with limit and returns the ids and the page
// sizes.
func listAll(t *testing.T, ctx context.Context, s *history.Store, userID string, q cheetah.ListQuery) (all []string, sizes []int) {
	t.Helper()
	for range 100 {
		page, err := s.List(ctx, userID, q)
		require.NoError(t, err)
		all = append(all, ids(page)...)
		sizes = append(sizes, len(page.Commands))
		for _, c := range page.Commands {
			require.Nil(t, c.Messages, "list entries carry no messages")
		}
		if page.NextCursor == "" {
			return all, sizes
		}
		q.Cursor = page.NextCursor
	}
	t.Fatal("list never ended")
	return nil, nil
}

func testListPaging(t *testing.T, ctx context.Context, s *history.Store) {
	var a, b, all []string
	var recs []cheetah.CommandRecord
	for i := range 12 {
		task := "task-a"
		if i%3 == 2 {
			task = "task-b"
		}
		r := newCommand("usr_1111", task)
		recs = append(recs, r)
		all = append(all, r.CommandID)
		if task == "task-a" {
			a = append(a, r.CommandID)
		} else {
			b = append(b, r.CommandID)
		}
	}
	for range 3 {
		recs = append(recs, newCommand("usr_2222", "task-a"))
	}
	insert(t, ctx, s, recs...)
	newestFirst := func(ids []string) []string {
		out := slices.Clone(ids)
		slices.Sort(out)
		slices.Reverse(out)
		return out
	}

	got, sizes := listAll(t, ctx, s, "usr_1111", cheetah.ListQuery{Limit: 5})
	require.Equal(t, newestFirst(all), got)
	require.Equal(t, []int{5, 5, 2}, sizes)

	got, sizes = listAll(t, ctx, s, "usr_1111", cheetah.ListQuery{TaskID: "task-a", Limit: 8})
	require.Equal(t, newestFirst(a), got)
	require.Equal(t, []int{8}, sizes, "a page that ends the list exactly has no next cursor")

	got, sizes = listAll(t, ctx, s, "usr_1111", cheetah.ListQuery{TaskID: "task-b", Limit: 3})
	require.Equal(t, newestFirst(b), got)
	require.Equal(t, []int{3, 1}, sizes)

	got, sizes = listAll(t, ctx, s, "usr_1111", cheetah.ListQuery{})
	require.Equal(t, newestFirst(all), got)
	require.Equal(t, []int{12}, sizes, "the default limit is 50")

	page, err := s.List(ctx, "usr_1111", cheetah.ListQuery{TaskID: "task-none"})
	require.NoError(t, err)
	require.Empty(t, page.Commands)
	require.Empty(t, page.NextCursor)

	// List entries are the record as Get shows it, without messages.
	page, err = s.List(ctx, "usr_2222", cheetah.ListQuery{Limit: 1})
	require.NoError(t, err)
	require.Len(t, page.Commands, 1)
	full := get(t, ctx, s, page.Commands[0])
	full.Messages = nil
	require.Equal(t, full, page.Commands[0])
}

func testListInvalid(t *testing.T, ctx context.Context, s *history.Store) {
	for _, q := range []cheetah.ListQuery{
		{Limit: -1},
		{Limit: 501},
		{Cursor: "not base64!"},
		{Cursor: base64.RawURLEncoding.EncodeToString([]byte{0xff, 0xfe})},
		{Cursor: base64.RawURLEncoding.EncodeToString([]byte("a\x00b"))},
		{Cursor: base64.RawURLEncoding.EncodeToString([]byte(strings.Repeat("x", 200)))},
	} {
		_, err := s.List(ctx, "usr_1111", q)
		require.ErrorIs(t, err, cheetah.ErrInvalidRequest, "%+v", q)
	}
	_, err := s.List(ctx, "usr_1111", cheetah.ListQuery{Limit: 500})
	require.NoError(t, err)
}

func testMarkInterrupted(t *testing.T, ctx context.Context, s *history.Store) {
	type tc struct {
		status cheetah.Status
		mode   cheetah.ResponseMode
		marked bool
	}
	cases := []tc{
		{cheetah.StatusAdmitted, cheetah.ModeRPC, true},
		{cheetah.StatusDispatched, cheetah.ModeAsync, true},
		{cheetah.StatusAcknowledged, cheetah.ModeRPC, true},
		{cheetah.StatusCompleted, cheetah.ModeRPC, false},
		{cheetah.StatusFailed, cheetah.ModeAsync, false},
		{cheetah.StatusAdmitted, cheetah.ModeNone, false},
		{cheetah.StatusDispatched, cheetah.ModeNone, false},
		{cheetah.StatusAcknowledged, cheetah.ModeNone, false},
	}
	recs := make([]cheetah.CommandRecord, len(cases))
	for i, c := range cases {
		recs[i] = newCommand("usr_1111", "task-1")
		recs[i].Status = c.status
		recs[i].ResponseMode = c.mode
	}
	insert(t, ctx, s, recs...)
	at := time.Now().Add(time.Minute)
	n, err := s.MarkInterrupted(ctx, at)
	require.NoError(t, err)
	require.Equal(t, int64(3), n)
	for i, c := range cases {
		got := get(t, ctx, s, recs[i])
		if !c.marked {
			require.Equal(t, c.status, got.Status, "%+v", c)
			continue
		}
		require.Equal(t, cheetah.StatusInterrupted, got.Status, "%+v", c)
		require.Equal(t, micro(at), *got.FinishedAt)
		require.Equal(t, "interrupted", got.Error.Code)
	}
	n, err = s.MarkInterrupted(ctx, at)
	require.NoError(t, err)
	require.Zero(t, n, "a second start finds nothing in flight")
}

func testRestart(t *testing.T, ctx context.Context, s *history.Store) {
	inflight := newCommand("usr_1111", "task-1")
	inflight.Status = cheetah.StatusDispatched
	done := newCommand("usr_1111", "task-1")
	none := newCommand("usr_1111", "task-1")
	none.ResponseMode = cheetah.ModeNone
	none.Status = cheetah.StatusDispatched
	insert(t, ctx, s, inflight, done, none)
	require.NoError(t, s.Write(ctx,
		progress(inflight.CommandID, 0),
		history.AppendMessage{CommandID: done.CommandID, Msg: cheetah.Message{Kind: cheetah.KindResult, Data: json.RawMessage(`{"i": 0}`)}},
		history.SetStatus{CommandID: done.CommandID, Status: cheetah.StatusCompleted},
	))
	// Enqueued without waiting: Close must still commit it.
	s.WriteAsync(nil, progress(inflight.CommandID, 1))

	s2 := Reopen(t, s)
	err := s.Write(ctx, progress(inflight.CommandID, 2))
	require.ErrorIs(t, err, history.ErrClosed)

	got := get(t, ctx, s2, inflight)
	require.Equal(t, cheetah.StatusDispatched, got.Status)
	requireSeqInOrder(t, got.Messages, 2)
	require.Equal(t, cheetah.StatusCompleted, get(t, ctx, s2, done).Status)

	at := time.Now()
	n, err := s2.MarkInterrupted(ctx, at)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	got = get(t, ctx, s2, inflight)
	require.Equal(t, cheetah.StatusInterrupted, got.Status)
	require.Equal(t, micro(at), *got.FinishedAt)
	require.Equal(t, cheetah.StatusCompleted, get(t, ctx, s2, done).Status)
	require.Equal(t, cheetah.StatusDispatched, get(t, ctx, s2, none).Status)

	// New messages continue the numbering after the restart.
	require.NoError(t, s2.Write(ctx, history.AppendMessage{CommandID: inflight.CommandID, Msg: cheetah.Message{Kind: cheetah.KindEvent, Late: true}}))
	got = get(t, ctx, s2, inflight)
	require.Equal(t, int64(3), got.Messages[2].Seq)
}

func testEpochs(t *testing.T, ctx context.Context, s *history.Store) {
	type span struct{ first, last int64 }
	const goroutines, each = 16, 20
	spans := make(chan span, goroutines*each)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				n := int64(1 + (g+i)%4)
				first, err := s.ReserveEpochs(ctx, n)
				if err != nil {
					t.Errorf("ReserveEpochs: %v", err)
					return
				}
				spans <- span{first, first + n - 1}
			}
		})
	}
	wg.Wait()
	close(spans)
	var all []span
	for sp := range spans {
		all = append(all, sp)
	}
	require.Len(t, all, goroutines*each)
	slices.SortFunc(all, func(a, b span) int { return int(a.first - b.first) })
	require.Equal(t, int64(1), all[0].first, "a fresh store issues from 1")
	for i := 1; i < len(all); i++ {
		require.Equal(t, all[i-1].last+1, all[i].first, "ranges neither overlap nor leave gaps")
	}
	high := all[len(all)-1].last

	s2 := Reopen(t, s)
	first, err := s2.ReserveEpochs(ctx, 3)
	require.NoError(t, err)
	require.Equal(t, high+1, first, "epochs keep rising across a restart")
	_, err = s2.ReserveEpochs(ctx, 0)
	require.ErrorIs(t, err, cheetah.ErrInvalidRequest)
}

func testKeys(t *testing.T, ctx context.Context, s *history.Store) {
	hash := func(k string) []byte { h := sha256.Sum256([]byte(k)); return h[:] }
	now := time.Now()
	keys := []history.Key{
		{ID: "key_client", Kind: "client", UserID: "usr_1111", Name: "laptop", Hash: hash("a"), CreatedAt: now},
		{ID: "key_app", Kind: "app", Name: "backend", Hash: hash("b"), WebhookSecret: "whsec_c2VjcmV0", TenantID: "acme", CreatedAt: now.Add(time.Second)},
		{ID: "key_admin", Kind: "admin", Name: "bootstrap", Hash: hash("c"), CreatedAt: now.Add(2 * time.Second)},
	}
	for _, k := range keys {
		require.NoError(t, s.CreateKey(ctx, k))
	}
	for i := range keys {
		keys[i].CreatedAt = micro(keys[i].CreatedAt)
	}

	err := s.CreateKey(ctx, keys[0])
	require.Error(t, err, "duplicate id")
	require.NotErrorIs(t, err, cheetah.ErrStoreUnavailable)
	err = s.CreateKey(ctx, history.Key{ID: "key_bad", Kind: "root", Name: "x", Hash: hash("d")})
	require.Error(t, err, "unknown kind")
	require.NotErrorIs(t, err, cheetah.ErrStoreUnavailable)

	got, err := s.GetKey(ctx, "key_app")
	require.NoError(t, err)
	require.Equal(t, keys[1], got)
	list, err := s.ListKeys(ctx)
	require.NoError(t, err)
	require.Equal(t, keys, list)
	_, err = s.GetKey(ctx, "key_nope")
	require.ErrorIs(t, err, cheetah.ErrNotFound)

	count := func(kind string) int64 {
		n, err := s.CountActiveKeys(ctx, kind)
		require.NoError(t, err)
		return n
	}
	require.Equal(t, int64(1), count("app"))
	require.Equal(t, int64(3), count(""))
	require.Equal(t, "acme", got.TenantID, "a tenant-bound app key keeps its tenant")
	require.Empty(t, list[0].TenantID)

	at := now.Add(time.Hour)
	ok, err := s.RevokeKey(ctx, "key_app", at)
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = s.RevokeKey(ctx, "key_app", at.Add(time.Hour))
	require.NoError(t, err)
	require.False(t, ok, "already revoked")
	ok, err = s.RevokeKey(ctx, "key_nope", at)
	require.NoError(t, err)
	require.False(t, ok, "unknown")

	got, err = s.GetKey(ctx, "key_app")
	require.NoError(t, err)
	require.Equal(t, micro(at), *got.RevokedAt)
	require.Equal(t, int64(0), count("app"))
	require.Equal(t, int64(2), count(""))
	require.Equal(t, int64(1), count("admin"))
}

func testPurge(t *testing.T, ctx context.Context, s *history.Store) {
	cutoff := time.Now()
	old := func(st cheetah.Status, mode cheetah.ResponseMode) cheetah.CommandRecord {
		r := newCommand("usr_1111", "task-1")
		r.CreatedAt = cutoff.Add(-2 * time.Hour)
		r.CommandID = CommandIDAt(r.CreatedAt)
		r.Status, r.ResponseMode = st, mode
		return r
	}
	oldDone := old(cheetah.StatusCompleted, cheetah.ModeRPC)
	oldNone := old(cheetah.StatusDispatched, cheetah.ModeNone)
	oldNone.CreatedAt = cutoff.Add(-time.Millisecond) // the millisecond before the cutoff's
	oldNone.CommandID = CommandIDAt(oldNone.CreatedAt)
	oldInflight := old(cheetah.StatusDispatched, cheetah.ModeRPC)
	newDone := newCommand("usr_1111", "task-1")
	newDone.CreatedAt = cutoff.Add(time.Minute)
	newDone.CommandID = CommandIDAt(newDone.CreatedAt)
	newDone.Status = cheetah.StatusCompleted
	// Found by its id's time, which is not before the cutoff's
	// millisecond: left for a later pass, though created before it.
	sameMilli := newCommand("usr_1111", "task-1")
	sameMilli.CreatedAt = cutoff.Add(-time.Hour)
	sameMilli.CommandID = CommandIDAt(cutoff)
	sameMilli.Status = cheetah.StatusCompleted
	// And by its created_at: an id minted before the clock stepped forward
	// says nothing of when the command was admitted.
	oldID := newCommand("usr_1111", "task-1")
	oldID.CreatedAt = cutoff.Add(time.Hour)
	oldID.CommandID = CommandIDAt(cutoff.Add(-time.Hour))
	oldID.Status = cheetah.StatusCompleted
	insert(t, ctx, s, oldDone, oldNone, oldInflight, newDone, sameMilli, oldID)
	require.NoError(t, s.Write(ctx, progress(oldDone.CommandID, 0), progress(oldDone.CommandID, 1), progress(newDone.CommandID, 0)))

	n, err := s.PurgeBefore(ctx, cutoff)
	require.NoError(t, err)
	require.Equal(t, int64(2), n)
	for _, r := range []cheetah.CommandRecord{oldDone, oldNone} {
		_, err := s.Get(ctx, r.UserID, r.CommandID)
		require.ErrorIs(t, err, cheetah.ErrNotFound)
	}
	for _, r := range []cheetah.CommandRecord{oldInflight, sameMilli, oldID} {
		get(t, ctx, s, r)
	}
	require.Len(t, get(t, ctx, s, newDone).Messages, 1)

	var left int
	require.NoError(t, DB(t, s).QueryRowContext(ctx, Q(s, "SELECT COUNT(*) FROM messages WHERE command_id = ?"), oldDone.CommandID).Scan(&left))
	require.Zero(t, left, "messages go with their command")
}

// CommitTime averages the commits' own durations: each commit below takes
// no longer than the Write around it, so neither can their average.
func testCommitTime(t *testing.T, ctx context.Context, s *history.Store) {
	var longest time.Duration
	for range 20 {
		rec := newCommand("usr_1111", "task-1")
		start := time.Now()
		require.NoError(t, s.Write(ctx, history.InsertCommand{Rec: rec}, progress(rec.CommandID, 0)))
		longest = max(longest, time.Since(start))
		got := s.CommitTime()
		require.Positive(t, got, "a commit's time is counted")
		require.LessOrEqual(t, got, longest, "no longer than the longest Write around a commit")
	}
}

func testGroupCommit(t *testing.T, ctx context.Context, s *history.Store) {
	const n = 1000
	before := s.Stats()
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			rec := newCommand("usr_1111", "task-1")
			s.WriteAsync(func(err error) { errs <- err }, history.InsertCommand{Rec: rec}, progress(rec.CommandID, 0))
		})
	}
	wg.Wait()
	for range n {
		require.NoError(t, <-errs)
	}
	after := s.Stats()
	batches, ops := after.Batches-before.Batches, after.Ops-before.Ops
	t.Logf("%d ops in %d transactions", ops, batches)
	require.Equal(t, int64(2*n), ops)
	require.Less(t, batches, int64(n), "concurrent writes share transactions")

	var count int
	require.NoError(t, DB(t, s).QueryRowContext(ctx, "SELECT COUNT(*) FROM commands").Scan(&count))
	require.Equal(t, n, count)
}

func testFailingOp(t *testing.T, ctx context.Context, s *history.Store) {
	existing := newCommand("usr_1111", "task-1")
	insert(t, ctx, s, existing)

	// One request with a bad op fails as a whole: its good insert is not
	// committed either.
	partial := newCommand("usr_1111", "task-1")
	err := s.Write(ctx, history.InsertCommand{Rec: partial}, progress(uuid.Must(uuid.NewV7()).String(), 0))
	require.Error(t, err)
	require.NotErrorIs(t, err, cheetah.ErrStoreUnavailable)
	require.Contains(t, err.Error(), "history.AppendMessage")
	_, err = s.Get(ctx, partial.UserID, partial.CommandID)
	require.ErrorIs(t, err, cheetah.ErrNotFound)

	err = s.Write(ctx, history.InsertCommand{Rec: existing})
	require.Error(t, err)
	require.NotErrorIs(t, err, cheetah.ErrStoreUnavailable)
	require.Contains(t, err.Error(), "history.InsertCommand")

	// Bad requests enqueued among good ones, quickly enough to share
	// batches, fail alone.
	const n = 300
	type outcome struct {
		i   int
		err error
	}
	results := make(chan outcome, n)
	good := make(map[int]cheetah.CommandRecord)
	retriesBefore := s.Stats().Retries
	for i := range n {
		done := func(err error) { results <- outcome{i, err} }
		switch i % 50 {
		case 20:
			s.WriteAsync(done, history.InsertCommand{Rec: existing}) // duplicate id
		case 40:
			s.WriteAsync(done, progress(uuid.Must(uuid.NewV7()).String(), 0)) // unknown command
		default:
			rec := newCommand("usr_1111", "task-1")
			good[i] = rec
			s.WriteAsync(done, history.InsertCommand{Rec: rec}, progress(rec.CommandID, 0))
		}
	}
	for range n {
		o := <-results
		if _, ok := good[o.i]; ok {
			require.NoError(t, o.err, "request %d", o.i)
			continue
		}
		require.Error(t, o.err, "request %d", o.i)
		require.False(t, errors.Is(o.err, cheetah.ErrStoreUnavailable), "request %d: %v", o.i, o.err)
	}
	t.Logf("batches retried one by one: %d", s.Stats().Retries-retriesBefore)
	for _, rec := range good {
		require.Len(t, get(t, ctx, s, rec).Messages, 1)
	}
}

func testClosed(t *testing.T, ctx context.Context, s *history.Store) {
	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "Close is idempotent")

	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rec := newCommand("usr_1111", "task-1")
	err := s.Write(ctx, history.InsertCommand{Rec: rec})
	require.ErrorIs(t, err, history.ErrClosed)
	require.ErrorIs(t, err, cheetah.ErrStoreUnavailable)

	done := make(chan error, 1)
	s.WriteAsync(func(err error) { done <- err }, history.InsertCommand{Rec: rec})
	select {
	case err := <-done:
		require.ErrorIs(t, err, history.ErrClosed)
	case <-ctx.Done():
		t.Fatal("WriteAsync after Close never called done")
	}

	_, err = s.Get(ctx, rec.UserID, rec.CommandID)
	require.ErrorIs(t, err, cheetah.ErrStoreUnavailable)
	require.ErrorIs(t, s.Ping(ctx), cheetah.ErrStoreUnavailable)
}
