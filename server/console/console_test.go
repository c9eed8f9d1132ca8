package console_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/agent"
	"github.com/cheetahbroker/cheetah/internal/syncbuf"
	"github.com/cheetahbroker/cheetah/server"
	"github.com/cheetahbroker/cheetah/server/auth"
	"github.com/cheetahbroker/cheetah/server/console"
)

// signIn posts key to the console's session endpoint with client, which
// keeps the cookie, and returns the answer.
func signIn(t *testing.T, client *http.Client, base, key string) (*http.Response, map[string]any) {
	t.Helper()
	body, _ := json.Marshal(map[string]string{"key": key})
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/ui/api/session", strings.NewReader(string(body)))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	raw, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(raw, &out)
	return resp, out
}

// do sends a request with client's cookies, with the CSRF token when it is
// not empty and the console's Origin.
func do(t *testing.T, client *http.Client, method, url, csrf string, body string) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, url, rd)
	require.NoError(t, err)
	if csrf != "" {
		req.Header.Set(console.CSRFHeader, csrf)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, raw
}

func sessionCookie(t *testing.T, resp *http.Response) *http.Cookie {
	t.Helper()
	for _, c := range resp.Cookies() {
		if c.Name == console.CookieName {
			return c
		}
	}
	t.Fatalf("no %s cookie in %v", console.CookieName, resp.Header.Values("Set-Cookie"))
	return nil
}

func TestSignInCookie(t *testing.T) {
	var logs syncbuf.Buffer
	br := startBroker(t, server.Options{Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	client := cookieClient(t)

	resp, info := signIn(t, client, br.url, adminKey)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%v", info)
	ck := sessionCookie(t, resp)
	require.True(t, ck.HttpOnly, "the session cookie is HttpOnly")
	require.Equal(t, http.SameSiteStrictMode, ck.SameSite)
	require.Equal(t, "/", ck.Path)
	require.False(t, ck.Secure, "over plain HTTP the cookie cannot be Secure")
	require.Positive(t, ck.MaxAge)
	require.Len(t, ck.Value, 43, "32 random bytes")
	require.NotEmpty(t, info["csrf_token"])
	require.NotEqual(t, ck.Value, info["csrf_token"], "the CSRF token is not the session id")
	// The answer never holds the key.
	raw, _ := json.Marshal(info)
	require.NotContains(t, string(raw), adminKey)
	require.Equal(t, auth.BootstrapID, info["key_id"])

	// The cookie is the admin key for reads.
	st, body := do(t, client, http.MethodGet, br.url+"/api/v1/admin/pools", "", "")
	require.Equal(t, http.StatusOK, st, "%s", body)

	// Signing in again ends the session the browser had.
	resp2, _ := signIn(t, client, br.url, adminKey)
	require.Equal(t, http.StatusCreated, resp2.StatusCode)
	require.NotEqual(t, ck.Value, sessionCookie(t, resp2).Value)
	old, err := http.NewRequestWithContext(t.Context(), http.MethodGet, br.url+"/ui/api/session", nil)
	require.NoError(t, err)
	old.AddCookie(&http.Cookie{Name: console.CookieName, Value: ck.Value})
	resp, err = http.DefaultClient.Do(old)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "the previous session still answers")

	// A sign-in that is not JSON, or that the browser says comes from
	// another site, is refused.
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, br.url+"/ui/api/session",
		strings.NewReader(`{"key":"`+adminKey+`"}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "text/plain")
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	req, err = http.NewRequestWithContext(t.Context(), http.MethodPost, br.url+"/ui/api/session",
		strings.NewReader(`{"key":"`+adminKey+`"}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	require.Empty(t, resp.Cookies())

	// A wrong key, and a key that is not an admin's, open no session.
	resp, _ = signIn(t, cookieClient(t), br.url, "chk_nobody_0000")
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	client2 := br.clientKey(t, "usr_c")
	resp, _ = signIn(t, cookieClient(t), br.url, client2)
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	require.Empty(t, resp.Cookies())

	// No key, no session id and no CSRF token is ever logged.
	require.NotEmpty(t, logs.String())
	for _, secret := range []string{adminKey, client2, ck.Value, info["csrf_token"].(string)} {
		require.NotContains(t, logs.String(), secret)
	}
}

func TestSignInCookieSecureOverTLS(t *testing.T) {
	b, err := server.Open(t.Context(), server.Options{DataDir: t.TempDir(), AdminKey: adminKey})
	require.NoError(t, err)
	ts := httptest.NewTLSServer(b.Server.Handler())
	t.Cleanup(func() {
		ts.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, b.Close(ctx))
	})
	client := ts.Client()
	client.Transport.(*http.Transport).TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // the test server's own certificate
	resp, _ := signIn(t, client, ts.URL, adminKey)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	ck := sessionCookie(t, resp)
	require.True(t, ck.Secure, "over TLS the cookie is Secure")
	require.True(t, ck.HttpOnly)
	require.Equal(t, http.SameSiteStrictMode, ck.SameSite)
}

func TestCSRF(t *testing.T) {
	br := startBroker(t, server.Options{})
	client := cookieClient(t)
	_, info := signIn(t, client, br.url, adminKey)
	csrf := info["csrf_token"].(string)
	body := `{"kind":"app","name":"from the console"}`

	// Without the token, with another token: refused, and nothing made.
	st, raw := do(t, client, http.MethodPost, br.url+"/api/v1/admin/keys", "", body)
	require.Equal(t, http.StatusForbidden, st, "%s", raw)
	require.Equal(t, cheetah.CodeForbidden, errorOf(t, raw).Code)
	st, raw = do(t, client, http.MethodPost, br.url+"/api/v1/admin/keys", csrf+"x", body)
	require.Equal(t, http.StatusForbidden, st, "%s", raw)
	keys, err := br.b.Keys.List(t.Context())
	require.NoError(t, err)
	require.Empty(t, keys, "a refused request made a key")

	// Revoke and disconnect are refused the same way.
	st, _ = do(t, client, http.MethodPost, br.url+"/api/v1/admin/users/usr_a/clients/c1/contexts/x1/revoke", "", "")
	require.Equal(t, http.StatusForbidden, st)
	st, _ = do(t, client, http.MethodDelete, br.url+"/api/v1/admin/users/usr_a/clients/c1", "", "")
	require.Equal(t, http.StatusForbidden, st)

	// From another origin, even with the token: refused.
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, br.url+"/api/v1/admin/keys", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set(console.CSRFHeader, csrf)
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	resp, err := client.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)

	// With it: made.
	st, raw = do(t, client, http.MethodPost, br.url+"/api/v1/admin/keys", csrf, body)
	require.Equal(t, http.StatusCreated, st, "%s", raw)

	// Signing out needs the token too; then the cookie is worth nothing.
	st, _ = do(t, client, http.MethodDelete, br.url+"/ui/api/session", "", "")
	require.Equal(t, http.StatusForbidden, st)
	st, _ = do(t, client, http.MethodDelete, br.url+"/ui/api/session", csrf, "")
	require.Equal(t, http.StatusOK, st)
	st, _ = do(t, client, http.MethodGet, br.url+"/api/v1/admin/pools", "", "")
	require.Equal(t, http.StatusUnauthorized, st)

	// A bearer key never needs the token: the API's callers are unchanged.
	st, raw = br.api(t, adminKey, http.MethodPost, "/api/v1/admin/keys", nil, map[string]string{"kind": "app", "name": "by key"}, nil)
	require.Equal(t, http.StatusCreated, st, "%s", raw)
}

