// Package auth issues and checks the broker's API keys. A key is shown once,
// when it is made; the store keeps only a SHA-256 of its secret part, and a
// presented key is compared with that hash in constant time. Keys are long
// random strings, so a fast hash is enough: there is nothing to brute-force.
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/protocol"
)

// Kind is what a key may do.
type Kind string

// Key kinds.
const (
	// Client keys are bound to one user and may only open a WebSocket.
	Client Kind = "client"
	// App keys act for any user: the trusted back end.
	App Kind = "app"
	// Admin keys may do everything, cross-user views included.
	Admin Kind = "admin"
)

// BootstrapID is the id of the admin key given by CHEETAH_ADMIN_KEY, which
// lives only in the process environment.
const BootstrapID = "bootstrap"

const prefix = "chk_"

// bootstrapKey describes the key given by CHEETAH_ADMIN_KEY.
var bootstrapKey = Key{ID: BootstrapID, Kind: Admin, Name: "CHEETAH_ADMIN_KEY"}

// Key describes a key, never its secret.
type Key struct {
	ID        string     `json:"id"`
	Kind      Kind       `json:"kind"`
	UserID    string     `json:"user_id,omitempty"`
	TenantID  string     `json:"tenant_id,omitempty"`
	Name      string     `json:"name"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

// Created is the one answer that shows a key's secret and webhook secret.
type Created struct {
	Key
	Secret        string `json:"key"`
	WebhookSecret string `json:"webhook_secret,omitempty"`
}

// Store is the part of the history store that holds keys.
type Store interface {
	CreateKey(ctx context.Context, k history.Key) error
	GetKey(ctx context.Context, id string) (history.Key, error)
	ListKeys(ctx context.Context) ([]history.Key, error)
	RevokeKey(ctx context.Context, id string, at time.Time) (bool, error)
	CountActiveKeys(ctx context.Context, kind string) (int64, error)
}

// Keys issues and verifies keys. Verified keys are cached by id; revoking
// through Keys drops the cache entry at once. Among replicas, another
// replica's revocation reaches this one as Forget, and cached keys are read
// again after CacheFor (SetCacheFor) in case that message was lost.
type Keys struct {
	store     Store
	now       func() time.Time
	bootstrap []byte // SHA-256 of CHEETAH_ADMIN_KEY, nil when unset
	cacheFor  time.Duration

	mu    sync.Mutex
	cache map[string]cachedKey
	// misses remembers, for missTTL, key ids the store does not know: a
	// flood of made-up keys is refused before any per-key rate limit can
	// apply, and without it each one would cost a database query.
	misses map[string]time.Time
}

// cachedKey is a key as read from the store, and when.
type cachedKey struct {
	rec history.Key
	at  time.Time
}

// SetCacheFor makes a cached key be read from the store again once it is
// older than d; zero (the default) keeps it until revoked through Keys.
// Call it before the Keys are used.
func (k *Keys) SetCacheFor(d time.Duration) { k.cacheFor = d }

// missTTL is how long an unknown key id is refused without asking the
// store; maxMisses bounds that memory (when it is full it starts over).
const (
	missTTL   = 10 * time.Second
	maxMisses = 10_000
)

// New returns Keys over store. adminKey, when not empty, is an admin key.
func New(store Store, adminKey string, now func() time.Time) *Keys {
	k := &Keys{store: store, now: now, cache: map[string]cachedKey{}, misses: map[string]time.Time{}}
	if adminKey != "" {
		h := sha256.Sum256([]byte(adminKey))
		k.bootstrap = h[:]
	}
	return k
}

// HasBootstrap reports whether an admin key came from the environment.
func (k *Keys) HasBootstrap() bool { return k.bootstrap != nil }

// Create makes a key of kind for userID (client keys only) and returns it
// with its secret, the only time the secret is shown.
func (k *Keys) Create(ctx context.Context, kind Kind, userID, name string) (Created, error) {
	return k.Make(ctx, Spec{Kind: kind, UserID: userID, Name: name})
}

// Spec describes a key to make.
type Spec struct {
	Kind   Kind
	UserID string // client keys only
	// TenantID binds an app key to one tenant (DESIGN §10); app keys only.
	TenantID string
	Name     string
}

// Make makes the key sp describes and returns it with its secret, the only
// time the secret is shown.
func (k *Keys) Make(ctx context.Context, sp Spec) (Created, error) {
	kind, userID, name := sp.Kind, sp.UserID, sp.Name
	switch kind {
	case Client:
		if !protocol.ValidID(userID) {
			return Created{}, cheetah.Invalidf("a client key needs a valid user_id")
		}
	case App, Admin:
		if userID != "" {
			return Created{}, cheetah.Invalidf("an %s key acts for every user: leave user_id out", kind)
		}
	default:
		return Created{}, cheetah.Invalidf("kind must be client, app or admin")
	}
	if sp.TenantID != "" {
		if kind != App {
			return Created{}, cheetah.Invalidf("only an app key can be bound to a tenant: leave tenant_id out")
		}
		if err := cheetah.CheckID("tenant_id", sp.TenantID); err != nil {
			return Created{}, err
		}
	}
	if len(name) > cheetah.MaxKeyNameLen {
		return Created{}, cheetah.Invalidf("name must be at most %d bytes", cheetah.MaxKeyNameLen)
	}
	if err := cheetah.CheckText("name", name); err != nil {
		return Created{}, err
	}
	id := hex.EncodeToString(random(6))
	secret := base64.RawURLEncoding.EncodeToString(random(32))
	sum := sha256.Sum256([]byte(secret))
	rec := history.Key{ID: id, Kind: string(kind), UserID: userID, TenantID: sp.TenantID, Name: name, Hash: sum[:], CreatedAt: k.now().UTC()}
	if kind != Client {
		rec.WebhookSecret = "whsec_" + base64.StdEncoding.EncodeToString(random(24))
	}
	if err := k.store.CreateKey(ctx, rec); err != nil {
		return Created{}, fmt.Errorf("auth: create key: %w", err)
	}
	k.mu.Lock()
	delete(k.misses, id) // someone may have guessed it before it existed
	k.mu.Unlock()
	return Created{Key: toKey(rec), Secret: prefix + id + "_" + secret, WebhookSecret: rec.WebhookSecret}, nil
}

// Verify returns the key that token is, or an unauthorized error. It never
// says which part was wrong.
func (k *Keys) Verify(ctx context.Context, token string) (Key, error) {
	if k.bootstrap != nil {
		h := sha256.Sum256([]byte(token))
		if subtle.ConstantTimeCompare(h[:], k.bootstrap) == 1 {
			return bootstrapKey, nil
		}
	}
	id, secret, ok := strings.Cut(strings.TrimPrefix(token, prefix), "_")
	if !ok || !strings.HasPrefix(token, prefix) || id == "" {
		return Key{}, cheetah.ErrUnauthorized
	}
	rec, err := k.get(ctx, id)
	if err != nil {
		return Key{}, err
	}
	sum := sha256.Sum256([]byte(secret))
	if subtle.ConstantTimeCompare(sum[:], rec.Hash) != 1 || rec.RevokedAt != nil {
		return Key{}, cheetah.ErrUnauthorized
	}
	return toKey(rec), nil
}

func (k *Keys) get(ctx context.Context, id string) (history.Key, error) {
	now := k.now()
	k.mu.Lock()
	cached, ok := k.cache[id]
	until, missed := k.misses[id]
	k.mu.Unlock()
	if ok && (k.cacheFor == 0 || now.Sub(cached.at) < k.cacheFor) {
		return cached.rec, nil
	}
	if missed && now.Before(until) {
		return history.Key{}, cheetah.ErrUnauthorized
	}
	rec, err := k.store.GetKey(ctx, id)
	switch {
	case errors.Is(err, cheetah.ErrNotFound):
		k.mu.Lock()
		if len(k.misses) >= maxMisses {
			clear(k.misses)
		}
		k.misses[id] = now.Add(missTTL)
		k.mu.Unlock()
		return history.Key{}, cheetah.ErrUnauthorized
	case err != nil:
		return history.Key{}, err
	}
	k.mu.Lock()
	k.cache[id] = cachedKey{rec: rec, at: now}
	k.mu.Unlock()
	return rec, nil
}

// Active returns the key with id while it is active (not revoked), or an
// unauthorized error. The console uses it to end the sessions of a key that
// was revoked after it signed in.
func (k *Keys) Active(ctx context.Context, id string) (Key, error) {
	if id == BootstrapID {
		if k.bootstrap == nil {
			return Key{}, cheetah.ErrUnauthorized
		}
		return bootstrapKey, nil
	}
	rec, err := k.get(ctx, id)
	if err != nil {
		return Key{}, err
	}
	if rec.RevokedAt != nil {
		return Key{}, cheetah.ErrUnauthorized
	}
	return toKey(rec), nil
}

// WebhookSecret returns the webhook secret of an app or admin key.
func (k *Keys) WebhookSecret(ctx context.Context, id string) (string, error) {
	if id == BootstrapID {
		return "", nil
	}
	rec, err := k.get(ctx, id)
	if err != nil {
		return "", err
	}
	return rec.WebhookSecret, nil
}

// List returns every key, revoked ones included, without secrets.
func (k *Keys) List(ctx context.Context) ([]Key, error) {
	recs, err := k.store.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("auth: list keys: %w", err)
	}
	out := make([]Key, 0, len(recs))
	for _, r := range recs {
		out = append(out, toKey(r))
	}
	return out, nil
}

// Revoke revokes a key and reports whether it was active.
func (k *Keys) Revoke(ctx context.Context, id string) (bool, error) {
	ok, err := k.store.RevokeKey(ctx, id, k.now().UTC())
	if err != nil {
		return false, fmt.Errorf("auth: revoke key: %w", err)
	}
	k.Forget(id)
	return ok, nil
}

// Forget drops what Keys remembers of key id, so that its next use reads
// the store: another replica revoked it (server/cluster.go).
func (k *Keys) Forget(id string) {
	k.mu.Lock()
	delete(k.cache, id)
	k.mu.Unlock()
}

// EnsureAdmin makes an admin key when none came from the environment and
// none is active in the store, and returns its secret to be shown once. It
// returns "" when an admin key already exists.
func (k *Keys) EnsureAdmin(ctx context.Context) (string, error) {
	if k.bootstrap != nil {
		return "", nil
	}
	n, err := k.store.CountActiveKeys(ctx, string(Admin))
	if err != nil {
		return "", fmt.Errorf("auth: count admin keys: %w", err)
	}
	if n > 0 {
		return "", nil
	}
	c, err := k.Create(ctx, Admin, "", "first admin key")
	if err != nil {
		return "", err
	}
	return c.Secret, nil
}

func toKey(r history.Key) Key {
	return Key{ID: r.ID, Kind: Kind(r.Kind), UserID: r.UserID, TenantID: r.TenantID, Name: r.Name, CreatedAt: r.CreatedAt, RevokedAt: r.RevokedAt}
}

func random(n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("auth: crypto/rand: %v", err))
	}
	return b
}
