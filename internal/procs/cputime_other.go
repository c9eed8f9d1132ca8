//go:build !unix

package procs

import "time"

const cpuTimeSupported = false

func processCPUTime() (time.Duration, bool) { return 0, false }
