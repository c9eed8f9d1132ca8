package sdktest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
)

// Users of the suite. Every scenario has a broker of its own.
const (
	userA = "usr_sdk_a"
	userB = "usr_sdk_b"
)

// suite is one scenario's view of its Env.
type suite struct {
	t   *testing.T
	env *Env
	m   *cheetah.Manager
	ctx context.Context
}

type scenario struct {
	name string
	run  func(s *suite)
}

// Run runs every scenario as a parallel subtest, each on the broker newEnv
// starts for it.
func Run(t *testing.T, newEnv func(t *testing.T) *Env) {
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			env := newEnv(t)
			if why, ok := env.Skip[sc.name]; ok {
				t.Skip("known difference: " + why)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*guard)
			t.Cleanup(cancel)
			sc.run(&suite{t: t, env: env, m: env.Manager, ctx: ctx})
		})
	}
}

var scenarios = []scenario{
	{"AcquireHandle", acquireHandle},
	{"SendAndWaitEcho", sendAndWaitEcho},
	{"SendCompletes", sendCompletes},
	{"SendOptions", sendOptions},
	{"ResponseModeNone", responseModeNone},
	{"NoContextReasons", noContextReasons},
	{"WaitGetsReleasedContext", waitGetsReleased},
	{"WaitEndsWithReason", waitEndsWithReason},
	{"LostReleased", lostReleased},
	{"LostReassigned", lostReassigned},
	{"LostRevoked", lostRevoked},
	{"LostContextGone", lostContextGone},
	{"LostNotLive", lostNotLive},
	{"LostNotWorker", lostNotWorker},
	{"LostExpired", lostExpired},
	{"LostUnknownLease", lostUnknownLease},
	{"ReleaseTwice", releaseTwice},
	{"ReleaseZeroHandle", releaseZeroHandle},
	{"ReleaseAll", releaseAll},
	{"ReleaseAllMany", releaseAllMany},
	{"Renew", renew},
	{"RenewOnUse", renewOnUse},
	{"ListAvailable", listAvailable},
	{"TaskContexts", taskContexts},
	{"TaskContextsUserThenTask", taskContextsUserThenTask},
	{"TaskIDWithSlash", taskIDWithSlash},
	{"CommandFails", commandFails},
	{"TimedOut", timedOut},
	{"CallerCancels", callerCancels},
	{"CancelledResolutionNamesCommand", cancelledResolutionNamesCommand},
	{"InvalidAcquire", invalidAcquire},
	{"InvalidSend", invalidSend},
	{"InvalidReads", invalidReads},
	{"UserBoundary", userBoundary},
	{"HistoryList", historyList},
	{"PayloadLimits", payloadLimits},
	{"CallbackToPrivateAddress", callbackToPrivateAddress},
	{"CreateContext", createContext},
	{"CreateFailures", createFailures},
	{"Affinity", affinity},
	{"QuotaExceededAndWait", quotaExceededAndWait},
	{"DoneRevoked", doneRevoked},
	{"DoneExpired", doneExpired},
	{"DoneContextGone", doneContextGone},
	{"DoneReleased", doneReleased},
	{"DoneClientGone", doneClientGone},
	{"ClearState", clearState},
}

// ---- helpers ----

func (s *suite) eventually(cond func() bool, format string, args ...any) {
	s.t.Helper()
	require.Eventually(s.t, cond, guard, 5*time.Millisecond, append([]any{format}, args...)...)
}

func (s *suite) acquire(req cheetah.AcquireRequest) *cheetah.Handle {
	s.t.Helper()
	if req.UserID == "" {
		req.UserID = userA
	}
	if req.ClientType == "" {
		req.ClientType = cheetah.Console
	}
	h, err := s.m.Acquire(s.ctx, req)
	require.NoError(s.t, err)
	require.NotNil(s.t, h)
	return h
}

func (s *suite) read(user, id string) cheetah.CommandRecord {
	s.t.Helper()
	rec, err := s.m.History().Read(s.ctx, user, id)
	require.NoError(s.t, err)
	return rec
}

// waitStatus waits until a command's record reaches status and returns it.
func (s *suite) waitStatus(user, id string, status cheetah.Status) cheetah.CommandRecord {
	s.t.Helper()
	var rec cheetah.CommandRecord
	s.eventually(func() bool {
		r, err := s.m.History().Read(s.ctx, user, id)
		rec = r
		return err == nil && r.Status == status
	}, "command %s reaches %s", id, status)
	return rec
}

// code is the API code of err, the value the suite compares.
func code(err error) string {
	c, _, _ := cheetah.Classify(err)
	return c
}

func requireCode(t *testing.T, err error, want *cheetah.Error, what string) {
	t.Helper()
	require.Error(t, err, what)
	require.ErrorIs(t, err, want, what)
	require.Equal(t, want.Code, code(err), what)
}

func lostReason(t *testing.T, err error, what string) cheetah.LostReason {
	t.Helper()
	require.Error(t, err, what)
	require.ErrorIs(t, err, cheetah.ErrLeaseLost, what)
	var lost *cheetah.LeaseLostError
	require.ErrorAs(t, err, &lost, what)
	return lost.Reason
}

func noContextReason(t *testing.T, err error, what string) cheetah.NoContextReason {
	t.Helper()
	require.Error(t, err, what)
	require.ErrorIs(t, err, cheetah.ErrNoContextAvailable, what)
	var nc *cheetah.NoContextError
	require.ErrorAs(t, err, &nc, what)
	return nc.Reason
}

// requireLost checks that every use of h fails with reason, and that
// nothing was dispatched through it.
func (s *suite) requireLost(h *cheetah.Handle, want cheetah.LostReason) {
	t := s.t
	t.Helper()
	_, err := h.Send(s.ctx, cheetah.Command{Name: "echo"})
	require.Equal(t, want, lostReason(t, err, "send"), "send")
	res, err := h.SendAndWait(s.ctx, cheetah.Command{Name: "echo"})
	require.Equal(t, want, lostReason(t, err, "send_and_wait"), "send_and_wait")
	require.Empty(t, res.CommandID)
	err = h.Renew(s.ctx)
	require.Equal(t, want, lostReason(t, err, "renew"), "renew")
	page, err := s.m.History().List(s.ctx, h.UserID(), cheetah.ListQuery{TaskID: h.TaskID()})
	require.NoError(t, err)
	for _, c := range page.Commands {
		require.NotEqual(t, h.Epoch(), c.Epoch, "a command was recorded through a lost handle")
	}
}

