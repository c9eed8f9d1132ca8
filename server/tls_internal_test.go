package server

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// selfSigned returns a self-signed ECDSA P-256 certificate for 127.0.0.1
// and localhost, and its key, in PEM.
func selfSigned(t *testing.T, serial int64) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
}

// reloaderRig is a CertReloader on files in a temporary folder, with a
// clock the test moves.
type reloaderRig struct {
	t                 *testing.T
	r                 *CertReloader
	certFile, keyFile string
	now               time.Time
	logs              bytes.Buffer
	keys              []string // a line of every key written, never to be logged
}

func newReloaderRig(t *testing.T) *reloaderRig {
	dir := t.TempDir()
	g := &reloaderRig{t: t, certFile: filepath.Join(dir, "tls.crt"), keyFile: filepath.Join(dir, "tls.key"), now: time.Unix(1_800_000_000, 0)}
	c, k := selfSigned(t, 1)
	g.write(g.certFile, c)
	g.write(g.keyFile, k)
	r, err := NewCertReloader(g.certFile, g.keyFile, slog.New(slog.NewTextHandler(&g.logs, nil)))
	require.NoError(t, err)
	r.now = func() time.Time { return g.now }
	r.checked = g.now
	g.r = r
	return g
}

// write replaces name with data; the modification time moves on a second
// so that the change shows whatever the file system's time resolution.
func (g *reloaderRig) write(name string, data []byte) {
	g.t.Helper()
	if block, _ := pem.Decode(data); block != nil && strings.Contains(block.Type, "PRIVATE KEY") {
		g.keys = append(g.keys, strings.Split(string(data), "\n")[1])
	}
	var mtime time.Time
	if fi, err := os.Stat(name); err == nil {
		mtime = fi.ModTime().Add(time.Second)
	}
	require.NoError(g.t, os.WriteFile(name, data, 0o600))
	if !mtime.IsZero() {
		require.NoError(g.t, os.Chtimes(name, mtime, mtime))
	}
}

// serial is the serial number of the certificate a handshake at the rig's
// time gets.
func (g *reloaderRig) serial() int64 {
	g.t.Helper()
	c, err := g.r.GetCertificate(nil)
	require.NoError(g.t, err)
	return c.Leaf.SerialNumber.Int64()
}

func (g *reloaderRig) noKeyLogged() {
	g.t.Helper()
	for _, k := range g.keys {
		require.NotContains(g.t, g.logs.String(), k)
	}
}

func TestCertReloaderPicksUpNewFilesAtMostOnceASecond(t *testing.T) {
	g := newReloaderRig(t)
	require.EqualValues(t, 1, g.serial())
	c, k := selfSigned(t, 2)
	g.write(g.keyFile, k)
	g.write(g.certFile, c)
	g.now = g.now.Add(500 * time.Millisecond)
	require.EqualValues(t, 1, g.serial(), "the files are looked at once a second at most")
	g.now = g.now.Add(500 * time.Millisecond)
	require.EqualValues(t, 2, g.serial())
	require.EqualValues(t, 2, g.r.Certificate().SerialNumber.Int64())
	require.Contains(t, g.logs.String(), "tls: certificate reloaded")
	require.Contains(t, g.logs.String(), "serial=2")
	g.noKeyLogged()
}

func TestCertReloaderKeepsTheLastGoodPair(t *testing.T) {
	g := newReloaderRig(t)
	// Only the certificate is replaced so far: it does not match the key.
	c, k := selfSigned(t, 2)
	g.write(g.certFile, c)
	g.now = g.now.Add(time.Second)
	require.EqualValues(t, 1, g.serial())
	require.Equal(t, 1, strings.Count(g.logs.String(), "does not load"), g.logs.String())
	// Unchanged files are not tried (nor logged) again.
	g.now = g.now.Add(time.Second)
	require.EqualValues(t, 1, g.serial())
	require.Equal(t, 1, strings.Count(g.logs.String(), "does not load"))
	// A half-written key does not load either.
	g.write(g.keyFile, k[:len(k)/2])
	g.now = g.now.Add(time.Second)
	require.EqualValues(t, 1, g.serial())
	require.Equal(t, 2, strings.Count(g.logs.String(), "does not load"))
	// The key arrives whole: the new pair is served.
	g.write(g.keyFile, k)
	g.now = g.now.Add(time.Second)
	require.EqualValues(t, 2, g.serial())
	// A file that goes away leaves the pair in use.
	require.NoError(t, os.Remove(g.keyFile))
	g.now = g.now.Add(time.Second)
	require.EqualValues(t, 2, g.serial())
	require.Contains(t, g.logs.String(), "cannot be read")
	g.noKeyLogged()
}

func TestCertReloaderReloadLoadsNow(t *testing.T) {
	g := newReloaderRig(t)
	c, k := selfSigned(t, 3)
	g.write(g.keyFile, k)
	g.write(g.certFile, c)
	// No second has passed, but Reload (SIGHUP) does not wait.
	require.NoError(t, g.r.Reload())
	require.EqualValues(t, 3, g.serial())
	// A bad pair is an error, and the pair in use stays.
	g.write(g.certFile, []byte("not PEM"))
	err := g.r.Reload()
	require.Error(t, err)
	require.Contains(t, err.Error(), g.certFile)
	require.EqualValues(t, 3, g.serial())
	g.noKeyLogged()
}

func TestNewCertReloaderRefusesWhatDoesNotLoad(t *testing.T) {
	dir := t.TempDir()
	c, k := selfSigned(t, 1)
	_, other := selfSigned(t, 2)
	cf, kf, of := filepath.Join(dir, "c.pem"), filepath.Join(dir, "k.pem"), filepath.Join(dir, "o.pem")
	require.NoError(t, os.WriteFile(cf, c, 0o600))
	require.NoError(t, os.WriteFile(kf, k, 0o600))
	require.NoError(t, os.WriteFile(of, other, 0o600))

	_, err := NewCertReloader(cf, "", nil)
	require.Error(t, err)
	_, err = NewCertReloader(cf, filepath.Join(dir, "missing.pem"), nil)
	require.ErrorIs(t, err, os.ErrNotExist)
	_, err = NewCertReloader(cf, of, nil)
	require.ErrorContains(t, err, "does not match")
	_, err = NewCertReloader(kf, kf, nil)
	require.Error(t, err)
	r, err := NewCertReloader(cf, kf, nil)
	require.NoError(t, err)
	require.EqualValues(t, 1, r.Certificate().SerialNumber.Int64())
	tc := r.TLSConfig()
	require.NotNil(t, tc.GetCertificate)
	require.Empty(t, tc.Certificates, "the certificate comes from the reloader alone")
}
