package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/reliability/internal/rig"
)

// wait is a send_and_wait whose command id is known as soon as the broker
// made it durable (X-Command-Id), while the resolution is still coming.
type wait struct {
	id  string
	res chan waitResult
}

type waitResult struct {
	status int
	res    cheetah.Resolution
	err    error
	at     time.Time
}

func startWait(t *testing.T, api *rig.API, key, token string, body map[string]any) wait {
	t.Helper()
	raw, err := json.Marshal(body)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	req, err := http.NewRequestWithContext(ctx, "POST", api.Base+"/api/v1/commands/wait", bytes.NewReader(raw))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("X-Lease", token)
	resp, err := api.HC.Do(req)
	if err != nil {
		cancel()
		t.Fatalf("send_and_wait: %v", err)
	}
	w := wait{id: resp.Header.Get("X-Command-Id"), res: make(chan waitResult, 1)}
	go func() {
		defer cancel()
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		r := waitResult{status: resp.StatusCode, err: err, at: time.Now()}
		var out struct {
			Resolution cheetah.Resolution `json:"resolution"`
		}
		if err == nil {
			r.err = json.Unmarshal(b, &out)
		}
		r.res = out.Resolution
		w.res <- r
	}()
	return w
}

// victim is a broker process with a `cheetah agent` process offering two
// flows, and a lease on one of them with `sleep 60` running under
// send_and_wait.
type victim struct {
	serve     *rig.Serve
	agent     *rig.Proc
	app, cli  string
	lease     cheetah.Lease
	wait      wait
	heartbeat time.Duration
	grace     time.Duration
}

const victimUser = "usr_fault_victim"

func newVictim(t *testing.T, heartbeat, grace time.Duration) *victim {
	t.Helper()
	v := &victim{heartbeat: heartbeat, grace: grace}
	v.serve = rig.NewServe(bin, rig.FreeAddr(t), adminKey, t.TempDir(),
		"--heartbeat", heartbeat.String(), "--reconnect-grace", grace.String())
	v.serve.Start(t)
	api := v.serve.API
	v.cli = api.MakeKey(t, adminKey, "client", victimUser)
	v.app = api.MakeKey(t, adminKey, "app", "")
	v.agent = rig.Start(t, "agent", []string{"CHEETAH_CLIENT_KEY=" + v.cli}, bin, "agent",
		"--url", api.Base, "--client-id", "victim-agent", "--flows", "2", "--allow", "sleep", "--log-level", "debug")
	ok := rig.PollUntil(context.Background(), 30*time.Second, 20*time.Millisecond, func() bool {
		var out struct{ Contexts []cheetah.ContextSnapshot }
		ans := api.Do(context.Background(), "GET", "/api/v1/users/"+victimUser+"/contexts/available?client_type=console", v.app, nil)
		return ans.Status == 200 && ans.Decode(&out) == nil && len(out.Contexts) == 2
	})
	require.True(t, ok, "the agent's two flows never became available")
	var ans rig.Answer
	v.lease, ans = api.Acquire(context.Background(), v.app, map[string]any{"user_id": victimUser, "task_id": "doomed", "client_type": "console", "ttl_s": 3600})
	require.Equal(t, 201, ans.Status, ans.String())
	v.wait = startWait(t, api, v.app, v.lease.LeaseToken, map[string]any{"name": "exec",
		"params": map[string]any{"argv": []string{"sleep", "60"}}, "timeout_ms": 120000})
	require.NotEmpty(t, v.wait.id, "X-Command-Id names the command once it is durable")
	// Acknowledged: the agent took the command (TestAgentKilledMidCommand
	// also waits for its program to run).
	ok = rig.PollUntil(context.Background(), 30*time.Second, 10*time.Millisecond, func() bool {
		rec, ans := api.Read(context.Background(), v.app, victimUser, v.wait.id)
		return ans.Status == 200 && rec.Status == cheetah.StatusAcknowledged
	})
	require.True(t, ok, "the exec command was never acknowledged")
	return v
}

func (v *victim) renewReason(t *testing.T) (int, string) {
	t.Helper()
	ans := v.serve.API.Do(context.Background(), "POST", "/api/v1/lease/renew", v.app, nil, "X-Lease", v.lease.LeaseToken)
	return ans.Status, ans.Reason()
}

func (v *victim) sendReason(t *testing.T) (int, string) {
	t.Helper()
	_, ans := v.serve.API.Send(context.Background(), v.app, v.lease.LeaseToken, map[string]any{"name": "echo"})
	return ans.Status, ans.Reason()
}

func (v *victim) adminLeases(t *testing.T) []cheetah.Lease {
	t.Helper()
	ans := v.serve.API.Do(context.Background(), "GET", "/api/v1/admin/leases?user_id="+victimUser, adminKey, nil)
	require.Equal(t, 200, ans.Status, ans.String())
	var out struct{ Leases []cheetah.Lease }
	require.NoError(t, ans.Decode(&out))
	return out.Leases
}

