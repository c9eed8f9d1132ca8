package report

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// Term names one median of a run: a column of a peer's row in a scenario.
type Term struct {
	Scenario string `json:"scenario"` // the scenario's key
	Peer     string `json:"peer"`
	Column   string `json:"column"`
}

// Goal is one goal of the issue. Its figure is the sum of the medians Of;
// with a reference (Per), the goal is on the ratio of the figure to the sum
// of the medians Per of the same run, else on the figure itself.
type Goal struct {
	Scenario  int     // the scenario's number, for the table
	Figure    string  // what is measured, in words
	Reference string  // what it is divided by, in words; empty for an absolute goal
	Of        []Term  // summed: the figure
	Per       []Term  // summed: the reference; none for an absolute goal
	Unit      string  // the unit of an absolute goal; a ratio's is "×"
	Goal      float64 // the bound
	AtMost    bool    // the bound is an upper one
}

// Verdict is what a run says of a goal.
type Verdict string

const (
	Met    Verdict = "met"
	NotMet Verdict = "not met"
	// Absent: a figure the goal needs was not measured (a peer absent or
	// failed, or its scenario not run). Nothing is estimated.
	Absent Verdict = "absent"
)

// Target is a goal checked against one run's medians. It is read, never
// asserted: a goal not met is a finding, not a failure.
type Target struct {
	Scenario  int     `json:"scenario"`
	Figure    string  `json:"figure"`
	Reference string  `json:"reference,omitempty"`
	Unit      string  `json:"unit"` // "×" for a ratio, else the figure's unit
	Goal      float64 `json:"goal"`
	AtMost    bool    `json:"at_most"`
	Verdict   Verdict `json:"verdict"`
	// Measured is the ratio, or the figure of an absolute goal; Value and
	// RefValue are the figure and the reference a ratio was taken of.
	Measured float64 `json:"measured"`
	Value    float64 `json:"value"`
	RefValue float64 `json:"reference_value,omitempty"`
	// ValueUnit is the unit of the figure and the reference.
	ValueUnit string `json:"value_unit,omitempty"`
	// Why is the reason of an absent verdict.
	Why string `json:"why,omitempty"`
}

// Check computes the goal's ratio (or figure) from the report's medians
// and gives its verdict.
func (g Goal) Check(r *Report) Target {
	t := Target{Scenario: g.Scenario, Figure: g.Figure, Reference: g.Reference, Unit: g.Unit, Goal: g.Goal, AtMost: g.AtMost}
	if len(g.Per) > 0 {
		t.Unit = "×"
	}
	v, unit, why := r.sum(g.Of)
	if why == "" && len(g.Per) > 0 {
		var ref float64
		ref, _, why = r.sum(g.Per)
		if why == "" && ref == 0 {
			why = "the reference is 0"
		}
		t.RefValue = ref
	}
	t.ValueUnit = unit
	if why != "" {
		t.Verdict, t.Why = Absent, why
		return t
	}
	t.Value, t.Measured = v, v
	if len(g.Per) > 0 {
		t.Measured = v / t.RefValue
	}
	t.Verdict = NotMet
	if (g.AtMost && t.Measured <= g.Goal) || (!g.AtMost && t.Measured >= g.Goal) {
		t.Verdict = Met
	}
	return t
}

// CheckGoals checks every goal against the report's medians.
func (r *Report) CheckGoals(goals []Goal) []Target {
	out := make([]Target, 0, len(goals))
	for _, g := range goals {
		out = append(out, g.Check(r))
	}
	return out
}

// sum adds the medians the terms name, and returns the unit of the first
// one's column. why says which term is missing.
func (r *Report) sum(terms []Term) (total float64, unit, why string) {
	if len(terms) == 0 {
		return 0, "", "nothing to measure"
	}
	for i, tm := range terms {
		s := r.Scenario(tm.Scenario)
		if s == nil {
			return 0, "", "scenario " + tm.Scenario + " not run"
		}
		row := s.Row(tm.Peer)
		switch {
		case row == nil:
			return 0, "", tm.Peer + " not measured"
		case row.Absent:
			return 0, "", tm.Peer + " absent"
		case row.Failed:
			return 0, "", tm.Peer + " failed"
		}
		v, ok := s.Median(tm.Peer, tm.Column)
		if !ok {
			why = tm.Peer + " has no " + s.columnLabel(tm.Column)
			if row.Note != "" {
				why += " (see its note)"
			}
			return 0, "", why
		}
		if i == 0 {
			unit = s.columnUnit(tm.Column)
		}
		total += v
	}
	return total, unit, ""
}

