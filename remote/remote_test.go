package remote_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/remote"
	"github.com/cheetahbroker/cheetah/server"
	"github.com/cheetahbroker/cheetah/server/auth"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// request is what the fake broker saw of one request.
type request struct {
	Method, Path, RawPath, Query string
	Header                       http.Header
	Body                         string
}

// fake records every request and answers each with the next of its answers
// (the last one repeats).
type fake struct {
	t       *testing.T
	srv     *httptest.Server
	mu      sync.Mutex
	seen    []request
	answers []answer
}

type answer struct {
	status int
	body   string
	header map[string]string
}

func newFake(t *testing.T, answers ...answer) *fake {
	f := &fake{t: t, answers: answers}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.seen = append(f.seen, request{r.Method, r.URL.Path, r.URL.RawPath, r.URL.RawQuery, r.Header.Clone(), string(b)})
		a := f.answers[min(len(f.seen), len(f.answers))-1]
		f.mu.Unlock()
		for k, v := range a.header {
			w.Header().Set(k, v)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(a.status)
		_, _ = io.WriteString(w, a.body)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

// answer replaces the fake's answers.
func (f *fake) answer(a ...answer) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answers = a
}

func (f *fake) requests() []request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]request(nil), f.seen...)
}

func (f *fake) last() request {
	r := f.requests()
	require.NotEmpty(f.t, r)
	return r[len(r)-1]
}

func TestDoSendsJSONWithTheKey(t *testing.T) {
	f := newFake(t, answer{200, `{"n":7}`, nil})
	c := remote.NewClient(f.srv.URL+"/prefix/", "chk_secret")
	var out struct{ N int }
	require.NoError(t, c.Do(context.Background(), "POST", "/api/v1/x?a=b", map[string]int{"v": 1}, &out, "X-Lease", "tok"))
	require.Equal(t, 7, out.N)
	r := f.last()
	require.Equal(t, "POST", r.Method)
	require.Equal(t, "/prefix/api/v1/x", r.Path)
	require.Equal(t, "a=b", r.Query)
	require.Equal(t, "Bearer chk_secret", r.Header.Get("Authorization"))
	require.Equal(t, "application/json", r.Header.Get("Content-Type"))
	require.Equal(t, remote.DefaultUserAgent, r.Header.Get("User-Agent"))
	require.Equal(t, "tok", r.Header.Get("X-Lease"))
	require.JSONEq(t, `{"v":1}`, r.Body)

	// No body: nothing sent, no content type; a custom agent and client.
	c = remote.NewClient(f.srv.URL, "k", remote.WithUserAgent("my-app/2"), remote.WithHTTPClient(f.srv.Client()))
	require.NoError(t, c.Do(context.Background(), "GET", "/y", nil, nil))
	r = f.last()
	require.Empty(t, r.Body)
	require.Empty(t, r.Header.Get("Content-Type"))
	require.Equal(t, "my-app/2", r.Header.Get("User-Agent"))

	require.Error(t, c.Do(context.Background(), "GET", "/y", nil, nil, "X-Lease"), "headers come in pairs")
}

