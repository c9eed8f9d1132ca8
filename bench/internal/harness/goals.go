package harness

import (
	"fmt"

	"github.com/cheetahbroker/cheetah/bench/internal/report"
)

// goals are the goals of the issue "the durable command path at the speed
// of the disk", each a ratio to a reference measured in the same run, or an
// absolute bound. They are read, never asserted.
func goals(c Config) []report.Goal {
	at := func(scenario, peer, column string) []report.Term {
		return []report.Term{{Scenario: scenario, Peer: peer, Column: column}}
	}
	_, fewFlows := agentsFor(c.ChurnContexts, c.ChurnPerClient)
	plus := func(a, b []report.Term) []report.Term { return append(append([]report.Term(nil), a...), b...) }
	gs := []report.Goal{
		{Scenario: 1, Figure: "round trip p50, Cheetah on PostgreSQL",
			Reference: "raw echo p50 + one PostgreSQL commit p50 (the durability floor row)",
			Of:        at("latency", peerCheetahPG, "p50"),
			Per:       plus(at("latency", peerEcho, "p50"), at("latency", peerPGCommit, "p50")),
			Goal:      1.5, AtMost: true},
		{Scenario: 1, Figure: "round trip p50, Cheetah on SQLite",
			Reference: "raw echo p50 + one SQLite commit p50 (the durability floor row)",
			Of:        at("latency", peerCheetahSQL, "p50"),
			Per:       plus(at("latency", peerEcho, "p50"), at("latency", peerSQLiteCommit, "p50")),
			Goal:      1.5, AtMost: true},
		{Scenario: 2, Figure: fmt.Sprintf("commands/s, %d contexts, Cheetah on PostgreSQL", c.ThroughputContexts),
			Reference: "NATS request-reply (queue group), commands/s",
			Of:        at("throughput", peerCheetahPG, "rate"),
			Per:       at("throughput", peerNATSQueue, "rate"),
			Goal:      0.25},
		{Scenario: 2, Figure: fmt.Sprintf("commands/s, %d contexts, Cheetah on SQLite", c.ThroughputContexts),
			Reference: "NATS request-reply (queue group), commands/s",
			Of:        at("throughput", peerCheetahSQL, "rate"),
			Per:       at("throughput", peerNATSQueue, "rate"),
			Goal:      0.25},
		{Scenario: 4, Figure: "history ingest, lifecycle (insert + statuses + messages), PostgreSQL, commands/s",
			Reference: "pgx CopyFrom of the same rows, commands/s",
			Of:        at("ingest", peerHistoryPostgres, "lifecycle"),
			Per:       at("ingest", peerCopyFrom, "lifecycle"),
			Goal:      0.3},
		{Scenario: 3, Figure: "acquire+release pairs/s, in process, real agents",
			Reference: "Redis SET NX PX + DEL, pairs/s",
			Of:        at("churn", peerCheetahInProc, "rate"),
			Per:       at("churn", peerRedis, "rate"),
			Goal:      3},
		{Scenario: 3, Figure: "acquire+release pairs/s, registry alone",
			Reference: "Redis SET NX PX + DEL, pairs/s",
			Of:        at("churn", peerRegistryAlone, "rate"),
			Per:       at("churn", peerRedis, "rate"),
			Goal:      20},
		{Scenario: 3, Figure: "acquire with a three-level quota, cost per pair: registry alone, pairs/s without the quota ÷ with it",
			Reference: "the same without quotas (registry alone), same run",
			Of:        at("churn", peerRegistryAlone, "rate"),
			Per:       at("churn", peerRegistryQuota, "rate"),
			Goal:      1.2, AtMost: true},
		{Scenario: 3, Figure: "acquire with a three-level quota, p99 of a pair: registry alone, with the quota",
			Reference: "the same without quotas (registry alone), p99, same run",
			Of:        at("churn", peerRegistryQuota, "p99"),
			Per:       at("churn", peerRegistryAlone, "p99"),
			Goal:      1.2, AtMost: true},
		{Scenario: 3, Figure: fmt.Sprintf("in-process churn p99 (real agents, %d contexts per client)", fewFlows),
			Of:   at("churn", peerCheetahInProc, "p99"),
			Unit: "µs", Goal: 1000, AtMost: true},
		{Scenario: 3, Figure: fmt.Sprintf("agents dropped under churn, in process, %d contexts per client", fewFlows),
			Of:   at("churn", peerCheetahInProc, "dropped"),
			Goal: 0, AtMost: true},
		{Scenario: 6, Figure: "round trip p50, caller on another replica than the client's",
			Reference: "the same round trip, caller on the client's replica (issue 12: the hop adds at most one loopback round trip)",
			Of:        at("cluster", peerOtherReplica, "p50"),
			Per:       at("cluster", peerSameReplica, "p50"),
			Goal:      1.3, AtMost: true},
	}
	if c.churnMany() {
		_, flows := agentsFor(c.ChurnContexts, c.ChurnPerClientMany)
		gs = append(gs, report.Goal{Scenario: 3, Figure: fmt.Sprintf("agents dropped under churn, in process, %d contexts per client", flows),
			Of:   at("churn", peerCheetahInProcMany(flows), "dropped"),
			Goal: 0, AtMost: true})
	}
	return append(gs, report.Goal{Scenario: 5, Figure: "RSS per idle connection, Cheetah broker",
		Reference: "raw coder/websocket server, RSS per idle connection",
		Of:        at("connections", peerCheetahBroker, "rss"),
		Per:       at("connections", peerEchoServer, "rss"),
		Goal:      1.15, AtMost: true})
}