func kinds(rec cheetah.CommandRecord) []cheetah.MessageKind {
	out := make([]cheetah.MessageKind, 0, len(rec.Messages))
	for _, m := range rec.Messages {
		out = append(out, m.Kind)
	}
	return out
}

// ---- scenarios ----

func acquireHandle(s *suite) {
	t := s.t
	s.agent(userA, "agent-1", 1, nil)
	before := time.Now()
	h := s.acquire(cheetah.AcquireRequest{TaskID: "task-1"})
	after := time.Now()
	l := h.Lease()
	require.Equal(t, userA, h.UserID())
	require.Equal(t, "agent-1", h.ClientID())
	require.Equal(t, "flow-1", h.ContextID())
	require.Equal(t, cheetah.Console, h.ClientType())
	require.Equal(t, "task-1", h.TaskID())
	require.Positive(t, h.Epoch())
	require.Equal(t, 300, l.TTLSeconds, "the default TTL")
	require.Regexp(t, `^[0-9a-f]{32}$`, l.LeaseToken)
	require.WithinRange(t, h.ExpiresAt(), before.Add(299*time.Second), after.Add(301*time.Second))
	require.NotContains(t, h.String(), l.LeaseToken)

	// An explicit TTL, and a second acquire gets a later epoch.
	s.agent(userA, "agent-2", 1, nil)
	h2 := s.acquire(cheetah.AcquireRequest{TaskID: "task-2", TTL: time.Minute})
	require.Equal(t, 60, h2.Lease().TTLSeconds)
	require.Equal(t, "agent-2", h2.ClientID())
	require.Greater(t, h2.Epoch(), h.Epoch())
}

func sendAndWaitEcho(s *suite) {
	t := s.t
	s.agent(userA, "agent-1", 1, nil)
	h := s.acquire(cheetah.AcquireRequest{TaskID: "echo-task"})
	res, err := h.SendAndWait(s.ctx, cheetah.Command{Name: "echo", Params: map[string]any{"hello": "world"}},
		cheetah.WithTimeout(guard))
	require.NoError(t, err)
	require.Equal(t, cheetah.StatusCompleted, res.Status)
	require.Nil(t, res.Error)
	require.NotEmpty(t, res.CommandID)
	require.Regexp(t, `^[0-9a-f]{32}$`, res.TraceID)
	require.NotEqual(t, strings.Repeat("0", 32), res.TraceID)

	// Read your result: the terminal message is already there.
	rec := s.read(userA, res.CommandID)
	require.Equal(t, cheetah.StatusCompleted, rec.Status)
	require.Equal(t, res.TraceID, rec.TraceID)
	require.Equal(t, res.CommandID, rec.CommandID)
	require.Equal(t, userA, rec.UserID)
	require.Equal(t, "agent-1", rec.ClientID)
	require.Equal(t, "flow-1", rec.ContextID)
	require.Equal(t, "echo-task", rec.TaskID)
	require.Equal(t, h.Epoch(), rec.Epoch)
	require.Equal(t, "echo", rec.Name)
	require.Equal(t, cheetah.ModeRPC, rec.ResponseMode)
	require.JSONEq(t, `{"hello":"world"}`, string(rec.Params))
	require.JSONEq(t, `{"tab_id":"1"}`, string(rec.Target), "the context's default tab")
	require.Nil(t, rec.Error)
	require.NotNil(t, rec.FinishedAt)
	require.Equal(t, []cheetah.MessageKind{cheetah.KindAck, cheetah.KindResult}, kinds(rec))
	require.JSONEq(t, `{"hello":"world"}`, string(rec.Messages[1].Data))
	require.False(t, rec.Messages[1].Late)
}

func sendCompletes(s *suite) {
	t := s.t
	s.agent(userA, "agent-1", 1, nil)
	h := s.acquire(cheetah.AcquireRequest{TaskID: "send-task"})
	id, err := h.Send(s.ctx, cheetah.Command{Name: "echo", Params: json.RawMessage(`{"n":1}`)})
	require.NoError(t, err)
	require.NotEmpty(t, id)
	// The id is returned once the record is durable.
	rec := s.read(userA, id)
	require.Equal(t, cheetah.ModeAsync, rec.ResponseMode, "a plain send is async")
	require.Regexp(t, `^[0-9a-f]{32}$`, rec.TraceID)
	rec = s.waitStatus(userA, id, cheetah.StatusCompleted)
	require.Equal(t, []cheetah.MessageKind{cheetah.KindAck, cheetah.KindResult}, kinds(rec))
	require.JSONEq(t, `{"n":1}`, string(rec.Messages[1].Data))

	// rpc on a plain send is taken as async: nobody waits.
	id, err = h.Send(s.ctx, cheetah.Command{Name: "echo"}, cheetah.WithResponseMode(cheetah.ModeRPC))
	require.NoError(t, err)
	require.Equal(t, cheetah.ModeAsync, s.waitStatus(userA, id, cheetah.StatusCompleted).ResponseMode)
}

func sendOptions(s *suite) {
	t := s.t
	s.agent(userA, "agent-1", 1, nil)
	h := s.acquire(cheetah.AcquireRequest{TaskID: "opts"})
	res, err := h.SendAndWait(s.ctx, cheetah.Command{Name: "echo"},
		cheetah.WithTarget("9"), cheetah.WithOptions(map[string]any{"fast": true}), cheetah.WithTimeout(guard))
	require.NoError(t, err)
	require.Equal(t, cheetah.StatusCompleted, res.Status)
	rec := s.read(userA, res.CommandID)
	require.JSONEq(t, `{"tab_id":"9"}`, string(rec.Target))
	require.JSONEq(t, `{"fast":true}`, string(rec.Options))
	require.Empty(t, rec.Params)
}

func responseModeNone(s *suite) {
	t := s.t
	s.agent(userA, "agent-1", 1, nil)
	h := s.acquire(cheetah.AcquireRequest{TaskID: "none"})
	id, err := h.Send(s.ctx, cheetah.Command{Name: "echo"}, cheetah.WithResponseMode(cheetah.ModeNone))
	require.NoError(t, err)
	rec := s.waitStatus(userA, id, cheetah.StatusAcknowledged)
	require.Equal(t, cheetah.ModeNone, rec.ResponseMode)
	// A later command proves the client is past it; still no terminal.
	res, err := h.SendAndWait(s.ctx, cheetah.Command{Name: "echo"}, cheetah.WithTimeout(guard))
	require.NoError(t, err)
	require.Equal(t, cheetah.StatusCompleted, res.Status)
	rec = s.read(userA, id)
	require.Equal(t, cheetah.StatusAcknowledged, rec.Status)
	require.Equal(t, []cheetah.MessageKind{cheetah.KindAck}, kinds(rec))
}

