// Package clustertest starts replicas of one broker on one PostgreSQL
// database (DESIGN §9) for tests, each served over HTTP and each reaching
// the database through a proxy of its own that a test may cut, and a
// round-robin balancer in front of them.
package clustertest

import (
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cheetahbroker/cheetah/history/historytest"
	"github.com/cheetahbroker/cheetah/internal/tcpproxy"
	"github.com/cheetahbroker/cheetah/server"
)

// AdminKey is every test replica's admin key.
const AdminKey = "cluster-test-admin-key-0123456789"

// Replica is one broker of a test cluster.
type Replica struct {
	Broker *server.Broker
	// URL is where it serves (and where the others reach it).
	URL string
	// Link is its own path to PostgreSQL: Cut it to cut the replica off.
	Link *tcpproxy.Proxy
	// DatabaseURL is the database as it reaches it, through Link.
	DatabaseURL string
}

// Start starts n replicas on one new PostgreSQL database and waits until
// each knows the others. opts, when given, adjusts each replica's options
// (the database, data directory, advertised URL and admin key are set).
func Start(tb testing.TB, n int, opts func(*server.Options)) []*Replica {
	tb.Helper()
	db := historytest.EmptyPostgres(tb)
	pg, err := url.Parse(db)
	if err != nil {
		tb.Fatalf("clustertest: %v", err)
	}
	rs := make([]*Replica, n)
	for i := range rs {
		var h atomic.Pointer[http.Handler]
		hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if hh := h.Load(); hh != nil {
				(*hh).ServeHTTP(w, r)
				return
			}
			http.Error(w, "starting", http.StatusServiceUnavailable)
		}))
		link := tcpproxy.Start(tb, "127.0.0.1:0", pg.Host)
		via := *pg
		via.Host = link.Addr()
		o := server.Options{ReplicaTTL: 3 * time.Second, ReconnectGrace: 5 * time.Second}
		if opts != nil {
			opts(&o)
		}
		o.DatabaseURL, o.DataDir, o.AdminKey, o.AdvertiseURL = via.String(), tb.TempDir(), AdminKey, hs.URL
		b, err := server.Open(context.Background(), o)
		if err != nil {
			hs.Close()
			tb.Fatalf("clustertest: open replica %d: %v", i, err)
		}
		handler := b.Server.Handler()
		h.Store(&handler)
		tb.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := b.Close(ctx); err != nil {
				tb.Errorf("clustertest: close replica: %v", err)
			}
			hs.Close()
		})
		rs[i] = &Replica{Broker: b, URL: hs.URL, Link: link, DatabaseURL: o.DatabaseURL}
	}
	for _, r := range rs {
		r.Broker.Cluster.Refresh(context.Background())
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, r := range rs {
		for len(r.Broker.Cluster.Peers()) != n-1 {
			if time.Now().After(deadline) {
				tb.Fatalf("clustertest: replica %s sees %d others, not %d", r.Broker.Cluster.ID(), len(r.Broker.Cluster.Peers()), n-1)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return rs
}

// Balancer serves a round-robin balancer in front of rs, as a user would
// put one: each request and each client connection goes to the next
// replica, with no stickiness. It returns the balancer's URL.
func Balancer(tb testing.TB, rs []*Replica) string {
	tb.Helper()
	urls := make([]string, len(rs))
	for i, r := range rs {
		urls[i] = r.URL
	}
	return BalancerOf(tb, urls)
}

// BalancerOf is Balancer in front of replicas at urls (processes, say).
// A replica that does not answer gets 502 from it, as from a balancer
// whose health check has not noticed yet.
func BalancerOf(tb testing.TB, urls []string) string {
	tb.Helper()
	targets := make([]*url.URL, len(urls))
	for i, u := range urls {
		t, err := url.Parse(u)
		if err != nil {
			tb.Fatalf("clustertest: %v", err)
		}
		targets[i] = t
	}
	var next atomic.Uint64
	lb := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(targets[next.Add(1)%uint64(len(targets))])
			pr.Out.Host = pr.In.Host
		},
		FlushInterval: -1,
		ErrorLog:      log.New(io.Discard, "", 0),
	})
	tb.Cleanup(lb.Close)
	return lb.URL
}
