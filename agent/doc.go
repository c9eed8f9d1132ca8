// Package agent is the client side of the Cheetah wire protocol: a library
// for programs that connect to a broker, offer contexts to run commands on,
// and answer the commands they are sent. The console agent (`cheetah agent`)
// is built on it, and so can any client of your own.
//
// An Agent offers Config.Flows console flows, reported to the broker as the
// contexts "flow-1" to "flow-N". Register a Handler for each command name
// with Handle, then call Run, which connects, says hello, waits for the
// broker's welcome, reports its contexts and serves commands until its
// context ends. When the connection drops, Run reconnects with jittered
// exponential backoff and reports its contexts again; it gives up only when
// the broker says a retry cannot succeed (close codes 4401, 4403 and 4409),
// and then returns a *CloseError.
//
// Every command is acknowledged with its first message (a progress, an
// event, a capture or its terminal message), in one write with it, or on
// its own 10 ms after it arrived if it has sent nothing by then: a command
// that ends quickly costs the agent and the broker one write and one
// wake-up less, and its acked_at is at most 10 ms late. The commands of one
// context run one at a time, in the order they arrived; different contexts
// run in parallel. A handler streams intermediate output through its Output
// and ends with a result or an error, which the agent sends as the command's
// terminal message (unless the command's response_mode is "none"). A handler
// signals a specific error code by returning a *CommandError; any other error
// becomes code "failed", a panic becomes "internal", and a handler whose
// context ended reports "timeout" (the command's timeout_ms passed) or
// "cancelled" (the broker sent cancel).
//
// Echo and Exec are the handlers of the console agent: Echo answers with the
// params it was given, and Exec runs a program from an allowlist, streaming
// its stdout and stderr as progress. Each program runs in a process group of
// its own, killed whole when its command is cancelled or times out; on Linux
// the kernel also kills the program when the agent process dies, however it
// dies, so a killed agent leaves no program running.
//
// Commands keep running when the connection drops. Whatever they send while
// the agent is disconnected is dropped; what they send once it has
// reconnected goes to the broker, which records it as late if the command
// was already resolved.
package agent
