// Package console is the broker's admin console: a web page at /ui/ for
// the operators of a fleet, served by the broker from assets embedded in
// the binary (plain ES modules and CSS; nothing is fetched from elsewhere).
//
// An operator signs in with an admin key, which the console exchanges for a
// session cookie (HttpOnly, SameSite=Strict, Secure over TLS) and never
// keeps in the page. Sessions live in the broker's memory: a restart signs
// every browser out. The page then calls the API under /api/v1 with that
// cookie, as the admin key would: the server admits a console session
// through Authenticate, and every request that changes anything must carry
// the session's CSRF token in X-CSRF-Token and come from the console's own
// origin. The overview is kept live by a server-sent event stream at
// /ui/api/events, fed by the registry's event stream.
//
// Everything a client reports and everything history holds is shown as
// text: the page builds its DOM with textContent, and a strict
// Content-Security-Policy allows no inline script or style.
package console

import (
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/jonboulle/clockwork"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/server/auth"
)

//go:embed assets
var assets embed.FS

// ContentSecurityPolicy is sent with every page and asset of the console:
// scripts and styles only from the broker's own files, images from there
// and from data: URLs (captures), connections only back to the broker.
const ContentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"

// Registry is what the console reads of the registry.
type Registry interface {
	Subscribe(f func(registry.Event)) (cancel func())
	Pools() []registry.PoolView
	Clients(userID string) []registry.ClientView
	Leases(userID, taskID string) []cheetah.Lease
	ListAvailable(ctx context.Context, userID string, clientType cheetah.ClientType) ([]cheetah.ContextSnapshot, error)
}

// Keys is what the console needs of the broker's keys.
type Keys interface {
	Verify(ctx context.Context, token string) (auth.Key, error)
	Active(ctx context.Context, id string) (auth.Key, error)
}

// Config wires a Console.
type Config struct {
	Registry Registry
	Keys     Keys
	Clock    clockwork.Clock
	// Fail answers an error in the API's envelope.
	Fail func(*gin.Context, error)
	// IdleTimeout ends a session unused for that long (30 minutes); MaxAge
	// ends any session that long after sign-in (12 hours).
	IdleTimeout, MaxAge time.Duration
	// KeepAlive is how often an idle event stream sends a comment, so that
	// proxies keep it open and an ended session is noticed (15 s).
	KeepAlive time.Duration
}

// Console serves the admin console.
type Console struct {
	reg       Registry
	keys      Keys
	clock     clockwork.Clock
	fail      func(*gin.Context, error)
	idle      time.Duration
	maxAge    time.Duration
	keepAlive time.Duration
	sessions  sessions
	assets    map[string]asset

	mu       sync.Mutex
	watchers map[chan struct{}]struct{}
	closed   chan struct{}
	once     sync.Once
	unsub    func()
}

// New returns a Console. It subscribes to the registry's events at once.
func New(cfg Config) *Console {
	if cfg.Clock == nil {
		cfg.Clock = clockwork.NewRealClock()
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.MaxAge == 0 {
		cfg.MaxAge = DefaultMaxAge
	}
	if cfg.KeepAlive == 0 {
		cfg.KeepAlive = 15 * time.Second
	}
	c := &Console{
		reg: cfg.Registry, keys: cfg.Keys, clock: cfg.Clock, fail: cfg.Fail,
		idle: cfg.IdleTimeout, maxAge: cfg.MaxAge, keepAlive: cfg.KeepAlive,
		sessions: sessions{byID: map[string]*session{}}, assets: loadAssets(),
		watchers: map[chan struct{}]struct{}{}, closed: make(chan struct{}),
	}
	c.unsub = c.reg.Subscribe(func(ev registry.Event) {
		// Commands do not change the overview; leases and clients do.
		if !strings.HasPrefix(string(ev.Kind), "command.") {
			c.Changed()
		}
	})
	return c
}

// Changed tells the open event streams that the registry's state changed.
// The registry's events say so for leases and clients; the server calls it
// after a client's state report, which changes contexts without an event.
func (c *Console) Changed() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for w := range c.watchers {
		select {
		case w <- struct{}{}:
		default: // a wake-up is already pending: the next snapshot covers this
		}
	}
}

// Close ends every event stream and stops listening to the registry. The
// sessions stay (a draining broker still answers the page's reads).
func (c *Console) Close() {
	c.once.Do(func() {
		c.unsub()
		close(c.closed)
	})
}

// asset is one embedded file of the page.
type asset struct {
	typ  string
	body []byte
}

// loadAssets reads the embedded files, by the path they are served at.
func loadAssets() map[string]asset {
	files, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err)
	}
	out := map[string]asset{}
	err = fs.WalkDir(files, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := fs.ReadFile(files, p)
		if err != nil {
			return err
		}
		typ := mime.TypeByExtension(path.Ext(p))
		if path.Ext(p) == ".js" {
			typ = "text/javascript; charset=utf-8"
		}
		route := "/ui/" + p
		if p == "index.html" {
			route = "/ui/"
		}
		out[route] = asset{typ: typ, body: body}
		return nil
	})
	if err != nil {
		panic(err)
	}
	return out
}

