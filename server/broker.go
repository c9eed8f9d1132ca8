package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jonboulle/clockwork"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/server/auth"
)

// Options configure a whole broker. Zero values take the defaults of
// `cheetah serve`.
type Options struct {
	// DatabaseURL is postgres://… for PostgreSQL; empty for the embedded
	// SQLite file in DataDir.
	DatabaseURL string
	DataDir     string
	// AdminKey, when set, is accepted as an admin key.
	AdminKey        string
	DefaultTTL      time.Duration
	ReconnectGrace  time.Duration
	Heartbeat       time.Duration
	MaxMessageBytes int
	KeyRateLimit    float64
	FrameRateLimit  float64
	// MaxInFlightPerContext bounds each context's unfinished commands.
	MaxInFlightPerContext int
	AllowedOrigins        []string
	LoopbackOnly          bool
	Log                   *slog.Logger
	Clock                 clockwork.Clock
}

// Broker is the store, registry, keys and server wired together: what
// `cheetah serve` runs, and what an application embeds to use the SDK in
// process.
type Broker struct {
	Store    *history.Store
	Registry *registry.Registry
	Keys     *auth.Keys
	Server   *Server
}

// Open opens the store (applying migrations), marks commands left in flight
// by the last run interrupted, and starts the registry.
func Open(ctx context.Context, o Options) (*Broker, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Clock == nil {
		o.Clock = clockwork.NewRealClock()
	}
	store, err := history.Open(ctx, history.Config{DatabaseURL: o.DatabaseURL, DataDir: o.DataDir, Logger: o.Log})
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	n, err := store.MarkInterrupted(ctx, o.Clock.Now())
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("mark interrupted commands: %w", err)
	}
	if n > 0 {
		o.Log.Info("commands in flight at the last stop are now interrupted", "count", n)
	}
	reg, err := registry.New(ctx, registry.Config{
		Clock: o.Clock, Store: store, Log: o.Log, DefaultTTL: o.DefaultTTL,
		ReconnectGrace: o.ReconnectGrace, MaxMessageBytes: o.MaxMessageBytes,
		MaxInFlightPerContext: o.MaxInFlightPerContext,
	})
	if err != nil {
		store.Close()
		return nil, err
	}
	keys := auth.New(store, o.AdminKey, o.Clock.Now)
	srv, err := New(Config{
		Registry: reg, Store: store, Keys: keys, Log: o.Log, Clock: o.Clock,
		Heartbeat: o.Heartbeat, MaxMessageBytes: o.MaxMessageBytes,
		KeyRateLimit: o.KeyRateLimit, FrameRateLimit: o.FrameRateLimit,
		AllowedOrigins: o.AllowedOrigins, LoopbackOnly: o.LoopbackOnly,
	})
	if err != nil {
		reg.Close()
		store.Close()
		return nil, err
	}
	return &Broker{Store: store, Registry: reg, Keys: keys, Server: srv}, nil
}

// Manager is the in-process SDK over this broker.
func (b *Broker) Manager() *cheetah.Manager { return cheetah.NewManager(b.Registry) }

// Close closes every client with 1001, stops the registry and flushes and
// closes the store.
func (b *Broker) Close(ctx context.Context) error {
	err := b.Server.Shutdown(ctx)
	b.Registry.Close()
	return errors.Join(err, b.Store.Close())
}