func TestDoRebuildsTheBrokersErrors(t *testing.T) {
	cases := []struct {
		name  string
		a     answer
		check func(t *testing.T, err error)
	}{
		{"lease lost", answer{423, `{"error":{"code":"lease_lost","message":"lease_lost: released","reason":"released"}}`, nil},
			func(t *testing.T, err error) {
				var lost *cheetah.LeaseLostError
				require.ErrorAs(t, err, &lost)
				require.Equal(t, cheetah.LostReleased, lost.Reason)
				require.ErrorIs(t, err, cheetah.ErrLeaseLost)
			}},
		{"no context", answer{409, `{"error":{"code":"no_context_available","message":"…","reason":"placement_miss"}}`, nil},
			func(t *testing.T, err error) {
				var nc *cheetah.NoContextError
				require.ErrorAs(t, err, &nc)
				require.Equal(t, cheetah.ReasonPlacementMiss, nc.Reason)
				require.ErrorIs(t, err, cheetah.ErrNoContextAvailable)
			}},
		{"not found", answer{404, `{"error":{"code":"not_found","message":"command x not found"}}`, nil},
			func(t *testing.T, err error) {
				require.ErrorIs(t, err, cheetah.ErrNotFound)
				var e *cheetah.Error
				require.ErrorAs(t, err, &e)
				require.Equal(t, "command x not found", e.Message)
			}},
		{"internal", answer{500, `{"error":{"code":"internal","message":"internal error"}}`, nil},
			func(t *testing.T, err error) {
				code, _, _ := cheetah.Classify(err)
				require.Equal(t, "internal", code)
			}},
		{"rate limited", answer{429, `{"error":{"code":"rate_limited","message":"slow down"}}`, map[string]string{"Retry-After": "3"}},
			func(t *testing.T, err error) {
				require.ErrorIs(t, err, cheetah.ErrRateLimited)
				var rl *remote.RateLimitedError
				require.ErrorAs(t, err, &rl)
				require.Equal(t, 3*time.Second, rl.RetryAfter)
				d, ok := remote.RetryAfter(err)
				require.True(t, ok)
				require.Equal(t, 3*time.Second, d)
				code, _, _ := cheetah.Classify(err)
				require.Equal(t, cheetah.CodeRateLimited, code)
			}},
		{"rate limited until a date", answer{429, `{"error":{"code":"rate_limited","message":"slow down"}}`,
			map[string]string{"Retry-After": time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat)}},
			func(t *testing.T, err error) {
				d, ok := remote.RetryAfter(err)
				require.True(t, ok)
				require.InDelta(t, 90, d.Seconds(), 2)
			}},
		{"not the envelope", answer{502, `<html>bad gateway</html>`, nil},
			func(t *testing.T, err error) {
				var se *remote.StatusError
				require.ErrorAs(t, err, &se)
				require.Equal(t, 502, se.StatusCode)
				require.Contains(t, se.Body, "bad gateway")
				code, _, _ := cheetah.Classify(err)
				require.Empty(t, code, "not the broker's answer")
				_, ok := remote.RetryAfter(err)
				require.False(t, ok)
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, tc.a)
			var out map[string]any
			err := remote.NewClient(f.srv.URL, "k").Do(context.Background(), "GET", "/x", nil, &out)
			require.Error(t, err)
			require.Nil(t, out, "an error answer is not decoded into out")
			tc.check(t, err)
		})
	}
}

func TestDoTransportErrorsWrapTheirCause(t *testing.T) {
	f := newFake(t, answer{200, `{}`, nil})
	url := f.srv.URL
	f.srv.Close()
	err := remote.NewClient(url, "k").Do(context.Background(), "GET", "/x", nil, nil)
	require.Error(t, err)
	code, _, _ := cheetah.Classify(err)
	require.Empty(t, code)
	var se *remote.StatusError
	require.False(t, errors.As(err, &se))

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = remote.NewClient(url, "k").Do(ctx, "GET", "/x", nil, nil)
	require.ErrorIs(t, err, context.Canceled)

	err = remote.NewClient("::not a url", "k").Do(context.Background(), "GET", "/x", nil, nil)
	require.Error(t, err)
}

