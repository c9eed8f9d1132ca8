package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/history"
)

// Lease-loss notices (DESIGN §10, "Knowing a lease ended"): an acquire
// with lease_webhook gets a lease.lost delivery when its lease ends other
// than by its holder's release. It is signed and retried as a result
// delivery is (Sign, Schedule), through the same client, so the same
// private-address rule holds when it connects.
//
// Unlike a result delivery, it is not durable: the delivery table is the
// command's row in history, and a lease has none. A notice pending when
// the broker stops (its first attempt not yet made, or a retry not yet
// due) is lost with the process; docs/behaviour.md says so.

// EventLeaseLost is the type of a lease-loss delivery.
const EventLeaseLost = "lease.lost"

// LeaseLost is the body of a lease.lost delivery. Lease never carries the
// token.
type LeaseLost struct {
	Type   string             `json:"type"`
	Lease  cheetah.Lease      `json:"lease"`
	Reason cheetah.LostReason `json:"reason"`
	At     time.Time          `json:"at"`
}

// CheckLeaseWebhook refuses an acquire's lease_webhook that the worker
// would not deliver to or could not sign, as Check does a callback.
func (w *Worker) CheckLeaseWebhook(ctx context.Context, req cheetah.AcquireRequest) error {
	if req.LeaseWebhook == "" {
		return nil
	}
	err := w.Check(ctx, cheetah.SendOptions{CallbackURL: req.LeaseWebhook, CallbackKeyID: req.LeaseWebhookKeyID})
	var e *cheetah.Error
	if errors.As(err, &e) && e.Code == cheetah.CodeInvalidRequest {
		return cheetah.Invalidf("lease_webhook: %s", e.Message)
	}
	return err
}

// Acquire checks an in-process acquire's lease_webhook first.
func (g *guard) Acquire(ctx context.Context, req cheetah.AcquireRequest) (cheetah.Lease, error) {
	if err := g.w.CheckLeaseWebhook(ctx, req); err != nil {
		return cheetah.Lease{}, err
	}
	return g.Backend.Acquire(ctx, req)
}

// leaseLost starts the delivery of ev's lease.lost, unless the lease was
// released by its holder or asked for none. It never blocks.
func (w *Worker) leaseLost(ev registry.Event) {
	if ev.Kind != registry.LeaseEnded || ev.LeaseWebhook == "" || ev.Reason == cheetah.LostReleased {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	w.wg.Add(1)
	go w.deliverLeaseLost(ev)
}

// deliverLeaseLost makes the attempts of one lease.lost delivery, on the
// result deliveries' schedule from the lease's end, until one is
// delivered, one is given up, or the worker closes.
func (w *Worker) deliverLeaseLost(ev registry.Event) {
	defer w.wg.Done()
	ctx := w.ctx
	id := fmt.Sprintf("lease_%s_%d", ev.UserID, ev.Epoch)
	log := w.log.With("webhook_id", id, "reason", ev.Reason)
	body, err := json.Marshal(LeaseLost{Type: EventLeaseLost, Reason: ev.Reason, At: ev.At.UTC(), Lease: cheetah.Lease{
		UserID: ev.UserID, ClientID: ev.ClientID, ContextID: ev.ContextID, ClientType: ev.ClientType,
		TaskID: ev.TaskID, Epoch: ev.Epoch, ExpiresAt: ev.ExpiresAt,
	}})
	if err != nil {
		log.Error("webhook: encode lease.lost", "err", err)
		return
	}
	d := history.PendingDelivery{CommandID: id, URL: ev.LeaseWebhook, UserID: ev.UserID, KeyID: ev.LeaseWebhookKeyID}
	for n := 1; n <= MaxAttempts; n++ {
		if n > 1 {
			now := w.clock.Now()
			t := w.clock.NewTimer(nextAttempt(ev.At, n-1, now).Sub(now))
			select {
			case <-t.Chan():
			case <-ctx.Done():
				t.Stop()
				return
			}
		}
		key, err := w.signingKey(ctx, d.KeyID)
		if err != nil {
			log.Warn("webhook: lease.lost given up", "reason", err.Error())
			w.count(OutcomeGaveUp)
			return
		}
		res, detail := w.post(ctx, d, n, key, body)
		if ctx.Err() != nil {
			return
		}
		switch res {
		case delivered:
			w.count(OutcomeDelivered)
			return
		case giveUp:
			w.count(OutcomeGaveUp)
			log.Warn("webhook: lease.lost given up", "error", detail)
			return
		}
		if n < MaxAttempts {
			w.count(OutcomeRetry)
			log.Info("webhook: lease.lost attempt failed, will retry", "error", detail)
		} else {
			w.count(OutcomeFailed)
			log.Warn("webhook: lease.lost failed, no attempts left", "error", detail)
		}
	}
}
