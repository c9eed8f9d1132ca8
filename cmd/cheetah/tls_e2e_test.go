package main_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
)

// issuer makes server certificates for 127.0.0.1 and localhost, signed by
// a CA made at test time.
type issuer struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newIssuer(t *testing.T) *issuer {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "cheetah e2e CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return &issuer{cert: cert, key: key}
}

func (is *issuer) pem() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: is.cert.Raw})
}

// write issues a certificate with serial and writes it and its key.
func (is *issuer) write(t *testing.T, serial int64, certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "localhost"},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, is.cert, &key.PublicKey, is.key)
	require.NoError(t, err)
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(keyFile+".tmp", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600))
	require.NoError(t, os.Rename(keyFile+".tmp", keyFile))
	require.NoError(t, os.WriteFile(certFile+".tmp", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.Rename(certFile+".tmp", certFile))
}

// TestServeTLS runs `cheetah serve --tls-cert --tls-key` and `cheetah agent
// --url https://… --ca-file`: the agent connects over wss, the API answers
// over https only, and after a renewal on disk and a SIGHUP new
// connections get the new certificate from the same process.
func TestServeTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	dir := t.TempDir()
	certFile, keyFile, caFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "ca.pem")
	is := newIssuer(t)
	is.write(t, 101, certFile, keyFile)
	require.NoError(t, os.WriteFile(caFile, is.pem(), 0o600))
	roots := x509.NewCertPool()
	roots.AddCert(is.cert)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	t.Cleanup(hc.CloseIdleConnections)

	// One of the pair alone is a usage error, from the flag or its variable.
	_, code := cli(t, []string{"CHEETAH_DATA_DIR=" + t.TempDir()}, "serve", "--tls-cert", certFile)
	require.Equal(t, 2, code)
	_, code = cli(t, []string{"CHEETAH_DATA_DIR=" + t.TempDir(), "CHEETAH_TLS_KEY=" + keyFile}, "serve")
	require.Equal(t, 2, code)

	addr := freePort(t)
	admin := "e2e-admin-key-tls-0123456789"
	serve := start(t, []string{"CHEETAH_ADMIN_KEY=" + admin, "CHEETAH_DATA_DIR=" + t.TempDir(), "CHEETAH_LISTEN=" + addr},
		"serve", "--tls-cert", certFile, "--tls-key", keyFile)
	base := "https://" + addr
	call := func(method, path, key string, body, out any) int {
		t.Helper()
		var rd io.Reader
		if body != nil {
			b, err := json.Marshal(body)
			require.NoError(t, err)
			rd = bytes.NewReader(b)
		}
		req, err := http.NewRequest(method, base+path, rd)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := hc.Do(req)
		if err != nil {
			return 0
		}
		defer resp.Body.Close()
		if out != nil && resp.StatusCode < 300 {
			require.NoError(t, json.NewDecoder(resp.Body).Decode(out))
		}
		return resp.StatusCode
	}
	require.Eventually(t, func() bool { return call("GET", "/readyz", "", nil, nil) == 200 }, 30*time.Second, 50*time.Millisecond)

	// Plain HTTP on the same address is refused.
	resp, err := http.Get("http://" + addr + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)

	var client struct{ Key string }
	require.Equal(t, 201, call("POST", "/api/v1/admin/keys", admin, map[string]any{"kind": "client", "user_id": "usr_tls", "name": "agent"}, &client))
	start(t, []string{"CHEETAH_CLIENT_KEY=" + client.Key}, "agent", "--url", base, "--ca-file", caFile, "--client-id", "tls-agent")
	var avail struct{ Contexts []cheetah.ContextSnapshot }
	require.Eventually(t, func() bool {
		call("GET", "/api/v1/users/usr_tls/contexts/available?client_type=console", admin, nil, &avail)
		return len(avail.Contexts) == 1
	}, 30*time.Second, 50*time.Millisecond, "the agent connects over wss with --ca-file")

	serial := func() int64 {
		conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})
		require.NoError(t, err)
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
	}
	require.EqualValues(t, 101, serial())
	is.write(t, 202, certFile, keyFile)
	require.NoError(t, serve.cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool { return serial() == 202 }, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, 200, call("GET", "/readyz", "", nil, nil), "the process that reloaded still serves")
	require.Nil(t, serve.cmd.ProcessState, "SIGHUP does not stop the broker")
}
