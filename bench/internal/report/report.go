// Package report holds the harness's results and renders them: a Markdown
// table per scenario for people, and JSON for tools.
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/cheetahbroker/cheetah/bench/internal/machine"
	"github.com/cheetahbroker/cheetah/bench/internal/stats"
)

// Report is one run of the harness.
type Report struct {
	Tool      string       `json:"tool"`
	Cheetah   string       `json:"cheetah_version"`
	StartedAt time.Time    `json:"started_at"`
	Seconds   float64      `json:"seconds"`
	Machine   machine.Info `json:"machine"`
	Settings  any          `json:"settings"`
	Versions  []Version    `json:"versions"`
	Scenarios []*Scenario  `json:"scenarios"`
	Goals     []Target     `json:"goals"`
	// Readings are figures shown with the goals without one of their own.
	Readings []Reading `json:"readings,omitempty"`
	// Footnotes are printed under the goals: how figures that span peers
	// were taken.
	Footnotes []string `json:"footnotes,omitempty"`
}

// Version is one peer's (or library's) version, or absent.
type Version struct {
	Name    string `json:"name"`
	Version string `json:"version,omitempty"`
	Absent  bool   `json:"absent,omitempty"`
	Note    string `json:"note,omitempty"`
}

// Better says which direction of a column is good.
type Better string

const (
	Lower  Better = "lower"
	Higher Better = "higher"
)

// Column is one figure of a scenario.
type Column struct {
	Key    string `json:"key"`
	Label  string `json:"label"`
	Unit   string `json:"unit"`
	Better Better `json:"better"`
}

// Scenario is one scenario with a row per peer.
type Scenario struct {
	Number  int      `json:"number"`
	Key     string   `json:"key"`
	Title   string   `json:"title"`
	Detail  string   `json:"detail"`
	Columns []Column `json:"columns"`
	Rows    []*Row   `json:"rows"`
	// Load is the machine's load average (1, 5, 15 min) when the scenario
	// started and ended: other work on the machine shows here.
	LoadStart string `json:"load_start,omitempty"`
	LoadEnd   string `json:"load_end,omitempty"`
}

// Row is one peer in a scenario. A peer that could not be reached is
// Absent; one that was reached but failed has Failed set. Neither carries
// figures: nothing is estimated.
type Row struct {
	Peer   string                   `json:"peer"`
	Absent bool                     `json:"absent,omitempty"`
	Failed bool                     `json:"failed,omitempty"`
	Reason string                   `json:"reason,omitempty"`
	Values map[string]stats.Summary `json:"values,omitempty"`
	Note   string                   `json:"note,omitempty"`
}

// OK reports whether the row has figures.
func (r *Row) OK() bool { return r != nil && !r.Absent && !r.Failed && r.Values != nil }

// Row returns the row of a peer, or nil.
func (s *Scenario) Row(peer string) *Row {
	for _, r := range s.Rows {
		if r.Peer == peer {
			return r
		}
	}
	return nil
}

// Median returns the median of a column of a peer's row, and whether the
// row has it.
func (s *Scenario) Median(peer, key string) (float64, bool) {
	r := s.Row(peer)
	if !r.OK() {
		return 0, false
	}
	v, ok := r.Values[key]
	return v.Median, ok && !math.IsNaN(v.Median)
}

// WriteJSON writes r, indented, to path.
func (r *Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// Markdown writes the whole report as Markdown.
func (r *Report) Markdown(w io.Writer) {
	fmt.Fprintf(w, "## Cheetah benchmark: %s\n\n", r.StartedAt.UTC().Format("2006-01-02 15:04 UTC"))
	m := r.Machine
	fmt.Fprintf(w, "Machine: %s, %d cores, %s memory, %s, %s/%s, %s (GOMAXPROCS %d). Cheetah %s. Run took %s.\n\n",
		orDash(m.CPUModel), m.Cores, Bytes(float64(m.MemoryBytes)), orDash(m.Kernel), m.OS, m.Arch, m.GoVersion, m.GOMAXPROCS,
		orDash(r.Cheetah), (time.Duration(r.Seconds * float64(time.Second))).Round(time.Second).String())
	fmt.Fprintf(w, "| peer | version |\n|---|---|\n")
	for _, v := range r.Versions {
		ver := v.Version
		if v.Absent {
			ver = "absent"
		}
		if v.Note != "" {
			ver += " (" + v.Note + ")"
		}
		fmt.Fprintf(w, "| %s | %s |\n", v.Name, ver)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Each cell: median over the repeats (min–max). Warm-up excluded.\n\n")
	for _, s := range r.Scenarios {
		s.Markdown(w)
	}
	r.goalsMarkdown(w)
}

// Markdown writes one scenario's table.
func (s *Scenario) Markdown(w io.Writer) {
	fmt.Fprintf(w, "### %d. %s\n\n%s\n\n", s.Number, s.Title, s.Detail)
	if s.LoadStart != "" {
		fmt.Fprintf(w, "Load average (1/5/15 min): %s at the start, %s at the end.\n\n", s.LoadStart, s.LoadEnd)
	}
	head := []string{"peer"}
	for _, c := range s.Columns {
		if c.Unit == "" {
			head = append(head, c.Label)
		} else {
			head = append(head, c.Label+" ("+c.Unit+")")
		}
	}
	fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(head, " | "), strings.Repeat("---|", len(head)))
	for _, r := range s.Rows {
		cells := []string{r.Peer}
		for _, c := range s.Columns {
			switch {
			case r.Absent:
				cells = append(cells, "absent")
			case r.Failed:
				cells = append(cells, "failed")
			default:
				v, ok := r.Values[c.Key]
				if !ok {
					cells = append(cells, "–")
					continue
				}
				cells = append(cells, Cell(v))
			}
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
	var notes []string
	for _, r := range s.Rows {
		switch {
		case r.Reason != "":
			notes = append(notes, fmt.Sprintf("%s: %s", r.Peer, r.Reason))
		case r.Note != "":
			notes = append(notes, fmt.Sprintf("%s: %s", r.Peer, r.Note))
		}
	}
	if len(notes) > 0 {
		fmt.Fprintln(w)
		for _, n := range notes {
			fmt.Fprintf(w, "- %s\n", n)
		}
	}
	fmt.Fprintln(w)
}

// Cell formats a summary as "median (min–max)", or just the median when
// there was one run.
func Cell(v stats.Summary) string {
	if math.IsNaN(v.Median) {
		return "–"
	}
	if len(v.Runs) <= 1 || v.Min == v.Max {
		return Num(v.Median)
	}
	return fmt.Sprintf("%s (%s–%s)", Num(v.Median), Num(v.Min), Num(v.Max))
}

// Num formats a figure with three significant digits and thousands
// separators: 12,300 or 45.6 or 0.123; a whole number as one: 16.
func Num(v float64) string {
	switch a := math.Abs(v); {
	case math.IsNaN(v):
		return "–"
	case a >= 1000:
		return group(strconv.FormatFloat(math.Round(v), 'f', 0, 64))
	case v == math.Trunc(v):
		return strconv.FormatFloat(v, 'f', 0, 64) // a count: 16, not 16.0
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case a >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	case a == 0:
		return "0"
	default:
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
}

func group(s string) string {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// Bytes formats a byte count in binary units.
func Bytes(v float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	return Num(v) + " " + units[i]
}

func orDash(s string) string {
	if s == "" {
		return "–"
	}
	return s
}

// Count formats a count with its noun: "1 run", "3 runs", "10,000 clients".
func Count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return group(strconv.Itoa(n)) + " " + noun + "s"
}
