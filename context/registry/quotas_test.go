package registry_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/quota"
)

func mustQuotas(t *testing.T, doc string) *quota.Set {
	t.Helper()
	s, err := quota.Parse([]byte(doc))
	require.NoError(t, err)
	return s
}

// connectUser connects a console client of userID with n idle workers.
func (e *env) connectUser(userID, clientID string, n int) *client {
	c := &client{conn: newFakeConn(), id: clientID}
	c.att = e.reg.Connect(registry.ClientInfo{UserID: userID, ClientID: clientID, Type: cheetah.Console, KeyID: "k1"}, c.conn)
	var ctxs []protocol.ContextReport
	for i := range n {
		ctxs = append(ctxs, worker(fmt.Sprintf("w%d", i)))
	}
	e.reg.Report(c.att, ctxs)
	return c
}

func (e *env) acquireAs(userID, tenant string, wait time.Duration) (cheetah.Lease, error) {
	return e.reg.Acquire(context.Background(), cheetah.AcquireRequest{UserID: userID, TaskID: "t", ClientType: cheetah.Console, TenantID: tenant, Wait: wait})
}

func quotaFull(t *testing.T, err error) cheetah.QuotaFull {
	t.Helper()
	require.Equal(t, cheetah.ReasonQuotaExceeded, noContextReason(t, err))
	var nc *cheetah.NoContextError
	require.ErrorAs(t, err, &nc)
	require.NotNil(t, nc.Quota)
	return *nc.Quota
}

func TestQuotaEachLevelFullAndFreed(t *testing.T) {
	e := setup(t)
	e.reg.SetQuotas(mustQuotas(t, `
quotas:
  - name: consoles
    match: {client_type: console}
    levels: {global: 3, tenant: 2, user: 1}
`))
	for _, u := range []string{"usr_a", "usr_b", "usr_c", "usr_d"} {
		e.connectUser(u, "c1", 2)
	}
	// user: one each.
	a, err := e.acquireAs("usr_a", "t1", 0)
	require.NoError(t, err)
	require.Equal(t, "t1", a.TenantID)
	_, err = e.acquireAs("usr_a", "t1", 0)
	require.Equal(t, cheetah.QuotaFull{Quota: "consoles", Level: "user", Used: 1, Cap: 1}, quotaFull(t, err))
	// tenant: two in t1.
	b, err := e.acquireAs("usr_b", "t1", 0)
	require.NoError(t, err)
	_, err = e.acquireAs("usr_c", "t1", 0)
	require.Equal(t, cheetah.QuotaFull{Quota: "consoles", Level: "tenant", Used: 2, Cap: 2}, quotaFull(t, err))
	// global: three in all.
	c, err := e.acquireAs("usr_c", "t2", 0)
	require.NoError(t, err)
	_, err = e.acquireAs("usr_d", "t3", 0)
	require.Equal(t, cheetah.QuotaFull{Quota: "consoles", Level: "global", Used: 3, Cap: 3}, quotaFull(t, err))

	// Freed: each level takes again once a slot is given back.
	ok, _ := e.reg.Release(context.Background(), c)
	require.True(t, ok)
	d, err := e.acquireAs("usr_d", "t3", 0)
	require.NoError(t, err)
	ok, _ = e.reg.Release(context.Background(), b)
	require.True(t, ok)
	_, err = e.acquireAs("usr_d", "t3", 0)
	require.Equal(t, "user", quotaFull(t, err).Level)
	b2, err := e.acquireAs("usr_c", "t1", 0)
	require.NoError(t, err)
	ok, _ = e.reg.Release(context.Background(), a)
	require.True(t, ok)
	a2, err := e.acquireAs("usr_a", "t4", 0)
	require.NoError(t, err)

	v := e.reg.Quotas()
	require.Len(t, v.Quotas, 1)
	require.Equal(t, registry.ScopeUse{Used: 3, Cap: 3}, v.Quotas[0].Occupancy.Global)
	require.Len(t, v.Quotas[0].Holders, 3)
	for _, h := range v.Quotas[0].Holders {
		require.Empty(t, h.LeaseToken, "no view shows a token")
	}
	require.Equal(t, []registry.ScopeUse{{TenantID: "t1", Used: 1, Cap: 2}, {TenantID: "t3", Used: 1, Cap: 2}, {TenantID: "t4", Used: 1, Cap: 2}}, v.Quotas[0].Occupancy.Tenants)

	n, _ := e.reg.ReleaseAll(context.Background(), []string{d.LeaseToken, b2.LeaseToken, a2.LeaseToken})
	require.Equal(t, 3, n)
	require.Zero(t, e.reg.Stats().Slots)
}

