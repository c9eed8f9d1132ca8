// Package sdktest is one behaviour suite for every implementation of the Go
// SDK: the broker in process and the remote client over the HTTP API. Each
// scenario runs the same calls and checks the same outcomes by value (status,
// error code, reason), never by message text, so an implementation that
// answers differently fails.
//
// A test of an implementation calls Run with a function that starts a fresh
// broker for one scenario and returns its Env; see sdk_test.go.
package sdktest

import (
	"context"
	"testing"
	"time"

	cheetah "github.com/cheetahbroker/cheetah"
)

// Env is one broker as a scenario sees it: the Manager under test, and the
// hooks the scenarios need to play the clients and the admin.
type Env struct {
	// Manager is the implementation under test.
	Manager *cheetah.Manager
	// URL is the broker's base URL (http://…), which clients dial.
	URL string
	// ClientKey returns a new client key bound to userID.
	ClientKey func(t *testing.T, userID string) string
	// Revoke ends the lease on a context with reason revoked, as an admin
	// does; it reports whether the context carried one.
	Revoke func(userID, clientID, contextID string) bool
	// Disconnect closes a client's connection as an admin does (4403); it
	// reports whether the client was connected.
	Disconnect func(userID, clientID string) bool
	// PendingCreations counts the broker's create_context requests still
	// waiting for their context: an abandoned acquire's is gone once the
	// broker noticed its caller went away.
	PendingCreations func() int
	// SetQuotas puts the quota file doc (YAML, DESIGN §10) in force.
	SetQuotas func(t *testing.T, doc string)
	// SendToken sends an "echo" command through a bare lease token, the way
	// the implementation's backend does for a handle. No Handle can carry a
	// token the broker never issued, so this is how unknown_lease is reached.
	SendToken func(ctx context.Context, token string) error
	// ReconnectGrace is the broker's reconnect grace: how long the leases
	// of a client whose connection dropped survive. Set it short (seconds):
	// a scenario waits it out.
	ReconnectGrace time.Duration
	// Skip names scenarios this implementation does not pass yet, each with
	// the known bug that explains why. Run skips them and reports the reason;
	// delete the entry with the fix.
	Skip map[string]string
}
