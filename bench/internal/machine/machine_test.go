package machine

import (
	"testing"
	"time"
)

func TestBusyOfSumsTheWorkingColumns(t *testing.T) {
	t.Parallel()
	// user nice system idle iowait irq softirq steal guest guest_nice
	line := "cpu  1000 20 300 99999 55 4 6 77 0 0\n"
	if got, want := busyOf(line), (1000+20+300+4+6)*10*time.Millisecond; got != want {
		t.Fatalf("busyOf = %v, want %v", got, want)
	}
	for _, bad := range []string{"", "cpu0 1 2 3 4 5 6 7", "cpu 1 2 3", "cpu 1 x 3 4 5 6 7"} {
		if got := busyOf(bad); got != 0 {
			t.Errorf("busyOf(%q) = %v, want 0", bad, got)
		}
	}
}

// The machine's busy time includes this process's: spinning for a CPU
// time shows in it.
func TestBusyTimeCountsThisProcess(t *testing.T) {
	busy0, cpu0 := BusyTime(), CPUTime()
	if busy0 == 0 || cpu0 == 0 {
		t.Skip("no /proc/stat or getrusage here")
	}
	const spun = 300 * time.Millisecond
	for CPUTime()-cpu0 < spun {
		// Each check is a system call: the spin is user and system time.
	}
	// /proc/stat counts in ticks of 10 ms, per CPU.
	if grew := BusyTime() - busy0; grew < spun-50*time.Millisecond {
		t.Fatalf("busy time grew by %v while this process used %v of CPU", grew, spun)
	}
}