func TestQuotaNarrowToWide(t *testing.T) {
	e := setup(t)
	e.reg.SetQuotas(mustQuotas(t, `
quotas:
  - name: wide
    levels: {global: 1}
  - name: narrow
    match: {client_type: console}
    levels: {tenant: 1, user: 1}
`))
	e.connectUser("usr_a", "c1", 2)
	_, err := e.acquireAs("usr_a", "t1", 0)
	require.NoError(t, err)
	// Every level is full: the narrowest is reported, whatever the order
	// of the quotas in the file.
	_, err = e.acquireAs("usr_a", "t1", 0)
	require.Equal(t, cheetah.QuotaFull{Quota: "narrow", Level: "user", Used: 1, Cap: 1}, quotaFull(t, err))
	e.connectUser("usr_b", "c1", 1)
	_, err = e.acquireAs("usr_b", "t1", 0)
	require.Equal(t, cheetah.QuotaFull{Quota: "narrow", Level: "tenant", Used: 1, Cap: 1}, quotaFull(t, err))
	_, err = e.acquireAs("usr_b", "t2", 0)
	require.Equal(t, cheetah.QuotaFull{Quota: "wide", Level: "global", Used: 1, Cap: 1}, quotaFull(t, err))
	// A browser acquire is governed by "wide" alone.
	_, err = e.reg.Acquire(context.Background(), cheetah.AcquireRequest{UserID: "usr_b", TaskID: "t", ClientType: cheetah.Browser})
	require.Equal(t, "wide", quotaFull(t, err).Quota)
}

func TestQuotaOverrides(t *testing.T) {
	e := setup(t)
	e.reg.SetQuotas(mustQuotas(t, `
quotas:
  - name: q
    levels: {global: 3, tenant: 1, user: 1}
tenants:
  acme: {q: {tenant: 5, user: 2}}
  tiny: {q: {user: 1, tenant: 1}}
`))
	e.connectUser("usr_a", "c1", 4)
	_, err := e.acquireAs("usr_a", "acme", 0)
	require.NoError(t, err)
	_, err = e.acquireAs("usr_a", "acme", 0)
	require.NoError(t, err, "acme's user cap is raised to 2")
	_, err = e.acquireAs("usr_a", "acme", 0)
	require.Equal(t, cheetah.QuotaFull{Quota: "q", Level: "user", Used: 2, Cap: 2}, quotaFull(t, err))
	e.connectUser("usr_b", "c1", 4)
	_, err = e.acquireAs("usr_b", "acme", 0)
	require.NoError(t, err)
	e.connectUser("usr_c", "c1", 4)
	_, err = e.acquireAs("usr_c", "acme", 0)
	require.Equal(t, cheetah.QuotaFull{Quota: "q", Level: "global", Used: 3, Cap: 3}, quotaFull(t, err), "acme's tenant cap of 5 does not raise global")
	_, err = e.acquireAs("usr_c", "default", 0)
	require.Equal(t, "global", quotaFull(t, err).Level)
}

