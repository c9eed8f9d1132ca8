package remote

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"time"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/protocol"
)

// New returns a Manager over the HTTP API of the broker at baseURL, acting
// with key (an app key, or an admin key). It is the remote counterpart of
// the broker's own Manager: the same methods, records and errors.
func New(baseURL, key string, opts ...Option) *cheetah.Manager {
	c := NewClient(baseURL, key, opts...)
	return cheetah.NewManager(&backend{c: c}, cheetah.WithTracerProvider(c.tp))
}

// maxReleaseAll is how many tokens the broker takes in one release-all
// request; larger sets go in several requests.
const maxReleaseAll = cheetah.MaxReleaseAll

// backend implements cheetah.Backend over the HTTP API. The API identifies a
// lease by its token alone, so that is all a handle sends.
type backend struct {
	c *Client
}

var _ cheetah.Backend = (*backend)(nil)

type leaseAnswer struct {
	Lease cheetah.Lease `json:"lease"`
}

// Acquire posts the request to /api/v1/acquire; a wait is sent in whole
// milliseconds, rounded up.
func (b *backend) Acquire(ctx context.Context, req cheetah.AcquireRequest) (cheetah.Lease, error) {
	body := cheetah.AcquireBody{
		UserID: req.UserID, TaskID: req.TaskID, ClientType: req.ClientType,
		ClientID: req.ClientID, Labels: req.Labels, RenewOnUse: req.RenewOnUse,
		TenantID: req.TenantID, AffinityKey: req.AffinityKey, LeaseWebhook: req.LeaseWebhook,
		ClearState: req.ClearState,
	}
	if c := req.Create; c != nil {
		body.Create = &cheetah.CreateBody{URL: c.URL}
		if c.Timeout != 0 {
			ms := millisUp(c.Timeout)
			body.Create.TimeoutMS = &ms
		}
	}
	if req.TTL != 0 {
		s, err := ttlSeconds(req.TTL)
		if err != nil {
			return cheetah.Lease{}, err
		}
		body.TTLS = &s
	}
	if req.Wait != 0 {
		ms := millisUp(req.Wait)
		body.WaitMS = &ms
	}
	var out leaseAnswer
	if err := b.c.Do(ctx, "POST", "/api/v1/acquire", body, &out); err != nil {
		return cheetah.Lease{}, err
	}
	return out.Lease, nil
}

// millisUp turns a duration into whole milliseconds, rounded up, so that a
// short wait does not become no wait at all; a negative one stays negative
// (refused by the broker, as in process).
func millisUp(d time.Duration) int64 {
	ms := d.Milliseconds()
	switch {
	case d > time.Duration(ms)*time.Millisecond:
		ms++
	case d < 0 && ms == 0:
		ms = -1
	}
	return ms
}

// ttlSeconds turns a TTL into ttl_s. The API counts whole seconds, so a TTL
// with a fraction is refused here exactly as the broker refuses it in
// process; a TTL out of range is sent and refused by the broker.
func ttlSeconds(ttl time.Duration) (int64, error) {
	if ttl%time.Second != 0 {
		return 0, cheetah.Invalidf("%s", cheetah.MsgTTL)
	}
	return int64(ttl / time.Second), nil
}

// commandRequest builds the body and headers of a send. What cannot be put
// on the wire (params that do not encode) is refused with the error the
// broker gives in process.
func commandRequest(lease cheetah.Lease, cmd cheetah.Command, so cheetah.SendOptions) (cheetah.CommandBody, []string, error) {
	body := cheetah.CommandBody{Name: cmd.Name, ResponseMode: so.ResponseMode}
	switch p := cmd.Params.(type) {
	case nil:
	case json.RawMessage:
		body.Params = p
	default:
		raw, err := json.Marshal(p)
		if err != nil {
			return body, nil, cheetah.Invalidf("params: %v", err)
		}
		body.Params = raw
	}
	if body.Params != nil && !json.Valid(body.Params) {
		return body, nil, cheetah.Invalidf("params is not valid JSON")
	}
	for _, f := range []struct {
		name string
		raw  json.RawMessage
		dst  *json.RawMessage
	}{{"target", so.Target, &body.Target}, {"options", so.Options, &body.Options}} {
		if len(f.raw) > 0 && !json.Valid(f.raw) {
			return body, nil, cheetah.Invalidf("%s must be a JSON object", f.name)
		}
		*f.dst = f.raw
	}
	if so.Timeout != 0 {
		// Whole milliseconds, as the broker counts them in process; below
		// one millisecond the broker refuses it.
		ms := so.Timeout.Milliseconds()
		if so.Timeout < 0 && ms == 0 {
			ms = -1
		}
		body.TimeoutMS = &ms
	}
	headers := []string{"X-Lease", lease.LeaseToken}
	if so.CallbackURL != "" {
		headers = append(headers, "X-Callback-Url", so.CallbackURL)
	}
	return body, headers, nil
}

