package webhook

import (
	"context"
	"errors"
	"net/netip"
	"net/url"
	"strconv"
	"strings"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/server/auth"
)

// MaxURLLen bounds a callback URL.
const MaxURLLen = 2048

// Check refuses, with invalid_request, a send whose callback cannot be
// delivered: a URL that is not absolute https (http too when private
// destinations are allowed), a literal private or loopback address or a
// localhost name without AllowPrivate, response mode none (such a command
// never ends), or nothing to sign with: a key without a webhook secret
// (the bootstrap admin key), or, for an in-process send (no key id), a
// broker without Config.Secret. A send without a callback passes.
func (w *Worker) Check(ctx context.Context, so cheetah.SendOptions) error {
	if so.CallbackURL == "" {
		return nil
	}
	if so.ResponseMode == cheetah.ModeNone {
		return cheetah.Invalidf("callback: a response_mode none command never ends, so there is nothing to deliver")
	}
	if err := w.CheckURL(so.CallbackURL); err != nil {
		return err
	}
	if so.CallbackKeyID == "" {
		if w.secret == nil {
			return cheetah.Invalidf("callback: this broker has no webhook secret to sign in-process deliveries with (server.Options.WebhookSecret)")
		}
		return nil
	}
	secret, err := w.keys.WebhookSecret(ctx, so.CallbackKeyID)
	switch {
	case errors.Is(err, cheetah.ErrUnauthorized), errors.Is(err, cheetah.ErrNotFound):
		return cheetah.Invalidf("callback: the key has no webhook secret")
	case err != nil:
		return cheetah.StoreUnavailable("callback: read the key's webhook secret", err)
	case secret == "" && so.CallbackKeyID == auth.BootstrapID:
		return cheetah.Invalidf("callback: the bootstrap admin key (CHEETAH_ADMIN_KEY) has no webhook secret to sign deliveries with; send with an app key")
	case secret == "":
		return cheetah.Invalidf("callback: the key has no webhook secret to sign deliveries with")
	}
	return nil
}

// CheckURL refuses a callback URL that the worker would not deliver to.
// Names other than localhost are not resolved here: the worker checks the
// address it actually connects to.
func (w *Worker) CheckURL(raw string) error {
	if len(raw) > MaxURLLen {
		return cheetah.Invalidf("callback: the URL is longer than %d bytes", MaxURLLen)
	}
	if err := cheetah.CheckText("callback", raw); err != nil {
		return err
	}
	u, err := url.Parse(raw)
	if err != nil || !u.IsAbs() || u.Host == "" || u.Opaque != "" {
		return cheetah.Invalidf("callback: not an absolute http(s) URL")
	}
	switch u.Scheme {
	case "https":
	case "http":
		if !w.cfg.AllowPrivate {
			return cheetah.Invalidf("callback: the URL must be https (http only with --webhook-allow-private)")
		}
	default:
		return cheetah.Invalidf("callback: the URL must be https")
	}
	host := u.Hostname()
	if host == "" {
		return cheetah.Invalidf("callback: the URL has no host")
	}
	if w.cfg.AllowPrivate {
		return nil
	}
	if why := nonPublicHost(host); why != "" {
		return cheetah.Invalidf("callback: %s is %s address; private and loopback destinations need --webhook-allow-private", host, why)
	}
	return nil
}

// nonPublicHost says why a URL's host is not a public destination, as far
// as can be told without resolving it: "" when it may be one.
func nonPublicHost(host string) string {
	name := strings.TrimSuffix(strings.ToLower(host), ".")
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return "a loopback"
	}
	// A resolver that follows inet_aton (the C library's) reads 2130706433,
	// 0x7f000001, 0177.0.0.1 and 127.1 all as 127.0.0.1: a host of that
	// form is judged by the address it names.
	if a, ok := numericIPv4(name); ok {
		return nonPublicIP(a.String())
	}
	return nonPublicIP(host)
}

// numericIPv4 reads s as inet_aton does: one to four parts separated by
// dots, each decimal, octal (leading 0) or hexadecimal (leading 0x), the
// last part filling the bytes the others leave.
func numericIPv4(s string) (netip.Addr, bool) {
	parts := strings.Split(s, ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	vals := make([]uint64, len(parts))
	for i, p := range parts {
		base := 10
		switch {
		case len(p) > 2 && (p[:2] == "0x" || p[:2] == "0X"):
			p, base = p[2:], 16
		case p == "0x" || p == "0X":
			p, base = "0", 16
		case len(p) > 1 && p[0] == '0':
			p, base = p[1:], 8
		}
		v, err := strconv.ParseUint(p, base, 32)
		if err != nil || p == "" {
			return netip.Addr{}, false
		}
		vals[i] = v
	}
	var n uint64
	for i, v := range vals[:len(vals)-1] {
		if v > 0xff {
			return netip.Addr{}, false
		}
		n |= v << (8 * (3 - i))
	}
	last := vals[len(vals)-1]
	if last >= 1<<(8*(5-len(vals))) {
		return netip.Addr{}, false
	}
	n |= last
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}), true
}