func TestQuotaWaitsFIFOForASlot(t *testing.T) {
	e := setup(t)
	e.reg.SetQuotas(mustQuotas(t, "quotas: [{name: one, levels: {global: 1}}]"))
	e.connectUser("usr_a", "c1", 1)
	e.connectUser("usr_b", "c1", 1)
	e.connectUser("usr_c", "c1", 1)
	a, err := e.acquireAs("usr_a", "", 0)
	require.NoError(t, err)
	type res struct {
		l   cheetah.Lease
		err error
	}
	bc, cc := make(chan res, 1), make(chan res, 1)
	go func() { l, err := e.acquireAs("usr_b", "", time.Minute); bc <- res{l, err} }()
	require.Eventually(t, func() bool { return e.reg.Stats().QuotaWaiters == 1 }, 10*time.Second, time.Millisecond)
	go func() { l, err := e.acquireAs("usr_c", "", time.Minute); cc <- res{l, err} }()
	require.Eventually(t, func() bool { return e.reg.Stats().QuotaWaiters == 2 }, 10*time.Second, time.Millisecond)

	// A newcomer that does not wait is refused: the slot is the waiters'.
	ok, _ := e.reg.Release(context.Background(), a)
	require.True(t, ok)
	b := <-bc
	require.NoError(t, b.err)
	require.Equal(t, "usr_b", b.l.UserID, "the first waiter gets the slot")
	_, err = e.acquireAs("usr_a", "", 0)
	require.Equal(t, "global", quotaFull(t, err).Level)
	ok, _ = e.reg.Release(context.Background(), b.l)
	require.True(t, ok)
	c := <-cc
	require.NoError(t, c.err)
	require.Equal(t, "usr_c", c.l.UserID)

	// A wait that runs out while the quota stays full says so.
	go func() { l, err := e.acquireAs("usr_a", "", time.Second); bc <- res{l, err} }()
	require.NoError(t, e.clock.BlockUntilContext(context.Background(), 2), "the expiry loop's timer and the waiter's")
	e.clock.Advance(time.Second)
	r := <-bc
	require.Equal(t, "global", quotaFull(t, r.err).Level)
	ok, _ = e.reg.Release(context.Background(), c.l)
	require.True(t, ok)
	s := e.reg.Stats()
	require.Zero(t, s.Slots)
	require.Zero(t, s.QuotaWaiters)
	require.Zero(t, s.Waiters)
}

func TestQuotaReloadGoodAndBroken(t *testing.T) {
	e := setup(t)
	e.reg.SetQuotas(mustQuotas(t, "quotas: [{name: consoles, match: {client_type: console}, levels: {user: 1}}]"))
	e.connectUser("usr_a", "c1", 3)
	a, err := e.acquireAs("usr_a", "", 0)
	require.NoError(t, err)
	_, err = e.acquireAs("usr_a", "", 0)
	require.Equal(t, "user", quotaFull(t, err).Level)

	// A good reload counts the live lease under the new caps.
	e.reg.SetQuotas(mustQuotas(t, "quotas: [{name: consoles2, match: {client_type: console}, levels: {user: 2}}]"))
	v := e.reg.Quotas()
	require.Equal(t, "consoles2", v.Quotas[0].Name)
	require.Equal(t, 1, v.Quotas[0].Occupancy.Global.Used)
	b, err := e.acquireAs("usr_a", "", 0)
	require.NoError(t, err)
	_, err = e.acquireAs("usr_a", "", 0)
	require.Equal(t, cheetah.QuotaFull{Quota: "consoles2", Level: "user", Used: 2, Cap: 2}, quotaFull(t, err))

	// A waiter governed by the quota is failed when a reload breaks.
	done := make(chan error, 1)
	go func() { _, err := e.acquireAs("usr_a", "", time.Minute); done <- err }()
	require.Eventually(t, func() bool { return e.reg.Stats().QuotaWaiters == 1 }, 10*time.Second, time.Millisecond)
	e.reg.QuotasBroken(errors.New("line 3: bad"))
	require.ErrorIs(t, <-done, cheetah.ErrQuotaUnavailable)
	// Broken: fail closed for what the quotas govern; the rest passes.
	ok, _ := e.reg.Release(context.Background(), a)
	require.True(t, ok)
	_, err = e.acquireAs("usr_a", "", 0)
	require.ErrorIs(t, err, cheetah.ErrQuotaUnavailable)
	require.Equal(t, "line 3: bad", e.reg.Quotas().Broken)
	e.connect("b1", cheetah.Browser, nil, worker("x"))
	_, err = e.acquire("t", func(r *cheetah.AcquireRequest) { r.ClientType = cheetah.Browser })
	require.NoError(t, err, "an acquire no quota governs passes")

	// A good file again ends it.
	e.reg.SetQuotas(mustQuotas(t, "quotas: [{name: consoles, match: {client_type: console}, levels: {user: 2}}]"))
	_, err = e.acquireAs("usr_a", "", 0)
	require.NoError(t, err)
	require.Empty(t, e.reg.Quotas().Broken)
	_ = b
	// No quotas at all: nothing is counted.
	e.reg.SetQuotas(nil)
	require.Zero(t, e.reg.Stats().Slots)
	require.Empty(t, e.reg.Quotas().Quotas)
}