// errUnknownLease is what the broker answers for a token it never issued,
// which an empty token is; the API cannot carry an empty X-Lease.
func errUnknownLease() error { return &cheetah.LeaseLostError{Reason: cheetah.LostUnknownLease} }

// Send posts the command to /api/v1/commands with the lease token in
// X-Lease and returns as soon as the broker admitted it.
func (b *backend) Send(ctx context.Context, lease cheetah.Lease, cmd cheetah.Command, so cheetah.SendOptions) (cheetah.Sent, error) {
	body, headers, err := commandRequest(lease, cmd, so)
	if err != nil {
		return cheetah.Sent{}, err
	}
	if lease.LeaseToken == "" {
		return cheetah.Sent{}, errUnknownLease()
	}
	var out cheetah.Sent
	if err := b.c.Do(ctx, "POST", "/api/v1/commands", body, &out, headers...); err != nil {
		return cheetah.Sent{}, err
	}
	return out, nil
}

// admissionGrace is how long a caller that went away before the broker
// answered still waits for the answer's headers, which name the command.
const admissionGrace = time.Second

// SendAndWait holds one request open until the command resolves. When the
// caller's context ends, the request is closed, and the broker ends the
// command cancelled, as it does for an in-process caller that goes away.
// The answer is then the in-process one: a cancelled resolution naming the
// command (the broker sends X-Command-Id and X-Trace-Id as soon as the
// command is admitted, before it is dispatched) and ctx's error. A caller
// that goes away before that answer has come waits for it up to
// admissionGrace more, so that a command that was admitted is named (in
// process, the call always returns after the admission).
func (b *backend) SendAndWait(ctx context.Context, lease cheetah.Lease, cmd cheetah.Command, so cheetah.SendOptions) (cheetah.Resolution, error) {
	body, headers, err := commandRequest(lease, cmd, so)
	if err != nil {
		return cheetah.Resolution{}, err
	}
	if lease.LeaseToken == "" {
		return cheetah.Resolution{}, errUnknownLease()
	}
	const path = "/api/v1/commands/wait"
	// The request has a context of its own, closed when the caller's ends
	// (after the grace, while no answer has come) or when this returns.
	reqCtx, closeReq := context.WithCancel(context.WithoutCancel(ctx))
	defer closeReq()
	answered, done := make(chan struct{}), make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
		case <-done:
			return
		}
		t := time.NewTimer(admissionGrace)
		defer t.Stop()
		select {
		case <-answered:
		case <-t.C:
		case <-done:
		}
		closeReq()
	}()
	resp, err := b.c.send(reqCtx, "POST", path, body, headers)
	close(answered)
	if err != nil {
		if ctx.Err() != nil {
			return cancelled(ctx, "", "")
		}
		return cheetah.Resolution{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return cheetah.Resolution{}, decodeError(resp)
	}
	id, trace := resp.Header.Get("X-Command-Id"), resp.Header.Get("X-Trace-Id")
	if so.OnAdmitted != nil && id != "" {
		so.OnAdmitted(cheetah.Sent{CommandID: id, TraceID: trace})
	}
	if ctx.Err() != nil {
		return cancelled(ctx, id, trace) // the deferred closeReq tells the broker
	}
	// The broker answers 200 at admission, so an error after it (the end
	// could not be recorded) comes as an error envelope in the 200 body.
	var out struct {
		Resolution *cheetah.Resolution `json:"resolution"`
		cheetah.Envelope
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		if ctx.Err() != nil {
			return cancelled(ctx, id, trace)
		}
		if id != "" && lease.UserID != "" {
			// The command was admitted and its answer lost on the way (a
			// proxy cut the request, a replica went away): history tells
			// its end.
			return b.awaitEnd(ctx, lease.UserID, id)
		}
		return cheetah.Resolution{}, fmt.Errorf("remote: POST %s: decode the answer: %w", path, err)
	}
	if err := out.Err(); err != nil {
		return cheetah.Resolution{CommandID: id, TraceID: trace}, err
	}
	if out.Resolution == nil {
		return cheetah.Resolution{}, fmt.Errorf("remote: POST %s: the answer holds no resolution", path)
	}
	return *out.Resolution, nil
}

