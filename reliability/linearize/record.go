package linearize

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"

	cheetah "github.com/cheetahbroker/cheetah"
)

// Driver performs the model's operations on a real broker.
type Driver interface {
	Acquire(ctx context.Context) (cheetah.Lease, error)
	Release(ctx context.Context, l cheetah.Lease) (bool, error)
	Renew(ctx context.Context, l cheetah.Lease) error
	Send(ctx context.Context, l cheetah.Lease) error
	Revoke(ctx context.Context, contextIndex int) (bool, error)
	// ContextIndex maps a lease's context id to its index in report order.
	ContextIndex(contextID string) int
}

// outputOf turns an error into the model's output.
func outputOf(err error) Output {
	var lost *cheetah.LeaseLostError
	var none *cheetah.NoContextError
	switch {
	case err == nil:
		return Output{OK: true}
	case errors.Is(err, ErrUnknownOutcome):
		return Output{Unknown: true, Lost: errors.Is(err, ErrAnswerLost)}
	case errors.As(err, &lost):
		return Output{Reason: string(lost.Reason)}
	case errors.As(err, &none):
		return Output{}
	}
	return Output{Err: err.Error()}
}

// Record runs goroutines × ops random operations concurrently on d and
// returns the history. Every operation on a lease starts after the acquire
// that returned it, so real-time order is respected.
func Record(d Driver, seed uint64, goroutines, ops int) []porcupine.Operation {
	ctx := context.Background()
	start := time.Now()
	var mu sync.Mutex
	var leases []cheetah.Lease
	var history []porcupine.Operation
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			rng := mrand.New(mrand.NewPCG(seed, uint64(g)))
			for range ops {
				mu.Lock()
				known := len(leases)
				pick := -1
				var l cheetah.Lease
				if known > 0 {
					// Mostly recent leases, which are likelier to be active.
					pick = known - 1 - min(rng.IntN(4), known-1)
					if rng.IntN(4) == 0 {
						pick = rng.IntN(known)
					}
					l = leases[pick]
				}
				mu.Unlock()
				var in Input
				switch r := rng.IntN(20); {
				case r < 6 || known == 0:
					in = Input{Kind: Acquire}
				case r < 10:
					in = Input{Kind: Release, Lease: pick}
				case r < 13:
					in = Input{Kind: Renew, Lease: pick}
				case r < 17:
					in = Input{Kind: Send, Lease: pick}
				case r < 19:
					in = Input{Kind: Revoke, Context: rng.IntN(3)}
				default:
					in = Input{Kind: []Kind{Release, Renew, Send}[rng.IntN(3)], Lease: -1}
					l = cheetah.Lease{LeaseToken: bogusToken()}
				}
				call := time.Since(start).Nanoseconds()
				var out Output
				switch in.Kind {
				case Acquire:
					got, err := d.Acquire(ctx)
					out = outputOf(err)
					if err == nil {
						mu.Lock()
						out.Lease = len(leases)
						leases = append(leases, got)
						mu.Unlock()
						out.Context, out.Epoch = d.ContextIndex(got.ContextID), got.Epoch
					}
				case Release:
					ok, err := d.Release(ctx, l)
					out = outputOf(err)
					out.OK = err == nil && ok
				case Renew:
					out = outputOf(d.Renew(ctx, l))
				case Send:
					out = outputOf(d.Send(ctx, l))
				case Revoke:
					ok, err := d.Revoke(ctx, in.Context)
					out = outputOf(err)
					out.OK = err == nil && ok
				}
				ret := time.Since(start).Nanoseconds()
				if out.Unknown {
					if in.Kind == Renew || in.Kind == Send {
						continue // it changes nothing the model holds, done or not
					}
					if out.Lost {
						// It may take effect at any time after its call.
						ret = math.MaxInt64
					}
				}
				mu.Lock()
				history = append(history, porcupine.Operation{ClientId: g, Input: in, Call: call, Output: out, Return: ret})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return history
}

func bogusToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Describe summarises a history for logs.
func Describe(h []porcupine.Operation) string {
	n := map[string]int{}
	for _, op := range h {
		i, o := op.Input.(Input), op.Output.(Output)
		k := i.Kind.String()
		switch {
		case o.Err != "":
			k += " error"
		case o.Unknown:
			k += " unknown"
		case o.OK:
			k += " ok"
		case o.Reason != "":
			k += " " + o.Reason
		default:
			k += " no"
		}
		n[k]++
	}
	return fmt.Sprint(n)
}
