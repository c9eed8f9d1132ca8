package security

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/history/historytest"
	"github.com/cheetahbroker/cheetah/protocol"
)

type quietConn struct{}

func (quietConn) Send(protocol.Frame) bool         { return true }
func (quietConn) Close(protocol.CloseCode, string) {}

// TestLeaseTokenTiming times renewals with guessed tokens: random ones,
// ones that share a 16-digit prefix with a live token, and ones that
// differ from a live token only in the last digit. The registry finds a
// lease by the SHA-256 of its token (context/registry tokenKey), so what a
// lookup compares is a digest the guesser cannot steer, and a guess closer
// to a real token cannot take a different path. It prints its figures and
// asserts nothing about them (timing on a shared machine is noise); run it
// with -security.timing=N (make chaos does). docs/reliability.md has the
// figures.
func TestLeaseTokenTiming(t *testing.T) {
	if *timing <= 0 {
		t.Skip("timing test: run with -security.timing=N")
	}
	ctx := context.Background()
	reg, err := registry.New(ctx, registry.Config{Store: historytest.NewSQLite(t)})
	require.NoError(t, err)
	defer reg.Close()
	var reps []protocol.ContextReport
	for i := range 200 {
		reps = append(reps, protocol.ContextReport{ContextID: fmt.Sprintf("c%d", i), Owner: protocol.OwnerWorker})
	}
	att := reg.Connect(registry.ClientInfo{UserID: userA, ClientID: "t", Type: cheetah.Console}, quietConn{})
	reg.Report(att, reps)
	var live []string
	for range 200 {
		l, err := reg.Acquire(ctx, cheetah.AcquireRequest{UserID: userA, TaskID: "t", ClientType: cheetah.Console, TTL: time.Hour})
		require.NoError(t, err)
		live = append(live, l.LeaseToken)
	}
	flip := func(s string, at int) string {
		b := []byte(s)
		b[at] = "0123456789abcdef"[(int(b[at]-'0')+1)%16]
		if b[at] == s[at] {
			b[at] = 'a'
		}
		return string(b)
	}
	kinds := map[string]func(i int) string{
		"random":           func(int) string { return fmt.Sprintf("%032x", uint64(time.Now().UnixNano())) },
		"same 16 digits":   func(i int) string { return flip(live[i%len(live)], 16) },
		"all but the last": func(i int) string { return flip(live[i%len(live)], 31) },
		"live":             func(i int) string { return live[i%len(live)] },
	}
	n := *timing
	medians := map[string]time.Duration{}
	for round := range 3 {
		for name, gen := range kinds {
			toks := make([]string, n)
			for i := range toks {
				toks[i] = gen(i)
			}
			samples := make([]time.Duration, 0, n/100)
			for i := 0; i+100 <= n; i += 100 {
				start := time.Now()
				for _, tok := range toks[i : i+100] {
					_, _ = reg.Renew(ctx, cheetah.Lease{LeaseToken: tok}, 0)
				}
				samples = append(samples, time.Since(start)/100)
			}
			slices.Sort(samples)
			if round == 2 {
				medians[name] = samples[len(samples)/2]
			}
		}
	}
	t.Logf("median Renew time per lookup over %d lookups each: %v", n, medians)
}