// TestQuotaSlotsReturnEveryWay ends leases every way a lease can end and
// checks the slots come back each time.
func TestQuotaSlotsReturnEveryWay(t *testing.T) {
	e := setup(t, func(c *registry.Config) { c.ReconnectGrace = time.Second })
	const quotas = "quotas: [{name: q, levels: {global: 10, tenant: 10, user: 10}}]"
	e.reg.SetQuotas(mustQuotas(t, quotas))
	c := e.connect("c1", cheetah.Console, nil, worker("a"), worker("b"), worker("c"), worker("d"), worker("e"))
	slots := func() int { return e.reg.Stats().Slots }

	l := e.mustAcquire("t")
	require.Equal(t, 3, slots(), "one slot at each level")
	_, _ = e.reg.Release(context.Background(), l)
	require.Zero(t, slots(), "released")

	e.mustAcquire("t", func(r *cheetah.AcquireRequest) { r.TTL = time.Second })
	e.clock.Advance(2 * time.Second)
	e.reg.ExpireDue()
	require.Zero(t, slots(), "expired")

	l = e.mustAcquire("t")
	e.revoked(user, l.ClientID, l.ContextID)
	require.Zero(t, slots(), "revoked")

	l = e.mustAcquire("t")
	var rest []protocol.ContextReport
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		if id != l.ContextID {
			rest = append(rest, worker(id))
		}
	}
	e.reg.Report(c.att, rest)
	require.Zero(t, slots(), "the context left the state report")

	// Leases charged before a reload give their slots back after it, and
	// a scope with none left is gone from the occupancy.
	l1, l2 := e.mustAcquire("t"), e.mustAcquire("t")
	e.reg.SetQuotas(mustQuotas(t, quotas))
	require.Equal(t, 6, slots(), "counted again under the reloaded quotas")
	_, _ = e.reg.Release(context.Background(), l1)
	require.Equal(t, 3, slots())
	_, _ = e.reg.Release(context.Background(), l2)
	require.Zero(t, slots(), "released after a reload")
	occ := e.reg.Quotas().Quotas[0].Occupancy
	require.Empty(t, occ.Tenants)
	require.Empty(t, occ.Users)

	e.mustAcquire("t")
	e.mustAcquire("t")
	require.Equal(t, 6, slots())
	e.reg.Disconnect(c.att)
	require.Equal(t, 6, slots(), "kept through the reconnect grace")
	e.clock.Advance(2 * time.Second)
	require.Eventually(t, func() bool { return slots() == 0 }, 10*time.Second, time.Millisecond, "the grace ran out")
	requireZero(t, e.reg)
}

