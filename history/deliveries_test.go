package history_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/history/historytest"
)

// stores runs fn on a fresh store of each dialect.
func stores(t *testing.T, fn func(t *testing.T, s *history.Store)) {
	for name, open := range map[string]func(testing.TB, ...historytest.Option) *history.Store{
		"sqlite":   historytest.NewSQLite,
		"postgres": historytest.NewPostgres,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, open(t))
		})
	}
}

func hookedCommand(userID string, mode cheetah.ResponseMode) cheetah.CommandRecord {
	return cheetah.CommandRecord{
		CommandID: uuid.Must(uuid.NewV7()).String(), UserID: userID, ClientID: "c", ContextID: "x",
		TaskID: "t", Epoch: 1, Name: "echo", Params: json.RawMessage(`{}`), ResponseMode: mode,
		TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", CreatedAt: time.Now(),
	}
}

func due(t *testing.T, s *history.Store, now time.Time) []history.PendingDelivery {
	t.Helper()
	d, err := s.DueDeliveries(t.Context(), now, 100)
	require.NoError(t, err)
	return d
}

// A terminal status arms the delivery of a command with a callback, in the
// same write; the claim, the schedule and the end of a delivery are columns
// of the command's row.
func TestDeliveryLifecycle(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, s *history.Store) {
		ctx := t.Context()
		hooked := hookedCommand("usr_1", cheetah.ModeAsync)
		plain := hookedCommand("usr_1", cheetah.ModeAsync)
		require.NoError(t, s.Write(ctx,
			history.InsertCommand{Rec: hooked, CallbackURL: "https://hooks.example.com/x", CallbackKeyID: "k1"},
			history.InsertCommand{Rec: plain, CallbackKeyID: "ignored without a URL"}))
		end := time.Now().Add(-time.Second).UTC().Truncate(time.Microsecond)

		require.Empty(t, due(t, s, end.Add(time.Hour)), "nothing is due before the command ends")
		_, ok, err := s.NextDeliveryAt(ctx)
		require.NoError(t, err)
		require.False(t, ok)

		require.NoError(t, s.Write(ctx,
			history.SetStatus{CommandID: hooked.CommandID, Status: cheetah.StatusCompleted, At: end},
			history.SetStatus{CommandID: plain.CommandID, Status: cheetah.StatusCompleted, At: end}))
		require.Empty(t, due(t, s, end.Add(-time.Millisecond)))
		got := due(t, s, end)
		require.Equal(t, []history.PendingDelivery{{
			CommandID: hooked.CommandID, UserID: "usr_1", URL: "https://hooks.example.com/x", KeyID: "k1",
			FinishedAt: end, Attempts: 0, DueAt: end,
		}}, got)
		next, ok, err := s.NextDeliveryAt(ctx)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, end, next)

		// A later terminal status does not apply and re-arms nothing.
		require.NoError(t, s.Write(ctx, history.SetStatus{CommandID: hooked.CommandID, Status: cheetah.StatusFailed, At: end.Add(time.Hour)}))
		require.Equal(t, end, due(t, s, end)[0].DueAt)

		// One claim wins.
		now := end.Add(time.Second)
		claimed, err := s.ClaimDelivery(ctx, hooked.CommandID, 0, now, now.Add(time.Minute))
		require.NoError(t, err)
		require.True(t, claimed)
		claimed, err = s.ClaimDelivery(ctx, hooked.CommandID, 0, now, now.Add(time.Minute))
		require.NoError(t, err)
		require.False(t, claimed, "claimed already")
		require.Empty(t, due(t, s, now))
		require.Len(t, due(t, s, now.Add(time.Minute)), 1, "a lapsed claim is due again")

		// The attempt's outcome schedules the next one.
		retryAt := end.Add(time.Minute)
		require.NoError(t, s.Write(ctx, history.SetDelivery{CommandID: hooked.CommandID, Attempts: 1, LastError: "HTTP 503", NextAt: retryAt}))
		rec, err := s.Get(ctx, "usr_1", hooked.CommandID)
		require.NoError(t, err)
		require.Equal(t, &cheetah.Delivery{URL: "https://hooks.example.com/x", Attempts: 1, LastError: "HTTP 503"}, rec.Delivery)
		claimed, err = s.ClaimDelivery(ctx, hooked.CommandID, 0, retryAt, retryAt.Add(time.Minute))
		require.NoError(t, err)
		require.False(t, claimed, "the attempt count moved on")
		got = due(t, s, retryAt)
		require.Len(t, got, 1)
		require.Equal(t, 1, got[0].Attempts)
		require.Equal(t, retryAt, got[0].DueAt)
		require.Equal(t, end, got[0].FinishedAt)

		// Delivered: nothing is pending any more.
		require.NoError(t, s.Write(ctx, history.SetDelivery{CommandID: hooked.CommandID, Attempts: 2, Delivered: true}))
		require.Empty(t, due(t, s, end.Add(24*time.Hour)))
		_, ok, err = s.NextDeliveryAt(ctx)
		require.NoError(t, err)
		require.False(t, ok)
		rec, err = s.Get(ctx, "usr_1", hooked.CommandID)
		require.NoError(t, err)
		require.Equal(t, &cheetah.Delivery{URL: "https://hooks.example.com/x", Attempts: 2, Delivered: true}, rec.Delivery)

		// A command inserted already ended is due at once.
		late := hookedCommand("usr_1", cheetah.ModeAsync)
		late.Status, late.FinishedAt = cheetah.StatusCompleted, &end
		require.NoError(t, s.Write(ctx, history.InsertCommand{Rec: late, CallbackURL: "https://hooks.example.com/y"}))
		got = due(t, s, end)
		require.Len(t, got, 1)
		require.Equal(t, late.CommandID, got[0].CommandID)
		require.Equal(t, end, got[0].DueAt)

		// A command without a URL keeps no key id.
		var keyID *string
		db := historytest.DB(t, s)
		require.NoError(t, db.QueryRowContext(ctx, historytest.Q(s, "SELECT callback_key_id FROM commands WHERE command_id = ?"), plain.CommandID).Scan(&keyID))
		require.Nil(t, keyID)
	})
}