func noContextReasons(s *suite) {
	t := s.t
	miss := func(req cheetah.AcquireRequest, want cheetah.NoContextReason, what string) {
		t.Helper()
		if req.UserID == "" {
			req.UserID = userA
		}
		if req.TaskID == "" {
			req.TaskID = "t"
		}
		h, err := s.m.Acquire(s.ctx, req)
		require.Nil(t, h, what)
		require.Equal(t, want, noContextReason(t, err, what), what)
	}
	miss(cheetah.AcquireRequest{ClientType: cheetah.Console}, cheetah.ReasonNoEligibleClient, "nobody connected")
	s.agent(userA, "agent-1", 1, map[string]string{"region": "eu"})
	miss(cheetah.AcquireRequest{}, cheetah.ReasonNoEligibleClient, "no browser (the default type)")
	miss(cheetah.AcquireRequest{UserID: userB, ClientType: cheetah.Console}, cheetah.ReasonNoEligibleClient, "another user's client")
	miss(cheetah.AcquireRequest{ClientType: cheetah.Console, ClientID: "agent-9"}, cheetah.ReasonPlacementMiss, "client_id")
	miss(cheetah.AcquireRequest{ClientType: cheetah.Console, Labels: map[string]string{"region": "us"}}, cheetah.ReasonPlacementMiss, "labels")
	miss(cheetah.AcquireRequest{ClientType: cheetah.Console, Labels: map[string]string{"gpu": "yes"}}, cheetah.ReasonPlacementMiss, "a label nobody has")

	h := s.acquire(cheetah.AcquireRequest{TaskID: "t", ClientID: "agent-1", Labels: map[string]string{"region": "eu"}})
	require.Equal(t, "agent-1", h.ClientID())
	miss(cheetah.AcquireRequest{ClientType: cheetah.Console}, cheetah.ReasonNoIdleWorker, "all leased")
	miss(cheetah.AcquireRequest{ClientType: cheetah.Console, ClientID: "agent-1"}, cheetah.ReasonNoIdleWorker, "placed but leased")
	miss(cheetah.AcquireRequest{ClientType: cheetah.Console, Labels: map[string]string{"region": "eu"}}, cheetah.ReasonNoIdleWorker, "labelled but leased")
}

func waitGetsReleased(s *suite) {
	t := s.t
	s.agent(userA, "agent-1", 1, nil)
	h1 := s.acquire(cheetah.AcquireRequest{TaskID: "first"})
	type result struct {
		h   *cheetah.Handle
		err error
		at  time.Time
	}
	got := make(chan result, 1)
	start := time.Now()
	go func() {
		h, err := s.m.Acquire(s.ctx, cheetah.AcquireRequest{UserID: userA, TaskID: "second",
			ClientType: cheetah.Console, Wait: guard})
		got <- result{h, err, time.Now()}
	}()
	// There is no way to observe the waiter through the SDK: give it time to
	// queue, then check that it did wait.
	time.Sleep(200 * time.Millisecond)
	released := time.Now()
	ok, err := s.m.Release(s.ctx, h1)
	require.NoError(t, err)
	require.True(t, ok)
	var r result
	select {
	case r = <-got:
	case <-time.After(guard):
		t.Fatal("the waiting acquire did not return")
	}
	require.NoError(t, r.err)
	require.False(t, r.at.Before(released), "the acquire returned before the release, after %s", r.at.Sub(start))
	require.Equal(t, "flow-1", r.h.ContextID())
	require.Equal(t, "second", r.h.TaskID())
	require.Greater(t, r.h.Epoch(), h1.Epoch())
	_, err = r.h.Send(s.ctx, cheetah.Command{Name: "echo"})
	require.NoError(t, err)
}

func waitEndsWithReason(s *suite) {
	t := s.t
	s.agent(userA, "agent-1", 1, nil)
	s.acquire(cheetah.AcquireRequest{TaskID: "first"})
	start := time.Now()
	_, err := s.m.Acquire(s.ctx, cheetah.AcquireRequest{UserID: userA, TaskID: "second",
		ClientType: cheetah.Console, Wait: 150 * time.Millisecond})
	require.Equal(t, cheetah.ReasonNoIdleWorker, noContextReason(t, err, "wait ends"))
	require.GreaterOrEqual(t, time.Since(start), 150*time.Millisecond)

	// A wait the caller gives up on returns the caller's context error.
	ctx, cancel := context.WithTimeout(s.ctx, 100*time.Millisecond)
	defer cancel()
	_, err = s.m.Acquire(ctx, cheetah.AcquireRequest{UserID: userA, TaskID: "third",
		ClientType: cheetah.Console, Wait: guard})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Empty(t, code(err), "not an API error")
}

func lostReleased(s *suite) {
	s.agent(userA, "agent-1", 1, nil)
	h := s.acquire(cheetah.AcquireRequest{TaskID: "t"})
	ok, err := s.m.Release(s.ctx, h)
	require.NoError(s.t, err)
	require.True(s.t, ok)
	s.requireLost(h, cheetah.LostReleased)
}

func lostReassigned(s *suite) {
	t := s.t
	s.agent(userA, "agent-1", 1, nil)
	h1 := s.acquire(cheetah.AcquireRequest{TaskID: "same-task"})
	_, err := s.m.Release(s.ctx, h1)
	require.NoError(t, err)
	h2 := s.acquire(cheetah.AcquireRequest{TaskID: "same-task"})
	require.Equal(t, h1.ContextID(), h2.ContextID())
	require.Greater(t, h2.Epoch(), h1.Epoch())
	s.requireLost(h1, cheetah.LostReassigned)
	// The stale handle cannot release the new lease either.
	ok, err := s.m.Release(s.ctx, h1)
	require.NoError(t, err)
	require.False(t, ok)
	res, err := h2.SendAndWait(s.ctx, cheetah.Command{Name: "echo"}, cheetah.WithTimeout(guard))
	require.NoError(t, err)
	require.Equal(t, cheetah.StatusCompleted, res.Status)
	require.Equal(t, h2.Epoch(), s.read(userA, res.CommandID).Epoch)
}

