package server_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/remote"
	"github.com/cheetahbroker/cheetah/server"
)

// scrape is one parsed GET /metrics.
type scrape map[string]*dto.MetricFamily

func (b *hookBroker) scrape() scrape {
	b.t.Helper()
	resp, err := http.Get(b.http.URL + "/metrics")
	require.NoError(b.t, err)
	defer resp.Body.Close()
	require.Equal(b.t, http.StatusOK, resp.StatusCode)
	require.Contains(b.t, resp.Header.Get("Content-Type"), "text/plain")
	raw, err := io.ReadAll(resp.Body)
	require.NoError(b.t, err)
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(raw)))
	require.NoError(b.t, err, string(raw))
	return fams
}

// value returns the value of the series of family name whose labels include
// want (a counter, a gauge, or a histogram's count), and 0 when there is
// none.
func (s scrape) value(name string, want ...string) float64 {
	f := s[name]
	if f == nil {
		return 0
	}
	total := 0.0
	for _, m := range f.Metric {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for i := 0; i+1 < len(want); i += 2 {
			if labels[want[i]] != want[i+1] {
				match = false
			}
		}
		if !match {
			continue
		}
		switch {
		case m.Counter != nil:
			total += m.Counter.GetValue()
		case m.Gauge != nil:
			total += m.Gauge.GetValue()
		case m.Histogram != nil:
			total += float64(m.Histogram.GetSampleCount())
		}
	}
	return total
}

