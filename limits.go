package cheetah

import (
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/cheetahbroker/cheetah/protocol"
)

// The broker's limits, in one place: the server checks requests against
// them, the registry and the remote SDK use the same values, and every error
// message that names a limit is built from these constants.
const (
	// MinTTL and MaxTTL bound a lease's time to live (ttl_s, whole seconds).
	MinTTL = time.Second
	MaxTTL = time.Hour
	// MaxWait bounds how long an acquire may wait for a context (wait_ms).
	MaxWait = time.Minute
	// MaxCommandTimeout bounds a command's timeout (timeout_ms).
	MaxCommandTimeout = time.Hour
	// MaxIDLen bounds user, client, context and command ids (IDPattern).
	MaxIDLen = protocol.MaxIDLen
	// MaxTaskIDLen bounds a task id, in bytes.
	MaxTaskIDLen = 256
	// MaxNameLen bounds a command name, in bytes.
	MaxNameLen = 128
	// MaxLabels, MaxLabelKeyLen and MaxLabelValueLen bound labels (lengths
	// in characters).
	MaxLabels        = protocol.MaxLabels
	MaxLabelKeyLen   = protocol.MaxLabelKeyLen
	MaxLabelValueLen = protocol.MaxLabelValueLen
	// MaxJSONDepth bounds the nesting of every JSON value the broker stores
	// (params, target, options, a client's data).
	MaxJSONDepth = protocol.MaxJSONDepth
	// DefaultMaxBodyBytes bounds an HTTP request body unless configured.
	DefaultMaxBodyBytes = 1 << 20
	// DefaultMaxMessageBytes bounds a WebSocket frame unless configured.
	DefaultMaxMessageBytes = 4 << 20
	// MaxReleaseAll bounds the tokens of one release-all request.
	MaxReleaseAll = 1000
	// MaxListLimit bounds one page of a command list (limit).
	MaxListLimit = 500
	// MaxKeyNameLen bounds the name of an API key, in bytes.
	MaxKeyNameLen = 128
	// MaxAffinityKeyLen bounds an acquire's affinity_key, in characters.
	MaxAffinityKeyLen = 256
	// MaxCreateTimeout bounds how long an acquire waits for a context it
	// asked a client to open (create.timeout_ms).
	MaxCreateTimeout = time.Minute
	// MaxCreateURLLen bounds the URL a new context opens at, in bytes.
	MaxCreateURLLen = 8192
)

// The broker's default settings, in one place: the registry and the server
// fill their configurations with them, and cheetah serve's flags show them
// as their defaults.
const (
	// DefaultTTL is a lease's TTL when the acquire names none.
	DefaultTTL = 300 * time.Second
	// DefaultReconnectGrace is how long a disconnected client's leases survive.
	DefaultReconnectGrace = 30 * time.Second
	// DefaultCommandTimeout applies when a send names no timeout.
	DefaultCommandTimeout = 30 * time.Second
	// DefaultMaxInFlightPerContext bounds a context's commands admitted and
	// not yet ended.
	DefaultMaxInFlightPerContext = 1024
	// DefaultHeartbeat is how often the broker pings its clients.
	DefaultHeartbeat = 20 * time.Second
	// DefaultMaxPendingHellos bounds the connections not yet past hello.
	DefaultMaxPendingHellos = 1024
	// MinMaxMessageBytes is the smallest frame limit a broker may be given.
	MinMaxMessageBytes = 1024
	// DefaultCreateTimeout is how long an acquire waits for a context it
	// asked a client to open, when it names no timeout.
	DefaultCreateTimeout = 10 * time.Second
	// DefaultTenant is the tenant of an acquire that names none.
	DefaultTenant = "default"
)