func lostRevoked(s *suite) {
	t := s.t
	s.agent(userA, "agent-1", 1, nil)
	h := s.acquire(cheetah.AcquireRequest{TaskID: "t"})
	require.True(t, s.env.Revoke(userA, "agent-1", "flow-1"))
	require.False(t, s.env.Revoke(userA, "agent-1", "flow-1"), "nothing left to revoke")
	s.requireLost(h, cheetah.LostRevoked)
	ok, err := s.m.Release(s.ctx, h)
	require.NoError(t, err)
	require.False(t, ok)
	// The context is idle again.
	s.waitAvailable(userA, "agent-1", 1)
}

func lostContextGone(s *suite) {
	t := s.t
	c := s.raw(userA, "raw-1", worker("c1"), worker("c2"))
	h := s.acquire(cheetah.AcquireRequest{TaskID: "t"})
	require.Equal(t, "c1", h.ContextID())
	c.report(worker("c2")) // c1 is gone
	s.requireLost(h, cheetah.LostContextGone)
	ok, err := s.m.Release(s.ctx, h)
	require.NoError(t, err)
	require.False(t, ok)
	leases, err := s.m.TaskContexts(s.ctx, userA, "t")
	require.NoError(t, err)
	require.Empty(t, leases)
}

func lostNotLive(s *suite) {
	t := s.t
	s.agent(userA, "agent-1", 1, nil)
	h := s.acquire(cheetah.AcquireRequest{TaskID: "t"})
	require.True(t, s.env.Disconnect(userA, "agent-1"))
	s.eventually(func() bool {
		err := h.Renew(s.ctx)
		var lost *cheetah.LeaseLostError
		return errors.As(err, &lost) && lost.Reason == cheetah.LostNotLive
	}, "the context stops being live")
	s.requireLost(h, cheetah.LostNotLive)
	// The lease survives the reconnect grace, so its holder can give it back.
	ok, err := s.m.Release(s.ctx, h)
	require.NoError(t, err)
	require.True(t, ok)
}

func lostNotWorker(s *suite) {
	t := s.t
	c := s.raw(userA, "raw-1", worker("c1"))
	h := s.acquire(cheetah.AcquireRequest{TaskID: "t"})
	c.report(human("c1")) // a person took the tab over
	s.requireLost(h, cheetah.LostNotWorker)
	ok, err := s.m.Release(s.ctx, h)
	require.NoError(t, err)
	require.True(t, ok, "the context still carries the lease")
}

func lostExpired(s *suite) {
	s.agent(userA, "agent-1", 1, nil)
	h := s.acquire(cheetah.AcquireRequest{TaskID: "short", TTL: time.Second})
	s.eventually(func() bool {
		ls, err := s.m.TaskContexts(s.ctx, userA, "short")
		return err == nil && len(ls) == 0
	}, "the lease expires")
	s.requireLost(h, cheetah.LostExpired)
}

func lostUnknownLease(s *suite) {
	t := s.t
	for _, token := range []string{"0123456789abcdef0123456789abcdef", "not-a-token"} {
		err := s.env.SendToken(s.ctx, token)
		require.Equal(t, cheetah.LostUnknownLease, lostReason(t, err, token))
	}
	// Release and release-all of tokens never issued change nothing.
	s.agent(userA, "agent-1", 1, nil)
	h := s.acquire(cheetah.AcquireRequest{TaskID: "t"})
	n, err := s.m.ReleaseAll(s.ctx, []*cheetah.Handle{new(cheetah.Handle)})
	require.NoError(t, err)
	require.Zero(t, n)
	_, err = h.Send(s.ctx, cheetah.Command{Name: "echo"})
	require.NoError(t, err)
}

func releaseTwice(s *suite) {
	t := s.t
	s.agent(userA, "agent-1", 1, nil)
	h := s.acquire(cheetah.AcquireRequest{TaskID: "t"})
	ok, err := s.m.Release(s.ctx, h)
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = s.m.Release(s.ctx, h)
	require.NoError(t, err)
	require.False(t, ok)
	s.waitAvailable(userA, "agent-1", 1)
}

func releaseZeroHandle(s *suite) {
	// A Handle that no acquire made carries no token: no lease to clear.
	ok, err := s.m.Release(s.ctx, new(cheetah.Handle))
	require.NoError(s.t, err)
	require.False(s.t, ok)
}

func releaseAll(s *suite) {
	t := s.t
	s.agent(userA, "agent-1", 3, nil)
	hs := []*cheetah.Handle{
		s.acquire(cheetah.AcquireRequest{TaskID: "a"}),
		s.acquire(cheetah.AcquireRequest{TaskID: "b"}),
		s.acquire(cheetah.AcquireRequest{TaskID: "c"}),
	}
	ok, err := s.m.Release(s.ctx, hs[1])
	require.NoError(t, err)
	require.True(t, ok)
	n, err := s.m.ReleaseAll(s.ctx, hs)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	n, err = s.m.ReleaseAll(s.ctx, hs)
	require.NoError(t, err)
	require.Zero(t, n)
	n, err = s.m.ReleaseAll(s.ctx, nil)
	require.NoError(t, err)
	require.Zero(t, n)
	for _, h := range hs {
		require.Equal(t, cheetah.LostReleased, lostReason(t, h.Renew(s.ctx), "renew"))
	}
	s.waitAvailable(userA, "agent-1", 3)
}

// releaseAllMany releases more handles than one HTTP request may carry.
func releaseAllMany(s *suite) {
	t := s.t
	s.agent(userA, "agent-1", 2, nil)
	h1 := s.acquire(cheetah.AcquireRequest{TaskID: "a"})
	h2 := s.acquire(cheetah.AcquireRequest{TaskID: "b"})
	hs := make([]*cheetah.Handle, 0, 2500)
	for range 1250 {
		hs = append(hs, h1, h2)
	}
	n, err := s.m.ReleaseAll(s.ctx, hs)
	require.NoError(t, err)
	require.Equal(t, 2, n)
}