// TestQuotaNeverAboveCap is a checker: many goroutines acquire (some
// waiting), release, let leases expire on the fake clock, lose contexts
// and disconnect, while a subscriber replays the registry's lease events
// (their order is the order the registry decided them) and checks that no
// level of the quota ever holds more than its cap.
func TestQuotaNeverAboveCap(t *testing.T) {
	e := setup(t, func(c *registry.Config) { c.ReconnectGrace = time.Second })
	const global, tenantCap, userCap = 5, 3, 2
	e.reg.SetQuotas(mustQuotas(t, fmt.Sprintf("quotas: [{name: q, levels: {global: %d, tenant: %d, user: %d}}]", global, tenantCap, userCap)))
	users := []string{"usr_0", "usr_1", "usr_2", "usr_3", "usr_4", "usr_5"}
	tenantOf := func(u string) string { return fmt.Sprintf("t%d", (u[4]-'0')%2) }
	clients := map[string]*client{}
	for _, u := range users {
		clients[u] = e.connectUser(u, "c1", 4)
	}

	var mu sync.Mutex
	var violations []string
	g, tn, us := 0, map[string]int{}, map[string]int{}
	cancel := e.reg.Subscribe(func(ev registry.Event) {
		mu.Lock()
		defer mu.Unlock()
		switch ev.Kind {
		case registry.LeaseAcquired:
			g++
			tn[tenantOf(ev.UserID)]++
			us[ev.UserID]++
			if g > global || tn[tenantOf(ev.UserID)] > tenantCap || us[ev.UserID] > userCap {
				violations = append(violations, fmt.Sprintf("seq %d: global %d, tenant %d, user %d", ev.Seq, g, tn[tenantOf(ev.UserID)], us[ev.UserID]))
			}
		case registry.LeaseEnded:
			g--
			tn[tenantOf(ev.UserID)]--
			us[ev.UserID]--
		}
	})
	defer cancel()

	var wg sync.WaitGroup
	var cmu sync.Mutex // guards clients' reports and reconnects
	for i := range 12 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			var held []cheetah.Lease
			for range 300 {
				u := users[rng.IntN(len(users))]
				switch op := rng.IntN(10); {
				case op < 5:
					req := cheetah.AcquireRequest{UserID: u, TaskID: "t", ClientType: cheetah.Console, TenantID: tenantOf(u),
						TTL: time.Duration(1+rng.IntN(3)) * time.Second}
					ctx, stop := context.WithCancel(context.Background())
					if op == 0 {
						// A short wait, ended by cancellation: it must not
						// park forever on a fake clock.
						req.Wait = time.Minute
						stop()
					}
					l, err := e.reg.Acquire(ctx, req)
					stop()
					if err == nil {
						held = append(held, l)
					}
				case op < 8 && len(held) > 0:
					k := rng.IntN(len(held))
					_, _ = e.reg.Release(context.Background(), held[k])
					held = append(held[:k], held[k+1:]...)
				case op == 8:
					e.clock.Advance(time.Second)
					e.reg.ExpireDue()
				default:
					cmu.Lock()
					c := clients[u]
					if rng.IntN(2) == 0 {
						// Lose a context, then report it again.
						e.reg.Report(c.att, []protocol.ContextReport{worker("w0"), worker("w1"), worker("w2")})
						e.reg.Report(c.att, []protocol.ContextReport{worker("w0"), worker("w1"), worker("w2"), worker("w3")})
					} else {
						e.reg.Disconnect(c.att)
						clients[u] = e.connectUser(u, "c1", 4)
					}
					cmu.Unlock()
				}
			}
			for _, l := range held {
				_, _ = e.reg.Release(context.Background(), l)
			}
		})
	}
	wg.Wait()
	for _, u := range users {
		e.reg.Disconnect(clients[u].att)
	}
	e.clock.Advance(2 * time.Second)
	e.reg.ExpireDue()
	require.Eventually(t, func() bool { return e.reg.Stats().Leases == 0 }, 10*time.Second, time.Millisecond)
	require.Zero(t, e.reg.Stats().Slots, "every slot came back")
	e.reg.Close() // delivers every event queued
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, violations)
	require.Zero(t, g)
}

