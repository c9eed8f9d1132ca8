package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cheetahbroker/cheetah/bench/internal/broker"
	"github.com/cheetahbroker/cheetah/bench/internal/report"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/quota"
)

func TestMain(m *testing.M) {
	if IsChild() { // the connections scenario runs this binary as its server
		os.Exit(ChildMain())
	}
	os.Exit(m.Run())
}

// TestSmoke runs every scenario at tiny sizes: the harness's plumbing, not
// Cheetah's speed. Peers that are not running are absent, which is fine;
// the rows that need nothing outside this process must have figures.
func TestSmoke(t *testing.T) {
	cfg := Smoke()
	if testing.Short() {
		cfg.Only = []string{"latency", "connections"}
	}
	cfg.ProfileDir = t.TempDir()
	cfg.Trace = true
	cfg.Version = "test"
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	log := &testLog{t: t}
	t.Cleanup(log.stop)
	rep, err := Run(ctx, cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	want := len(scenarios)
	if testing.Short() {
		want = 2
	}
	if len(rep.Scenarios) != want {
		t.Fatalf("%d scenarios, want %d", len(rep.Scenarios), want)
	}
	mustHave := map[string]bool{peerEcho: true, peerCheetahSQL: true, peerHistorySQLite: true, peerEchoServer: true, peerCheetahBroker: true}
	for _, s := range rep.Scenarios {
		for _, r := range s.Rows {
			switch {
			case r.OK() && strings.HasPrefix(r.Note, "failed"):
				t.Logf("%s / %s: %s", s.Key, r.Peer, r.Note) // a finding (agents dropped), kept with its failure
			case r.OK():
				// The first column is every peer's; later ones may be
				// Cheetah's alone (store commits, agents dropped).
				if _, ok := r.Values[s.Columns[0].Key]; !ok {
					t.Errorf("%s / %s: no %s", s.Key, r.Peer, s.Columns[0].Key)
				}
			case mustHave[r.Peer]:
				t.Errorf("%s / %s: %s", s.Key, r.Peer, r.Reason)
			case r.Reason == "":
				t.Errorf("%s / %s: absent or failed without a reason", s.Key, r.Peer)
			default:
				t.Logf("%s / %s: %s", s.Key, r.Peer, r.Reason)
			}
		}
	}
	if len(rep.Goals) != len(goals(cfg)) {
		t.Errorf("%d goals checked, want %d", len(rep.Goals), len(goals(cfg)))
	}
	// Memory per connection at the smoke size may be 0 or less: only the
	// round trip on SQLite must have a ratio.
	local := map[string]bool{"round trip p50, Cheetah on SQLite": true}
	for _, g := range rep.Goals {
		switch {
		case g.Verdict == report.Absent && strings.Contains(g.Why, " not measured"):
			t.Errorf("goal %q names a row its scenario lacks: %s", g.Figure, g.Why)
		case local[g.Figure] && g.Verdict == report.Absent:
			t.Errorf("goal %q: absent (%s), though it needs nothing outside this process", g.Figure, g.Why)
		case local[g.Figure] && (g.Measured <= 0 || g.Value <= 0 || g.RefValue <= 0):
			t.Errorf("goal %q: %+v", g.Figure, g)
		}
	}
	for _, rd := range rep.Readings {
		if rd.Term.Peer == peerCheetahSQL && rd.Term.Scenario == "latency" && (rd.Absent || rd.Value <= 0) {
			t.Errorf("reading %q: %+v", rd.Figure, rd)
		}
	}
	var md bytes.Buffer
	rep.Markdown(&md)
	for _, s := range []string{"| peer | version |", "### 1. Round-trip latency", "| " + peerEcho + " | ", "### Goals", "| round trip p50, Cheetah on SQLite |"} {
		if !strings.Contains(md.String(), s) {
			t.Errorf("markdown lacks %q", s)
		}
	}
	path := filepath.Join(t.TempDir(), "r.json")
	if err := rep.WriteJSON(path); err != nil {
		t.Fatal(err)
	}
	var back report.Report
	b, _ := os.ReadFile(path)
	if err := json.Unmarshal(b, &back); err != nil || len(back.Scenarios) != want {
		t.Fatalf("json round trip: %v, %d scenarios", err, len(back.Scenarios))
	}
	if _, err := os.Stat(filepath.Join(cfg.ProfileDir, "latency-cheetah-on-sqlite.cpu.pprof")); err != nil {
		t.Errorf("no CPU profile: %v", err)
	}
	// An execution trace of the same phase, as runtime/trace writes one.
	if b, err := os.ReadFile(filepath.Join(cfg.ProfileDir, "latency-cheetah-on-sqlite.trace")); err != nil || !bytes.HasPrefix(b, []byte("go 1.")) || len(b) < 1024 {
		t.Errorf("no execution trace: %v (%d bytes)", err, len(b))
	}
}

// TestGoalsNameScenarios checks that every goal reads scenarios the
// harness has, and that the many-contexts row has its own goal.
func TestGoalsNameScenarios(t *testing.T) {
	for _, c := range []Config{Full(), Quick(), Smoke()} {
		gs := goals(c)
		drops := 0
		for _, g := range gs {
			for _, tm := range append(append([]report.Term(nil), g.Of...), g.Per...) {
				if s := scenarioByName(tm.Scenario); s == nil || s.number != g.Scenario {
					t.Errorf("goal %q reads scenario %q, numbered %d", g.Figure, tm.Scenario, g.Scenario)
				}
			}
			if strings.HasPrefix(g.Figure, "agents dropped") {
				drops++
			}
		}
		if len(gs) != 14 || drops != 2 {
			t.Errorf("%d goals, %d of drops: want 14 and 2", len(gs), drops)
		}
	}
	c := Full()
	c.ChurnPerClientMany = c.ChurnPerClient
	if len(goals(c)) != 13 {
		t.Error("a many-contexts row equal to the usual one is not run, and has no goal")
	}
}

func TestPayload(t *testing.T) {
	p := Payload(256, 1)
	if len(p) != 256 || !json.Valid(p) {
		t.Fatalf("%d bytes, valid %v: %s", len(p), json.Valid(p), p)
	}
	if !bytes.Equal(p, Payload(256, 1)) || bytes.Equal(p, Payload(256, 2)) {
		t.Fatal("the payload follows its seed")
	}
}

func TestConfigs(t *testing.T) {
	for name, c := range map[string]Config{"full": Full(), "quick": Quick(), "smoke": Smoke()} {
		if err := c.Check(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	c := Full()
	c.Only = []string{"7"}
	if c.Check() == nil {
		t.Error("scenario 7 accepted")
	}
	c.Only = []string{"3", "Ingest"}
	if c.Check() != nil || !c.wants(scenarioByName("churn")) || c.wants(scenarioByName("1")) {
		t.Error("only")
	}
}

// testLog sends the harness's progress to the test log, while the test
// runs.
type testLog struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
}

func (l *testLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.done {
		l.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func (l *testLog) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.done = true
}

// TestChurnQuotas checks that the quota row's registry has the quota in
// force over the churn's acquires: a lease takes a slot at each of the three
// levels, under the tenant's override, and its release gives them back.
func TestChurnQuotas(t *testing.T) {
	set, err := quota.Parse([]byte(churnQuotas))
	if err != nil {
		t.Fatal(err)
	}
	r, err := broker.StartRegistry(t.Context(), "", t.TempDir(), 2, 2, set)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	mgr := r.Manager()
	h, err := mgr.Acquire(t.Context(), churnRequest(0, churnTenant))
	if err != nil {
		t.Fatal(err)
	}
	occ := r.Reg.Quotas().Quotas[0].Occupancy
	want := registry.QuotaOccupancy{
		Global:  registry.ScopeUse{Used: 1, Cap: 1000000},
		Tenants: []registry.ScopeUse{{TenantID: churnTenant, Used: 1, Cap: 600000}},
		Users:   []registry.ScopeUse{{TenantID: churnTenant, UserID: broker.User, Used: 1, Cap: 100000}},
	}
	if !reflect.DeepEqual(occ, want) {
		t.Fatalf("occupancy under a churn lease %+v, want %+v", occ, want)
	}
	if _, err := mgr.Release(t.Context(), h); err != nil {
		t.Fatal(err)
	}
	if occ := r.Reg.Quotas().Quotas[0].Occupancy; occ.Global.Used != 0 || len(occ.Tenants) != 0 || len(occ.Users) != 0 {
		t.Fatalf("occupancy after the release %+v, want none", occ)
	}
}

// TestRowsAlternate checks that rows runs its peers run by run in turn, and
// that a peer that fails or is absent leaves the others measured.
func TestRowsAlternate(t *testing.T) {
	cfg := Smoke()
	cfg.Repeats = 3
	e := &env{ctx: t.Context(), cfg: cfg, log: io.Discard}
	var order []string
	peer := func(name string, failAt int) runner {
		return func() (func(*trial) (map[string]float64, error), func(), error) {
			return func(tr *trial) (map[string]float64, error) {
				order = append(order, fmt.Sprintf("%s%d", name, tr.i))
				if tr.i == failAt {
					return nil, errors.New("broke")
				}
				return map[string]float64{"rate": float64(tr.i + 1)}, nil
			}, nil, nil
		}
	}
	absentPeer := func() (func(*trial) (map[string]float64, error), func(), error) {
		return nil, nil, absent(errors.New("not running"))
	}
	rows := e.rows("churn", false, []string{"a", "b", "c", "d"}, []runner{peer("a", -1), peer("b", 1), absentPeer, peer("d", -1)})
	if got := strings.Join(order, " "); got != "a0 b0 d0 a1 b1 d1 a2 d2" {
		t.Errorf("runs in the order %s", got)
	}
	if v := rows[0].Values["rate"]; !rows[0].OK() || v.Median != 2 {
		t.Errorf("a: %+v", rows[0])
	}
	if !rows[1].Failed || !strings.Contains(rows[1].Reason, "failed in run 2: broke") || rows[1].Values != nil {
		t.Errorf("b: %+v", rows[1])
	}
	if !rows[2].Absent || !strings.Contains(rows[2].Reason, "not running") {
		t.Errorf("c: %+v", rows[2])
	}
	if !rows[3].OK() {
		t.Errorf("d: %+v", rows[3])
	}
}
