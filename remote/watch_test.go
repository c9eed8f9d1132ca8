package remote_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/remote"
)

// Handle.Done over HTTP long-polls /api/v1/lease/wait: an alive answer and
// failed polls (503) are asked again; lease_lost closes Done with the
// reason, and the watch ends.
func TestDoneLongPoll(t *testing.T) {
	t.Parallel()
	var polls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/api/v1/acquire":
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"lease":{"user_id":"u","client_id":"c","context_id":"x","client_type":"console","task_id":"t","epoch":1,"lease_token":"0123456789abcdef0123456789abcdef","ttl_s":60,"expires_at":"2026-12-01T00:00:00Z"}}`))
		case "/api/v1/lease/wait":
			if r.Header.Get("X-Lease") != "0123456789abcdef0123456789abcdef" {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			switch polls.Add(1) {
			case 1:
				_, _ = w.Write([]byte(`{"alive":true}`))
			case 2, 3:
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write([]byte(`{"error":{"code":"overloaded","message":"busy"}}`))
			default:
				w.WriteHeader(http.StatusLocked)
				_, _ = w.Write([]byte(`{"error":{"code":"lease_lost","message":"lease_lost: expired","reason":"expired"}}`))
			}
		}
	}))
	defer srv.Close()
	m := remote.New(srv.URL, "key")
	h, err := m.Acquire(context.Background(), cheetah.AcquireRequest{UserID: "u", TaskID: "t"})
	require.NoError(t, err)
	defer h.Close()
	select {
	case <-h.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done did not close")
	}
	var lost *cheetah.LeaseLostError
	require.True(t, errors.As(h.Err(), &lost))
	require.Equal(t, cheetah.LostExpired, lost.Reason)
	require.Equal(t, int32(4), polls.Load())
}