// readings are Cheetah's costs per command, shown with the goals: CPU per
// command in scenarios 1 and 2, the machine's CPU per command and how busy
// it was in scenario 2 (NATS's too: on a saturated machine, the ratio of
// the rates is the inverse of these), store commits per round trip in
// scenario 1, store ops per commit in scenario 2.
func readings(rep *report.Report) []report.Reading {
	var out []report.Reading
	read := func(n int, figure, scenario, peer, column string) {
		out = append(out, rep.Read(n, figure, report.Term{Scenario: scenario, Peer: peer, Column: column}))
	}
	for _, p := range []string{peerCheetahSQL, peerCheetahPG, peerCheetahPGAPI} {
		read(1, "CPU per command, round trip, "+p, "latency", p, "cpu_us")
	}
	for _, p := range []string{peerCheetahSQL, peerCheetahPG} {
		read(2, "CPU per command, throughput, "+p, "throughput", p, "cpu_us")
	}
	for _, p := range []string{peerNATSQueue, peerCheetahSQL, peerCheetahPG} {
		read(2, "machine CPU per command, throughput, "+p, "throughput", p, "machine_cpu_us")
		read(2, "machine busy, throughput, "+p, "throughput", p, "machine_busy")
	}
	for _, p := range []string{peerCheetahSQL, peerCheetahPG, peerCheetahPGAPI} {
		read(1, "store commits per round trip, "+p, "latency", p, "commits")
	}
	for _, p := range []string{peerCheetahSQL, peerCheetahPG} {
		read(2, "store ops per commit, throughput, "+p, "throughput", p, "ops_per_commit")
	}
	return out
}

// footnotes say how the figures that are not plain medians were taken.
func footnotes() []string {
	return []string{
		"CPU per command (scenarios 1 and 2) is this process's user + system time (getrusage RUSAGE_SELF) over the measured phase divided by the commands completed in it. " +
			"Cheetah runs in the harness's process, and so do its agents (they answer over real WebSockets, but in this process) and the callers' SDK: the figure counts all three, and the kernel's work for this process (system time: SQLite's writes and fsyncs happen in it), not the PostgreSQL server's CPU. " +
			"The peers' own workers run in this process too (the NATS responders, the echo server), which is why the column is given for Cheetah's rows only.",
		"Machine CPU per operation and machine busy (scenarios 2 and 3) are the whole machine's user, nice, system, irq and softirq time from /proc/stat over the measured phase (not idle, iowait or steal): " +
			"per operation completed in it, and as a share of all the machine's CPUs over the phase's wall time. They count every process, so the PostgreSQL server's, NATS's and Redis's work is in their peers' figures, and the harness's own callers are in every row.",
		"Store commits per round trip (scenario 1) and ops per commit (scenarios 2 and 4) are the history store's own counters; they span the warm-up too.",
		"A ratio is absent when either side is: a peer that did not answer, a run that failed or a scenario not run gives no figure, and nothing is estimated.",
	}
}
