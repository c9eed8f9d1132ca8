package main_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/history/historytest"
)

// Two `serve` processes on one PostgreSQL form a cluster with no other
// setting. The replica that holds a client is SIGKILLed while a command
// sent through the other runs: the survivor marks the command interrupted
// (not the dead replica's next start), and the caller's wait through the
// survivor ends with that resolution, as one node's would.
func TestReplicaKilledUnderACommand(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	t.Parallel()
	db := historytest.EmptyPostgres(t)
	const admin = "cluster-e2e-admin-key-0123456789"
	serve := func(addr string) *proc {
		return start(t, []string{"CHEETAH_ADMIN_KEY=" + admin, "CHEETAH_LISTEN=" + addr, "CHEETAH_DATABASE_URL=" + db},
			"serve", "--replica-ttl", "1s")
	}
	addrA, addrB := freePort(t), freePort(t)
	a := serve(addrA)
	b := serve(addrB)
	apiA, apiB := api{t: t, base: "http://" + addrA}, api{t: t, base: "http://" + addrB}
	for _, x := range []api{apiA, apiB} {
		require.Eventually(t, func() bool { return x.call("GET", "/readyz", "", nil, nil) == 200 }, 30*time.Second, 20*time.Millisecond)
	}
	var client, app struct{ Key string }
	require.Equal(t, 201, apiB.call("POST", "/api/v1/admin/keys", admin, map[string]any{"kind": "client", "user_id": "usr_kill", "name": "agent"}, &client))
	require.Equal(t, 201, apiB.call("POST", "/api/v1/admin/keys", admin, map[string]any{"kind": "app", "name": "app"}, &app))
	start(t, []string{"CHEETAH_CLIENT_KEY=" + client.Key, "CHEETAH_URL=" + apiA.base},
		"agent", "--client-id", "kill-agent", "--flows", "1", "--allow", "sleep")

	// Through B: the context is A's.
	var acq struct{ Lease cheetah.Lease }
	require.Eventually(t, func() bool {
		return apiB.call("POST", "/api/v1/acquire", app.Key, map[string]any{"user_id": "usr_kill", "task_id": "k", "client_type": "console"}, &acq) == 201
	}, 30*time.Second, 20*time.Millisecond)
	type answer struct {
		status int
		body   []byte
		err    error
	}
	waited := make(chan answer, 1)
	named := make(chan string, 1)
	go func() {
		st, body, err := postSeen(apiB.base, "/api/v1/commands/wait", app.Key,
			map[string]any{"name": "exec", "params": map[string]any{"argv": []string{"sleep", "60"}}, "timeout_ms": 120000},
			func(h http.Header) { named <- h.Get("X-Command-Id") }, "X-Lease", acq.Lease.LeaseToken)
		waited <- answer{st, body, err}
	}()
	// The caller knows its command once the early headers came through B;
	// a kill before that is a wait that named nothing (503).
	select {
	case got := <-named:
		require.NotEmpty(t, got)
	case <-time.After(30 * time.Second):
		t.Fatal("the wait's early headers never came")
	}
	var id string
	require.Eventually(t, func() bool {
		var page cheetah.CommandPage
		apiB.call("GET", "/api/v1/users/usr_kill/commands?task_id=k", app.Key, nil, &page)
		if len(page.Commands) == 0 || page.Commands[0].Status != cheetah.StatusAcknowledged {
			return false
		}
		id = page.Commands[0].CommandID
		return true
	}, 30*time.Second, 20*time.Millisecond)

	require.NoError(t, a.cmd.Process.Signal(syscall.SIGKILL))
	_ = a.cmd.Wait()
	select {
	case w := <-waited:
		require.NoError(t, w.err)
		require.Equal(t, 200, w.status)
		var got struct{ Resolution cheetah.Resolution }
		require.NoError(t, json.Unmarshal(w.body, &got), string(w.body))
		require.Equal(t, id, got.Resolution.CommandID)
		require.Equal(t, cheetah.StatusInterrupted, got.Resolution.Status)
	case <-time.After(60 * time.Second):
		t.Fatal("the wait through the survivor hung")
	}
	var rec struct{ Command cheetah.CommandRecord }
	require.Equal(t, 200, apiB.call("GET", "/api/v1/users/usr_kill/commands/"+id, app.Key, nil, &rec))
	require.Equal(t, cheetah.StatusInterrupted, rec.Command.Status, "the survivor ended the dead replica's command")
	require.Equal(t, 200, apiB.call("GET", "/readyz", "", nil, nil))
	require.NoError(t, b.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, b.cmd.Wait(), fmt.Sprint(b.out.String()))
}