// Address blocks that are not public beyond what netip's predicates cover.
var reserved = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),     // "this network"
	netip.MustParsePrefix("100.64.0.0/10"), // carrier-grade NAT
	netip.MustParsePrefix("192.0.0.0/24"),  // IETF protocol assignments
	netip.MustParsePrefix("198.18.0.0/15"), // benchmarking
	netip.MustParsePrefix("240.0.0.0/4"),   // reserved, and broadcast
	netip.MustParsePrefix("fec0::/10"),     // deprecated site-local
}

// IPv6 blocks whose last 32 bits are an IPv4 address.
var embeddingV4 = []netip.Prefix{
	netip.MustParsePrefix("::/96"),        // IPv4-compatible (deprecated)
	netip.MustParsePrefix("64:ff9b::/96"), // NAT64 well-known prefix
}

// nonPublicIP says why a literal IP address is not a public destination:
// "" when it is one, or when s is not an IP address.
func nonPublicIP(s string) string {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return ""
	}
	a = a.Unmap().WithZone("")
	// An IPv6 address that carries an IPv4 one (IPv4-compatible ::a.b.c.d,
	// NAT64 64:ff9b::a.b.c.d) reaches what the IPv4 address names.
	if a.Is6() && !a.IsLoopback() && !a.IsUnspecified() {
		for _, p := range embeddingV4 {
			if p.Contains(a) {
				b := a.As16()
				a = netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})
				break
			}
		}
	}
	switch {
	case a.IsLoopback():
		return "a loopback"
	case a.IsPrivate():
		return "a private"
	case a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast():
		return "a link-local"
	case a.IsUnspecified():
		return "an unspecified"
	case a.IsMulticast(), a.IsInterfaceLocalMulticast():
		return "a multicast"
	}
	for _, p := range reserved {
		if p.Contains(a) {
			return "a reserved"
		}
	}
	return ""
}

// Guard returns b with every Send and SendAndWait that names a callback
// checked first (see Check): what Broker.Manager gives in-process callers.
func (w *Worker) Guard(b cheetah.Backend) cheetah.Backend { return &guard{Backend: b, w: w} }

type guard struct {
	cheetah.Backend
	w *Worker
}

func (g *guard) Send(ctx context.Context, l cheetah.Lease, cmd cheetah.Command, so cheetah.SendOptions) (cheetah.Sent, error) {
	if so.CallbackURL != "" {
		if err := g.w.Check(ctx, so); err != nil {
			return cheetah.Sent{}, err
		}
	}
	return g.Backend.Send(ctx, l, cmd, so)
}

func (g *guard) SendAndWait(ctx context.Context, l cheetah.Lease, cmd cheetah.Command, so cheetah.SendOptions) (cheetah.Resolution, error) {
	if so.CallbackURL != "" {
		if err := g.w.Check(ctx, so); err != nil {
			return cheetah.Resolution{}, err
		}
	}
	return g.Backend.SendAndWait(ctx, l, cmd, so)
}

// WatchLease passes Handle.Done's watch to the backend guarded, when it
// can watch leases (the registry does).
func (g *guard) WatchLease(l cheetah.Lease, lost func(cheetah.LostReason)) (stop func()) {
	if lw, ok := g.Backend.(cheetah.LeaseWatcher); ok {
		return lw.WatchLease(l, lost)
	}
	return func() {}
}

// Observe is the worker's subscription to the registry's events
// (registry.Registry.Subscribe): when a command sent with a callback ends
// and its terminal status is durable, so that its delivery is armed in
// history, the worker wakes at once instead of at its next poll; when a
// lease with a lease_webhook is lost, its lease.lost delivery starts
// (leaselost.go). It never blocks.
func (w *Worker) Observe(ev registry.Event) {
	w.leaseLost(ev)
	if ev.Kind == registry.CommandEnded && ev.HasCallback && ev.Durable && ev.Status.Terminal() {
		w.Notify()
	}
}
