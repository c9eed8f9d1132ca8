package agent

import "syscall"

// dieWithAgent makes the kernel kill the program when the thread that
// started it ends: runProgram holds that thread (runtime.LockOSThread) until
// the program has been waited for, so that thread ends only with the agent.
func dieWithAgent(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
