package server_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"log"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/agent"
	"github.com/cheetahbroker/cheetah/internal/syncbuf"
	"github.com/cheetahbroker/cheetah/remote"
	"github.com/cheetahbroker/cheetah/server"
	"github.com/cheetahbroker/cheetah/server/auth"
)

// testCA is a certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "cheetah test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// leaf returns the PEM certificate and key of a server certificate for
// 127.0.0.1 and localhost with the given serial number.
func (ca *testCA) leaf(t *testing.T, serial int64) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
}

// writePair writes a pair the way a renewal tool does: each file replaced
// whole by a rename, the key first.
func writePair(t *testing.T, certFile, keyFile string, certPEM, keyPEM []byte) {
	t.Helper()
	for _, f := range []struct {
		name string
		data []byte
	}{{keyFile, keyPEM}, {certFile, certPEM}} {
		tmp := f.name + ".tmp"
		require.NoError(t, os.WriteFile(tmp, f.data, 0o600))
		require.NoError(t, os.Rename(tmp, f.name))
	}
}

// tlsBroker is a whole broker (server.Open on SQLite) served on TLS the
// way `cheetah serve --tls-cert --tls-key` serves it.
type tlsBroker struct {
	b                 *server.Broker
	certs             *server.CertReloader
	addr              string // host:port
	certFile, keyFile string
	logs              *syncbuf.Buffer
}

func startTLSBroker(t *testing.T, ca *testCA) *tlsBroker {
	t.Helper()
	dir := t.TempDir()
	tb := &tlsBroker{certFile: filepath.Join(dir, "cert.pem"), keyFile: filepath.Join(dir, "key.pem"), logs: &syncbuf.Buffer{}}
	certPEM, keyPEM := ca.leaf(t, 1001)
	writePair(t, tb.certFile, tb.keyFile, certPEM, keyPEM)
	lg := slog.New(slog.NewTextHandler(tb.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))

	ctx := context.Background()
	var err error
	tb.certs, err = server.NewCertReloader(tb.certFile, tb.keyFile, lg)
	require.NoError(t, err)
	tb.b, err = server.Open(ctx, server.Options{DataDir: t.TempDir(), Log: lg})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	tb.addr = ln.Addr().String()
	hs := &http.Server{Handler: tb.b.Server.Handler(), TLSConfig: tb.certs.TLSConfig(),
		ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	served := make(chan error, 1)
	go func() { served <- hs.ServeTLS(ln, "", "") }()
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		require.NoError(t, hs.Shutdown(cctx))
		require.ErrorIs(t, <-served, http.ErrServerClosed)
		require.NoError(t, tb.b.Close(cctx))
	})
	return tb
}

func (tb *tlsBroker) key(t *testing.T, kind auth.Kind, userID string) string {
	t.Helper()
	c, err := tb.b.Keys.Create(context.Background(), kind, userID, "tls test")
	require.NoError(t, err)
	return c.Secret
}

// serial returns the serial number of the certificate a new TLS connection
// to the broker is shown, verified against roots.
func (tb *tlsBroker) serial(t *testing.T, roots *x509.CertPool) int64 {
	t.Helper()
	conn, err := tls.Dial("tcp", tb.addr, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})
	require.NoError(t, err)
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
}

