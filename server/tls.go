package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

// certCheckInterval is how often, at most, a handshake looks at whether the
// certificate files changed.
const certCheckInterval = time.Second

// CertReloader serves the certificate of a PEM certificate file and key file
// (`cheetah serve --tls-cert --tls-key`) and picks up new ones without a
// restart: a TLS handshake that comes at least a second after the last
// check compares the files' size and modification time with those of the
// pair in use and, when either changed, loads the pair again. Reload does
// the same at once, whatever the files say (SIGHUP, see ReloadOnSIGHUP).
//
// A pair that fails to load (a key that does not match the certificate
// because only one file was replaced so far, or a half-written file) is
// logged and the last good pair stays in use; the same files are not tried
// again until they change once more. Nothing about the key is ever logged.
//
// It is safe for concurrent use.
type CertReloader struct {
	certFile, keyFile string
	log               *slog.Logger
	interval          time.Duration
	now               func() time.Time

	mu      sync.Mutex
	cert    *tls.Certificate
	loaded  filesStamp // the files as they were when cert was read
	failed  filesStamp // the files as they were when they last failed to load
	checked time.Time  // the last look at the files
}

// fileStamp is what tells a changed file: size and modification time.
type fileStamp struct {
	size    int64
	modTime time.Time
}

type filesStamp struct{ cert, key fileStamp }

// NewCertReloader loads the pair in certFile and keyFile, and fails when it
// cannot: a broker must not start on TLS without a certificate. log, when
// not nil, is told of reloads and of pairs that fail to load.
func NewCertReloader(certFile, keyFile string, log *slog.Logger) (*CertReloader, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("tls: both a certificate file and a key file are needed")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &CertReloader{certFile: certFile, keyFile: keyFile, log: log, interval: certCheckInterval, now: time.Now}
	st, err := r.stat()
	if err != nil {
		return nil, err
	}
	cert, err := r.load()
	if err != nil {
		return nil, err
	}
	r.cert, r.loaded, r.checked = cert, st, r.now()
	return r, nil
}

// TLSConfig returns a server configuration that takes its certificate from
// r, for http.Server.TLSConfig. TLS 1.2 is the oldest version it accepts.
func (r *CertReloader) TLSConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: r.GetCertificate}
}

// GetCertificate returns the pair in use, after loading it again if the
// files changed (looked at once a second at most). It is the
// tls.Config.GetCertificate of TLSConfig.
func (r *CertReloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	if now.Sub(r.checked) >= r.interval || now.Before(r.checked) {
		r.checked = now
		r.refresh(false)
	}
	return r.cert, nil
}

// Reload loads the pair from the files now, changed or not. On failure the
// pair in use stays, and the error says why.
func (r *CertReloader) Reload() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.checked = r.now()
	return r.refresh(true)
}

// Certificate returns the leaf certificate in use.
func (r *CertReloader) Certificate() *x509.Certificate {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cert.Leaf
}

// ReloadOnSIGHUP makes every SIGHUP the process gets call Reload, until
// the returned stop is called; stop waits for the goroutine it started.
func (r *CertReloader) ReloadOnSIGHUP() (stop func()) {
	return onSIGHUP(func() { _ = r.Reload() }) // refresh logs the outcome
}

// onSIGHUP calls f on every SIGHUP the process gets, one at a time, until
// the returned stop is called; stop waits for the goroutine it started.
func onSIGHUP(f func()) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-hup:
				f()
			case <-done:
				return
			}
		}
	})
	return sync.OnceFunc(func() {
		signal.Stop(hup)
		close(done)
		wg.Wait()
	})
}

// refresh loads the pair again when force is set or the files changed
// since the last load (and since the last failure). r.mu is held.
func (r *CertReloader) refresh(force bool) error {
	st, err := r.stat()
	if err != nil {
		if force || st != r.failed {
			r.log.Warn("tls: the certificate files cannot be read; the current certificate stays in use", "err", err)
		}
		r.failed = st
		return err
	}
	if !force && (st == r.loaded || st == r.failed) {
		return nil
	}
	cert, err := r.load()
	if err != nil {
		r.failed = st
		r.log.Warn("tls: the new certificate pair does not load; the current certificate stays in use",
			"cert_file", r.certFile, "err", err)
		return err
	}
	old := r.cert.Leaf
	r.cert, r.loaded, r.failed = cert, st, filesStamp{}
	r.log.Info("tls: certificate reloaded", "cert_file", r.certFile,
		"serial", cert.Leaf.SerialNumber.String(), "not_after", cert.Leaf.NotAfter.UTC().Format(time.RFC3339),
		"previous_serial", old.SerialNumber.String())
	return nil
}

func (r *CertReloader) stat() (filesStamp, error) {
	var st filesStamp
	for _, f := range []struct {
		name string
		to   *fileStamp
	}{{r.certFile, &st.cert}, {r.keyFile, &st.key}} {
		fi, err := os.Stat(f.name)
		if err != nil {
			return st, fmt.Errorf("tls: %w", err)
		}
		*f.to = fileStamp{size: fi.Size(), modTime: fi.ModTime()}
	}
	return st, nil
}

// load reads and checks the pair. Its errors name the files, never what is
// in the key file.
func (r *CertReloader) load() (*tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return nil, fmt.Errorf("tls: load %s and %s: %w", r.certFile, r.keyFile, err)
	}
	if cert.Leaf == nil { // filled in by LoadX509KeyPair since Go 1.23
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("tls: parse %s: %w", r.certFile, err)
		}
	}
	return &cert, nil
}