// awaitEnd reads the command's record until it has ended, backing off from
// 50 ms to 2 s, and answers with its end as a wait would have.
func (b *backend) awaitEnd(ctx context.Context, userID, commandID string) (cheetah.Resolution, error) {
	wait := 50 * time.Millisecond
	for {
		rec, err := b.ReadCommand(ctx, userID, commandID)
		switch {
		case err == nil && rec.Status.Terminal():
			return rec.Resolution(), nil
		case err != nil && ctx.Err() == nil && !passing(err):
			return cheetah.Resolution{CommandID: commandID}, err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return cancelled(ctx, commandID, rec.TraceID)
		case <-t.C:
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// cancelled is a wait's answer when its caller's ctx ended first.
func cancelled(ctx context.Context, id, trace string) (cheetah.Resolution, error) {
	cerr := ctx.Err()
	return cheetah.Resolution{CommandID: id, TraceID: trace, Status: cheetah.StatusCancelled,
		Error: &cheetah.ErrorInfo{Code: "cancelled", Message: cerr.Error()}}, cerr
}

// passing reports whether err may pass if asked again: the broker or the
// way to it failed, rather than the broker refused.
func passing(err error) bool {
	var ue *url.Error
	var se *StatusError
	var rl *RateLimitedError
	return errors.Is(err, cheetah.ErrStoreUnavailable) || errors.As(err, &ue) || errors.As(err, &rl) ||
		(errors.As(err, &se) && se.StatusCode >= 500)
}

// Renew extends the lease through /api/v1/lease/renew; ttl zero keeps the
// lease's own TTL.
func (b *backend) Renew(ctx context.Context, lease cheetah.Lease, ttl time.Duration) (cheetah.Lease, error) {
	var body cheetah.RenewBody
	if ttl != 0 {
		s, err := ttlSeconds(ttl)
		if err != nil {
			return cheetah.Lease{}, err
		}
		body.TTLS = &s
	}
	if lease.LeaseToken == "" {
		return cheetah.Lease{}, errUnknownLease()
	}
	var out leaseAnswer
	if err := b.c.Do(ctx, "POST", "/api/v1/lease/renew", body, &out, "X-Lease", lease.LeaseToken); err != nil {
		return cheetah.Lease{}, err
	}
	return out.Lease, nil
}

// Release gives the lease back through /api/v1/lease/release and reports
// whether this call cleared it. A zero lease is not one: nothing is sent.
func (b *backend) Release(ctx context.Context, lease cheetah.Lease) (bool, error) {
	if lease.LeaseToken == "" {
		return false, nil // no lease carries an empty token
	}
	var out struct {
		Released bool `json:"released"`
	}
	if err := b.c.Do(ctx, "POST", "/api/v1/lease/release", nil, &out, "X-Lease", lease.LeaseToken); err != nil {
		return false, err
	}
	return out.Released, nil
}

// ReleaseAll sends the tokens in requests of at most maxReleaseAll. On an
// error it returns how many leases the requests before it cleared.
func (b *backend) ReleaseAll(ctx context.Context, tokens []string) (int, error) {
	n := 0
	for len(tokens) > 0 {
		batch := tokens[:min(len(tokens), maxReleaseAll)]
		tokens = tokens[len(batch):]
		var out struct {
			Released int `json:"released"`
		}
		if err := b.c.Do(ctx, "POST", "/api/v1/lease/release-all", cheetah.ReleaseAllBody{LeaseTokens: batch}, &out); err != nil {
			return n, err
		}
		n += out.Released
	}
	return n, nil
}

// ListAvailable reads the user's idle contexts, of clientType when it is
// not empty.
func (b *backend) ListAvailable(ctx context.Context, userID string, clientType cheetah.ClientType) ([]cheetah.ContextSnapshot, error) {
	p, err := userPath(userID)
	if err != nil {
		return nil, err
	}
	p += "/contexts/available"
	if clientType != "" {
		p += "?" + url.Values{"client_type": {string(clientType)}}.Encode()
	}
	var out struct {
		Contexts []cheetah.ContextSnapshot `json:"contexts"`
	}
	if err := b.c.Do(ctx, "GET", p, nil, &out); err != nil {
		return nil, err
	}
	if out.Contexts == nil {
		out.Contexts = []cheetah.ContextSnapshot{}
	}
	return out.Contexts, nil
}

// TaskContexts reads the user's live leases that carry taskID, without
// tokens; an empty task id has none and is not sent.
func (b *backend) TaskContexts(ctx context.Context, userID, taskID string) ([]cheetah.Lease, error) {
	p, err := userPath(userID)
	if err != nil {
		return nil, err
	}
	if taskID == "" {
		// No lease carries an empty task id, and a path cannot ask.
		return []cheetah.Lease{}, nil
	}
	var out struct {
		Leases []cheetah.Lease `json:"leases"`
	}
	if err := b.c.Do(ctx, "GET", p+"/tasks/"+segment(taskID)+"/leases", nil, &out); err != nil {
		return nil, err
	}
	if out.Leases == nil {
		out.Leases = []cheetah.Lease{}
	}
	return out.Leases, nil
}

// ReadCommand reads one command of the user with every message that came
// back for it.
func (b *backend) ReadCommand(ctx context.Context, userID, commandID string) (cheetah.CommandRecord, error) {
	p, err := userPath(userID)
	if err != nil {
		return cheetah.CommandRecord{}, err
	}
	if commandID == "" {
		// A path cannot ask; no command has an empty id.
		return cheetah.CommandRecord{}, cheetah.NotFoundf("command %s not found", commandID)
	}
	var out struct {
		Command cheetah.CommandRecord `json:"command"`
	}
	if err := b.c.Do(ctx, "GET", p+"/commands/"+segment(commandID), nil, &out); err != nil {
		return cheetah.CommandRecord{}, err
	}
	return out.Command, nil
}

// ListCommands reads a page of the user's commands, newest first, as q
// filters and pages them.
func (b *backend) ListCommands(ctx context.Context, userID string, q cheetah.ListQuery) (cheetah.CommandPage, error) {
	p, err := userPath(userID)
	if err != nil {
		return cheetah.CommandPage{}, err
	}
	v := url.Values{}
	if q.TaskID != "" {
		v.Set("task_id", q.TaskID)
	}
	if q.Limit != 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	if q.Cursor != "" {
		v.Set("cursor", q.Cursor)
	}
	p += "/commands"
	if len(v) > 0 {
		p += "?" + v.Encode()
	}
	var out cheetah.CommandPage
	if err := b.c.Do(ctx, "GET", p, nil, &out); err != nil {
		return cheetah.CommandPage{}, err
	}
	if out.Commands == nil {
		out.Commands = []cheetah.CommandRecord{}
	}
	return out, nil
}

// userPath returns /api/v1/users/{userID}. A user id that is not well formed
// is refused here with the broker's own error: it cannot be a path segment
// safely (an empty one, or one with a slash, would reach another route).
func userPath(userID string) (string, error) {
	if !protocol.ValidUserID(userID) {
		return "", cheetah.Invalidf("user_id %q is not a valid id", userID)
	}
	return "/api/v1/users/" + segment(userID), nil
}

// segment escapes one path segment, dot segments included, which a client
// or proxy on the way would otherwise resolve away.
func segment(s string) string {
	switch s {
	case ".":
		return "%2E"
	case "..":
		return "%2E%2E"
	}
	return url.PathEscape(s)
}