func TestSessionExpiresAndEndsWithItsKey(t *testing.T) {
	clock := clockwork.NewFakeClock()
	br := startBroker(t, server.Options{Clock: clock})

	// Unused for the idle timeout: over.
	client := cookieClient(t)
	signIn(t, client, br.url, adminKey)
	st, _ := do(t, client, http.MethodGet, br.url+"/ui/api/session", "", "")
	require.Equal(t, http.StatusOK, st)
	clock.Advance(console.DefaultIdleTimeout - time.Second)
	st, _ = do(t, client, http.MethodGet, br.url+"/api/v1/admin/pools", "", "")
	require.Equal(t, http.StatusOK, st, "used within the idle timeout")
	clock.Advance(console.DefaultIdleTimeout)
	st, raw := do(t, client, http.MethodGet, br.url+"/api/v1/admin/pools", "", "")
	require.Equal(t, http.StatusUnauthorized, st, "%s", raw)
	st, _ = do(t, client, http.MethodGet, br.url+"/ui/api/session", "", "")
	require.Equal(t, http.StatusUnauthorized, st)

	// Used all the time, it still ends at the maximum age.
	client = cookieClient(t)
	signIn(t, client, br.url, adminKey)
	for elapsed := time.Duration(0); elapsed < console.DefaultMaxAge-console.DefaultIdleTimeout; elapsed += console.DefaultIdleTimeout / 2 {
		clock.Advance(console.DefaultIdleTimeout / 2)
		st, _ = do(t, client, http.MethodGet, br.url+"/ui/api/session", "", "")
		require.Equal(t, http.StatusOK, st, "after %s", elapsed)
	}
	clock.Advance(console.DefaultIdleTimeout)
	st, _ = do(t, client, http.MethodGet, br.url+"/ui/api/session", "", "")
	require.Equal(t, http.StatusUnauthorized, st, "past the maximum age")

	// A key revoked after it signed in ends its sessions.
	made, err := br.b.Keys.Create(t.Context(), auth.Admin, "", "operator")
	require.NoError(t, err)
	client = cookieClient(t)
	resp, _ := signIn(t, client, br.url, made.Secret)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	st, _ = do(t, client, http.MethodGet, br.url+"/api/v1/admin/keys", "", "")
	require.Equal(t, http.StatusOK, st)
	st, _ = br.api(t, adminKey, http.MethodDelete, "/api/v1/admin/keys/"+made.ID, nil, nil, nil)
	require.Equal(t, http.StatusOK, st)
	st, _ = do(t, client, http.MethodGet, br.url+"/api/v1/admin/keys", "", "")
	require.Equal(t, http.StatusUnauthorized, st)
}

