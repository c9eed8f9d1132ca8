package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/server"
	"github.com/cheetahbroker/cheetah/server/webhook"
)

// lease_webhook on acquire: a lease lost (revoked, expired, its context
// gone) is delivered as a signed Standard Webhooks lease.lost with the
// reason; a released one sends nothing.
func TestLeaseLostWebhook(t *testing.T) {
	t.Parallel()
	b := openBroker(t, server.Options{WebhookAllowPrivate: true})
	recv, got := hookReceiver(t)
	agent := b.connectAgent("agent-1", "flow-1", "flow-2", "flow-3")
	acquire := func(task string, ttl int) cheetah.Lease {
		var acq struct{ Lease cheetah.Lease }
		resp := b.do("POST", "/api/v1/acquire", b.appKey, map[string]any{"user_id": user, "task_id": task, "client_type": "console",
			"ttl_s": ttl, "lease_webhook": recv.URL + "/lost"}, &acq)
		require.Equal(t, http.StatusCreated, resp.StatusCode)
		return acq.Lease
	}
	lost := func() webhook.LeaseLost {
		d := nextDelivery(t, got)
		verifySignature(t, b.appSecret, d)
		// And as the Standard Webhooks reference library verifies it,
		// timestamp tolerance included.
		wh, err := standardwebhooks.NewWebhook(b.appSecret)
		require.NoError(t, err)
		require.NoError(t, wh.Verify(d.body, d.header))
		var ll webhook.LeaseLost
		require.NoError(t, json.Unmarshal(d.body, &ll))
		require.Equal(t, "lease.lost", ll.Type)
		require.NotContains(t, string(d.body), "lease_token")
		require.Equal(t, "1", d.header.Get("X-Cheetah-Attempt"))
		require.Regexp(t, `^lease_`, d.header.Get("webhook-id"))
		return ll
	}

	released := acquire("released", 60)
	b.do("POST", "/api/v1/lease/release", b.appKey, nil, nil, "X-Lease", released.LeaseToken)
	revoked := acquire("revoked", 60)
	requireRevoked(t, b.reg, user, "agent-1", revoked.ContextID)
	ll := lost()
	require.Equal(t, cheetah.LostRevoked, ll.Reason)
	require.Equal(t, revoked.Epoch, ll.Lease.Epoch)
	require.Equal(t, "revoked", ll.Lease.TaskID)
	// The release came first and was decided on first: nothing for it.
	require.Empty(t, got, "a released lease sends nothing")

	expired := acquire("expired", 1)
	ll = lost()
	require.Equal(t, cheetah.LostExpired, ll.Reason)
	require.Equal(t, expired.Epoch, ll.Lease.Epoch)

	gone := acquire("gone", 60)
	var reps []any
	for _, id := range []string{"flow-1", "flow-2", "flow-3"} {
		if id != gone.ContextID {
			reps = append(reps, map[string]any{"context_id": id, "tab_id": "t-" + id, "owner": "worker"})
		}
	}
	raw, _ := json.Marshal(map[string]any{"type": "state", "contexts": reps})
	agent.sendRaw(raw)
	ll = lost()
	require.Equal(t, cheetah.LostContextGone, ll.Reason)
	require.Equal(t, gone.Epoch, ll.Lease.Epoch)
	select {
	case d := <-got:
		t.Fatalf("an extra delivery: %s", d.body)
	case <-time.After(100 * time.Millisecond):
	}
}

// A lease_webhook the worker would not deliver to is refused at the edge.
func TestLeaseWebhookRefused(t *testing.T) {
	t.Parallel()
	b := openBroker(t, server.Options{})
	b.connectAgent("agent-1", "flow-1")
	for _, u := range []string{"http://example.com/x", "https://127.0.0.1/x", "https://localhost/x", "not a url", "ftp://example.com/"} {
		b.expectError(400, "invalid_request", "", "POST", "/api/v1/acquire", b.appKey,
			map[string]any{"user_id": user, "task_id": "t", "client_type": "console", "lease_webhook": u})
	}
	// In process too: the broker's Manager checks it before acquiring.
	_, err := b.open.Manager().Acquire(context.Background(), cheetah.AcquireRequest{UserID: user, TaskID: "t",
		ClientType: cheetah.Console, LeaseWebhook: "https://127.0.0.1/x"})
	require.ErrorIs(t, err, cheetah.ErrInvalidRequest)
	require.Zero(t, b.reg.Stats().Leases)
}