// TestBackendRequests checks how each SDK call is put on the wire.
func TestBackendRequests(t *testing.T) {
	ctx := context.Background()
	lease := `{"lease":{"user_id":"usr_1","client_id":"c","context_id":"x","client_type":"console","task_id":"t","epoch":5,"lease_token":"tok","ttl_s":90,"expires_at":"2026-01-02T03:04:05.123456789Z"}}`
	f := newFake(t, answer{201, lease, nil})
	m := remote.New(f.srv.URL, "k")
	strict := false
	h, err := m.Acquire(ctx, cheetah.AcquireRequest{UserID: "usr_1", TaskID: "t", ClientType: cheetah.Console,
		ClientID: "c", Labels: map[string]string{"region": "eu"}, TTL: 90 * time.Second, Wait: 1500 * time.Microsecond,
		RenewOnUse: &strict})
	require.NoError(t, err)
	r := f.last()
	require.Equal(t, "/api/v1/acquire", r.Path)
	require.JSONEq(t, `{"user_id":"usr_1","task_id":"t","client_type":"console","client_id":"c","labels":{"region":"eu"},
		"ttl_s":90,"wait_ms":2,"renew_on_use":false}`, r.Body, "wait_ms rounds up")
	require.Equal(t, int64(5), h.Epoch())
	require.Equal(t, "tok", h.Lease().LeaseToken)
	require.Equal(t, time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.UTC), h.ExpiresAt())

	_, err = m.Acquire(ctx, cheetah.AcquireRequest{UserID: "usr_1", TaskID: "t"})
	require.NoError(t, err)
	require.JSONEq(t, `{"user_id":"usr_1","task_id":"t"}`, f.last().Body, "nothing but what was asked")

	n := len(f.requests())
	_, err = m.Acquire(ctx, cheetah.AcquireRequest{UserID: "usr_1", TaskID: "t", TTL: 1500 * time.Millisecond})
	require.ErrorIs(t, err, cheetah.ErrInvalidRequest)
	require.Len(t, f.requests(), n, "refused before sending: the API counts whole seconds")

	f.answer(answer{202, `{"command_id":"c1","trace_id":"t1"}`, nil})
	id, err := h.Send(ctx, cheetah.Command{Name: "go", Params: map[string]int{"a": 1}},
		cheetah.WithTarget("7"), cheetah.WithOptions(map[string]any{"o": true}), cheetah.WithTimeout(1500*time.Millisecond),
		cheetah.WithCallback("https://example.com/hook"))
	require.NoError(t, err)
	require.Equal(t, "c1", id)
	r = f.last()
	require.Equal(t, "/api/v1/commands", r.Path)
	require.Equal(t, "tok", r.Header.Get("X-Lease"))
	require.Equal(t, "https://example.com/hook", r.Header.Get("X-Callback-Url"))
	require.JSONEq(t, `{"name":"go","params":{"a":1},"target":{"tab_id":"7"},"options":{"o":true},
		"response_mode":"async","timeout_ms":1500}`, r.Body)

	f.answer(answer{200, `{"resolution":{"command_id":"c2","trace_id":"t2","status":"failed","error":{"code":"boom","message":"m","data":{"n":1}}}}`, nil})
	res, err := h.SendAndWait(ctx, cheetah.Command{Name: "go", Params: json.RawMessage(`[1,2]`)})
	require.NoError(t, err)
	require.Equal(t, cheetah.Resolution{CommandID: "c2", TraceID: "t2", Status: cheetah.StatusFailed,
		Error: &cheetah.ErrorInfo{Code: "boom", Message: "m", Data: json.RawMessage(`{"n":1}`)}}, res)
	r = f.last()
	require.Equal(t, "/api/v1/commands/wait", r.Path)
	require.JSONEq(t, `{"name":"go","params":[1,2],"response_mode":"rpc"}`, r.Body)
	require.Empty(t, r.Header.Get("X-Callback-Url"))

	f.answer(answer{200, strings.Replace(lease, `"ttl_s":90`, `"ttl_s":120`, 1), nil})
	require.NoError(t, h.RenewFor(ctx, 2*time.Minute))
	require.Equal(t, "/api/v1/lease/renew", f.last().Path)
	require.JSONEq(t, `{"ttl_s":120}`, f.last().Body)
	require.Equal(t, 120, h.Lease().TTLSeconds)
	require.NoError(t, h.Renew(ctx))
	require.JSONEq(t, `{}`, f.last().Body, "zero keeps the lease's TTL")

	f.answer(answer{200, `{"released":true}`, nil})
	ok, err := m.Release(ctx, h)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "/api/v1/lease/release", f.last().Path)
	require.Equal(t, "tok", f.last().Header.Get("X-Lease"))

	f.answer(answer{200, `{"contexts":[]}`, nil})
	list, err := m.ListAvailable(ctx, "usr_1", cheetah.Browser)
	require.NoError(t, err)
	require.NotNil(t, list)
	require.Equal(t, "/api/v1/users/usr_1/contexts/available", f.last().Path)
	require.Equal(t, "client_type=browser", f.last().Query)

	f.answer(answer{200, `{"leases":null}`, nil})
	ls, err := m.TaskContexts(ctx, "usr_1", "catalog/42 ?")
	require.NoError(t, err)
	require.NotNil(t, ls)
	require.Equal(t, "/api/v1/users/usr_1/tasks/catalog%2F42%20%3F/leases", f.last().RawPath, "one escaped segment")
	_, err = m.TaskContexts(ctx, "usr_1", "..")
	require.NoError(t, err)
	require.Equal(t, "/api/v1/users/usr_1/tasks/%2E%2E/leases", f.last().RawPath, "a dot segment is not resolved away")

	f.answer(answer{200, `{"command":{"command_id":"c/1","messages":[]}}`, nil})
	rec, err := m.History().Read(ctx, "usr_1", "c/1")
	require.NoError(t, err)
	require.Equal(t, "c/1", rec.CommandID)
	require.Equal(t, "/api/v1/users/usr_1/commands/c%2F1", f.last().RawPath)

	f.answer(answer{200, `{"commands":[{"command_id":"c3"}],"next_cursor":"cur2"}`, nil})
	page, err := m.History().List(ctx, "usr_1", cheetah.ListQuery{TaskID: "a&b", Limit: 10, Cursor: "cur"})
	require.NoError(t, err)
	require.Equal(t, "cur2", page.NextCursor)
	require.Equal(t, "c3", page.Commands[0].CommandID)
	require.Equal(t, "/api/v1/users/usr_1/commands", f.last().Path)
	require.Equal(t, "cursor=cur&limit=10&task_id=a%26b", f.last().Query)

	// What a path cannot carry is answered here, as the broker would.
	n = len(f.requests())
	_, err = m.ListAvailable(ctx, "", "")
	require.ErrorIs(t, err, cheetah.ErrInvalidRequest)
	_, err = m.History().Read(ctx, "usr_1", "")
	require.ErrorIs(t, err, cheetah.ErrNotFound)
	ls, err = m.TaskContexts(ctx, "usr_1", "")
	require.NoError(t, err)
	require.Empty(t, ls)
	require.Len(t, f.requests(), n)
}

