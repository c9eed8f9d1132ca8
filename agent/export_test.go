package agent

import "time"

// SetAckWithin sets how long a's acks wait for their command's first
// message; call it before Run.
func SetAckWithin(a *Agent, d time.Duration) { a.ackWithin = d }