func renew(s *suite) {
	t := s.t
	s.agent(userA, "agent-1", 1, nil)
	h := s.acquire(cheetah.AcquireRequest{TaskID: "t", TTL: time.Minute})
	first := h.ExpiresAt()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, h.Renew(s.ctx))
	require.True(t, h.ExpiresAt().After(first), "expires_at moves: %s → %s", first, h.ExpiresAt())
	require.Equal(t, 60, h.Lease().TTLSeconds)

	before := time.Now()
	require.NoError(t, h.RenewFor(s.ctx, 2*time.Minute))
	require.Equal(t, 120, h.Lease().TTLSeconds)
	require.WithinRange(t, h.ExpiresAt(), before.Add(119*time.Second), time.Now().Add(121*time.Second))
	require.NoError(t, s.m.Renew(s.ctx, h))
	require.Equal(t, 120, h.Lease().TTLSeconds, "a renew keeps the TTL it was given")

	// The broker's view agrees with the handle's.
	ls, err := s.m.TaskContexts(s.ctx, userA, "t")
	require.NoError(t, err)
	require.Len(t, ls, 1)
	require.True(t, ls[0].ExpiresAt.Equal(h.ExpiresAt()), "%s vs %s", ls[0].ExpiresAt, h.ExpiresAt())
	require.Equal(t, 120, ls[0].TTLSeconds)

	for _, ttl := range []time.Duration{-time.Second, 1500 * time.Millisecond, 3601 * time.Second} {
		requireCode(t, h.RenewFor(s.ctx, ttl), cheetah.ErrInvalidRequest, fmt.Sprintf("renew for %s", ttl))
	}
	require.Equal(t, 120, h.Lease().TTLSeconds, "a refused renew changes nothing")
}

func renewOnUse(s *suite) {
	t := s.t
	s.agent(userA, "agent-1", 2, nil)
	expiry := func(task string) time.Time {
		t.Helper()
		ls, err := s.m.TaskContexts(s.ctx, userA, task)
		require.NoError(t, err)
		require.Len(t, ls, 1)
		return ls[0].ExpiresAt
	}
	strict := false
	hs := s.acquire(cheetah.AcquireRequest{TaskID: "strict", TTL: time.Minute, RenewOnUse: &strict})
	hu := s.acquire(cheetah.AcquireRequest{TaskID: "on-use", TTL: time.Minute})
	s0, u0 := expiry("strict"), expiry("on-use")
	time.Sleep(20 * time.Millisecond)
	for _, h := range []*cheetah.Handle{hs, hu} {
		id, err := h.Send(s.ctx, cheetah.Command{Name: "echo"})
		require.NoError(t, err)
		s.waitStatus(userA, id, cheetah.StatusCompleted)
	}
	require.True(t, expiry("strict").Equal(s0), "renew_on_use false: a send does not extend")
	require.True(t, expiry("on-use").After(u0), "a send extends")
}

type place struct{ Client, Context, State string }

func places(cs []cheetah.ContextSnapshot) []place {
	out := []place{}
	for _, c := range cs {
		out = append(out, place{c.ClientID, c.ContextID, c.State})
	}
	return out
}

func listAvailable(s *suite) {
	t := s.t
	s.agent(userA, "agent-a", 2, map[string]string{"region": "eu"})
	s.agent(userA, "agent-b", 1, nil)
	list, err := s.m.ListAvailable(s.ctx, userA, cheetah.Console)
	require.NoError(t, err)
	require.Equal(t, []place{{"agent-a", "flow-1", "idle"}, {"agent-a", "flow-2", "idle"}, {"agent-b", "flow-1", "idle"}}, places(list),
		"longest idle first")
	for i, c := range list {
		require.Equal(t, userA, c.UserID)
		require.Equal(t, cheetah.Console, c.ClientType)
		require.Equal(t, cheetah.OwnerWorker, c.Owner)
		require.NotNil(t, c.IdleSince)
		if i > 0 {
			require.False(t, c.IdleSince.Before(*list[i-1].IdleSince), "idle_since ascends")
		}
	}
	require.Equal(t, "2", list[1].TabID)

	// The longest idle is taken first; a released context goes to the back.
	h := s.acquire(cheetah.AcquireRequest{TaskID: "t"})
	require.Equal(t, "agent-a", h.ClientID())
	require.Equal(t, "flow-1", h.ContextID())
	list, err = s.m.ListAvailable(s.ctx, userA, cheetah.Console)
	require.NoError(t, err)
	require.Equal(t, []place{{"agent-a", "flow-2", "idle"}, {"agent-b", "flow-1", "idle"}}, places(list))
	_, err = s.m.Release(s.ctx, h)
	require.NoError(t, err)
	list, err = s.m.ListAvailable(s.ctx, userA, "")
	require.NoError(t, err)
	require.Equal(t, []place{{"agent-a", "flow-2", "idle"}, {"agent-b", "flow-1", "idle"}, {"agent-a", "flow-1", "idle"}}, places(list),
		"every type when none is given")

	list, err = s.m.ListAvailable(s.ctx, userA, cheetah.Browser)
	require.NoError(t, err)
	require.NotNil(t, list)
	require.Empty(t, list)
	list, err = s.m.ListAvailable(s.ctx, userB, "")
	require.NoError(t, err)
	require.NotNil(t, list)
	require.Empty(t, list, "another user sees nothing")
	_, err = s.m.ListAvailable(s.ctx, userA, "robot")
	requireCode(t, err, cheetah.ErrInvalidRequest, "client type robot")
}

func taskContexts(s *suite) {
	t := s.t
	s.agent(userA, "agent-1", 3, nil)
	h1 := s.acquire(cheetah.AcquireRequest{TaskID: "fan-out"})
	h2 := s.acquire(cheetah.AcquireRequest{TaskID: "fan-out"})
	s.acquire(cheetah.AcquireRequest{TaskID: "other"})
	ls, err := s.m.TaskContexts(s.ctx, userA, "fan-out")
	require.NoError(t, err)
	require.Len(t, ls, 2)
	for i, h := range []*cheetah.Handle{h1, h2} {
		want := h.Lease()
		want.LeaseToken = ""
		require.Empty(t, ls[i].LeaseToken, "never a token")
		require.Equal(t, want.Epoch, ls[i].Epoch, "ordered by epoch")
		require.Equal(t, want.ContextID, ls[i].ContextID)
		require.Equal(t, want.ClientID, ls[i].ClientID)
		require.Equal(t, want.ClientType, ls[i].ClientType)
		require.Equal(t, want.TaskID, ls[i].TaskID)
		require.Equal(t, want.TTLSeconds, ls[i].TTLSeconds)
		require.True(t, want.ExpiresAt.Equal(ls[i].ExpiresAt))
	}
	_, err = s.m.Release(s.ctx, h1)
	require.NoError(t, err)
	ls, err = s.m.TaskContexts(s.ctx, userA, "fan-out")
	require.NoError(t, err)
	require.Len(t, ls, 1)
	require.Equal(t, h2.Epoch(), ls[0].Epoch)

	for _, q := range []struct{ task, user string }{{"nothing", userA}, {"fan-out", userB}, {"", userA}} {
		ls, err = s.m.TaskContexts(s.ctx, q.user, q.task)
		require.NoError(t, err)
		require.NotNil(t, ls)
		require.Empty(t, ls, "%+v", q)
	}
}

