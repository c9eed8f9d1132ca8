package report

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/cheetahbroker/cheetah/bench/internal/stats"
)

// goalsReport is a run with a latency and a churn scenario: medians of a
// few rows, one peer absent, one failed, one without a column.
func goalsReport() *Report {
	row := func(peer string, vals map[string]float64) *Row {
		r := &Row{Peer: peer, Values: map[string]stats.Summary{}}
		for k, v := range vals {
			r.Values[k] = stats.Summarize([]float64{v * 0.9, v, v * 1.2}) // the median is v
		}
		return r
	}
	lat := &Scenario{Number: 1, Key: "latency", Columns: []Column{{Key: "p50", Label: "p50", Unit: "µs"}}}
	lat.Rows = []*Row{
		row("echo", map[string]float64{"p50": 20}),
		row("pg commit", map[string]float64{"p50": 980}),
		row("sqlite commit", map[string]float64{"p50": 400}),
		row("cheetah pg", map[string]float64{"p50": 1400}),
		row("cheetah sqlite", map[string]float64{"p50": 700}),
		{Peer: "nats", Absent: true, Reason: "absent: dial tcp: refused"},
		{Peer: "cheetah http", Failed: true, Reason: "failed in run 1: boom"},
		row("zero", map[string]float64{"p50": 0}),
	}
	churn := &Scenario{Number: 3, Key: "churn", Columns: []Column{
		{Key: "rate", Label: "pairs", Unit: "/s"}, {Key: "p99", Label: "p99", Unit: "µs"}, {Key: "dropped", Label: "agents dropped"}}}
	churn.Rows = []*Row{
		row("redis", map[string]float64{"rate": 40_000, "p99": 900}),
		row("in process", map[string]float64{"rate": 100_000, "p99": 1000, "dropped": 0}),
		row("in process, many", map[string]float64{"rate": 90_000, "p99": 1500, "dropped": 2}),
	}
	return &Report{Scenarios: []*Scenario{lat, churn}}
}

func TestGoalRatiosAndVerdicts(t *testing.T) {
	r := goalsReport()
	at := func(sc, peer, col string) Term { return Term{Scenario: sc, Peer: peer, Column: col} }
	for _, c := range []struct {
		name    string
		goal    Goal
		verdict Verdict
		ratio   float64 // the measured ratio or figure; ignored when absent
		unit    string
		why     string // part of the reason, when absent
	}{
		{name: "sum reference, met",
			goal:    Goal{Of: []Term{at("latency", "cheetah pg", "p50")}, Per: []Term{at("latency", "echo", "p50"), at("latency", "pg commit", "p50")}, Goal: 1.5, AtMost: true},
			verdict: Met, ratio: 1.4, unit: "×"},
		{name: "sum reference, not met",
			goal:    Goal{Of: []Term{at("latency", "cheetah sqlite", "p50")}, Per: []Term{at("latency", "echo", "p50"), at("latency", "sqlite commit", "p50")}, Goal: 1.5, AtMost: true},
			verdict: NotMet, ratio: 700.0 / 420, unit: "×"},
		{name: "at least, met",
			goal:    Goal{Of: []Term{at("churn", "in process", "rate")}, Per: []Term{at("churn", "redis", "rate")}, Goal: 2.5},
			verdict: Met, ratio: 2.5, unit: "×"},
		{name: "at least, not met",
			goal:    Goal{Of: []Term{at("churn", "in process", "rate")}, Per: []Term{at("churn", "redis", "rate")}, Goal: 20},
			verdict: NotMet, ratio: 2.5, unit: "×"},
		{name: "absolute, on the bound",
			goal:    Goal{Of: []Term{at("churn", "in process", "p99")}, Unit: "µs", Goal: 1000, AtMost: true},
			verdict: Met, ratio: 1000, unit: "µs"},
		{name: "absolute zero, met",
			goal:    Goal{Of: []Term{at("churn", "in process", "dropped")}, Unit: "agents", Goal: 0, AtMost: true},
			verdict: Met, ratio: 0, unit: "agents"},
		{name: "absolute zero, not met",
			goal:    Goal{Of: []Term{at("churn", "in process, many", "dropped")}, Unit: "agents", Goal: 0, AtMost: true},
			verdict: NotMet, ratio: 2, unit: "agents"},
		{name: "reference absent",
			goal:    Goal{Of: []Term{at("latency", "cheetah pg", "p50")}, Per: []Term{at("latency", "nats", "p50")}, Goal: 2, AtMost: true},
			verdict: Absent, unit: "×", why: "nats absent"},
		{name: "one term of the reference absent",
			goal:    Goal{Of: []Term{at("latency", "cheetah pg", "p50")}, Per: []Term{at("latency", "echo", "p50"), at("latency", "nats", "p50")}, Goal: 2, AtMost: true},
			verdict: Absent, unit: "×", why: "nats absent"},
		{name: "figure failed",
			goal:    Goal{Of: []Term{at("latency", "cheetah http", "p50")}, Per: []Term{at("latency", "echo", "p50")}, Goal: 2, AtMost: true},
			verdict: Absent, unit: "×", why: "cheetah http failed"},
		{name: "reference zero",
			goal:    Goal{Of: []Term{at("latency", "cheetah pg", "p50")}, Per: []Term{at("latency", "zero", "p50")}, Goal: 2, AtMost: true},
			verdict: Absent, unit: "×", why: "reference is 0"},
		{name: "column missing",
			goal:    Goal{Of: []Term{at("churn", "redis", "dropped")}, Unit: "agents", Goal: 0, AtMost: true},
			verdict: Absent, unit: "agents", why: "redis has no agents dropped"},
		{name: "peer not in the scenario",
			goal:    Goal{Of: []Term{at("churn", "registry", "rate")}, Per: []Term{at("churn", "redis", "rate")}, Goal: 20},
			verdict: Absent, unit: "×", why: "registry not measured"},
		{name: "scenario not run",
			goal:    Goal{Of: []Term{at("connections", "broker", "rss")}, Per: []Term{at("connections", "floor", "rss")}, Goal: 1.15, AtMost: true},
			verdict: Absent, unit: "×", why: "scenario connections not run"},
	} {
		got := c.goal.Check(r)
		if got.Verdict != c.verdict || got.Unit != c.unit {
			t.Errorf("%s: verdict %q unit %q, want %q %q (%+v)", c.name, got.Verdict, got.Unit, c.verdict, c.unit, got)
			continue
		}
		if c.verdict == Absent {
			if !strings.Contains(got.Why, c.why) {
				t.Errorf("%s: why %q, want it to say %q", c.name, got.Why, c.why)
			}
			if !strings.HasPrefix(got.MeasuredText(), "absent") {
				t.Errorf("%s: measured %q", c.name, got.MeasuredText())
			}
			continue
		}
		if math.Abs(got.Measured-c.ratio) > 1e-9 {
			t.Errorf("%s: measured %v, want %v", c.name, got.Measured, c.ratio)
		}
	}
}

