package server_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/history/historytest"
	"github.com/cheetahbroker/cheetah/server"
)

// retentionLog is a slog handler that passes on the retention's records.
type retentionLog chan slog.Record

func (retentionLog) Enabled(context.Context, slog.Level) bool { return true }
func (h retentionLog) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, "history retention") {
		h <- r
	}
	return nil
}
func (h retentionLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h retentionLog) WithGroup(string) slog.Handler      { return h }

func (h retentionLog) next(t *testing.T) slog.Record {
	t.Helper()
	select {
	case r := <-h:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("no retention pass")
		return slog.Record{}
	}
}

func finished(t *testing.T, b *server.Broker, created time.Time) cheetah.CommandRecord {
	t.Helper()
	rec := cheetah.CommandRecord{CommandID: historytest.CommandIDAt(created), UserID: user, ClientID: "c", ContextID: "x",
		TaskID: "t", Epoch: 1, Name: "echo", ResponseMode: cheetah.ModeAsync, TraceID: "4bf92f3577b34da6a3ce929d0e0e4736",
		Status: cheetah.StatusCompleted, CreatedAt: created, FinishedAt: &created}
	require.NoError(t, b.Store.Write(t.Context(), history.InsertCommand{Rec: rec}))
	return rec
}

// The broker deletes the finished commands past Options.HistoryRetention:
// once at Open, then every RetentionInterval by its clock, keeping the
// recent ones.
func TestHistoryRetention(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClockAt(time.Now())
	logs := make(retentionLog, 16)
	b, err := server.Open(t.Context(), server.Options{DataDir: t.TempDir(), Clock: clock, Log: slog.New(logs),
		HistoryRetention: 24 * time.Hour, RetentionInterval: time.Hour})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, b.Close(context.Background())) })

	// The pass at Open found nothing.
	require.Equal(t, "history retention removed nothing", logs.next(t).Message)

	old := finished(t, b, clock.Now().Add(-48*time.Hour))
	recent := finished(t, b, clock.Now().Add(-time.Hour))
	clock.Advance(time.Hour)
	r := logs.next(t)
	require.Equal(t, "history retention removed commands", r.Message)
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "count" {
			require.EqualValues(t, 1, a.Value.Int64())
		}
		return true
	})
	_, err = b.Store.Get(t.Context(), user, old.CommandID)
	require.ErrorIs(t, err, cheetah.ErrNotFound)
	_, err = b.Store.Get(t.Context(), user, recent.CommandID)
	require.NoError(t, err)
}

// HistoryRetention 0 keeps everything: no pass runs.
func TestHistoryRetentionZeroKeepsAll(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClockAt(time.Now())
	logs := make(retentionLog, 16)
	b, err := server.Open(t.Context(), server.Options{DataDir: t.TempDir(), Clock: clock, Log: slog.New(logs)})
	require.NoError(t, err)
	old := finished(t, b, clock.Now().Add(-1000*24*time.Hour))
	n, err := b.Retention.Purge(t.Context())
	require.NoError(t, err)
	require.Zero(t, n)
	_, err = b.Store.Get(t.Context(), user, old.CommandID)
	require.NoError(t, err)
	require.NoError(t, b.Close(context.Background()))
	require.Empty(t, logs)
}

// Close joins everything Open started, the retention loop included. (Not
// parallel: goleak compares with the goroutines of this test's start.)
func TestBrokerCloseJoinsRetention(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	logs := make(retentionLog, 16)
	b, err := server.Open(t.Context(), server.Options{DataDir: t.TempDir(), Log: slog.New(logs),
		HistoryRetention: time.Hour, RetentionInterval: time.Hour})
	require.NoError(t, err)
	logs.next(t) // the loop is running
	require.NoError(t, b.Close(context.Background()))
}

// A second broker on one data directory is refused, naming the first; once
// the first is closed, one may open there again.
func TestBrokerDataDirLock(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	first, err := server.Open(t.Context(), server.Options{DataDir: dir, Listen: "127.0.0.1:8420"})
	require.NoError(t, err)

	_, err = server.Open(t.Context(), server.Options{DataDir: dir, Listen: "127.0.0.1:8421"})
	require.ErrorIs(t, err, history.ErrDataDirInUse)
	host, _ := os.Hostname()
	require.Contains(t, err.Error(), "in use by another broker")
	require.Contains(t, err.Error(), fmt.Sprintf("pid %d on host %s, a broker listening on 127.0.0.1:8420", os.Getpid(), host))

	require.NoError(t, first.Close(context.Background()))
	again, err := server.Open(t.Context(), server.Options{DataDir: dir})
	require.NoError(t, err)
	require.NoError(t, again.Close(context.Background()))
}
