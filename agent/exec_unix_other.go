//go:build unix && !linux

package agent

import "syscall"

// dieWithAgent does nothing where the kernel has no parent-death signal for
// os/exec to ask for: a program outlives a killed agent there.
func dieWithAgent(*syscall.SysProcAttr) {}