// Commands that the next start marks interrupted end without a SetStatus:
// ArmInterruptedDeliveries, run just before MarkInterrupted, arms theirs.
func TestArmInterruptedDeliveries(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, s *history.Store) {
		ctx := t.Context()
		inFlight := hookedCommand("usr_1", cheetah.ModeRPC)
		none := hookedCommand("usr_1", cheetah.ModeNone)
		ended := hookedCommand("usr_1", cheetah.ModeAsync)
		require.NoError(t, s.Write(ctx,
			history.InsertCommand{Rec: inFlight, CallbackURL: "https://h.example.com/1"},
			history.InsertCommand{Rec: none, CallbackURL: "https://h.example.com/2"},
			history.InsertCommand{Rec: ended, CallbackURL: "https://h.example.com/3"},
			history.SetStatus{CommandID: ended.CommandID, Status: cheetah.StatusCompleted, At: time.Now().Add(-time.Hour)},
			history.SetDelivery{CommandID: ended.CommandID, Attempts: 1, Delivered: true}))

		at := time.Now().UTC().Truncate(time.Microsecond)
		n, err := s.ArmInterruptedDeliveries(ctx, at)
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		require.Empty(t, due(t, s, at), "armed, but not due before the command has ended")
		_, err = s.MarkInterrupted(ctx, at)
		require.NoError(t, err)
		got := due(t, s, at)
		require.Len(t, got, 1)
		require.Equal(t, inFlight.CommandID, got[0].CommandID)
		require.Equal(t, "", got[0].KeyID)
		require.Equal(t, at, got[0].FinishedAt)

		n, err = s.ArmInterruptedDeliveries(ctx, at.Add(time.Hour))
		require.NoError(t, err)
		require.Zero(t, n, "again is harmless")
	})
}

// Pending deliveries are rows: they survive a restart.
func TestDeliveriesSurviveRestart(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, s *history.Store) {
		ctx := context.Background()
		c := hookedCommand("usr_1", cheetah.ModeAsync)
		end := time.Now().UTC().Truncate(time.Microsecond)
		require.NoError(t, s.Write(ctx,
			history.InsertCommand{Rec: c, CallbackURL: "https://h.example.com/", CallbackKeyID: "k"},
			history.SetStatus{CommandID: c.CommandID, Status: cheetah.StatusFailed, At: end},
			history.SetDelivery{CommandID: c.CommandID, Attempts: 1, LastError: "HTTP 500", NextAt: end.Add(time.Minute)}))
		s = historytest.Reopen(t, s)
		got := due(t, s, end.Add(time.Minute))
		require.Len(t, got, 1)
		require.Equal(t, history.PendingDelivery{CommandID: c.CommandID, UserID: "usr_1", URL: "https://h.example.com/",
			KeyID: "k", FinishedAt: end, Attempts: 1, DueAt: end.Add(time.Minute)}, got[0])
	})
}
