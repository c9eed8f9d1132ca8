package cheetah_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
)

func TestErrorsRoundTrip(t *testing.T) {
	t.Parallel()
	for _, err := range []error{
		&cheetah.LeaseLostError{Reason: cheetah.LostReassigned},
		&cheetah.NoContextError{Reason: cheetah.ReasonPlacementMiss},
		cheetah.Invalidf("ttl_s must be from 1 to 3600"),
		cheetah.NotFoundf("no command"),
		cheetah.StoreUnavailable("write", errors.New("dial tcp: refused")),
	} {
		wrapped := fmt.Errorf("op: %w", err)
		code, reason, msg := cheetah.Classify(wrapped)
		require.NotEmpty(t, code)
		back := cheetah.FromCode(code, reason, msg)
		c2, r2, _ := cheetah.Classify(back)
		require.Equal(t, code, c2, "%v", err)
		require.Equal(t, reason, r2)
		require.ErrorIs(t, back, &cheetah.Error{Code: code})
	}
}

func TestErrorsIsAs(t *testing.T) {
	t.Parallel()
	err := fmt.Errorf("send: %w", &cheetah.LeaseLostError{Reason: cheetah.LostExpired})
	require.ErrorIs(t, err, cheetah.ErrLeaseLost)
	require.NotErrorIs(t, err, cheetah.ErrNotFound)
	var lost *cheetah.LeaseLostError
	require.ErrorAs(t, err, &lost)
	require.Equal(t, cheetah.LostExpired, lost.Reason)

	err = &cheetah.NoContextError{Reason: cheetah.ReasonNoIdleWorker}
	require.ErrorIs(t, err, cheetah.ErrNoContextAvailable)
	require.NotErrorIs(t, err, cheetah.ErrLeaseLost)

	store := cheetah.StoreUnavailable("acquire", errors.New("secret-host:5432 refused"))
	require.ErrorIs(t, store, cheetah.ErrStoreUnavailable)
	code, _, msg := cheetah.Classify(store)
	require.Equal(t, cheetah.CodeStoreUnavailable, code)
	require.NotContains(t, msg, "secret-host", "a store's address never reaches an API answer")

	code, _, _ = cheetah.Classify(errors.New("plain"))
	require.Empty(t, code, "an unknown error is internal")
}

func TestStatusRank(t *testing.T) {
	t.Parallel()
	require.Less(t, cheetah.StatusAdmitted.Rank(), cheetah.StatusDispatched.Rank())
	require.Less(t, cheetah.StatusDispatched.Rank(), cheetah.StatusAcknowledged.Rank())
	for _, s := range []cheetah.Status{cheetah.StatusCompleted, cheetah.StatusFailed, cheetah.StatusTimedOut,
		cheetah.StatusDisconnected, cheetah.StatusCancelled, cheetah.StatusInterrupted} {
		require.True(t, s.Terminal(), s)
	}
	require.False(t, cheetah.StatusAcknowledged.Terminal())
	require.Equal(t, -1, cheetah.Status("bogus").Rank())
}

// The envelope survives JSON: what the server writes, the remote SDK reads
// back as the same kind of error; an envelope without a code is no error.
func TestEnvelopeRoundTrip(t *testing.T) {
	t.Parallel()
	code, reason, msg := cheetah.Classify(&cheetah.LeaseLostError{Reason: cheetah.LostExpired})
	b, err := json.Marshal(cheetah.Envelope{Error: &cheetah.EnvelopeError{Code: code, Message: msg, Reason: reason}})
	require.NoError(t, err)
	require.JSONEq(t, `{"error":{"code":"lease_lost","message":"`+msg+`","reason":"expired"}}`, string(b))
	var back cheetah.Envelope
	require.NoError(t, json.Unmarshal(b, &back))
	var lost *cheetah.LeaseLostError
	require.ErrorAs(t, back.Err(), &lost)
	require.Equal(t, cheetah.LostExpired, lost.Reason)

	for _, raw := range []string{`{}`, `{"error":null}`, `{"error":{"message":"no code"}}`} {
		var e cheetah.Envelope
		require.NoError(t, json.Unmarshal([]byte(raw), &e))
		require.NoError(t, e.Err(), raw)
	}
}
