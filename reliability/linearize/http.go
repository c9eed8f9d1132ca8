package linearize

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/reliability/internal/rig"
)

// HTTPDriver performs the model's operations over the HTTP API at API's
// base, for User, whose client Client reported Reports' contexts.
type HTTPDriver struct {
	API          *rig.API
	App, Admin   string // keys
	User, Client string
}

func (d HTTPDriver) Acquire(ctx context.Context) (cheetah.Lease, error) {
	l, ans := d.API.Acquire(ctx, d.App, map[string]any{"user_id": d.User, "task_id": "lin", "client_type": "console", "ttl_s": 3600})
	return l, answerErr(ans, 201)
}

func (d HTTPDriver) Release(ctx context.Context, l cheetah.Lease) (bool, error) {
	ans := d.API.Do(ctx, "POST", "/api/v1/lease/release", d.App, nil, "X-Lease", l.LeaseToken)
	var out struct{ Released bool }
	if err := answerErr(ans, 200); err != nil {
		return false, err
	}
	return out.Released, ans.Decode(&out)
}

func (d HTTPDriver) Renew(ctx context.Context, l cheetah.Lease) error {
	return answerErr(d.API.Do(ctx, "POST", "/api/v1/lease/renew", d.App, nil, "X-Lease", l.LeaseToken), 200)
}

func (d HTTPDriver) Send(ctx context.Context, l cheetah.Lease) error {
	_, ans := d.API.Send(ctx, d.App, l.LeaseToken, map[string]any{"name": "noop"})
	return answerErr(ans, 202)
}

func (d HTTPDriver) Revoke(ctx context.Context, i int) (bool, error) {
	ans := d.API.Do(ctx, "POST", fmt.Sprintf("/api/v1/admin/users/%s/clients/%s/contexts/c%d/revoke", d.User, d.Client, i), d.Admin, nil)
	if err := answerErr(ans, 200); err != nil {
		return false, err
	}
	var out struct{ Revoked bool }
	return out.Revoked, ans.Decode(&out)
}

func (d HTTPDriver) ContextIndex(id string) int { return ContextIndex(id) }

// ErrUnknownOutcome is a call answered with a failure that does not say
// whether it took effect (a 5xx from a replica: the replica that held the
// lease did not answer it, or the store did not): it may have, by the
// time the answer came.
var ErrUnknownOutcome = errors.New("linearize: the outcome is unknown")

// ErrAnswerLost is a call whose answer was lost (the connection dropped, or
// the balancer answered for a replica that died under it): another replica
// it was passed to may still act on it after, so it may take effect at any
// time after its call.
var ErrAnswerLost = fmt.Errorf("%w: the answer was lost", ErrUnknownOutcome)

func answerErr(a rig.Answer, want int) error {
	switch {
	case a.Err != nil, a.Status >= 500 && a.Code() == "":
		return fmt.Errorf("%w: %s", ErrAnswerLost, a)
	case a.Status >= 500:
		return fmt.Errorf("%w: %s", ErrUnknownOutcome, a)
	}
	if a.Status == want {
		return nil
	}
	switch a.Code() {
	case cheetah.CodeLeaseLost:
		return &cheetah.LeaseLostError{Reason: cheetah.LostReason(a.Reason())}
	case cheetah.CodeNoContextAvailable:
		return &cheetah.NoContextError{Reason: cheetah.NoContextReason(a.Reason())}
	}
	return fmt.Errorf("%s", a)
}

// ContextIndex maps a context id of Reports to its index.
func ContextIndex(id string) int {
	n, err := strconv.Atoi(strings.TrimPrefix(id, "c"))
	if err != nil {
		return -1
	}
	return n
}

// Reports are n worker contexts, c0…c(n-1), in report order.
func Reports(n int) []protocol.ContextReport {
	var reps []protocol.ContextReport
	for i := range n {
		reps = append(reps, rig.Worker(fmt.Sprintf("c%d", i)))
	}
	return reps
}
