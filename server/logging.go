package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strings"
)

// Log formats of NewLogHandler.
const (
	LogText = "text"
	LogJSON = "json"
)

// NewLogHandler returns the slog handler of `cheetah serve` and `cheetah
// agent`: text (logfmt) or JSON lines on w, at level and above.
//
// Nothing in Cheetah logs a key or a lease token; the handler is a second
// line of defence for what a library might put in an error text. It
// replaces with "[redacted]": the value of any attribute whose key names a
// secret (token, key, authorization, secret, lease, password, in any case
// and inside groups), every substring that has the shape of an API key
// (chk_…) or a webhook secret (whsec_…), and each literal of secrets (the
// bootstrap admin key, whose shape is the operator's choice), in messages
// and in string and error values alike.
func NewLogHandler(w io.Writer, format string, level slog.Level, secrets ...string) (slog.Handler, error) {
	var lit []string
	for _, s := range secrets {
		if len(s) >= 8 { // a short literal would redact ordinary words
			lit = append(lit, s)
		}
	}
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler
	switch format {
	case LogText, "":
		h = slog.NewTextHandler(w, opts)
	case LogJSON:
		h = slog.NewJSONHandler(w, opts)
	default:
		return nil, fmt.Errorf("log format %q is not text or json", format)
	}
	return &redactor{next: h, literals: lit}, nil
}

const redacted = "[redacted]"

// secretShapes are the shapes of Cheetah's secrets: API keys
// (chk_<id>_<secret>) and webhook secrets (whsec_<base64>).
var secretShapes = regexp.MustCompile(`chk_[0-9A-Za-z]+_[0-9A-Za-z_-]+|whsec_[0-9A-Za-z+/=]+`)

// secretKeys are the words that mark an attribute as secret when its key
// contains one.
var secretKeys = []string{"token", "key", "authorization", "secret", "lease", "password", "cookie"}

// redactor is the slog.Handler of NewLogHandler.
type redactor struct {
	next     slog.Handler
	literals []string
}

func (h *redactor) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h *redactor) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, h.text(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(h.attr(a))
		return true
	})
	return h.next.Handle(ctx, out)
}

func (h *redactor) WithAttrs(as []slog.Attr) slog.Handler {
	clean := make([]slog.Attr, len(as))
	for i, a := range as {
		clean[i] = h.attr(a)
	}
	return &redactor{next: h.next.WithAttrs(clean), literals: h.literals}
}

func (h *redactor) WithGroup(name string) slog.Handler {
	return &redactor{next: h.next.WithGroup(name), literals: h.literals}
}

func (h *redactor) attr(a slog.Attr) slog.Attr {
	if secretKey(a.Key) {
		return slog.String(a.Key, redacted)
	}
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, h.text(v.String()))
	case slog.KindGroup:
		g := v.Group()
		clean := make([]any, len(g))
		for i, x := range g {
			clean[i] = h.attr(x)
		}
		return slog.Group(a.Key, clean...)
	case slog.KindAny:
		switch x := v.Any().(type) {
		case error:
			return slog.String(a.Key, h.text(x.Error()))
		case fmt.Stringer:
			return slog.String(a.Key, h.text(x.String()))
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}

// text removes secrets from s.
func (h *redactor) text(s string) string {
	s = secretShapes.ReplaceAllString(s, redacted)
	for _, l := range h.literals {
		s = strings.ReplaceAll(s, l, redacted)
	}
	return s
}

// secretKey reports whether an attribute key names a secret. Keys that
// merely contain "key" as part of an id ("key_id") are not secrets.
func secretKey(k string) bool {
	k = strings.ToLower(k)
	if k == "key_id" || strings.HasSuffix(k, "_key_id") {
		return false
	}
	for _, w := range secretKeys {
		if strings.Contains(k, w) {
			return true
		}
	}
	return false
}
