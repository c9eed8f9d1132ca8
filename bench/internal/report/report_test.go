package report

import (
	"bytes"
	"strings"
	"testing"

	"github.com/cheetahbroker/cheetah/bench/internal/stats"
)

func TestNum(t *testing.T) {
	for v, want := range map[float64]string{1234567: "1,234,567", 123.4: "123", 12.34: "12.3", 1.234: "1.23", 0.01234: "0.0123", 0: "0", -4321: "-4,321", 16: "16", 100: "100"} {
		if got := Num(v); got != want {
			t.Errorf("Num(%v) = %q, want %q", v, got, want)
		}
	}
	if got := Bytes(16 * 1024); got != "16 KiB" {
		t.Errorf("Bytes = %q", got)
	}
}

func TestMarkdownShowsAbsentAndSpread(t *testing.T) {
	s := &Scenario{Number: 1, Title: "t", Columns: []Column{{Key: "p50", Label: "p50", Unit: "µs"}}}
	s.Rows = append(s.Rows,
		&Row{Peer: "a", Values: map[string]stats.Summary{"p50": stats.Summarize([]float64{10, 12, 11})}},
		&Row{Peer: "b", Absent: true, Reason: "dial tcp: refused"},
	)
	var buf bytes.Buffer
	s.Markdown(&buf)
	out := buf.String()
	for _, want := range []string{"| a | 11 (10–12) |", "| b | absent |", "- b: dial tcp: refused"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
}