// Scenario returns the scenario of a key, or nil.
func (r *Report) Scenario(key string) *Scenario {
	for _, s := range r.Scenarios {
		if s.Key == key {
			return s
		}
	}
	return nil
}

func (s *Scenario) columnLabel(key string) string {
	for _, c := range s.Columns {
		if c.Key == key {
			return c.Label
		}
	}
	return key
}

func (s *Scenario) columnUnit(key string) string {
	for _, c := range s.Columns {
		if c.Key == key {
			return c.Unit
		}
	}
	return ""
}

// Reading is a figure shown with the goals that has no goal of its own: a
// cost of Cheetah's per command, say.
type Reading struct {
	Scenario int     `json:"scenario"`
	Figure   string  `json:"figure"`
	Term     Term    `json:"term"`
	Value    float64 `json:"value"`
	Unit     string  `json:"unit,omitempty"`
	Absent   bool    `json:"absent,omitempty"`
	Why      string  `json:"why,omitempty"`
}

// Read takes the reading's median from the report.
func (r *Report) Read(scenario int, figure string, t Term) Reading {
	rd := Reading{Scenario: scenario, Figure: figure, Term: t}
	rd.Value, rd.Unit, rd.Why = r.sum([]Term{t})
	rd.Absent = rd.Why != ""
	return rd
}

// GoalText is a goal as the table shows it: "≤ 1.5×", "≥ 0.25×", "≤ 1,000 µs".
func (t Target) GoalText() string {
	op := "≥ "
	switch {
	case t.AtMost && t.Goal == 0:
		op = "= " // nothing may be below 0: a count that must stay 0
	case t.AtMost:
		op = "≤ "
	}
	return op + withUnit(exact(t.Goal), t.Unit)
}

// MeasuredText is the measured cell: the ratio and what it is the ratio of,
// the figure of an absolute goal, or "absent" and why.
func (t Target) MeasuredText() string {
	switch {
	case t.Verdict == Absent:
		return "absent (" + t.Why + ")"
	case t.Reference == "" && t.Measured == math.Trunc(t.Measured) && math.Abs(t.Measured) < 1e15:
		return withUnit(exact(t.Measured), t.Unit) // a count: 0 agents, not 0.00
	case t.Reference == "":
		return withUnit(Num(t.Measured), t.Unit)
	default:
		return fmt.Sprintf("%s (%s ÷ %s)", withUnit(Num(t.Measured), t.Unit), withUnit(Num(t.Value), t.ValueUnit), withUnit(Num(t.RefValue), t.ValueUnit))
	}
}

func withUnit(n, unit string) string {
	switch unit {
	case "":
		return n
	case "×":
		return n + "×"
	}
	return n + " " + unit
}

// exact formats a goal's bound as written: 1.5, 0.25, 1,000.
func exact(v float64) string {
	s := strconv.FormatFloat(v, 'f', -1, 64)
	if v >= 1000 && !strings.Contains(s, ".") {
		return group(s)
	}
	return s
}

func (r *Report) goalsMarkdown(w io.Writer) {
	if len(r.Goals) == 0 {
		return
	}
	fmt.Fprintf(w, "### Goals\n\nEach ratio is of medians of this run: the figure ÷ its reference, both measured above.\n\n")
	fmt.Fprintf(w, "| # | figure | reference (same run) | measured | goal | verdict |\n|---|---|---|---|---|---|\n")
	for _, t := range r.Goals {
		ref := t.Reference
		if ref == "" {
			ref = "— (absolute)"
		}
		fmt.Fprintf(w, "| %d | %s | %s | %s | %s | %s |\n", t.Scenario, t.Figure, ref, t.MeasuredText(), t.GoalText(), t.Verdict)
	}
	fmt.Fprintln(w)
	if len(r.Readings) > 0 {
		fmt.Fprintf(w, "Cheetah per command, from the same run (no goal; see the notes):\n\n| # | figure | measured |\n|---|---|---|\n")
		for _, rd := range r.Readings {
			m := withUnit(Num(rd.Value), rd.Unit)
			if rd.Absent {
				m = "absent (" + rd.Why + ")"
			}
			fmt.Fprintf(w, "| %d | %s | %s |\n", rd.Scenario, rd.Figure, m)
		}
		fmt.Fprintln(w)
	}
	for i, f := range r.Footnotes {
		fmt.Fprintf(w, "%d. %s\n", i+1, f)
	}
	if len(r.Footnotes) > 0 {
		fmt.Fprintln(w)
	}
}