// taskContextsUserThenTask: TaskContexts takes the user, then the task. Each
// user's task is named after the other user, so a call that mixed the two
// up would find the other user's lease instead of its own.
func taskContextsUserThenTask(s *suite) {
	t := s.t
	s.agent(userA, "agent-a", 1, nil)
	s.agent(userB, "agent-b", 1, nil)
	ha := s.acquire(cheetah.AcquireRequest{UserID: userA, TaskID: userB})
	hb := s.acquire(cheetah.AcquireRequest{UserID: userB, TaskID: userA})
	for _, h := range []*cheetah.Handle{ha, hb} {
		ls, err := s.m.TaskContexts(s.ctx, h.UserID(), h.TaskID())
		require.NoError(t, err)
		require.Len(t, ls, 1, "user %s, task %s", h.UserID(), h.TaskID())
		require.Equal(t, h.UserID(), ls[0].UserID)
		require.Equal(t, h.TaskID(), ls[0].TaskID)
		require.Equal(t, h.ClientID(), ls[0].ClientID)
		require.Equal(t, h.Epoch(), ls[0].Epoch)
	}
}

// taskIDWithSlash: a task id is any 1 to 256 bytes, slashes included.
func taskIDWithSlash(s *suite) {
	t := s.t
	s.agent(userA, "agent-1", 1, nil)
	for _, task := range []string{"catalog/42", "a b?c#d%2F", ".."} {
		h := s.acquire(cheetah.AcquireRequest{TaskID: task})
		ls, err := s.m.TaskContexts(s.ctx, userA, task)
		require.NoError(t, err, task)
		require.Len(t, ls, 1, task)
		require.Equal(t, task, ls[0].TaskID)
		id, err := h.Send(s.ctx, cheetah.Command{Name: "echo"})
		require.NoError(t, err)
		page, err := s.m.History().List(s.ctx, userA, cheetah.ListQuery{TaskID: task})
		require.NoError(t, err)
		require.Len(t, page.Commands, 1, task)
		require.Equal(t, id, page.Commands[0].CommandID)
		_, err = s.m.Release(s.ctx, h)
		require.NoError(t, err)
	}
}

func commandFails(s *suite) {
	t := s.t
	s.agent(userA, "agent-1", 1, nil)
	h := s.acquire(cheetah.AcquireRequest{TaskID: "t"})
	res, err := h.SendAndWait(s.ctx, cheetah.Command{Name: cmdFail}, cheetah.WithTimeout(guard))
	require.NoError(t, err, "a failed command is a resolution, not an error")
	require.Equal(t, cheetah.StatusFailed, res.Status)
	require.NotNil(t, res.Error)
	require.Equal(t, "boom", res.Error.Code)
	require.Equal(t, "it broke", res.Error.Message)
	require.JSONEq(t, `{"n":1}`, string(res.Error.Data))
	rec := s.read(userA, res.CommandID)
	require.Equal(t, cheetah.StatusFailed, rec.Status)
	require.Equal(t, "boom", rec.Error.Code)
	require.Equal(t, []cheetah.MessageKind{cheetah.KindAck, cheetah.KindError}, kinds(rec))
	require.Equal(t, "boom", rec.Messages[1].Code)

	res, err = h.SendAndWait(s.ctx, cheetah.Command{Name: "no-such-command"}, cheetah.WithTimeout(guard))
	require.NoError(t, err)
	require.Equal(t, cheetah.StatusFailed, res.Status)
	require.Equal(t, "unknown_command_name", res.Error.Code)
}

func timedOut(s *suite) {
	t := s.t
	a := s.agent(userA, "agent-1", 1, nil)
	h := s.acquire(cheetah.AcquireRequest{TaskID: "t"})
	res, err := h.SendAndWait(s.ctx, cheetah.Command{Name: cmdHang}, cheetah.WithTimeout(100*time.Millisecond))
	require.NoError(t, err)
	require.Equal(t, cheetah.StatusTimedOut, res.Status)
	require.NotNil(t, res.Error)
	require.Equal(t, "timed_out", res.Error.Code)
	require.Equal(t, a.waitStarted(t), res.CommandID)
	rec := s.read(userA, res.CommandID)
	require.Equal(t, cheetah.StatusTimedOut, rec.Status)
	require.Equal(t, "timed_out", rec.Error.Code)
	require.NoError(t, h.Renew(s.ctx), "the lease outlives a timed-out command")
}

// cancelled runs a hold command and cancels the caller once it runs. It
// returns the resolution, the id of the command the client ran, and the
// error.
func (s *suite) cancelled(a *testAgent, h *cheetah.Handle) (cheetah.Resolution, string, error) {
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	started := make(chan string, 1)
	go func() {
		defer cancel()
		select {
		case id := <-a.started:
			started <- id
		case <-time.After(guard):
			started <- "" // reported below, on the test's goroutine
		}
	}()
	res, err := h.SendAndWait(ctx, cheetah.Command{Name: cmdHold}, cheetah.WithTimeout(guard))
	id := <-started
	require.NotEmpty(s.t, id, "the command never started on the client")
	return res, id, err
}