// Serve answers the console's requests: the page and its files under /ui/,
// the session at /ui/api/session and the event stream at /ui/api/events.
// It reports false, answering nothing, for any other path. The server calls
// it for the paths its API routes do not know: the console is a page, not
// a part of the API its OpenAPI document describes.
func (c *Console) Serve(ctx *gin.Context) bool {
	p, m := ctx.Request.URL.Path, ctx.Request.Method
	var handlers map[string]gin.HandlerFunc
	switch p {
	case "/ui":
		handlers = map[string]gin.HandlerFunc{http.MethodGet: func(ctx *gin.Context) {
			ctx.Redirect(http.StatusMovedPermanently, "/ui/")
		}}
	case "/ui/api/session":
		handlers = map[string]gin.HandlerFunc{http.MethodPost: c.postSession, http.MethodGet: c.getSession,
			http.MethodDelete: c.deleteSession}
	case "/ui/api/events":
		handlers = map[string]gin.HandlerFunc{http.MethodGet: c.events}
	default:
		a, ok := c.assets[p]
		if !ok {
			return false
		}
		handlers = map[string]gin.HandlerFunc{http.MethodGet: func(ctx *gin.Context) {
			headers(ctx)
			ctx.Header("Cache-Control", "no-cache")
			ctx.Data(http.StatusOK, a.typ, a.body)
		}}
	}
	if m == http.MethodHead {
		m = http.MethodGet
	}
	h, ok := handlers[m]
	if !ok {
		allow := make([]string, 0, len(handlers))
		for k := range handlers {
			allow = append(allow, k)
		}
		slices.Sort(allow)
		ctx.Header("Allow", strings.Join(allow, ", "))
		c.fail(ctx, &cheetah.Error{Code: cheetah.CodeMethodNotAllowed,
			Message: fmt.Sprintf("%s is not allowed here; allowed: %s", ctx.Request.Method, strings.Join(allow, ", "))})
		return true
	}
	h(ctx)
	return true
}

// headers are the security headers of every console answer.
func headers(ctx *gin.Context) {
	h := ctx.Writer.Header()
	h.Set("Content-Security-Policy", ContentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
}

// sessionInfo is what the page learns of its session: never the key.
type sessionInfo struct {
	CSRFToken string    `json:"csrf_token"`
	KeyID     string    `json:"key_id"`
	KeyName   string    `json:"key_name"`
	ExpiresAt time.Time `json:"expires_at"`
}

func (c *Console) info(s *session) sessionInfo {
	return sessionInfo{CSRFToken: s.csrf, KeyID: s.keyID, KeyName: s.keyName, ExpiresAt: s.expiresAt(c.idle, c.maxAge).UTC()}
}

// maxSignInBody bounds the sign-in request: a key is under 100 bytes.
const maxSignInBody = 4 << 10

func (c *Console) postSession(ctx *gin.Context) {
	headers(ctx)
	ctx.Header("Cache-Control", "no-store")
	// A JSON body cannot come from another site's form without a CORS
	// preflight, which the broker never grants: nobody can be signed in to
	// the console by another page.
	if !sameOrigin(ctx.Request) || !strings.HasPrefix(ctx.GetHeader("Content-Type"), "application/json") {
		c.fail(ctx, errOrigin)
		return
	}
	var b struct {
		Key string `json:"key"`
	}
	dec := json.NewDecoder(io.LimitReader(ctx.Request.Body, maxSignInBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil || b.Key == "" {
		c.fail(ctx, cheetah.Invalidf("the body must be {\"key\": \"<admin key>\"}"))
		return
	}
	s, err := c.signIn(ctx.Request.Context(), b.Key)
	if err != nil {
		c.fail(ctx, err)
		return
	}
	// A browser signing in again leaves its previous session behind.
	if old, err := ctx.Request.Cookie(CookieName); err == nil {
		if prev := c.sessions.get(old.Value, c.clock.Now(), c.idle, c.maxAge, false); prev != nil {
			c.sessions.end(prev)
		}
	}
	setCookie(ctx.Writer, ctx.Request, s.id, int(c.maxAge/time.Second))
	ctx.JSON(http.StatusCreated, c.info(s))
}

// session answers the console's own requests: it writes the security
// headers and returns the request's session, or answers why there is none
// and returns nil.
func (c *Console) session(ctx *gin.Context) *session {
	headers(ctx)
	ctx.Header("Cache-Control", "no-store")
	s, _, ok, err := c.lookup(ctx.Request)
	if !ok {
		err = errNoSession
	}
	if err != nil {
		c.fail(ctx, err)
		return nil
	}
	return s
}

func (c *Console) getSession(ctx *gin.Context) {
	if s := c.session(ctx); s != nil {
		ctx.JSON(http.StatusOK, c.info(s))
	}
}

func (c *Console) deleteSession(ctx *gin.Context) {
	s := c.session(ctx)
	if s == nil {
		return
	}
	c.sessions.end(s)
	setCookie(ctx.Writer, ctx.Request, "", -1)
	ctx.JSON(http.StatusOK, gin.H{"signed_out": true})
}