func TestPageHeadersAndAssets(t *testing.T) {
	br := startBroker(t, server.Options{})
	for _, p := range []string{"/ui/", "/ui/app.js", "/ui/style.css", "/ui/icon.svg"} {
		resp, err := http.Get(br.url + p)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, p)
		require.Equal(t, console.ContentSecurityPolicy, resp.Header.Get("Content-Security-Policy"), p)
		require.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"), p)
		require.Equal(t, "DENY", resp.Header.Get("X-Frame-Options"), p)
	}
	csp := console.ContentSecurityPolicy
	require.NotContains(t, csp, "unsafe-inline")
	require.NotContains(t, csp, "unsafe-eval")
	require.Contains(t, csp, "script-src 'self'")

	resp, err := http.Get(br.url + "/ui/app.js")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, "text/javascript; charset=utf-8", resp.Header.Get("Content-Type"))

	// /ui leads to /ui/; an unknown file under /ui/ is the API's 404.
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err = noRedirect.Get(br.url + "/ui")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusMovedPermanently, resp.StatusCode)
	require.Equal(t, "/ui/", resp.Header.Get("Location"))
	st, raw := br.api(t, "", http.MethodGet, "/ui/nothing.js", nil, nil, nil)
	require.Equal(t, http.StatusNotFound, st)
	require.Equal(t, cheetah.CodeNotFound, errorOf(t, raw).Code)
	st, raw = br.api(t, "", http.MethodPut, "/ui/api/session", nil, nil, nil)
	require.Equal(t, http.StatusMethodNotAllowed, st, "%s", raw)

	// The served page is the files in assets/, with no inline script or
	// style and no markup built from strings.
	inline := regexp.MustCompile(`(?i)<script(?:\s[^>]*)?>\s*[^<\s]|\son[a-z]+\s*=|\sstyle\s*=|<style`)
	risky := regexp.MustCompile(`innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(|new Function`)
	err = fs.WalkDir(os.DirFS("assets"), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(filepath.Join("assets", p))
		require.NoError(t, err)
		route := "/ui/" + p
		if p == "index.html" {
			route = "/ui/"
			require.False(t, inline.Match(b), "index.html has inline script or style")
		}
		if strings.HasSuffix(p, ".js") {
			require.False(t, risky.Match(b), "%s builds markup from strings or evaluates code", p)
		}
		st, served := br.api(t, "", http.MethodGet, route, nil, nil, nil)
		require.Equal(t, http.StatusOK, st, route)
		require.Equal(t, string(b), string(served), "%s is served as it is in assets/", route)
		return nil
	})
	require.NoError(t, err)
}

// sse reads server-sent events from a stream.
type sse struct{ r *bufio.Reader }

// next returns the next event's name and data, skipping comments.
func (s *sse) next(t *testing.T) (string, string) {
	t.Helper()
	var name, data string
	for {
		line, err := s.r.ReadString('\n')
		require.NoError(t, err)
		line = strings.TrimRight(line, "\n")
		switch {
		case line == "" && name != "":
			return name, data
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data = strings.TrimPrefix(line, "data: ")
		}
	}
}

// overview reads events until one overview satisfies cond.
func (s *sse) overview(t *testing.T, cond func(console.Overview) bool) console.Overview {
	t.Helper()
	for {
		name, data := s.next(t)
		if name != "overview" {
			continue
		}
		var o console.Overview
		require.NoError(t, json.Unmarshal([]byte(data), &o))
		if cond(o) {
			return o
		}
	}
}