// Messages built from the limits, shared by every place that checks them.
var (
	MsgTTL           = fmt.Sprintf("ttl_s must be a whole number of seconds from %d to %d", int64(MinTTL/time.Second), int64(MaxTTL/time.Second))
	MsgWait          = fmt.Sprintf("wait_ms must be a whole number from 0 to %d", MaxWait.Milliseconds())
	MsgTimeout       = fmt.Sprintf("timeout_ms must be a whole number from 1 to %d", MaxCommandTimeout.Milliseconds())
	MsgListLimit     = fmt.Sprintf("limit must be a whole number from 1 to %d", MaxListLimit)
	MsgCreateTimeout = fmt.Sprintf("create.timeout_ms must be a whole number from 1 to %d", MaxCreateTimeout.Milliseconds())
	MsgAffinityKey   = fmt.Sprintf("affinity_key must be 1 to %d characters of UTF-8 without NUL", MaxAffinityKeyLen)
)

// CheckID reports an invalid_request error unless v is a well-formed id
// (user, client, context or command id: protocol.IDPattern). field names it.
func CheckID(field, v string) error {
	if !protocol.ValidID(v) {
		return Invalidf("%s must be 1 to %d letters, digits or _.:- starting with a letter or digit (%s)", field, MaxIDLen, protocol.IDPattern)
	}
	return nil
}

// CheckTaskID reports an invalid_request error unless v is a well-formed
// task id: 1 to MaxTaskIDLen bytes of UTF-8 without NUL.
func CheckTaskID(field, v string) error {
	if v == "" || len(v) > MaxTaskIDLen {
		return Invalidf("%s must be 1 to %d bytes", field, MaxTaskIDLen)
	}
	return CheckText(field, v)
}

// CheckText reports an invalid_request error unless v can be stored as
// text: valid UTF-8 without NUL.
func CheckText(field, v string) error {
	if !utf8.ValidString(v) {
		return Invalidf("%s must be valid UTF-8", field)
	}
	if !protocol.NoNUL(v) {
		return Invalidf("%s must not contain NUL (\\u0000)", field)
	}
	return nil
}

// CheckLabels reports an invalid_request error unless m is within the label
// limits: at most MaxLabels, keys not empty and at most MaxLabelKeyLen
// characters, values at most MaxLabelValueLen, no NUL. The same limits hold
// for the labels a client reports (protocol).
func CheckLabels(field string, m map[string]string) error {
	if len(m) > MaxLabels {
		return Invalidf("%s: at most %d labels", field, MaxLabels)
	}
	for k, v := range m {
		switch {
		case k == "":
			return Invalidf("%s: a key must not be empty", field)
		case utf8.RuneCountInString(k) > MaxLabelKeyLen:
			return Invalidf("%s: a key must be at most %d characters", field, MaxLabelKeyLen)
		case utf8.RuneCountInString(v) > MaxLabelValueLen:
			return Invalidf("%s: a value must be at most %d characters", field, MaxLabelValueLen)
		}
		if err := CheckText(field, k); err != nil {
			return err
		}
		if err := CheckText(field, v); err != nil {
			return err
		}
	}
	return nil
}

// CheckPlacement reports an invalid_request error unless the placement
// members of an acquire (DESIGN §10) are within their limits: tenant_id an
// id, affinity_key at most MaxAffinityKeyLen characters, create's URL at
// most MaxCreateURLLen bytes and its timeout at most MaxCreateTimeout (zero
// is the default; over HTTP it is whole milliseconds, rounded up). It fills the create timeout's default.
func CheckPlacement(req *AcquireRequest) error {
	if req.TenantID != "" {
		if err := CheckID("tenant_id", req.TenantID); err != nil {
			return err
		}
	}
	if req.AffinityKey != "" {
		if utf8.RuneCountInString(req.AffinityKey) > MaxAffinityKeyLen || CheckText("affinity_key", req.AffinityKey) != nil {
			return Invalidf("%s", MsgAffinityKey)
		}
	}
	if c := req.Create; c != nil {
		if len(c.URL) > MaxCreateURLLen {
			return Invalidf("create.url must be at most %d bytes", MaxCreateURLLen)
		}
		if err := CheckText("create.url", c.URL); err != nil {
			return err
		}
		switch {
		case c.Timeout == 0:
			c.Timeout = DefaultCreateTimeout
		case c.Timeout < 0 || c.Timeout > MaxCreateTimeout:
			return Invalidf("%s", MsgCreateTimeout)
		}
	}
	return nil
}
