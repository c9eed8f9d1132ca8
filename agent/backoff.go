package agent

import (
	"math/rand/v2"
	"time"
)

// backoff yields the delays between connection attempts: exponential from
// min up to max, with equal jitter (half of each delay fixed, half random).
// The jitter spreads out agents that lost the broker at the same moment,
// such as when it restarted, and the fixed half keeps any one agent from
// retrying in a tight loop.
type backoff struct {
	min, max time.Duration
	attempt  int
}

func (b *backoff) next() time.Duration {
	d := b.max
	if b.attempt < 62 { // beyond that the shift overflows
		if e := b.min << b.attempt; e > 0 && e < b.max {
			d = e
			b.attempt++
		}
	}
	return d/2 + rand.N(d/2+1)
}

// reset starts over from min, after a connection the broker accepted.
func (b *backoff) reset() { b.attempt = 0 }
