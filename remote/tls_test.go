package remote_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cheetahbroker/cheetah/remote"
)

// TestWithTLSConfigTrustsAPrivateCA: an https:// broker whose certificate
// the system does not trust is reached with WithTLSConfig's roots, and
// refused without them before any request (so any key) is sent.
func TestWithTLSConfigTrustsAPrivateCA(t *testing.T) {
	var got []string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get("Authorization"))
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake
	srv.StartTLS()
	t.Cleanup(srv.Close)
	ctx := context.Background()

	err := remote.NewClient(srv.URL, "app_secret").Do(ctx, "GET", "/healthz", nil, nil)
	var unknown x509.UnknownAuthorityError
	require.ErrorAs(t, err, &unknown)
	require.Empty(t, got, "nothing reached the broker")

	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	c := remote.NewClient(srv.URL, "app_secret", remote.WithTLSConfig(&tls.Config{RootCAs: roots}))
	var out struct{ OK bool }
	require.NoError(t, c.Do(ctx, "GET", "/healthz", nil, &out))
	require.True(t, out.OK)
	require.Equal(t, []string{"Bearer app_secret"}, got)
}