// openStream opens the console's event stream with client's session; it
// is closed when the test ends, or after 30 s.
func openStream(t *testing.T, client *http.Client, base string) *sse {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/ui/api/events", nil)
	require.NoError(t, err)
	resp, err := client.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	return &sse{r: bufio.NewReader(resp.Body)}
}

func TestEventStream(t *testing.T) {
	br := startBroker(t, server.Options{})
	client := cookieClient(t)
	_, info := signIn(t, client, br.url, adminKey)

	// Without a session: no stream.
	st, _ := br.api(t, "", http.MethodGet, "/ui/api/events", nil, nil, nil)
	require.Equal(t, http.StatusUnauthorized, st)

	s := openStream(t, client, br.url)
	first := s.overview(t, func(console.Overview) bool { return true })
	require.Empty(t, first.Users)

	// A client connects: the stream shows it with its contexts, no poll.
	a := agent.New(agent.Config{URL: br.url, Token: br.clientKey(t, "usr_sse"), ClientID: "agent-sse",
		Name: "sse agent", Version: "1.2.3", Labels: map[string]string{"rack": "r1"}, Flows: 2})
	actx, stop := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- a.Run(actx) }()
	t.Cleanup(func() { stop(); <-done })
	o := s.overview(t, func(o console.Overview) bool {
		return len(o.Users) == 1 && len(o.Users[0].Idle) == 2
	})
	u := o.Users[0]
	require.Equal(t, "usr_sse", u.UserID)
	require.Len(t, u.Clients, 1)
	require.Equal(t, "sse agent", u.Clients[0].Name)
	require.Equal(t, "1.2.3", u.Clients[0].Version)
	require.Equal(t, map[string]string{"rack": "r1"}, u.Clients[0].Labels)
	require.True(t, u.Clients[0].Connected)
	require.NotNil(t, u.Clients[0].ConnectedAt)
	require.Equal(t, 2, u.Contexts[cheetah.StateIdle])

	// A lease appears, without its token.
	var acq struct{ Lease cheetah.Lease }
	st, raw := br.api(t, adminKey, http.MethodPost, "/api/v1/acquire", nil,
		map[string]any{"user_id": "usr_sse", "task_id": "t-sse", "client_type": "console", "ttl_s": 60}, &acq)
	require.Equal(t, http.StatusCreated, st, "%s", raw)
	o = s.overview(t, func(o console.Overview) bool { return len(o.Leases) == 1 })
	l := o.Leases[0]
	require.Equal(t, "t-sse", l.TaskID)
	require.Equal(t, acq.Lease.Epoch, l.Epoch)
	require.Empty(t, l.LeaseToken)
	require.True(t, l.ExpiresAt.Equal(acq.Lease.ExpiresAt))

	// Signing out ends the stream with a signed-out event.
	st, _ = do(t, client, http.MethodDelete, br.url+"/ui/api/session", info["csrf_token"].(string), "")
	require.Equal(t, http.StatusOK, st)
	for {
		name, _ := s.next(t)
		if name == "signed-out" {
			break
		}
	}
	_, err := s.r.ReadString('\n')
	require.ErrorIs(t, err, io.EOF, "the stream ends after signed-out")
}

func TestEventStreamsPerSession(t *testing.T) {
	br := startBroker(t, server.Options{})
	client := cookieClient(t)
	signIn(t, client, br.url, adminKey)
	for range console.MaxStreams {
		s := openStream(t, client, br.url)
		s.overview(t, func(console.Overview) bool { return true })
	}
	st, raw := do(t, client, http.MethodGet, br.url+"/ui/api/events", "", "")
	require.Equal(t, http.StatusTooManyRequests, st, "%s", raw)
	require.Equal(t, cheetah.CodeRateLimited, errorOf(t, raw).Code)
	// Another session has streams of its own.
	other := cookieClient(t)
	signIn(t, other, br.url, adminKey)
	openStream(t, other, br.url).overview(t, func(console.Overview) bool { return true })
}

// TestDrainEndsEventStreams: a draining broker ends the console's streams,
// which would otherwise hold an HTTP server's graceful shutdown until its
// deadline.
func TestDrainEndsEventStreams(t *testing.T) {
	br := startBroker(t, server.Options{})
	client := cookieClient(t)
	signIn(t, client, br.url, adminKey)
	s := openStream(t, client, br.url)
	s.overview(t, func(console.Overview) bool { return true })
	br.b.Server.Drain()
	_, err := io.ReadAll(s.r)
	require.NoError(t, err, "the stream ends cleanly")
}