func TestReleaseAllBatches(t *testing.T) {
	f := newFake(t, answer{200, `{"released":400}`, nil})
	m := remote.New(f.srv.URL, "k")
	var hs []*cheetah.Handle
	f.answer(answer{201, `{"lease":{"lease_token":"tok"}}`, nil})
	h, err := m.Acquire(context.Background(), cheetah.AcquireRequest{UserID: "usr_1", TaskID: "t"})
	require.NoError(t, err)
	for range 2500 {
		hs = append(hs, h)
	}
	f.answer(answer{200, `{"released":400}`, nil})
	n, err := m.ReleaseAll(context.Background(), hs)
	require.NoError(t, err)
	require.Equal(t, 1200, n)
	var sizes []int
	for _, r := range f.requests()[1:] {
		require.Equal(t, "/api/v1/lease/release-all", r.Path)
		var b struct {
			LeaseTokens []string `json:"lease_tokens"`
		}
		require.NoError(t, json.Unmarshal([]byte(r.Body), &b))
		sizes = append(sizes, len(b.LeaseTokens))
	}
	require.Equal(t, []int{1000, 1000, 500}, sizes)
}

// TestSendAndWaitCancelClosesTheRequest: the caller's context bounds the
// request, and its end is answered as in process.
func TestSendAndWaitCancelClosesTheRequest(t *testing.T) {
	// Each wait request reports that it arrived, then that the server saw
	// its caller go.
	type wait struct{ arrived, gone chan struct{} }
	waits := make(chan wait, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/v1/acquire" {
			w.WriteHeader(201)
			_, _ = io.WriteString(w, `{"lease":{"lease_token":"tok"}}`)
			return
		}
		// As the broker does: the server notices a caller that hangs up
		// only once the body is read.
		_, _ = io.Copy(io.Discard, r.Body)
		wt := wait{make(chan struct{}), make(chan struct{})}
		waits <- wt
		close(wt.arrived)
		<-r.Context().Done()
		close(wt.gone)
	}))
	defer srv.Close()
	m := remote.New(srv.URL, "k")
	h, err := m.Acquire(context.Background(), cheetah.AcquireRequest{UserID: "usr_1", TaskID: "t"})
	require.NoError(t, err)
	seen := func() wait {
		select {
		case wt := <-waits:
			return wt
		case <-time.After(10 * time.Second):
			t.Fatal("no wait request arrived")
			return wait{}
		}
	}
	goneOf := func(wt wait) {
		select {
		case <-wt.gone:
		case <-time.After(10 * time.Second):
			t.Fatal("the broker did not see the request end")
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan wait, 1)
	go func() {
		wt := <-waits
		<-wt.arrived
		cancel()
		got <- wt
	}()
	res, err := h.SendAndWait(ctx, cheetah.Command{Name: "slow"})
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, context.Canceled, err, "ctx's own error, as in process")
	require.Equal(t, cheetah.StatusCancelled, res.Status)
	require.Equal(t, "cancelled", res.Error.Code)
	goneOf(<-got)

	// A deadline is the caller's too.
	ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	res, err = h.SendAndWait(ctx, cheetah.Command{Name: "slow"})
	require.Equal(t, context.DeadlineExceeded, err)
	require.Equal(t, cheetah.StatusCancelled, res.Status)
	goneOf(seen())
}

