package webhook_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/history/historytest"
	"github.com/cheetahbroker/cheetah/server/auth"
	"github.com/cheetahbroker/cheetah/server/webhook"
)

// Numeric forms of a loopback or private IPv4 address that a C resolver
// (inet_aton) reads as that address are refused like the dotted form.
func TestCheckNumericHosts(t *testing.T) {
	t.Parallel()
	store := historytest.NewSQLite(t)
	keys := auth.New(store, "", time.Now)
	strict, err := webhook.New(webhook.Config{Store: store, Keys: keys})
	require.NoError(t, err)
	t.Cleanup(strict.Close)
	for _, h := range []string{
		"2130706433", "0x7f000001", "0X7F000001", "127.1", "127.0.1", "0177.0.0.1", "0177.1", "0x7f.1",
		"017700000001", "0", "0x0", "10.1", "167772161", "0xa9fea9fe", "192.168.257", "0300.0250.1.1",
		"[::ffff:7f00:1]", "[::ffff:127.0.0.1]", "[::127.0.0.1]", "[::ffff:10.0.0.1]", "[64:ff9b::127.0.0.1]",
		"[64:ff9b::a00:1]",
	} {
		u := "https://" + h + "/hook"
		err := strict.CheckURL(u)
		require.ErrorIs(t, err, cheetah.ErrInvalidRequest, u)
		require.Contains(t, err.Error(), "--webhook-allow-private", u)
	}
	// Public numeric forms, and names that only look numeric, are not
	// refused here (the dialer checks the address it connects to).
	for _, h := range []string{"134744072", "0x08080808", "8.8.8.8", "1.2.3.4.example.com", "0x7f000001.example.com",
		"[64:ff9b::808:808]", "4294967296"} {
		u := "https://" + h + "/hook"
		require.NoError(t, strict.CheckURL(u), u)
	}
	// A URL that is not text the store can hold.
	require.ErrorIs(t, strict.CheckURL("https://hooks.example.com/\xff"), cheetah.ErrInvalidRequest)
}

// last_error of a delivery whose host does not resolve says so, without the
// broker's resolver address or the lookup's own words.
func TestLastErrorHidesResolver(t *testing.T) {
	t.Parallel()
	e := newEnv(t, historytest.NewSQLite(t))
	id := e.finished("https://no-such-host.invalid/hook", e.keyID)
	e.flush()
	d := e.delivery(id)
	require.Equal(t, 1, d.Attempts)
	require.True(t, strings.HasPrefix(d.LastError, "could not resolve host"), d.LastError)
	for _, leak := range []string{":53", "lookup", "dial", "udp", "no-such-host.invalid"} {
		require.NotContains(t, d.LastError, leak)
	}
	// A refused connection names no address of the broker either.
	r := newReceiver(t, http.StatusOK)
	r.Close()
	id = e.finished(r.URL+"/hook", e.keyID)
	e.flush()
	d = e.delivery(id)
	require.Equal(t, "could not connect: connection refused", d.LastError)
}