func callerCancels(s *suite) {
	t := s.t
	a := s.agent(userA, "agent-1", 1, nil)
	h := s.acquire(cheetah.AcquireRequest{TaskID: "t"})
	res, _, err := s.cancelled(a, h)
	require.ErrorIs(t, err, context.Canceled)
	require.Empty(t, code(err), "the caller's own error, not an API error")
	require.Equal(t, cheetah.StatusCancelled, res.Status)
	require.NotNil(t, res.Error)
	require.Equal(t, "cancelled", res.Error.Code)

	// The command is the newest of the task; it ends cancelled, and the
	// client, told to cancel, answers late.
	page, err := s.m.History().List(s.ctx, userA, cheetah.ListQuery{TaskID: "t", Limit: 1})
	require.NoError(t, err)
	require.Len(t, page.Commands, 1)
	id := page.Commands[0].CommandID
	rec := s.waitStatus(userA, id, cheetah.StatusCancelled)
	require.Equal(t, "cancelled", rec.Error.Code)
	s.eventually(func() bool {
		rec = s.read(userA, id)
		for _, m := range rec.Messages {
			if m.Kind == cheetah.KindError && m.Code == "cancelled" && m.Late {
				return true
			}
		}
		return false
	}, "the client's late error is recorded")

	// The lease is still the caller's.
	res, err = h.SendAndWait(s.ctx, cheetah.Command{Name: "echo"}, cheetah.WithTimeout(guard))
	require.NoError(t, err)
	require.Equal(t, cheetah.StatusCompleted, res.Status)
}

// cancelledResolutionNamesCommand: the resolution of a cancelled wait names
// its command, so the caller can read it.
func cancelledResolutionNamesCommand(s *suite) {
	t := s.t
	a := s.agent(userA, "agent-1", 1, nil)
	h := s.acquire(cheetah.AcquireRequest{TaskID: "t"})
	res, id, err := s.cancelled(a, h)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, id, res.CommandID)
	require.Equal(t, s.read(userA, id).TraceID, res.TraceID)
}

func invalidAcquire(s *suite) {
	t := s.t
	bad := func(req cheetah.AcquireRequest, what string) {
		t.Helper()
		h, err := s.m.Acquire(s.ctx, req)
		require.Nil(t, h, what)
		requireCode(t, err, cheetah.ErrInvalidRequest, what)
	}
	ok := cheetah.AcquireRequest{UserID: userA, TaskID: "t", ClientType: cheetah.Console}
	with := func(f func(r *cheetah.AcquireRequest)) cheetah.AcquireRequest {
		r := ok
		f(&r)
		return r
	}
	bad(with(func(r *cheetah.AcquireRequest) { r.TaskID = "" }), "empty task id")
	bad(with(func(r *cheetah.AcquireRequest) { r.TaskID = strings.Repeat("x", 257) }), "task id too long")
	for _, u := range []string{"", "bad user", "a/b", "-lead", "..", strings.Repeat("u", 129)} {
		bad(with(func(r *cheetah.AcquireRequest) { r.UserID = u }), "user id "+u)
	}
	for _, ttl := range []time.Duration{-time.Second, 500 * time.Millisecond, 1500 * time.Millisecond, 3601 * time.Second} {
		bad(with(func(r *cheetah.AcquireRequest) { r.TTL = ttl }), "ttl "+ttl.String())
	}
	for _, w := range []time.Duration{-time.Millisecond, time.Minute + time.Millisecond} {
		bad(with(func(r *cheetah.AcquireRequest) { r.Wait = w }), "wait "+w.String())
	}
	bad(with(func(r *cheetah.AcquireRequest) { r.ClientType = "robot" }), "client type")
	bad(with(func(r *cheetah.AcquireRequest) { r.ClientID = "bad id" }), "client id")
	labels := map[string]string{}
	for i := range 33 {
		labels[fmt.Sprint("k", i)] = "v"
	}
	bad(with(func(r *cheetah.AcquireRequest) { r.Labels = labels }), "33 labels")
	bad(with(func(r *cheetah.AcquireRequest) { r.TenantID = "bad tenant" }), "tenant id")
	bad(with(func(r *cheetah.AcquireRequest) { r.AffinityKey = strings.Repeat("k", cheetah.MaxAffinityKeyLen+1) }), "affinity key too long")
	for _, d := range []time.Duration{-time.Millisecond, cheetah.MaxCreateTimeout + time.Millisecond} {
		bad(with(func(r *cheetah.AcquireRequest) { r.Create = &cheetah.CreateSpec{Timeout: d} }), "create timeout "+d.String())
	}
	bad(with(func(r *cheetah.AcquireRequest) {
		r.Create = &cheetah.CreateSpec{URL: strings.Repeat("u", cheetah.MaxCreateURLLen+1)}
	}), "create url too long")

	// The limits themselves are valid: these fail only for want of a client.
	for _, r := range []cheetah.AcquireRequest{
		with(func(r *cheetah.AcquireRequest) { r.TTL = time.Hour }),
		with(func(r *cheetah.AcquireRequest) { r.TTL = time.Second }),
		with(func(r *cheetah.AcquireRequest) { r.TaskID = strings.Repeat("x", 256) }),
		with(func(r *cheetah.AcquireRequest) { r.UserID = strings.Repeat("u", 128) }),
		with(func(r *cheetah.AcquireRequest) { r.AffinityKey = strings.Repeat("k", cheetah.MaxAffinityKeyLen) }),
	} {
		_, err := s.m.Acquire(s.ctx, r)
		require.Equal(t, cheetah.ReasonNoEligibleClient, noContextReason(t, err, "valid request"))
	}
}

func invalidSend(s *suite) {
	t := s.t
	s.agent(userA, "agent-1", 1, nil)
	h := s.acquire(cheetah.AcquireRequest{TaskID: "t"})
	bad := func(cmd cheetah.Command, what string, opts ...cheetah.SendOption) {
		t.Helper()
		_, err := h.Send(s.ctx, cmd, opts...)
		requireCode(t, err, cheetah.ErrInvalidRequest, "send: "+what)
		_, err = h.SendAndWait(s.ctx, cmd, opts...)
		requireCode(t, err, cheetah.ErrInvalidRequest, "send_and_wait: "+what)
	}
	bad(cheetah.Command{}, "empty name")
	bad(cheetah.Command{Name: strings.Repeat("n", 129)}, "name too long")
	bad(cheetah.Command{Name: "echo", Params: func() {}}, "params that do not encode")
	bad(cheetah.Command{Name: "echo", Params: json.RawMessage(`{"a":`)}, "params that are not JSON")
	bad(cheetah.Command{Name: "echo"}, "negative timeout", cheetah.WithTimeout(-time.Second))
	bad(cheetah.Command{Name: "echo"}, "timeout under 1 ms", cheetah.WithTimeout(time.Microsecond))
	bad(cheetah.Command{Name: "echo"}, "timeout over an hour", cheetah.WithTimeout(time.Hour+time.Millisecond))
	bad(cheetah.Command{Name: "echo"}, "unknown response mode", cheetah.WithResponseMode("later"))
	_, err := h.SendAndWait(s.ctx, cheetah.Command{Name: "echo"}, cheetah.WithResponseMode(cheetah.ModeNone))
	requireCode(t, err, cheetah.ErrInvalidRequest, "send_and_wait with none")

	// Nothing was recorded, and the handle still works.
	page, err := s.m.History().List(s.ctx, userA, cheetah.ListQuery{})
	require.NoError(t, err)
	require.Empty(t, page.Commands)
	res, err := h.SendAndWait(s.ctx, cheetah.Command{Name: "echo"}, cheetah.WithTimeout(time.Hour))
	require.NoError(t, err)
	require.Equal(t, cheetah.StatusCompleted, res.Status)
}