// TestTLSEndToEnd: a broker on TLS serves the real agent over wss:// and the
// remote SDK over https:// when they trust its CA; plain HTTP, plain ws://
// and a client without the CA are refused; a certificate replaced on disk
// is what the next connection sees, without a restart.
func TestTLSEndToEnd(t *testing.T) {
	ca := newTestCA(t)
	tb := startTLSBroker(t, ca)
	trust := &tls.Config{RootCAs: ca.pool}
	clientKey := tb.key(t, auth.Client, user)
	appKey := tb.key(t, auth.App, "")

	// The agent, over wss://, trusting the CA.
	ctx, cancel := context.WithCancel(context.Background())
	a := agent.New(agent.Config{URL: "wss://" + tb.addr, TLSConfig: trust, Token: clientKey, ClientID: "console-tls", Flows: 1})
	a.Handle("echo", agent.Echo())
	ran := make(chan error, 1)
	go func() { ran <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-ran)
	})
	select {
	case <-a.Connected():
	case err := <-ran:
		t.Fatalf("the agent stopped before it was welcomed: %v", err)
	case <-time.After(15 * time.Second):
		t.Fatalf("the agent was not welcomed over wss; broker log:\n%s", tb.logs)
	}

	// The remote SDK, over https://, acquires the agent's flow and runs a
	// command on it.
	mgr := remote.New("https://"+tb.addr, appKey, remote.WithTLSConfig(trust))
	h, err := mgr.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "tls-1", ClientType: cheetah.Console})
	require.NoError(t, err)
	require.Equal(t, "console-tls", h.ClientID())
	res, err := h.SendAndWait(ctx, cheetah.Command{Name: "echo", Params: json.RawMessage(`{"over":"tls"}`)})
	require.NoError(t, err)
	require.Equal(t, cheetah.StatusCompleted, res.Status)
	rec, err := mgr.History().Read(ctx, user, res.CommandID)
	require.NoError(t, err)
	require.NotEmpty(t, rec.Messages)
	require.JSONEq(t, `{"over":"tls"}`, string(rec.Messages[len(rec.Messages)-1].Data))

	// Plain HTTP reaches no route: the API key is never read.
	_, err = remote.New("http://"+tb.addr, appKey).Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "tls-2", ClientType: cheetah.Console})
	var se *remote.StatusError
	require.ErrorAs(t, err, &se)
	require.Equal(t, http.StatusBadRequest, se.StatusCode)
	require.Contains(t, se.Body, "HTTPS")
	// Nor does a plain ws:// upgrade.
	_, _, err = websocket.Dial(ctx, "ws://"+tb.addr+"/ws/v1/client", nil)
	require.Error(t, err)
	// A client that does not trust the CA does not get through the handshake.
	_, err = remote.New("https://"+tb.addr, appKey).Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "tls-3", ClientType: cheetah.Console})
	var unknown x509.UnknownAuthorityError
	require.ErrorAs(t, err, &unknown)
	_, _, err = websocket.Dial(ctx, "wss://"+tb.addr+"/ws/v1/client", nil)
	require.ErrorAs(t, err, &unknown)

	// A renewed certificate is what new connections see, without a restart.
	require.EqualValues(t, 1001, tb.serial(t, ca.pool))
	certPEM, keyPEM := ca.leaf(t, 2002)
	writePair(t, tb.certFile, tb.keyFile, certPEM, keyPEM)
	deadline := time.Now().Add(10 * time.Second)
	for tb.serial(t, ca.pool) != 2002 {
		require.True(t, time.Now().Before(deadline), "the renewed certificate was not served; broker log:\n%s", tb.logs)
		time.Sleep(50 * time.Millisecond)
	}
	require.EqualValues(t, 2002, tb.certs.Certificate().SerialNumber.Int64())
	require.Contains(t, tb.logs.String(), "tls: certificate reloaded")

	// A new SDK client, on a new connection, works with the new one.
	released, err := mgr.Release(ctx, h)
	require.NoError(t, err)
	require.True(t, released)
	mgr2 := remote.New("https://"+tb.addr, appKey, remote.WithTLSConfig(trust))
	h2, err := mgr2.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "tls-4", ClientType: cheetah.Console})
	require.NoError(t, err)
	res, err = h2.SendAndWait(ctx, cheetah.Command{Name: "echo", Params: json.RawMessage(`{"n":2}`)})
	require.NoError(t, err)
	require.Equal(t, cheetah.StatusCompleted, res.Status)

	// The broker never logged a key.
	logs := tb.logs.String()
	for _, secret := range []string{clientKey, appKey, strings.Split(string(keyPEM), "\n")[1]} {
		require.NotContains(t, logs, secret)
	}
}
