package quota_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/quota"
)

const good = `
quotas:
  - name: browsers
    match: {client_type: browser}
    levels: {global: 100, tenant: 20, user: 2}
  - name: eu
    match: {labels: {region: eu}}
    levels: {user: 1}
tenants:
  acme: {browsers: {tenant: 40, user: 4}}
`

func TestParseGood(t *testing.T) {
	s, err := quota.Parse([]byte(good))
	require.NoError(t, err)
	require.Equal(t, 2, s.Len())
	b := s.Quotas[0]
	require.Equal(t, quota.Caps{Global: 100, Tenant: 20, User: 2}, b.CapsFor("other"))
	require.Equal(t, quota.Caps{Global: 100, Tenant: 40, User: 4}, b.CapsFor("acme"), "an override raises tenant and user, never global")
	require.Equal(t, []int{0}, s.Governing(nil, cheetah.Browser, nil))
	require.Equal(t, []int{0, 1}, s.Governing(nil, cheetah.Browser, map[string]string{"region": "eu", "x": "y"}))
	require.Equal(t, []int{1}, s.Governing(nil, cheetah.Console, map[string]string{"region": "eu"}))
	require.Empty(t, s.Governing(nil, cheetah.Console, map[string]string{"region": "us"}))
	var none *quota.Set
	require.Empty(t, none.Governing(nil, cheetah.Browser, nil))

	empty, err := quota.Parse(nil)
	require.NoError(t, err)
	require.Zero(t, empty.Len())
}

func TestParseRefuses(t *testing.T) {
	for name, doc := range map[string]string{
		"bad yaml":          "quotas: [",
		"unknown top field": "quota: []",
		"unknown field":     "quotas: [{name: a, levels: {user: 1}, colour: red}]",
		"unknown level":     "quotas: [{name: a, levels: {team: 1}}]",
		"zero cap":          "quotas: [{name: a, levels: {user: 0}}]",
		"negative cap":      "quotas: [{name: a, levels: {global: -1}}]",
		"no cap":            "quotas: [{name: a, levels: {}}]",
		"no name":           "quotas: [{levels: {user: 1}}]",
		"same name":         "quotas: [{name: a, levels: {user: 1}}, {name: a, levels: {user: 2}}]",
		"bad client type":   "quotas: [{name: a, match: {client_type: phone}, levels: {user: 1}}]",
		"override global":   "quotas: [{name: a, levels: {global: 5}}]\ntenants: {acme: {a: {global: 10}}}",
		"override unknown":  "quotas: [{name: a, levels: {global: 5}}]\ntenants: {acme: {b: {user: 1}}}",
		"override zero":     "quotas: [{name: a, levels: {global: 5}}]\ntenants: {acme: {a: {user: 0}}}",
		"override field":    "quotas: [{name: a, levels: {global: 5}}]\ntenants: {acme: {a: {users: 3}}}",
		"two documents":     "quotas: []\n---\nquotas: []",
		"string cap":        "quotas: [{name: a, levels: {user: many}}]",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := quota.Parse([]byte(doc))
			require.Error(t, err)
		})
	}
}

func TestLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "quotas.yaml")
	_, err := quota.Load(path)
	require.Error(t, err, "a missing file")
	require.NoError(t, os.WriteFile(path, []byte(good), 0o600))
	s, err := quota.Load(path)
	require.NoError(t, err)
	require.Equal(t, "browsers", s.Quotas[0].Name)
}
