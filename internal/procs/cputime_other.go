//go:build !unix

package procs

import "time"

const cpuTimeSupported = false

func processCPUTime() time.Duration { return 0 }
