// Package browsertest holds what the tests that drive Debian's chromium
// share: finding the browser, and waiting on what a page shows.
package browsertest

import (
	"context"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/cheetahbroker/cheetah/server"
)

// ChromiumPath is Debian's chromium, or $CHEETAH_CHROMIUM. The test fails
// rather than skips without it: a browser test that quietly does not run is
// a test nobody notices is missing.
func ChromiumPath(t testing.TB) string {
	t.Helper()
	p := os.Getenv("CHEETAH_CHROMIUM")
	if p == "" {
		p = "/usr/bin/chromium"
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("no chromium at %s (%v): `make test` installs Debian's chromium through scripts/ensure-chromium; "+
			"or run scripts/ensure-chromium, or set CHEETAH_CHROMIUM", p, err)
	}
	return p
}

// Eventually polls cond until it holds or timeout passes. It is for waiting
// on a browser, whose progress sends no signal to the test.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		select {
		case <-tick.C:
		case <-t.Context().Done():
			t.Fatalf("test ended waiting for %s", what)
		}
	}
}

// Flags are the command-line options of a headless chromium for a test, with
// its profile in profile: no sandbox (containers), no GPU, nothing fetched in
// the background, no first-run screens. A test adds its own after them.
func Flags(chromium, profile string) []chromedp.ExecAllocatorOption {
	return []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium),
		chromedp.UserDataDir(profile),
		chromedp.Flag("headless", "new"),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("no-default-browser-check", true),
		chromedp.Flag("disable-dev-shm-usage", true),
	}
}

// Broker opens a broker with o and serves it over HTTP on a loopback port
// until the test ends; it returns the broker and its base URL. The broker
// is closed first, then the HTTP server.
func Broker(t testing.TB, o server.Options) (*server.Broker, string) {
	t.Helper()
	b, err := server.Open(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: b.Server.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go hs.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := b.Close(ctx); err != nil {
			t.Errorf("close broker: %v", err)
		}
		hs.Close()
	})
	return b, "http://" + ln.Addr().String()
}