// A wait whose answer is cut after the broker named the command (a proxy
// or a replica went away) is answered from the command's record, once it
// has ended.
func TestSendAndWaitAnswerCutShortIsReadFromHistory(t *testing.T) {
	const id = "0190f0f0-0000-7000-8000-000000000001"
	var reads atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/api/v1/acquire":
			w.WriteHeader(201)
			_, _ = io.WriteString(w, `{"lease":{"lease_token":"tok","user_id":"usr_1"}}`)
		case "/api/v1/commands/wait":
			w.Header().Set("X-Command-Id", id)
			w.Header().Set("X-Trace-Id", "4bf92f3577b34da6a3ce929d0e0e4736")
			w.WriteHeader(http.StatusOK)
			_, _ = io.WriteString(w, `{"resolution":{"comm`)
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler) // the connection drops mid-answer
		case "/api/v1/users/usr_1/commands/" + id:
			status := "dispatched"
			if reads.Add(1) >= 3 {
				status = "failed"
			}
			_, _ = io.WriteString(w, `{"command":{"command_id":"`+id+`","trace_id":"4bf92f3577b34da6a3ce929d0e0e4736","status":"`+
				status+`","error":{"code":"boom","message":"it broke"}}}`)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	h, err := remote.New(srv.URL, "k").Acquire(context.Background(), cheetah.AcquireRequest{UserID: "usr_1", TaskID: "t"})
	require.NoError(t, err)
	res, err := h.SendAndWait(context.Background(), cheetah.Command{Name: "echo"})
	require.NoError(t, err)
	require.Equal(t, cheetah.Resolution{CommandID: id, TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", Status: cheetah.StatusFailed,
		Error: &cheetah.ErrorInfo{Code: "boom", Message: "it broke"}}, res)
	require.EqualValues(t, 3, reads.Load(), "read until it ended")
}

// A refusal (4xx) whose body is cut on the way is asked again once: the
// broker acted on nothing, and says why the second time. Any other cut
// answer is not.
func TestRefusalCutShortIsAskedAgain(t *testing.T) {
	const lost = `{"error":{"code":"lease_lost","reason":"revoked","message":"lease_lost: revoked"}}`
	var calls, status atomic.Int32
	status.Store(http.StatusLocked)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		if calls.Add(1) == 1 {
			w.Header().Set("Content-Length", strconv.Itoa(len(lost)))
			w.WriteHeader(int(status.Load()))
			_, _ = io.WriteString(w, lost[:10])
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		}
		w.WriteHeader(int(status.Load()))
		_, _ = io.WriteString(w, lost)
	}))
	defer srv.Close()
	c := remote.NewClient(srv.URL, "k")
	err := c.Do(context.Background(), "POST", "/api/v1/commands", map[string]string{"name": "echo"}, nil, "X-Lease", "tok")
	var ll *cheetah.LeaseLostError
	require.ErrorAs(t, err, &ll)
	require.Equal(t, cheetah.LostRevoked, ll.Reason)
	require.EqualValues(t, 2, calls.Load())

	calls.Store(0)
	status.Store(http.StatusServiceUnavailable)
	err = c.Do(context.Background(), "POST", "/api/v1/commands", map[string]string{"name": "echo"}, nil, "X-Lease", "tok")
	require.Error(t, err)
	require.EqualValues(t, 1, calls.Load(), "a 5xx may have acted: never asked again")
}

// TestRateLimitedByTheBroker: a real broker's 429 carries Retry-After.
func TestRateLimitedByTheBroker(t *testing.T) {
	ctx := context.Background()
	b, err := server.Open(ctx, server.Options{DataDir: t.TempDir(), KeyRateLimit: 0.5})
	require.NoError(t, err)
	hs := httptest.NewServer(b.Server.Handler())
	defer func() {
		require.NoError(t, b.Close(ctx))
		hs.Close()
	}()
	key, err := b.Keys.Create(ctx, auth.App, "", "test")
	require.NoError(t, err)
	m := remote.New(hs.URL, key.Secret)
	_, err = m.ListAvailable(ctx, "usr_1", "")
	require.NoError(t, err)
	_, err = m.ListAvailable(ctx, "usr_1", "")
	require.ErrorIs(t, err, cheetah.ErrRateLimited)
	d, ok := remote.RetryAfter(err)
	require.True(t, ok)
	require.Equal(t, 2*time.Second, d)

	// A key the broker does not know.
	_, err = remote.New(hs.URL, "chk_nope_nope").ListAvailable(ctx, "usr_1", "")
	require.ErrorIs(t, err, cheetah.ErrUnauthorized)
}