func TestAffinity(t *testing.T) {
	e := setup(t)
	e.connect("c1", cheetah.Console, nil, worker("a"), worker("b"), worker("c"))
	withKey := func(k string) func(*cheetah.AcquireRequest) {
		return func(r *cheetah.AcquireRequest) { r.AffinityKey = k }
	}
	// No context carried the key yet: the default selection, a miss.
	l := e.mustAcquire("t", withKey("shop-login"))
	require.Equal(t, "a", l.ContextID)
	require.NotNil(t, l.AffinityHit)
	require.False(t, *l.AffinityHit)
	_, _ = e.reg.Release(context.Background(), l)
	// a is now idle the shortest; the key still finds it.
	l = e.mustAcquire("t", withKey("shop-login"))
	require.Equal(t, "a", l.ContextID)
	require.True(t, *l.AffinityHit)
	// Miss while the context is leased: the default selection (b).
	l2 := e.mustAcquire("t", withKey("shop-login"))
	require.Equal(t, "b", l2.ContextID)
	require.False(t, *l2.AffinityHit)
	_, _ = e.reg.Release(context.Background(), l2)
	_, _ = e.reg.Release(context.Background(), l)
	// Both a and b last carried the key: the one idle longer wins (b).
	l = e.mustAcquire("t", withKey("shop-login"))
	require.Equal(t, "b", l.ContextID)
	require.True(t, *l.AffinityHit)
	_, _ = e.reg.Release(context.Background(), l)
	// A lease without a key clears what the context's last lease carried.
	plain := e.mustAcquire("t", func(r *cheetah.AcquireRequest) { r.ClientID = "c1"; r.Labels = nil })
	require.Equal(t, "c", plain.ContextID)
	require.Nil(t, plain.AffinityHit, "no key, no affinity_hit")
	_, _ = e.reg.Release(context.Background(), plain)
	// Miss after the context is gone: a and b leave the state report.
	c := e.connect("c1", cheetah.Console, nil, worker("c"), worker("d"))
	_ = c
	l = e.mustAcquire("t", withKey("shop-login"))
	require.False(t, *l.AffinityHit)
	require.Equal(t, "c", l.ContextID)
	// Too long a key is refused.
	_, err := e.acquire("t", withKey(string(make([]rune, cheetah.MaxAffinityKeyLen+1))))
	require.ErrorIs(t, err, cheetah.ErrInvalidRequest)
}

// A reload that makes a quota govern an acquire already waiting puts it in
// the slot queue, and one that stops governing takes it out.
func TestQuotaReloadRematchesWaiters(t *testing.T) {
	e := setup(t)
	e.connectUser("usr_a", "c1", 1)
	held, err := e.acquireAs("usr_a", "", 0)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { _, err := e.acquireAs("usr_a", "", time.Minute); done <- err }()
	require.Eventually(t, func() bool { return e.reg.Stats().Waiters == 1 }, 10*time.Second, time.Millisecond)
	require.Zero(t, e.reg.Stats().QuotaWaiters)
	e.reg.SetQuotas(mustQuotas(t, "quotas: [{name: q, levels: {user: 1}}]"))
	require.Equal(t, 1, e.reg.Stats().QuotaWaiters)
	e.reg.QuotasBroken(errors.New("bad"))
	require.ErrorIs(t, <-done, cheetah.ErrQuotaUnavailable, "a waiter the quota now governs fails closed too")
	e.reg.SetQuotas(nil)
	go func() { _, err := e.acquireAs("usr_a", "", time.Minute); done <- err }()
	require.Eventually(t, func() bool { return e.reg.Stats().Waiters == 1 }, 10*time.Second, time.Millisecond)
	e.reg.SetQuotas(mustQuotas(t, "quotas: [{name: q, levels: {user: 1}}]"))
	require.Equal(t, 1, e.reg.Stats().QuotaWaiters)
	e.reg.SetQuotas(mustQuotas(t, "quotas: [{name: q, match: {client_type: browser}, levels: {user: 1}}]"))
	require.Zero(t, e.reg.Stats().QuotaWaiters, "no longer governed")
	_, _ = e.reg.Release(context.Background(), held)
	require.NoError(t, <-done)
}
