package harness

import (
	"fmt"

	"github.com/cheetahbroker/cheetah/bench/internal/report"
)

// targets checks the goals of issue 6 against the medians. They are read,
// never asserted: a missed target is a finding, not a failure.
func targets(rep *report.Report) []report.Target {
	sc := map[string]*report.Scenario{}
	for _, s := range rep.Scenarios {
		sc[s.Key] = s
	}
	var out []report.Target
	// ratio adds "a's figure / b's figure" against a goal.
	ratio := func(n int, key, text, peerA, peerB, col string, goal float64, atMost bool) {
		t := report.Target{Scenario: n, Text: text, Unit: "×", Goal: goal, AtMost: atMost}
		s := sc[key]
		if s == nil {
			return
		}
		a, okA := s.Median(peerA, col)
		b, okB := s.Median(peerB, col)
		if !okA || !okB || b == 0 {
			t.Absent = true
		} else {
			t.Measured = a / b
			t.Met = meets(t.Measured, goal, atMost)
			t.Detail = fmt.Sprintf("%s vs %s", report.Num(a), report.Num(b))
		}
		out = append(out, t)
	}
	// level adds one figure against a goal.
	level := func(n int, key, text, peer, col, unit string, goal float64, atMost bool) {
		t := report.Target{Scenario: n, Text: text, Unit: unit, Goal: goal, AtMost: atMost}
		s := sc[key]
		if s == nil {
			return
		}
		v, ok := s.Median(peer, col)
		if !ok {
			t.Absent = true
		} else {
			t.Measured, t.Met = v, meets(v, goal, atMost)
		}
		out = append(out, t)
	}
	cores := rep.Machine.Cores
	ratio(1, "latency", "Cheetah on PostgreSQL p50 ÷ NATS p50", peerCheetahPG, peerNATS, "p50", 2, true)
	ratio(1, "latency", "Cheetah on PostgreSQL p50 ÷ raw echo p50", peerCheetahPG, peerEcho, "p50", 4, true)
	tpText := fmt.Sprintf("Cheetah on PostgreSQL durable commands/s on %d cores", cores)
	if cores != 2 {
		tpText += " (the goal is stated for 2)"
	}
	level(2, "throughput", tpText, peerCheetahPG, "rate", "/s", 25_000, false)
	ratio(2, "throughput", "Cheetah on PostgreSQL ÷ NATS, commands/s", peerCheetahPG, peerNATSQueue, "rate", 0.5, false)
	level(3, "churn", "Cheetah in process, pairs/s", peerCheetahInProc, "rate", "/s", 500_000, false)
	ratio(3, "churn", "Cheetah in process ÷ Redis, pairs/s", peerCheetahInProc, peerRedis, "rate", 20, false)
	ratio(4, "ingest", "Cheetah history on PostgreSQL ÷ CopyFrom, lifecycle commands/s", peerHistoryPostgres, peerCopyFrom, "lifecycle", 0.3, false)
	ratio(4, "ingest", "Cheetah history on PostgreSQL ÷ CopyFrom, insert-only commands/s", peerHistoryPostgres, peerCopyFrom, "insert", 0.3, false)
	level(5, "connections", "Cheetah broker memory per idle connection, RSS", peerCheetahBroker, "rss", "KiB", 16, true)
	level(5, "connections", "Cheetah broker memory per idle connection, Go heap + stacks", peerCheetahBroker, "go", "KiB", 16, true)
	return out
}

func meets(v, goal float64, atMost bool) bool {
	if atMost {
		return v <= goal
	}
	return v >= goal
}
