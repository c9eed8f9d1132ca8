package main_test

import (
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/history/historytest"
)

// code is the error code of a 503 answer, or "" for another status.
func code(t *testing.T, base, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(base + path)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var env cheetah.Envelope
	if resp.StatusCode >= 300 && json.Unmarshal(raw, &env) == nil && env.Error != nil {
		return resp.StatusCode, env.Error.Code
	}
	return resp.StatusCode, ""
}

// missingDatabase returns the URL of a PostgreSQL database that does not
// exist yet, with a password the server (trust auth) ignores, and the
// function that creates it; it is dropped when the test ends.
func missingDatabase(t *testing.T) (dbURL, password string, create func()) {
	t.Helper()
	admin, err := sql.Open("pgx", historytest.ServerURL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close() })
	if err := admin.Ping(); err != nil {
		t.Skipf("PostgreSQL at %s does not answer: %v", historytest.ServerURL(), err)
	}
	name := "cheetah_e2e_wait_" + rand.Text()[:12]
	name = strings.ToLower(name)
	u, err := url.Parse(historytest.ServerURL())
	require.NoError(t, err)
	password = "e2e-pw-never-logged-93b1"
	u.Path, u.User = "/"+name, url.UserPassword(u.User.Username(), password)
	t.Cleanup(func() { _, _ = admin.Exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)") })
	return u.String(), password, func() {
		_, err := admin.Exec("CREATE DATABASE " + name)
		require.NoError(t, err)
	}
}

// `serve` pointed at a PostgreSQL database that is not there yet does not
// exit: it listens, answers /healthz 200 and /readyz and the API 503
// store_unavailable, logs each attempt without the password, and becomes
// ready once the database exists, without a restart. With --database-url
// it makes no ./cheetah-data.
func TestServeWaitsForDatabase(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	t.Parallel()
	dbURL, password, create := missingDatabase(t)
	cwd := t.TempDir()
	addr := freePort(t)
	p := startIn(t, cwd, []string{"CHEETAH_ADMIN_KEY=wait-admin-key-0123456789", "CHEETAH_LISTEN=" + addr,
		"CHEETAH_DATABASE_URL=" + dbURL}, "serve")
	base := "http://" + addr
	require.Eventually(t, func() bool { s, _ := code(t, base, "/healthz"); return s == 200 }, 30*time.Second, 20*time.Millisecond,
		"alive while the database is away")
	require.Eventually(t, func() bool { return strings.Contains(p.out.String(), "attempt=2") }, 30*time.Second, 20*time.Millisecond,
		"it keeps trying")
	s, c := code(t, base, "/readyz")
	require.Equal(t, 503, s)
	require.Equal(t, cheetah.CodeStoreUnavailable, c)
	s, c = code(t, base, "/api/v1/users/usr_1/commands")
	require.Equal(t, 503, s)
	require.Equal(t, cheetah.CodeStoreUnavailable, c)

	create()
	require.Eventually(t, func() bool { s, _ := code(t, base, "/readyz"); return s == 200 }, 60*time.Second, 50*time.Millisecond,
		"ready once the database exists")
	s, _ = code(t, base, "/api/v1/users/usr_1/commands")
	require.Equal(t, 401, s, "the API answers (a key is required)")

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, p.cmd.Wait())
	out := p.out.String()
	require.Contains(t, out, "store not available")
	require.Contains(t, out, "next_try_in=")
	require.NotContains(t, out, password)
	_, err := os.Stat(filepath.Join(cwd, "cheetah-data"))
	require.ErrorIs(t, err, os.ErrNotExist, "no data directory with --database-url")
	entries, err := os.ReadDir(cwd)
	require.NoError(t, err)
	require.Empty(t, entries)
}

// SIGTERM while serve waits for its database ends it cleanly (exit 0).
func TestServeStopsWhileWaitingForDatabase(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	t.Parallel()
	dbURL, _, _ := missingDatabase(t)
	addr := freePort(t)
	p := startIn(t, t.TempDir(), []string{"CHEETAH_ADMIN_KEY=wait-admin-key-0123456789", "CHEETAH_LISTEN=" + addr,
		"CHEETAH_DATABASE_URL=" + dbURL}, "serve")
	require.Eventually(t, func() bool { return strings.Contains(p.out.String(), "attempt=1") }, 30*time.Second, 20*time.Millisecond)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err, "a clean stop")
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not stop while waiting for its database")
	}
	require.Contains(t, p.out.String(), "stopped before the store opened")
}

// A second serve on one data directory is refused, naming the first.
func TestServeRefusesSecondOnDataDir(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	t.Parallel()
	dir := t.TempDir()
	addr := freePort(t)
	env := []string{"CHEETAH_ADMIN_KEY=lock-admin-key-0123456789", "CHEETAH_DATA_DIR=" + dir}
	first := start(t, append(env, "CHEETAH_LISTEN="+addr), "serve")
	a := api{t: t, base: "http://" + addr}
	require.Eventually(t, func() bool { return a.call("GET", "/readyz", "", nil, nil) == 200 }, 30*time.Second, 50*time.Millisecond)

	second := start(t, append(env, "CHEETAH_LISTEN="+freePort(t)), "serve")
	done := make(chan error, 1)
	go func() { done <- second.cmd.Wait() }()
	select {
	case err := <-done:
		require.Error(t, err, "the second broker exits non-zero")
	case <-time.After(30 * time.Second):
		t.Fatal("a second serve on one data directory started")
	}
	require.Contains(t, second.out.String(), "in use by another broker")
	require.Contains(t, second.out.String(), "listening on "+addr)
	require.NoError(t, first.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, first.cmd.Wait())
}
