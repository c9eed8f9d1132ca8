package rig

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// PGCluster is a PostgreSQL cluster of the test's own, made with initdb in
// a temporary folder and run with pg_ctl on a port of its own, so that the
// test can stop and start it without touching anyone else's server. As root
// the binaries run as the postgres user.
type PGCluster struct {
	t       testing.TB
	binDir  string
	Dir     string // the data directory
	sockDir string
	Port    int
	asUser  []string // runuser prefix when running as root
}

// pgBinDir finds the newest /usr/lib/postgresql/*/bin with initdb.
func pgBinDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(dirs) == 0 {
		return "", fmt.Errorf("no /usr/lib/postgresql/*/bin/initdb (apt-get install postgresql)")
	}
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(dirs[i]))))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(dirs[j]))))
		return vi < vj
	})
	return filepath.Dir(dirs[len(dirs)-1]), nil
}

// NewPGCluster runs initdb and starts the cluster; it is stopped (immediate
// mode) and removed when the test ends.
func NewPGCluster(t testing.TB) *PGCluster {
	t.Helper()
	bin, err := pgBinDir()
	if err != nil {
		t.Skip(err.Error())
	}
	base, err := os.MkdirTemp("", "cheetah-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	c := &PGCluster{t: t, binDir: bin, Dir: filepath.Join(base, "data"), sockDir: base}
	if os.Geteuid() == 0 {
		c.asUser = []string{"runuser", "-u", "postgres", "--"}
		if err := exec.Command("chown", "postgres:postgres", base).Run(); err != nil {
			t.Fatalf("chown %s: %v", base, err)
		}
		_ = os.Chmod(base, 0o700)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.Port = l.Addr().(*net.TCPAddr).Port
	l.Close()
	if out, err := c.run("initdb", "-D", c.Dir, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	c.Start()
	t.Cleanup(func() { _, _ = c.run("pg_ctl", "-D", c.Dir, "-m", "immediate", "-w", "stop") })
	return c
}

func (c *PGCluster) run(tool string, args ...string) ([]byte, error) {
	argv := append(append([]string{}, c.asUser...), append([]string{filepath.Join(c.binDir, tool)}, args...)...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = c.sockDir
	return cmd.CombinedOutput()
}

// URL is the cluster's postgres database.
func (c *PGCluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.Port)
}

// Start starts the server and waits until it accepts connections (pg_ctl -w).
func (c *PGCluster) Start() {
	c.t.Helper()
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200", c.Port, c.sockDir)
	if out, err := c.run("pg_ctl", "-D", c.Dir, "-o", opts, "-l", filepath.Join(c.sockDir, "log"), "-w", "-t", "60", "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(c.sockDir, "log"))
		c.t.Fatalf("pg_ctl start: %v\n%s\n%s", err, out, log)
	}
}

// Stop stops the server: "fast" ends every session and checkpoints,
// "immediate" is a crash.
func (c *PGCluster) Stop(mode string) time.Duration {
	c.t.Helper()
	start := time.Now()
	if out, err := c.run("pg_ctl", "-D", c.Dir, "-m", mode, "-w", "-t", "60", "stop"); err != nil {
		c.t.Fatalf("pg_ctl stop: %v\n%s", err, out)
	}
	return time.Since(start)
}

// Freeze stops every process of the server (SIGSTOP) for d, then lets them
// go on: the database stops answering without closing a connection or
// losing a write, as under a stall of its host. Linux only (it finds the
// postmaster's children in /proc).
func (c *PGCluster) Freeze(d time.Duration) error {
	pids, err := c.processes()
	if err != nil {
		return err
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGSTOP)
	}
	time.Sleep(d)
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGCONT)
	}
	return nil
}

// processes returns the postmaster's pid, then its children's.
func (c *PGCluster) processes() ([]int, error) {
	head, err := os.ReadFile(filepath.Join(c.Dir, "postmaster.pid"))
	if err != nil {
		return nil, err
	}
	pm, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(head), "\n", 2)[0]))
	if err != nil {
		return nil, fmt.Errorf("postmaster.pid: %w", err)
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	pids := []int{pm}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid …: comm may hold spaces and parentheses.
		rest := string(stat[strings.LastIndexByte(string(stat), ')')+1:])
		if f := strings.Fields(rest); len(f) > 1 && f[1] == strconv.Itoa(pm) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}