// afterDeath checks what follows a client's death: sends fail not_live, the
// lease survives the reconnect grace, then ends context_gone. The broker
// learnt of the death (and started the grace) between earliest and latest.
func (v *victim) afterDeath(t *testing.T, earliest, latest time.Time) {
	t.Helper()
	st, reason := v.sendReason(t)
	require.Equal(t, 423, st)
	require.Equal(t, string(cheetah.LostNotLive), reason, "a send to a dead client's context fails not_live")
	st, reason = v.renewReason(t)
	require.Equal(t, 423, st)
	require.Equal(t, string(cheetah.LostNotLive), reason)
	ls := v.adminLeases(t)
	require.Len(t, ls, 1, "the lease survives during the reconnect grace")
	require.Equal(t, v.lease.Epoch, ls[0].Epoch)
	require.Empty(t, ls[0].LeaseToken, "admin views never show tokens")

	var ended time.Time
	ok := rig.PollUntil(context.Background(), v.grace+10*time.Second, 20*time.Millisecond, func() bool {
		_, reason := v.renewReason(t)
		if reason == string(cheetah.LostContextGone) {
			ended = time.Now()
			return true
		}
		require.Equal(t, string(cheetah.LostNotLive), reason)
		return false
	})
	require.True(t, ok, "the lease never ended context_gone")
	t.Logf("lease ended context_gone %s after the broker learnt of the death (grace %s)", ended.Sub(latest).Round(time.Millisecond), v.grace)
	require.GreaterOrEqual(t, ended.Sub(earliest), v.grace, "the lease ended before the grace was over")
	require.Less(t, ended.Sub(latest), v.grace+2*time.Second, "the lease outlived the grace")
	st, reason = v.sendReason(t)
	require.Equal(t, 423, st)
	require.Equal(t, string(cheetah.LostContextGone), reason)
	require.Empty(t, v.adminLeases(t))
	rel := v.serve.API.Do(context.Background(), "POST", "/api/v1/lease/release", v.app, nil, "X-Lease", v.lease.LeaseToken)
	require.Equal(t, 200, rel.Status)
	require.JSONEq(t, `{"released":false}`, string(rel.Body))
}

// TestAgentKilledMidCommand kills the agent process (SIGKILL to its process
// group) while a send_and_wait is in the middle of its work. The program it
// runs is in a group of its own, so the signal does not reach it: it must
// die with the agent (the parent-death signal) all the same.
func TestAgentKilledMidCommand(t *testing.T) {
	needProcesses(t)
	t.Parallel()
	const hb, grace = time.Second, 3 * time.Second
	v := newVictim(t, hb, grace)
	// The agent acknowledges a command when it takes it, before its
	// program starts: wait for the program.
	var programs []int
	rig.PollUntil(context.Background(), 30*time.Second, 10*time.Millisecond, func() bool {
		programs = v.agent.Descendants()
		return len(programs) > 0
	})
	require.NotEmpty(t, programs, "sleep runs under the agent")
	killed := time.Now()
	require.NoError(t, v.agent.Signal(syscall.SIGKILL))
	ok := rig.PollUntil(context.Background(), 10*time.Second, 10*time.Millisecond, func() bool {
		for _, pid := range programs {
			if rig.Running(pid) {
				return false
			}
		}
		return true
	})
	require.True(t, ok, "the program the agent ran outlived it")
	t.Logf("the agent's program ended %s after the agent's SIGKILL", time.Since(killed).Round(time.Millisecond))
	v.agent.Kill()
	var r waitResult
	select {
	case r = <-v.wait.res:
	case <-time.After(30 * time.Second):
		t.Fatal("the waiter never resolved")
	}
	took := r.at.Sub(killed)
	t.Logf("waiter resolved %s %s after SIGKILL (heartbeat %s)", r.res.Status, took.Round(time.Millisecond), hb)
	require.NoError(t, r.err)
	require.Equal(t, 200, r.status)
	require.Equal(t, cheetah.StatusDisconnected, r.res.Status)
	require.Less(t, took, hb, "the waiter resolves within one heartbeat")
	rec, ans := v.serve.API.Read(context.Background(), v.app, victimUser, v.wait.id)
	require.Equal(t, 200, ans.Status)
	require.Equal(t, cheetah.StatusDisconnected, rec.Status, "history agrees with the resolution")
	v.afterDeath(t, killed, r.at)
	noSecrets(t, v.serve.AllLogs()+v.agent.Out.String(), adminKey, v.app, v.cli, v.lease.LeaseToken)
}

// TestAgentFrozenMidCommand stops the agent with SIGSTOP: its connection
// stays open but it answers nothing, so only the heartbeat can find out.
// The broker closes it after three silent heartbeats (4408) and the waiter
// resolves disconnected.
func TestAgentFrozenMidCommand(t *testing.T) {
	needProcesses(t)
	t.Parallel()
	const hb, grace = time.Second, 2 * time.Second
	v := newVictim(t, hb, grace)
	frozen := time.Now()
	require.NoError(t, v.agent.Signal(syscall.SIGSTOP))
	var r waitResult
	select {
	case r = <-v.wait.res:
	case <-time.After(30 * time.Second):
		t.Fatal("the waiter never resolved")
	}
	took := r.at.Sub(frozen)
	t.Logf("waiter resolved %s %s after SIGSTOP (heartbeat %s)", r.res.Status, took.Round(time.Millisecond), hb)
	require.Equal(t, cheetah.StatusDisconnected, r.res.Status)
	require.GreaterOrEqual(t, took, 2*hb, "closed before the client was silent for long")
	// The broker cannot give up on the client before it was silent for two
	// heartbeats at least (its last frame came at most one before).
	v.afterDeath(t, frozen.Add(2*hb), r.at)
	v.agent.Kill()
	noSecrets(t, v.serve.AllLogs()+v.agent.Out.String(), adminKey, v.app, v.cli, v.lease.LeaseToken)
	// Silent for three heartbeats, noticed at the next tick: the broker
	// closes with 4408 after at most 4 heartbeats, and from then on the
	// client's contexts are not live (it does not wait for the close
	// handshake that a frozen peer never answers).
	require.Less(t, took, 5*hb)
}
