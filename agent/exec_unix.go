//go:build unix

package agent

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
)

// killProcessGroup starts the program in a process group of its own and
// makes cancellation kill the whole group. Killing only the program would
// leave its children (a shell's pipeline, a build's compilers) running, and
// holding the output pipes open. Where the system can (Linux), the program
// is also killed when the agent dies: its own group keeps it out of a
// signal to the agent's, so without that a killed agent would leave it
// running, reparented to init, with nobody to read its output.
func killProcessGroup(c *exec.Cmd) {
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	dieWithAgent(c.SysProcAttr)
	c.Cancel = func() error {
		err := syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
		if errors.Is(err, syscall.ESRCH) {
			// The group is already gone; os/exec expects this error for it.
			return os.ErrProcessDone
		}
		return err
	}
}

// signalName names the signal that ended a process, or "" if none did.
func signalName(ps *os.ProcessState) string {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return ws.Signal().String()
	}
	return ""
}
