// Package fuzz holds the fuzz targets of the reliability suite: the HTTP
// API's JSON bodies (and the path and header values around them) driven
// through the server's handler, and the state-report reconciler driven
// through registry.Report. Without -fuzz they replay their seeds and the
// crashers saved under testdata/fuzz, as regression tests.
package fuzz

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/history/historytest"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/server"
	"github.com/cheetahbroker/cheetah/server/auth"
)

const (
	fuzzAdmin = "fuzz-admin-key-0123456789abcdef0123"
	fuzzUser  = "usr_fuzz"
)

// statusOf is DESIGN §5's table of error codes and statuses.
var statusOf = map[string]int{
	"invalid_request": 400, "unauthorized": 401, "forbidden": 403, "not_found": 404,
	"no_context_available": 409, "payload_too_large": 413, "lease_lost": 423,
	"rate_limited": 429, "store_unavailable": 503, "overloaded": 503,
	"method_not_allowed": 405,
}

// answering is a client connection that answers every command at once with
// a result, as a well-behaved client would.
type answering struct {
	reg *registry.Registry
	att *registry.Attachment
	mu  sync.Mutex
}

func (a *answering) Send(f protocol.Frame) bool {
	if c, ok := f.(*protocol.Command); ok && c.ResponseMode != protocol.ResponseNone {
		go func() {
			a.mu.Lock()
			att := a.att
			a.mu.Unlock()
			a.reg.ClientMessage(context.Background(), att, &protocol.Result{CommandID: c.CommandID, Data: json.RawMessage(`{}`)})
		}()
	}
	return true
}
func (a *answering) Close(protocol.CloseCode, string) {}

type httpRig struct {
	b       *server.Broker
	handler http.Handler
	app     string
}

// newHTTPRig opens a broker for this fuzz target (one per fuzzing
// process), with a client of three contexts (two worker, one human) that
// answers everything; closed when the target ends.
func newHTTPRig(f *testing.F, databaseURL string) *httpRig {
	ctx := context.Background()
	b, err := server.Open(ctx, server.Options{DatabaseURL: databaseURL, DataDir: f.TempDir(), AdminKey: fuzzAdmin, MaxMessageBytes: 64 << 10, MaxBodyBytes: 64 << 10})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		_ = b.Close(cctx)
	})
	app, err := b.Keys.Create(ctx, auth.App, "", "fuzz")
	if err != nil {
		f.Fatal(err)
	}
	conn := &answering{reg: b.Registry}
	conn.mu.Lock()
	conn.att = b.Registry.Connect(registry.ClientInfo{UserID: fuzzUser, ClientID: "fz", Type: cheetah.Console}, conn)
	conn.mu.Unlock()
	b.Registry.Report(conn.att, []protocol.ContextReport{
		{ContextID: "c0", TabID: "0", Owner: protocol.OwnerWorker},
		{ContextID: "c1", TabID: "1", Owner: protocol.OwnerWorker},
		{ContextID: "c2", TabID: "2", Owner: protocol.OwnerHuman},
	})
	return &httpRig{b: b, handler: b.Server.Handler(), app: app.Secret}
}

// route is one endpoint; arg fills its path, query or X-Lease.
type route struct {
	method string
	path   func(arg string) string
	lease  bool // sends X-Lease: a fresh valid lease when arg is empty, else arg
	admin  bool
}

var routes = []route{
	{"POST", func(string) string { return "/api/v1/acquire" }, false, false},
	{"POST", func(string) string { return "/api/v1/commands" }, true, false},
	{"POST", func(string) string { return "/api/v1/commands/wait" }, true, false},
	{"POST", func(string) string { return "/api/v1/lease/renew" }, true, false},
	{"POST", func(string) string { return "/api/v1/lease/release" }, true, false},
	{"POST", func(string) string { return "/api/v1/lease/release-all" }, false, false},
	{"POST", func(string) string { return "/api/v1/admin/keys" }, false, true},
	{"GET", func(a string) string { return "/api/v1/users/" + url.PathEscape(a) + "/commands?limit=3" }, false, false},
	{"GET", func(a string) string { return "/api/v1/users/" + fuzzUser + "/commands/" + url.PathEscape(a) }, false, false},
	{"GET", func(a string) string {
		return "/api/v1/users/" + url.PathEscape(a) + "/contexts/available?client_type=" + url.QueryEscape(a)
	}, false, false},
	{"POST", func(a string) string {
		return "/api/v1/admin/users/" + fuzzUser + "/clients/fz/contexts/" + url.PathEscape(a) + "/revoke"
	}, false, true},
	{"GET", func(a string) string { return "/api/v1/users/" + fuzzUser + "/commands?" + a }, false, false},
	{"GET", func(a string) string { return "/api/v1/users/" + fuzzUser + "/tasks/" + url.PathEscape(a) + "/leases" }, false, false},
	{"DELETE", func(a string) string { return "/api/v1/admin/users/" + fuzzUser + "/clients/" + url.PathEscape(a) }, false, true},
}