func TestGoalsMarkdown(t *testing.T) {
	r := goalsReport()
	at := func(sc, peer, col string) []Term { return []Term{{Scenario: sc, Peer: peer, Column: col}} }
	r.Goals = r.CheckGoals([]Goal{
		{Scenario: 1, Figure: "round trip p50, PostgreSQL", Reference: "raw echo p50 + one PostgreSQL commit p50",
			Of: at("latency", "cheetah pg", "p50"), Per: append(at("latency", "echo", "p50"), at("latency", "pg commit", "p50")...), Goal: 1.5, AtMost: true},
		{Scenario: 3, Figure: "agents dropped", Of: at("churn", "in process, many", "dropped"), Unit: "agents", Goal: 0, AtMost: true},
		{Scenario: 1, Figure: "vs NATS", Reference: "NATS", Of: at("latency", "cheetah pg", "p50"), Per: at("latency", "nats", "p50"), Goal: 0.25},
		{Scenario: 3, Figure: "p99", Of: at("churn", "in process", "p99"), Unit: "µs", Goal: 1000, AtMost: true},
	})
	r.Readings = []Reading{r.Read(1, "p50 of Cheetah on PostgreSQL", Term{"latency", "cheetah pg", "p50"}), r.Read(1, "p50 over HTTP", Term{"latency", "cheetah http", "p50"})}
	r.Footnotes = []string{"a footnote"}
	var buf bytes.Buffer
	r.goalsMarkdown(&buf)
	out := buf.String()
	for _, want := range []string{
		"| 1 | round trip p50, PostgreSQL | raw echo p50 + one PostgreSQL commit p50 | 1.40× (1,400 µs ÷ 1,000 µs) | ≤ 1.5× | met |",
		"| 3 | agents dropped | — (absolute) | 2 agents | = 0 agents | not met |",
		"| 1 | vs NATS | NATS | absent (nats absent) | ≥ 0.25× | absent |",
		"| 3 | p99 | — (absolute) | 1,000 µs | ≤ 1,000 µs | met |",
		"| 1 | p50 of Cheetah on PostgreSQL | 1,400 µs |",
		"| 1 | p50 over HTTP | absent (cheetah http failed) |",
		"1. a footnote",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
}
