package remote

import (
	"context"
	"errors"
	"sync"
	"time"

	cheetah "github.com/cheetahbroker/cheetah"
)

var _ cheetah.LeaseWatcher = (*backend)(nil)

// watchPoll is how long one long poll of /api/v1/lease/wait lasts, and
// watchRetry how long the watch waits after a failed one (the broker was
// unreachable, or answered something else than the lease's fate), doubling
// up to watchMaxRetry while they keep failing.
const (
	watchPoll     = 20 * time.Second
	watchRetry    = 250 * time.Millisecond
	watchMaxRetry = 5 * time.Second
)

// WatchLease implements cheetah.LeaseWatcher over the broker's long poll:
// one goroutine asks POST /api/v1/lease/wait, again and again, until the
// broker answers lease_lost (the reason goes to lost) or stop is called.
// The broker answers the poll as soon as its registry hears of the end, so
// Handle.Done closes well within a second of it.
func (b *backend) WatchLease(lease cheetah.Lease, lost func(cheetah.LostReason)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if lease.LeaseToken == "" {
			lost(cheetah.LostUnknownLease)
			return
		}
		ms := watchPoll.Milliseconds()
		retry := watchRetry
		for ctx.Err() == nil {
			var out cheetah.LeaseWaitAnswer
			err := b.c.Do(ctx, "POST", "/api/v1/lease/wait", cheetah.LeaseWaitBody{TimeoutMS: &ms}, &out, "X-Lease", lease.LeaseToken)
			var ll *cheetah.LeaseLostError
			if errors.As(err, &ll) {
				if ctx.Err() == nil {
					lost(ll.Reason)
				}
				return
			}
			if err == nil {
				retry = watchRetry
				continue
			}
			// The broker did not answer, or refused the poll (a revoked
			// key): ask again, less and less often.
			t := time.NewTimer(retry)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
			retry = min(2*retry, watchMaxRetry)
		}
	}()
	return func() {
		cancel()
		wg.Wait()
	}
}