func invalidReads(s *suite) {
	t := s.t
	for _, u := range []string{"", "bad user", "a/b", "..", "-lead"} {
		_, err := s.m.ListAvailable(s.ctx, u, "")
		requireCode(t, err, cheetah.ErrInvalidRequest, "available of "+u)
		_, err = s.m.TaskContexts(s.ctx, u, "t")
		requireCode(t, err, cheetah.ErrInvalidRequest, "task contexts of "+u)
		_, err = s.m.History().Read(s.ctx, u, "0193a4b0-0000-7000-8000-000000000000")
		requireCode(t, err, cheetah.ErrInvalidRequest, "read of "+u)
		_, err = s.m.History().List(s.ctx, u, cheetah.ListQuery{})
		requireCode(t, err, cheetah.ErrInvalidRequest, "list of "+u)
	}
	for _, q := range []cheetah.ListQuery{{Limit: -1}, {Limit: 501}, {Cursor: "!!not a cursor!!"}} {
		_, err := s.m.History().List(s.ctx, userA, q)
		requireCode(t, err, cheetah.ErrInvalidRequest, fmt.Sprintf("list %+v", q))
	}
	for _, id := range []string{"0193a4b0-0000-7000-8000-000000000000", "", "..", "a/b", "x?y"} {
		_, err := s.m.History().Read(s.ctx, userA, id)
		requireCode(t, err, cheetah.ErrNotFound, "read "+id)
	}
}

func userBoundary(s *suite) {
	t := s.t
	s.agent(userA, "agent-1", 1, nil)
	s.agent(userB, "agent-1", 1, nil) // the same client id, another user
	ha := s.acquire(cheetah.AcquireRequest{UserID: userA, TaskID: "t"})
	hb := s.acquire(cheetah.AcquireRequest{UserID: userB, TaskID: "t"})
	res, err := ha.SendAndWait(s.ctx, cheetah.Command{Name: "echo"}, cheetah.WithTimeout(guard))
	require.NoError(t, err)
	_, err = s.m.History().Read(s.ctx, userB, res.CommandID)
	requireCode(t, err, cheetah.ErrNotFound, "another user's command")
	page, err := s.m.History().List(s.ctx, userB, cheetah.ListQuery{})
	require.NoError(t, err)
	require.Empty(t, page.Commands)
	ls, err := s.m.TaskContexts(s.ctx, userB, "t")
	require.NoError(t, err)
	require.Len(t, ls, 1)
	require.Equal(t, hb.Epoch(), ls[0].Epoch, "each user sees only its own lease")
}

func historyList(s *suite) {
	t := s.t
	s.agent(userA, "agent-1", 1, nil)
	h := s.acquire(cheetah.AcquireRequest{TaskID: "listed"})
	var ids []string
	for i := range 3 {
		res, err := h.SendAndWait(s.ctx, cheetah.Command{Name: "echo", Params: map[string]int{"i": i}}, cheetah.WithTimeout(guard))
		require.NoError(t, err)
		ids = append(ids, res.CommandID)
	}
	var got []string
	q := cheetah.ListQuery{TaskID: "listed", Limit: 2}
	for {
		page, err := s.m.History().List(s.ctx, userA, q)
		require.NoError(t, err)
		require.LessOrEqual(t, len(page.Commands), 2)
		for _, c := range page.Commands {
			require.Empty(t, c.Messages, "list entries carry no messages")
			require.Equal(t, cheetah.StatusCompleted, c.Status)
			got = append(got, c.CommandID)
		}
		if page.NextCursor == "" {
			break
		}
		q.Cursor = page.NextCursor
	}
	require.Equal(t, []string{ids[2], ids[1], ids[0]}, got, "newest first")
	page, err := s.m.History().List(s.ctx, userA, cheetah.ListQuery{TaskID: "other"})
	require.NoError(t, err)
	require.NotNil(t, page.Commands)
	require.Empty(t, page.Commands)
	require.Empty(t, page.NextCursor)
}

// payloadLimits: what fits in a command frame (4 MiB by default) is
// accepted, whichever way it is sent; what does not is payload_too_large.
func payloadLimits(s *suite) {
	t := s.t
	s.agent(userA, "agent-1", 1, nil)
	h := s.acquire(cheetah.AcquireRequest{TaskID: "big"})
	big := strings.Repeat("x", 5<<20)
	_, err := h.Send(s.ctx, cheetah.Command{Name: "echo", Params: map[string]string{"s": big}})
	requireCode(t, err, cheetah.ErrPayloadTooLarge, "5 MiB of params")
	id, err := h.Send(s.ctx, cheetah.Command{Name: "echo", Params: map[string]string{"s": big[:3<<19]}})
	require.NoError(t, err, "1.5 MiB of params")
	s.waitStatus(userA, id, cheetah.StatusCompleted)
}

// callbackToPrivateAddress: a callback to a loopback address is refused
// before anything is recorded, whether or not the broker delivers webhooks
// (and whichever secret would sign them).
func callbackToPrivateAddress(s *suite) {
	t := s.t
	s.agent(userA, "agent-1", 1, nil)
	h := s.acquire(cheetah.AcquireRequest{TaskID: "cb"})
	_, err := h.Send(s.ctx, cheetah.Command{Name: "echo"}, cheetah.WithCallback("http://127.0.0.1:9/hook"))
	requireCode(t, err, cheetah.ErrInvalidRequest, "send with a callback")
	_, err = h.SendAndWait(s.ctx, cheetah.Command{Name: "echo"}, cheetah.WithCallback("http://127.0.0.1:9/hook"))
	requireCode(t, err, cheetah.ErrInvalidRequest, "send_and_wait with a callback")
	page, err := s.m.History().List(s.ctx, userA, cheetah.ListQuery{})
	require.NoError(t, err)
	require.Empty(t, page.Commands)
}