// FuzzHTTPBodies sends arbitrary bodies (and path, query and X-Lease values)
// to every application endpoint and several admin ones. The broker must
// never fail inside (500), must answer errors in the one envelope with the
// status DESIGN §5 gives the code, must never echo a key or a lease token,
// and must leave no lease or waiter behind.
func FuzzHTTPBodies(f *testing.F) { fuzzHTTPBodies(f, newHTTPRig(f, "")) }

// FuzzHTTPBodiesPostgres is FuzzHTTPBodies on PostgreSQL, which refuses
// what SQLite takes (a NUL in text): whatever reaches the store must be
// something it holds.
func FuzzHTTPBodiesPostgres(f *testing.F) {
	fuzzHTTPBodies(f, newHTTPRig(f, historytest.EmptyPostgres(f)))
}

func fuzzHTTPBodies(f *testing.F, r *httpRig) {
	seeds := []struct {
		route uint8
		body  string
		arg   string
	}{
		{0, `{"user_id":"usr_fuzz","task_id":"t","client_type":"console"}`, ""},
		{0, `{"user_id":"usr_fuzz","task_id":"t","client_type":"console","ttl_s":0}`, ""},
		{0, `{"user_id":"usr_fuzz","task_id":"t","client_type":"console","ttl_s":3601,"wait_ms":-1}`, ""},
		{0, `{"user_id":"usr_fuzz","task_id":"t","labels":{"a":"b"},"renew_on_use":false,"wait_ms":10}`, ""},
		{0, `{"user_id":"../x","task_id":""}`, ""},
		{0, `{"user_id":"usr_fuzz","task_id":"t"} {}`, ""},
		{0, `{"user_id":"usr_fuzz","task_id":"t","extra":1}`, ""},
		{0, `[]`, ""},
		{0, `{"ttl_s":1e400}`, ""},
		{1, `{"name":"echo","params":{"a":[1,2,{"b":null}]},"target":{"tab_id":"9"},"options":{"x":1}}`, ""},
		{1, `{"name":"echo","response_mode":"none"}`, ""},
		{1, `{"name":"","params":null}`, ""},
		{1, `{"name":"echo","target":[1]}`, ""},
		{1, `{"name":"echo","timeout_ms":0}`, ""},
		{1, `{"name":"echo"}`, "0123456789abcdef0123456789abcdef"},
		{2, `{"name":"echo","timeout_ms":5000}`, ""},
		{2, `{"name":"echo","response_mode":"none"}`, ""},
		{2, `{"name":"echo","response_mode":"bogus"}`, ""},
		{3, `{"ttl_s":10}`, ""},
		{3, `{"ttl_s":"10"}`, ""},
		{4, ``, ""},
		{4, ``, "not-a-token"},
		{5, `{"lease_tokens":["a","b"]}`, ""},
		{5, `{"lease_tokens":null}`, ""},
		{6, `{"kind":"client","user_id":"usr_fuzz","name":"n"}`, ""},
		{6, `{"kind":"root"}`, ""},
		{7, ``, fuzzUser},
		{7, ``, "usr/../../x"},
		{8, ``, "01234567-89ab-cdef-0123-456789abcdef"},
		{8, ``, "%00"},
		{9, ``, "browser"},
		{10, ``, "c0"},
		{11, ``, "limit=0&cursor=%ff"},
		{11, ``, "cursor=abc&limit=501"},
		{12, ``, "t/with/slash"},
		{13, ``, "nobody"},
		// What the store cannot hold or a reader would have to guess at:
		// NUL, invalid UTF-8, members named twice, deep nesting.
		{0, `{"user_id":"usr_fuzz","task_id":"t\u0000","client_type":"console"}`, ""},
		{0, "{\"user_id\":\"usr_fuzz\",\"task_id\":\"t\xff\",\"client_type\":\"console\"}", ""},
		{0, `{"user_id":"usr_fuzz","task_id":"t","labels":{"a\u0000":"b"}}`, ""},
		{0, `{"user_id":"x","user_id":"usr_fuzz","task_id":"t","client_type":"console"}`, ""},
		{1, `{"name":"n\u0000"}`, ""},
		{1, `{"name":"echo","params":{"s":"\u0000"}}`, ""},
		{1, `{"name":"echo","params":{"s":"\ud800"}}`, ""},
		{1, `{"name":"echo","params":{"a":1,"a":2}}`, ""},
		{1, `{"name":"echo","params":` + strings.Repeat("[", 65) + strings.Repeat("]", 65) + `}`, ""},
		{2, `{"name":"echo","timeout_ms":5000,"target":` + strings.Repeat(`{"a":`, 65) + `1` + strings.Repeat("}", 65) + `}`, ""},
		{3, `{"ttl_s":10,"ttl_s":20}`, ""},
		{5, `{"lease_tokens":["a\u0000"]}`, ""},
		{6, `{"kind":"app","name":"n\u0000"}`, ""},
		{7, ``, "usr\x00"},
		{8, ``, "c\x00"},
		{8, ``, "\xff"},
		{11, ``, "task_id=%00"},
		{12, ``, "t\x00"},
		{13, ``, "c\x00"},
	}
	for _, s := range seeds {
		f.Add(s.route, []byte(s.body), s.arg)
	}
	f.Fuzz(func(t *testing.T, which uint8, body []byte, arg string) {
		rt := routes[int(which)%len(routes)]
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		var held cheetah.Lease
		token := arg
		if rt.lease && arg == "" {
			l, err := r.b.Registry.Acquire(ctx, cheetah.AcquireRequest{UserID: fuzzUser, TaskID: "fuzz-held", ClientType: cheetah.Console, TTL: time.Minute})
			if err != nil {
				t.Fatalf("acquire a lease for the request: %v", err)
			}
			held, token = l, l.LeaseToken
		}
		req, err := http.NewRequestWithContext(ctx, rt.method, "http://127.0.0.1"+rt.path(arg), bytes.NewReader(body))
		if err != nil {
			return // not a request a client could send
		}
		key := r.app
		if rt.admin {
			key = fuzzAdmin
		}
		req.Header.Set("Authorization", "Bearer "+key)
		if rt.lease && token != "" && validHeader(token) {
			req.Header.Set("X-Lease", token)
		}
		rec := httptest.NewRecorder()
		r.handler.ServeHTTP(rec, req)
		resp := rec.Result()
		out := rec.Body.Bytes()
		if resp.StatusCode >= 500 && resp.StatusCode != 503 {
			t.Fatalf("%s %s → %d: %s", rt.method, req.URL, resp.StatusCode, out)
		}
		for _, secret := range []string{fuzzAdmin, r.app, held.LeaseToken} {
			if secret != "" && bytes.Contains(out, []byte(secret)) && !(strings.HasSuffix(req.URL.Path, "/acquire") || strings.HasSuffix(req.URL.Path, "/renew")) {
				t.Fatalf("%s %s echoed a secret: %s", rt.method, req.URL, out)
			}
		}
		if resp.StatusCode >= 300 && resp.StatusCode < 400 {
			// No route redirects: a path with a trailing slash is a 404
			// envelope like any unknown path (seed 5bee1fdc1986cb82).
			t.Fatalf("%s %s → %d to %q", rt.method, req.URL, resp.StatusCode, resp.Header.Get("Location"))
		}
		if ctx.Err() == nil && len(out) > 0 {
			if !json.Valid(out) {
				t.Fatalf("%s %s → %d: not JSON: %q", rt.method, req.URL, resp.StatusCode, out)
			}
			if resp.StatusCode >= 400 {
				var env struct {
					Error struct{ Code, Message, Reason string }
				}
				if err := json.Unmarshal(out, &env); err != nil || env.Error.Code == "" {
					t.Fatalf("%s %s → %d: not the error envelope: %s", rt.method, req.URL, resp.StatusCode, out)
				}
				if want, ok := statusOf[env.Error.Code]; !ok || want != resp.StatusCode {
					t.Fatalf("%s %s → %d with code %s (DESIGN gives %d)", rt.method, req.URL, resp.StatusCode, env.Error.Code, want)
				}
				// The store is up throughout: store_unavailable here means
				// the edge let by a value the store refused (a NUL in text
				// on PostgreSQL), a bad request answered as retryable.
				if env.Error.Code == "store_unavailable" {
					t.Fatalf("%s %s → 503 store_unavailable with the store up: %s", rt.method, req.URL, out)
				}
			}
		}
		// Leave nothing behind: a lease the body acquired goes back.
		if resp.StatusCode == 201 && strings.HasSuffix(req.URL.Path, "/acquire") {
			var got struct{ Lease cheetah.Lease }
			if err := json.Unmarshal(out, &got); err != nil || len(got.Lease.LeaseToken) != 32 {
				t.Fatalf("acquire answered 201 without a lease: %s", out)
			}
			_, _ = r.b.Registry.Release(context.Background(), got.Lease)
		}
		if held.LeaseToken != "" {
			_, _ = r.b.Registry.Release(context.Background(), held)
		}
		if st := r.b.Registry.Stats(); st.Leases != 0 || st.Waiters != 0 || st.Heap != 0 {
			t.Fatalf("bookkeeping left behind after %s %s: %+v", rt.method, req.URL, st)
		}
	})
}

// validHeader reports whether v may be sent as a header value at all.
func validHeader(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}
