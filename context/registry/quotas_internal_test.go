package registry

import "testing"

// A scope that empties and opens again, as a user's only lease ends and
// the next begins, reuses its count: an acquire allocates none under the
// registry's lock.
func TestQuotaScopeCountsAreReused(t *testing.T) {
	u := newQuotaUses(1)[0]
	cycle := func() { u.give("acme", "usr_1", u.take("acme", "usr_1")) }
	cycle() // the maps' own room
	if allocs := testing.AllocsPerRun(100, cycle); allocs > 0 {
		t.Fatalf("%v allocations per acquire and release of an empty scope", allocs)
	}
	if len(u.tenants) != 0 || len(u.users) != 0 || u.global != 0 {
		t.Fatalf("scopes left: %v %v, global %d", u.tenants, u.users, u.global)
	}
}
