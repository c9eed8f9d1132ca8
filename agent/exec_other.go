//go:build !unix

package agent

import (
	"os"
	"os/exec"
)

// killProcessGroup keeps os/exec's default on systems without Unix process
// groups: cancellation kills the program itself.
func killProcessGroup(*exec.Cmd) {}

// signalName reports no signal where processes do not end by signals.
func signalName(*os.ProcessState) string { return "" }
