// Package machine describes the computer a benchmark ran on, so that a
// figure is never read without the machine that produced it.
package machine

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Info is what the report prints about the machine.
type Info struct {
	CPUModel    string `json:"cpu_model"`
	Cores       int    `json:"cores"` // logical CPUs the process may use
	MemoryBytes uint64 `json:"memory_bytes"`
	Kernel      string `json:"kernel"`
	OS          string `json:"os"`
	Arch        string `json:"arch"`
	GoVersion   string `json:"go_version"`
	GOMAXPROCS  int    `json:"gomaxprocs"`
}

// Describe reads the machine's description. Fields it cannot read stay
// empty; it never fails.
func Describe() Info {
	return Info{
		CPUModel:    cpuModel(),
		Cores:       runtime.NumCPU(),
		MemoryBytes: memTotal(),
		Kernel:      kernel(),
		OS:          runtime.GOOS,
		Arch:        runtime.GOARCH,
		GoVersion:   runtime.Version(),
		GOMAXPROCS:  runtime.GOMAXPROCS(0),
	}
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func memTotal() uint64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			kb, _ := strconv.ParseUint(fields[1], 10, 64)
			return kb * 1024
		}
	}
	return 0
}

func kernel() string {
	var u syscall.Utsname
	if err := syscall.Uname(&u); err != nil {
		return ""
	}
	return cstr(u.Sysname[:]) + " " + cstr(u.Release[:])
}

func cstr[T int8 | uint8](b []T) string {
	var sb strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
}

// RSS returns the resident set size of the calling process in bytes, read
// from /proc/self/status (0 where that is unavailable).
func RSS() uint64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "VmRSS:" {
			kb, _ := strconv.ParseUint(fields[1], 10, 64)
			return kb * 1024
		}
	}
	return 0
}

// RaiseFileLimit lifts RLIMIT_NOFILE to at least want (soft and, where the
// process may, hard), and returns the soft limit now in force.
func RaiseFileLimit(want uint64) (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	if lim.Cur >= want {
		return lim.Cur, nil
	}
	next := lim
	next.Cur = want
	if next.Max < want {
		next.Max = want // only root may raise the hard limit
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &next); err != nil {
		// Not allowed to raise the hard limit: take what it allows.
		next = lim
		next.Cur = lim.Max
		if err2 := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &next); err2 != nil {
			return lim.Cur, err
		}
	}
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	return lim.Cur, nil
}

// LoadAvg returns the 1, 5 and 15 minute load averages as /proc/loadavg
// shows them ("0.52 0.61 0.70"), or "" where it cannot be read.
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// CPUTime is the CPU time this process has used so far, user and system,
// every thread (getrusage RUSAGE_SELF); 0 when it cannot be read.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// clockTicks is the unit of /proc/stat: USER_HZ, 100 on every Linux the
// kernel's ABI allows user space to see (sysconf(_SC_CLK_TCK) without cgo).
const clockTicks = 100

// BusyTime is the CPU time the whole machine has spent working so far, every
// process and the kernel, summed over its CPUs: user, nice, system, irq and
// softirq of /proc/stat's first line, without idle, iowait and the time
// another guest stole. It is 0 where it cannot be read. Over a phase, it
// counts what a peer's servers (PostgreSQL, NATS, Redis) spent as well as
// this process.
func BusyTime() time.Duration {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil {
		return 0
	}
	return busyOf(line)
}

// busyOf reads the busy time from /proc/stat's "cpu" line.
func busyOf(line string) time.Duration {
	f := strings.Fields(line)
	// cpu user nice system idle iowait irq softirq steal …
	if len(f) < 8 || f[0] != "cpu" {
		return 0
	}
	var ticks uint64
	for _, i := range []int{1, 2, 3, 6, 7} {
		n, err := strconv.ParseUint(f[i], 10, 64)
		if err != nil {
			return 0
		}
		ticks += n
	}
	return time.Duration(ticks) * (time.Second / clockTicks)
}
