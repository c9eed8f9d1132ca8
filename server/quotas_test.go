package server_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/remote"
	"github.com/cheetahbroker/cheetah/server"
	"github.com/cheetahbroker/cheetah/server/auth"
)

// withQuotaFile serves the broker with the quota file at path.
func withQuotaFile(t *testing.T, path string) func(*server.Config) {
	return func(c *server.Config) {
		f, err := server.OpenQuotaFile(path, c.Registry, nil)
		require.NoError(t, err)
		c.Quotas = f
	}
}

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, []byte(text), 0o600))
}

type acquireAnswer struct {
	Lease cheetah.Lease          `json:"lease"`
	Error *cheetah.EnvelopeError `json:"error"`
}

func TestQuotasOverHTTP(t *testing.T) {
	path := filepath.Join(t.TempDir(), "quotas.yaml")
	writeFile(t, path, `
quotas:
  - name: consoles
    match: {client_type: console}
    levels: {global: 10, tenant: 2, user: 1}
tenants:
  acme: {consoles: {user: 2}}
`)
	b := setup(t, withQuotaFile(t, path))
	b.connectAgent("c1", "a", "b", "x")
	acq := func(key string, body map[string]any) (*http.Response, acquireAnswer) {
		var out acquireAnswer
		if body["user_id"] == nil {
			body["user_id"] = user
		}
		body["task_id"], body["client_type"] = "t", "console"
		resp := b.do("POST", "/api/v1/acquire", key, body, &out)
		return resp, out
	}

	resp, first := acq(b.appKey, map[string]any{})
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, "default", first.Lease.TenantID)
	resp, out := acq(b.appKey, map[string]any{})
	require.Equal(t, http.StatusConflict, resp.StatusCode)
	require.Equal(t, "quota_exceeded", out.Error.Reason)
	require.Equal(t, map[string]any{"quota": "consoles", "level": "user", "used": float64(1), "cap": float64(1)}, out.Error.Details)

	// A tenant-bound key acts for its tenant, and only for it.
	created, err := b.keys.Make(context.Background(), auth.Spec{Kind: auth.App, TenantID: "acme", Name: "acme"})
	require.NoError(t, err)
	resp, out = acq(created.Secret, map[string]any{"tenant_id": "other"})
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	require.Equal(t, "forbidden", out.Error.Code)
	resp, out = acq(created.Secret, map[string]any{})
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, "acme", out.Lease.TenantID)
	resp, out = acq(created.Secret, map[string]any{"tenant_id": "acme"})
	require.Equal(t, http.StatusCreated, resp.StatusCode, "acme's user cap is 2")
	resp, out = acq(created.Secret, map[string]any{"tenant_id": "acme"})
	require.Equal(t, http.StatusConflict, resp.StatusCode)
	require.Equal(t, map[string]any{"quota": "consoles", "level": "user", "used": float64(2), "cap": float64(2)}, out.Error.Details,
		"user and tenant are both full: the narrower is named")

	// The admin view: definitions, occupancy, holders without tokens.
	var view registry.QuotasView
	require.Equal(t, http.StatusOK, b.do("GET", "/api/v1/admin/quotas", b.adminKey, nil, &view).StatusCode)
	require.Len(t, view.Quotas, 1)
	q := view.Quotas[0]
	require.Equal(t, "consoles", q.Name)
	require.Equal(t, 3, q.Occupancy.Global.Used)
	require.Len(t, q.Holders, 3)
	for _, h := range q.Holders {
		require.Empty(t, h.LeaseToken)
	}
	require.Equal(t, http.StatusForbidden, b.do("GET", "/api/v1/admin/quotas", b.appKey, nil, nil).StatusCode)

	// A good reload by the API.
	writeFile(t, path, "quotas: [{name: consoles, match: {client_type: console}, levels: {user: 3}}]\n")
	var rel map[string]any
	require.Equal(t, http.StatusOK, b.do("POST", "/api/v1/admin/quotas/reload", b.adminKey, nil, &rel).StatusCode)
	require.Equal(t, map[string]any{"reloaded": true, "quotas": float64(1)}, rel)
	resp, _ = acq(b.appKey, map[string]any{"user_id": user})
	require.Equal(t, http.StatusConflict, resp.StatusCode, "no idle context left: the quota passes")

	// A broken reload fails closed.
	writeFile(t, path, "quotas: [{name: consoles, levels: {user: 0}}]\n")
	var env cheetah.Envelope
	require.Equal(t, http.StatusServiceUnavailable, b.do("POST", "/api/v1/admin/quotas/reload", b.adminKey, nil, &env).StatusCode)
	require.Equal(t, "quota_unavailable", env.Error.Code)
	_, _ = b.reg.Release(context.Background(), first.Lease)
	resp, out = acq(b.appKey, map[string]any{})
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Equal(t, "quota_unavailable", out.Error.Code)
	require.Equal(t, http.StatusOK, b.do("GET", "/api/v1/admin/quotas", b.adminKey, nil, &view).StatusCode)
	require.NotEmpty(t, view.Broken)

	// Fixed: served again.
	writeFile(t, path, "quotas: [{name: consoles, match: {client_type: console}, levels: {user: 3}}]\n")
	require.Equal(t, http.StatusOK, b.do("POST", "/api/v1/admin/quotas/reload", b.adminKey, nil, nil).StatusCode)
	resp, _ = acq(b.appKey, map[string]any{})
	require.Equal(t, http.StatusCreated, resp.StatusCode)
}

