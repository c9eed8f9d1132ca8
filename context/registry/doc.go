// Package registry holds the broker's live state: connected clients, their
// contexts, the leases that assign contexts to tasks, and the commands in
// flight. It lives in the context/ folder; its package name keeps clear of
// the standard library's context package.
//
// Every state change is one short critical section under the registry's
// mutex: assignment, the ownership check that admits a command, release,
// expiry, revoke, a state report, a disconnect. That makes each of them
// atomic, which is what the design's invariants need, and keeps the set of
// operations small enough for a PostgreSQL-backed registry to implement the
// same way later (conditional UPDATE … RETURNING per operation).
//
// A command is admitted and dispatched in one step under the lock
// (ownership checked, lease renewed, its record's insert handed to the
// ordered outbox, its frame handed to the connection), so commands and
// assignment frames reach a client in the order they happened. Dispatch
// overlaps the record's commit (invariant 9): the sender is told the id
// once the store's callback says the record is durable, a waiting sender
// its resolution once the terminal message is durable too. The insert of a
// waited command may be held back briefly (Config.InsertDelay) so that a
// quick answer shares its commit.
//
// Nothing under the lock waits on the store or on anyone else: epochs come
// from a block reserved ahead in the background (an acquire that finds it
// empty fails with store_unavailable), and the writes a transition decides
// go to an ordered outbox that one goroutine hands to the store in that
// order (outbox.go). Each transition also emits one Event (events.go) into
// an ordered queue that one goroutine delivers, off the lock, to the
// registry's telemetry and to the subscribers of Subscribe. Close joins
// every goroutine of the registry.
//
// Names: a command ends through endCommand (untrack drops its bookkeeping),
// a lease through endLease, a context through dropContext and a client
// through dropClient.
package registry