// The broker's metrics, scraped and parsed as Prometheus text, move as
// leases and commands happen, and no label carries an id.
func TestMetricsScrape(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := openBroker(t, server.Options{WebhookAllowPrivate: true})
	recv, got := hookReceiver(t)

	s := b.scrape()
	for _, name := range []string{"cheetah_leases", "cheetah_commands_in_flight", "cheetah_clients", "cheetah_contexts",
		"cheetah_acquires_waiting", "cheetah_history_write_held", "cheetah_history_write_dropped_total",
		"go_goroutines", "process_start_time_seconds", "target_info"} {
		require.Contains(t, s, name, "a series there from the start")
	}
	require.Zero(t, s.value("cheetah_leases"))
	require.Zero(t, s.value("cheetah_clients", "client_type", "console", "state", "connected"))
	require.Zero(t, s.value("cheetah_history_write_held"))

	agent := b.connectAgent("agent-1", "flow-1")
	s = b.scrape()
	require.EqualValues(t, 1, s.value("cheetah_clients", "client_type", "console", "state", "connected"))
	require.EqualValues(t, 1, s.value("cheetah_contexts", "client_type", "console", "state", "idle"))
	require.EqualValues(t, 1, s.value("cheetah_frames_total", "type", "hello", "direction", "in"))
	require.EqualValues(t, 1, s.value("cheetah_frames_total", "type", "welcome", "direction", "out"))
	require.EqualValues(t, 1, s.value("cheetah_frames_total", "type", "state", "direction", "in"))

	mgr := remote.New(b.http.URL, b.appKey)
	h, err := mgr.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "metered", ClientType: cheetah.Console})
	require.NoError(t, err)
	next[*protocol.Assignment](agent)
	_, err = mgr.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "metered-2", ClientType: cheetah.Console})
	require.ErrorIs(t, err, cheetah.ErrNoContextAvailable)
	s = b.scrape()
	require.EqualValues(t, 1, s.value("cheetah_acquires_total", "outcome", "acquired", "client_type", "console"))
	require.EqualValues(t, 1, s.value("cheetah_acquires_total", "outcome", "no_context_available", "reason", "no_idle_worker"))
	require.EqualValues(t, 1, s.value("cheetah_leases"))
	require.EqualValues(t, 1, s.value("cheetah_contexts", "client_type", "console", "state", "leased"))
	require.Zero(t, s.value("cheetah_contexts", "client_type", "console", "state", "idle"))
	require.EqualValues(t, 2, s.value("cheetah_http_server_duration_seconds", "route", "/api/v1/acquire", "method", "POST"))
	require.EqualValues(t, 1, s.value("cheetah_http_server_duration_seconds", "route", "/api/v1/acquire", "status", "409"))

	// A command, answered, with a webhook.
	go answer(agent, 1)
	res, err := h.SendAndWait(ctx, cheetah.Command{Name: "echo", Params: map[string]int{"n": 1}}, cheetah.WithCallback(recv.URL))
	require.NoError(t, err)
	require.Equal(t, cheetah.StatusCompleted, res.Status)
	nextDelivery(t, got)
	b.flush()
	s = b.scrape()
	require.EqualValues(t, 1, s.value("cheetah_command_duration_seconds", "name", "echo", "status", "completed"))
	require.Zero(t, s.value("cheetah_commands_in_flight"))
	require.EqualValues(t, 1, s.value("cheetah_frames_total", "type", "command", "direction", "out"))
	require.EqualValues(t, 1, s.value("cheetah_frames_total", "type", "ack", "direction", "in"))
	require.EqualValues(t, 1, s.value("cheetah_frames_total", "type", "result", "direction", "in"))
	require.Positive(t, s.value("cheetah_history_write_duration_seconds", "outcome", "ok"))
	require.Positive(t, s.value("cheetah_history_write_batch_size", "outcome", "ok"))
	require.EqualValues(t, 1, s.value("cheetah_webhook_deliveries_total", "outcome", "delivered"))

	// A command still in flight is counted as such.
	id, err := h.Send(ctx, cheetah.Command{Name: "echo"})
	require.NoError(t, err)
	require.EqualValues(t, 1, b.scrape().value("cheetah_commands_in_flight"))
	answer(agent, 1)
	rec := waitStatus(t, b, id, cheetah.StatusCompleted)
	require.Equal(t, cheetah.StatusCompleted, rec.Status)

	// Release, then a send through the released handle.
	ok, err := mgr.Release(ctx, h)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = h.Send(ctx, cheetah.Command{Name: "echo"})
	require.ErrorIs(t, err, cheetah.ErrLeaseLost)
	s = b.scrape()
	require.Zero(t, s.value("cheetah_leases"))
	require.EqualValues(t, 1, s.value("cheetah_leases_ended_total", "reason", "released"))
	require.EqualValues(t, 1, s.value("cheetah_lease_lost_total", "reason", "released"))
	// An async send's duration is counted just after its end is durable,
	// which a history read can see first.
	require.Eventually(t, func() bool {
		return b.scrape().value("cheetah_command_duration_seconds", "name", "echo", "status", "completed") == 2
	}, 10*time.Second, 10*time.Millisecond)

	// A revoke and a client that goes away.
	h, err = mgr.Acquire(ctx, cheetah.AcquireRequest{UserID: user, TaskID: "metered", ClientType: cheetah.Console})
	require.NoError(t, err)
	requireRevoked(t, b.reg, user, "agent-1", h.ContextID())
	require.NoError(t, agent.conn.CloseNow())
	require.Eventually(t, func() bool {
		return b.scrape().value("cheetah_clients", "client_type", "console", "state", "away") == 1
	}, 10*time.Second, 10*time.Millisecond)
	s = b.scrape()
	require.EqualValues(t, 1, s.value("cheetah_leases_ended_total", "reason", "revoked"))
	require.EqualValues(t, 1, s.value("cheetah_contexts", "client_type", "console", "state", "not_live"))

	// No label value is an id, a token or a key.
	secret := []string{user, "metered", "agent-1", "flow-1", h.Lease().LeaseToken, res.CommandID, id, b.appKey, b.client}
	for name, f := range s {
		for _, m := range f.Metric {
			for _, l := range m.Label {
				for _, x := range secret {
					require.NotContains(t, l.GetValue(), x, "%s{%s}", name, l.GetName())
				}
			}
		}
	}
}

// waitStatus reads a command until it has status st.
func waitStatus(t *testing.T, b *hookBroker, id string, st cheetah.Status) cheetah.CommandRecord {
	t.Helper()
	var rec cheetah.CommandRecord
	require.Eventually(t, func() bool {
		var err error
		rec, err = b.store.Get(context.Background(), user, id)
		return err == nil && rec.Status == st
	}, 10*time.Second, 5*time.Millisecond)
	return rec
}
