package stats

import (
	"testing"
	"time"
)

func TestSummarize(t *testing.T) {
	s := Summarize([]float64{5, 1, 3})
	if s.Median != 3 || s.Min != 1 || s.Max != 5 {
		t.Fatalf("odd: %+v", s)
	}
	s = Summarize([]float64{4, 1, 3, 2})
	if s.Median != 2.5 || s.Min != 1 || s.Max != 4 {
		t.Fatalf("even: %+v", s)
	}
	if s.Runs[0] != 4 {
		t.Fatalf("runs keep their order: %v", s.Runs)
	}
}

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 1000; i++ {
		d = append(d, time.Duration(i))
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{50, 500}, {99, 990}, {99.9, 999}, {100, 1000}, {0.01, 1}} {
		if got := Percentile(d, c.p); got != c.want {
			t.Errorf("p%v = %v, want %v", c.p, got, c.want)
		}
	}
	if Percentile(nil, 50) != 0 {
		t.Error("no samples")
	}
}
