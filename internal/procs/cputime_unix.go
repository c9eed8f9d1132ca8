//go:build unix

package procs

import (
	"syscall"
	"time"
)

const cpuTimeSupported = true

// processCPUTime is the user and system time of every thread of the process.
func processCPUTime() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
