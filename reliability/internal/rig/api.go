package rig

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	cheetah "github.com/cheetahbroker/cheetah"
)

// API calls a broker's HTTP API. Every request is bounded by Timeout.
type API struct {
	Base    string
	HC      *http.Client
	Timeout time.Duration
}

// NewAPI returns a client of the broker at base (http://host:port).
func NewAPI(base string) *API {
	return &API{Base: strings.TrimRight(base, "/"), HC: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}, Timeout: 30 * time.Second}
}

// Answer is one HTTP answer.
type Answer struct {
	Status int
	Body   []byte
	Header http.Header
	Err    error // the request got no answer
}

// ErrorBody is the API's error envelope.
type ErrorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Reason  string `json:"reason"`
	} `json:"error"`
}

// Envelope decodes the error envelope of a non-2xx answer.
func (a Answer) Envelope() ErrorBody {
	var e ErrorBody
	_ = json.Unmarshal(a.Body, &e)
	return e
}

// Code is the envelope's code, or "" for a 2xx answer.
func (a Answer) Code() string { return a.Envelope().Error.Code }

// Reason is the envelope's reason.
func (a Answer) Reason() string { return a.Envelope().Error.Reason }

// Decode unmarshals the body into v.
func (a Answer) Decode(v any) error {
	if err := json.Unmarshal(a.Body, v); err != nil {
		return fmt.Errorf("decode %d %s: %w", a.Status, a.Body, err)
	}
	return nil
}

func (a Answer) String() string {
	if a.Err != nil {
		return "no answer: " + a.Err.Error()
	}
	return fmt.Sprintf("%d %s", a.Status, bytes.TrimSpace(a.Body))
}

// Do sends one request. body is JSON-encoded unless it is []byte or nil;
// headers are name, value pairs.
func (c *API) Do(ctx context.Context, method, path, key string, body any, headers ...string) Answer {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			return Answer{Err: err}
		}
		rd = bytes.NewReader(raw)
	}
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, c.Base+path, rd)
	if err != nil {
		return Answer{Err: err}
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := c.HC.Do(req)
	if err != nil {
		return Answer{Err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return Answer{Status: resp.StatusCode, Body: raw, Header: resp.Header, Err: err}
}

// MakeKey creates a key with the admin key and returns its secret.
func (c *API) MakeKey(t testing.TB, admin, kind, userID string) string {
	t.Helper()
	body := map[string]any{"kind": kind, "name": "reliability"}
	if userID != "" {
		body["user_id"] = userID
	}
	ans := c.Do(context.Background(), "POST", "/api/v1/admin/keys", admin, body)
	if ans.Status != 201 {
		t.Fatalf("make %s key: %s", kind, ans)
	}
	var created struct {
		Key string `json:"key"`
	}
	if err := ans.Decode(&created); err != nil {
		t.Fatal(err)
	}
	return created.Key
}

// Acquire asks for a context; the lease is zero unless the answer is 201.
func (c *API) Acquire(ctx context.Context, key string, req map[string]any) (cheetah.Lease, Answer) {
	ans := c.Do(ctx, "POST", "/api/v1/acquire", key, req)
	var out struct {
		Lease cheetah.Lease `json:"lease"`
	}
	if ans.Status == 201 {
		_ = ans.Decode(&out)
	}
	return out.Lease, ans
}

// Send is POST /api/v1/commands; the id is empty unless the answer is 202.
func (c *API) Send(ctx context.Context, key, token string, body map[string]any) (string, Answer) {
	ans := c.Do(ctx, "POST", "/api/v1/commands", key, body, "X-Lease", token)
	var out cheetah.Sent
	if ans.Status == 202 {
		_ = ans.Decode(&out)
	}
	return out.CommandID, ans
}

// SendAndWait is POST /api/v1/commands/wait. id is the X-Command-Id header
// the broker sends once the command is durable, set even when the wait was
// cut short.
func (c *API) SendAndWait(ctx context.Context, key, token string, body map[string]any) (cheetah.Resolution, string, Answer) {
	ans := c.Do(ctx, "POST", "/api/v1/commands/wait", key, body, "X-Lease", token)
	var out struct {
		Resolution cheetah.Resolution `json:"resolution"`
	}
	id := ""
	if ans.Header != nil {
		id = ans.Header.Get("X-Command-Id")
	}
	if ans.Status == 200 {
		_ = json.Unmarshal(ans.Body, &out)
	}
	if id == "" {
		id = out.Resolution.CommandID
	}
	return out.Resolution, id, ans
}

// Read reads one command record.
func (c *API) Read(ctx context.Context, key, user, id string) (cheetah.CommandRecord, Answer) {
	ans := c.Do(ctx, "GET", "/api/v1/users/"+user+"/commands/"+id, key, nil)
	var out struct {
		Command cheetah.CommandRecord `json:"command"`
	}
	if ans.Status == 200 {
		_ = ans.Decode(&out)
	}
	return out.Command, ans
}

// Ready reports whether /readyz answers 200.
func (c *API) Ready(ctx context.Context) bool {
	return c.Do(ctx, "GET", "/readyz", "", nil).Status == 200
}
