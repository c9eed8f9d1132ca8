package agent_test

import (
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cheetahbroker/cheetah/agent"
	"github.com/cheetahbroker/cheetah/internal/syncbuf"
)

// TestTLSBrokerNeedsTrustedRoots: an https:// or wss:// broker whose
// certificate a private CA issued is reached once Config.TLSConfig trusts
// that CA, and never before (the client key is not sent).
func TestTLSBrokerNeedsTrustedRoots(t *testing.T) {
	t.Parallel()
	b := newFakeBrokerOn(t, 1<<20, true)
	require.True(t, strings.HasPrefix(b.url, "https://"), b.url)

	logs := &syncbuf.Buffer{}
	cfg := testConfig(b)
	cfg.Log = slog.New(slog.NewTextHandler(logs, nil))
	r := start(t, agent.New(cfg))
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "certificate signed by unknown authority") },
		guard, 5*time.Millisecond, "the agent without the CA must fail the TLS handshake")
	r.cancel()
	require.NoError(t, r.wait(t))
	require.Zero(t, b.hellos.Load(), "no hello, so no key, went to an untrusted broker")

	roots := x509.NewCertPool()
	roots.AddCert(b.srv.Certificate())
	for _, url := range []string{b.url, "wss://" + strings.TrimPrefix(b.url, "https://") + "/ws/v1/client"} {
		cfg := testConfig(b)
		cfg.URL = url
		cfg.TLSConfig = &tls.Config{RootCAs: roots}
		a := agent.New(cfg)
		r := start(t, a)
		bc, _ := b.accept(t)
		require.Equal(t, testToken, bc.hello.Token, url)
		connected(t, a)
		r.cancel()
		require.NoError(t, r.wait(t), url)
	}
}