func TestQuotaReloadWithoutFile(t *testing.T) {
	b := setup(t)
	var env cheetah.Envelope
	require.Equal(t, http.StatusBadRequest, b.do("POST", "/api/v1/admin/quotas/reload", b.adminKey, nil, &env).StatusCode)
	var view registry.QuotasView
	require.Equal(t, http.StatusOK, b.do("GET", "/api/v1/admin/quotas", b.adminKey, nil, &view).StatusCode)
	require.Empty(t, view.Quotas)
}

func TestTenantKeys(t *testing.T) {
	b := setup(t)
	var created auth.Created
	require.Equal(t, http.StatusCreated, b.do("POST", "/api/v1/admin/keys", b.adminKey, map[string]any{"kind": "app", "name": "acme", "tenant_id": "acme"}, &created).StatusCode)
	require.Equal(t, "acme", created.TenantID)
	for _, body := range []map[string]any{
		{"kind": "client", "name": "x", "user_id": user, "tenant_id": "acme"},
		{"kind": "admin", "name": "x", "tenant_id": "acme"},
		{"kind": "app", "name": "x", "tenant_id": "bad tenant"},
	} {
		var env cheetah.Envelope
		require.Equal(t, http.StatusBadRequest, b.do("POST", "/api/v1/admin/keys", b.adminKey, body, &env).StatusCode, body)
		require.Equal(t, "invalid_request", env.Error.Code)
	}
}

func TestPlacementValidation(t *testing.T) {
	b := setup(t)
	long := make([]byte, 257)
	for i := range long {
		long[i] = 'k'
	}
	for _, body := range []map[string]any{
		{"tenant_id": "no spaces"},
		{"tenant_id": 7},
		{"affinity_key": string(long)},
		{"create": map[string]any{"timeout_ms": 0}},
		{"create": map[string]any{"timeout_ms": 60001}},
		{"create": map[string]any{"url": 3}},
		{"create": map[string]any{"colour": "red"}},
		{"create": "yes"},
	} {
		body["user_id"], body["task_id"] = user, "t"
		var env cheetah.Envelope
		resp := b.do("POST", "/api/v1/acquire", b.appKey, body, &env)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, body)
		require.Equal(t, "invalid_request", env.Error.Code)
	}
}

// The quota metrics: acquires refused by level, occupancy per quota and
// level, and never a user or tenant id in a label.
func TestQuotaMetrics(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "quotas.yaml")
	writeFile(t, path, "quotas: [{name: consoles, match: {client_type: console}, levels: {global: 5, user: 1}}]\n")
	b := openBroker(t, server.Options{QuotaFile: path})
	b.connectAgent("agent-1", "flow-1", "flow-2")
	mgr := remote.New(b.http.URL, b.appKey)
	ctx := context.Background()
	_, err := mgr.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "q", ClientType: cheetah.Console, TenantID: "acme"})
	require.NoError(t, err)
	_, err = mgr.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "q", ClientType: cheetah.Console, TenantID: "acme"})
	require.ErrorIs(t, err, cheetah.ErrNoContextAvailable)
	s := b.scrape()
	require.EqualValues(t, 1, s.value("cheetah_acquires_total", "outcome", "no_context_available", "reason", "quota_exceeded", "quota_level", "user"))
	require.EqualValues(t, 1, s.value("cheetah_quota_used", "quota", "consoles", "quota_level", "global"))
	require.EqualValues(t, 1, s.value("cheetah_quota_used", "quota", "consoles", "quota_level", "user"))
	require.EqualValues(t, 1, s.value("cheetah_quota_full_scopes", "quota", "consoles", "quota_level", "user"))
	require.Zero(t, s.value("cheetah_quota_full_scopes", "quota", "consoles", "quota_level", "global"))
	resp, err := http.Get(b.http.URL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	for name, text := range map[string]string{"user": user, "tenant": "acme"} {
		require.NotContains(t, string(raw), `"`+text+`"`, "no %s id in a label", name)
	}
}

func TestBrokenQuotaFileRefusesToOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "quotas.yaml")
	writeFile(t, path, "quotas: [{name: q, levels: {user: 1}, extra: 1}]\n")
	_, err := server.Open(context.Background(), server.Options{DataDir: t.TempDir(), QuotaFile: path})
	require.ErrorContains(t, err, "extra")
}
