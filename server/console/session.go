package console

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/server/auth"
)

// CookieName is the console's session cookie.
const CookieName = "cheetah_console"

// CSRFHeader carries the session's CSRF token on every request that changes
// anything.
const CSRFHeader = "X-CSRF-Token"

// Session lifetimes: a session ends after IdleTimeout without a request, and
// MaxAge after sign-in in any case.
const (
	DefaultIdleTimeout = 30 * time.Minute
	DefaultMaxAge      = 12 * time.Hour
	// maxSessions bounds the sessions held in memory; signing in beyond it
	// drops the expired ones, or else ends the oldest one.
	maxSessions = 1024
)

// session is one signed-in browser. It holds the id of the admin key that
// signed in, never the key.
type session struct {
	id      string // the cookie's value
	csrf    string
	keyID   string
	keyName string
	created time.Time
	seen    time.Time
	done    chan struct{} // closed when the session ends
	streams atomic.Int32  // its open event streams
}

// expiresAt is when s ends unless it is used again.
func (s *session) expiresAt(idle, maxAge time.Duration) time.Time {
	t := s.seen.Add(idle)
	if hard := s.created.Add(maxAge); hard.Before(t) {
		return hard
	}
	return t
}

// sessions is the in-memory session table. A broker restart signs every
// browser out.
type sessions struct {
	mu   sync.Mutex
	byID map[string]*session
}

// add holds s. When the table is full it first drops the sessions that
// have expired, then, if none had, the oldest.
func (t *sessions) add(s *session, now time.Time, idle, maxAge time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.byID) >= maxSessions {
		for _, o := range t.byID {
			if !now.Before(o.expiresAt(idle, maxAge)) {
				t.endLocked(o)
			}
		}
	}
	if len(t.byID) >= maxSessions {
		var oldest *session
		for _, o := range t.byID {
			if oldest == nil || o.created.Before(oldest.created) {
				oldest = o
			}
		}
		t.endLocked(oldest)
	}
	t.byID[s.id] = s
}

// get returns the live session with id, or nil; touch counts this as a use
// of it. An expired one is ended on the way.
func (t *sessions) get(id string, now time.Time, idle, maxAge time.Duration, touch bool) *session {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.byID[id]
	if s == nil {
		return nil
	}
	if !now.Before(s.expiresAt(idle, maxAge)) {
		t.endLocked(s)
		return nil
	}
	if touch {
		s.seen = now
	}
	return s
}

func (t *sessions) end(s *session) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.endLocked(s)
}

func (t *sessions) endLocked(s *session) {
	if t.byID[s.id] == s {
		delete(t.byID, s.id)
		close(s.done)
	}
}

func randomToken() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic("console: crypto/rand: " + err.Error())
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

var (
	errNoSession = &cheetah.Error{Code: cheetah.CodeUnauthorized, Message: "sign in to the console again: the session ended"}
	errCSRF      = &cheetah.Error{Code: cheetah.CodeForbidden, Message: "the " + CSRFHeader + " header is missing or does not match the session"}
	errOrigin    = &cheetah.Error{Code: cheetah.CodeForbidden, Message: "a console request must come from the console's own origin"}
)

// safeMethod reports whether m changes nothing, so needs no CSRF token.
func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// sameOrigin reports whether a browser request came from a page of this
// server, as the browser tells (Sec-Fetch-Site, sent by every current
// browser): a request it marks as coming from elsewhere is refused even with
// the right CSRF token. The header is read rather than Origin compared with
// Host, because a reverse proxy in front of the broker rewrites Host (see
// docs/operations.md). A request without it (not a current browser) is
// judged by its CSRF token alone.
func sameOrigin(r *http.Request) bool {
	site := r.Header.Get("Sec-Fetch-Site")
	return site == "" || site == "same-origin"
}

// lookup returns the request's session and the key that signed in to it.
// Without a session cookie ok is false. A session that ended, a key revoked
// since, or, on a request that changes anything, a missing or wrong CSRF
// token or a foreign Origin, is an error.
func (c *Console) lookup(r *http.Request) (s *session, key auth.Key, ok bool, err error) {
	ck, cerr := r.Cookie(CookieName)
	if cerr != nil || ck.Value == "" {
		return nil, auth.Key{}, false, nil
	}
	s = c.sessions.get(ck.Value, c.clock.Now(), c.idle, c.maxAge, true)
	if s == nil {
		return nil, auth.Key{}, true, errNoSession
	}
	if !safeMethod(r.Method) {
		if !sameOrigin(r) {
			return nil, auth.Key{}, true, errOrigin
		}
		got := r.Header.Get(CSRFHeader)
		if got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(s.csrf)) != 1 {
			return nil, auth.Key{}, true, errCSRF
		}
	}
	key, err = c.keys.Active(r.Context(), s.keyID)
	if err != nil {
		if errors.Is(err, cheetah.ErrUnauthorized) {
			c.sessions.end(s)
			return nil, auth.Key{}, true, errNoSession
		}
		return nil, auth.Key{}, true, cheetah.StoreUnavailable("console session", err)
	}
	return s, key, true, nil
}

// Authenticate is how the API's routes admit the console: it returns the
// admin key of the request's console session. ok is false when the request
// carries no session cookie (the API then asks for a bearer key); err says
// why a request that carries one is refused.
func (c *Console) Authenticate(r *http.Request) (key auth.Key, ok bool, err error) {
	_, key, ok, err = c.lookup(r)
	return key, ok, err
}

// setCookie writes the session cookie: HttpOnly, SameSite=Strict, Secure
// when the request came over TLS, for the whole origin (the console calls
// the API under /api/v1).
func setCookie(w http.ResponseWriter, r *http.Request, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{
		Name: CookieName, Value: value, Path: "/", MaxAge: maxAge,
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode,
	})
}

// signIn checks an admin key and opens a session for it.
func (c *Console) signIn(ctx context.Context, secret string) (*session, error) {
	key, err := c.keys.Verify(ctx, secret)
	if err != nil {
		if errors.Is(err, cheetah.ErrUnauthorized) {
			return nil, &cheetah.Error{Code: cheetah.CodeUnauthorized, Message: "the key is not valid"}
		}
		return nil, cheetah.StoreUnavailable("console sign-in", err)
	}
	if key.Kind != auth.Admin {
		return nil, &cheetah.Error{Code: cheetah.CodeForbidden, Message: "only an admin key signs in to the console"}
	}
	now := c.clock.Now()
	s := &session{id: randomToken(), csrf: randomToken(), keyID: key.ID, keyName: key.Name,
		created: now, seen: now, done: make(chan struct{})}
	c.sessions.add(s, now, c.idle, c.maxAge)
	return s, nil
}
