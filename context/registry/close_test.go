package registry_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/history/historytest"
)

// Close returns only once nothing of the registry runs: a command whose end
// the store commits after Close gets its resolution, but no goroutine of
// the registry wakes for it (its spans were ended by Close), and no
// goroutine of the registry is left. Not parallel: it counts goroutines.
func TestCloseJoinsEverything(t *testing.T) {
	hs := &historytest.Holding{Store: historytest.NewSQLite(t)}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	e := setup(t, func(c *registry.Config) { c.Store, c.TracerProvider = hs, tp })
	ignore := goleak.IgnoreCurrent() // the store's and the other tests' goroutines

	c := e.connect("a", cheetah.Console, nil, worker("w1"), worker("w2"))
	ctx := context.Background()
	l1 := e.mustAcquire("t1")
	l2 := e.mustAcquire("t2")
	type out struct {
		res cheetah.Resolution
		err error
	}
	done := make(chan out, 2)
	// Both records durable before the store holds its callbacks: a
	// sender waits for its record, Close or not (invariant 9).
	admitted := make(chan struct{}, 2)
	stopEvents := e.reg.Subscribe(func(ev registry.Event) {
		if ev.Kind == registry.CommandAdmitted {
			admitted <- struct{}{}
		}
	})
	for _, l := range []cheetah.Lease{l1, l2} {
		go func() {
			res, err := e.reg.SendAndWait(ctx, l, cheetah.Command{Name: "echo"}, cheetah.SendOptions{Timeout: time.Hour})
			done <- out{res, err}
		}()
	}
	f1, f2 := cmdFrame(t, c, 1), cmdFrame(t, c, 2)
	<-admitted
	<-admitted
	stopEvents()
	// One command ends; the store has not said it committed when Close
	// comes. The other is still in flight.
	hs.SetHold(true)
	e.result(c, f1.CommandID, `{}`)
	_ = f2
	e.reg.Close()
	ended := len(rec.Ended())

	o := <-done
	require.Equal(t, cheetah.StatusInterrupted, o.res.Status, "Close resolves what is in flight")
	// The store commits the first end now.
	require.NoError(t, hs.Store.Write(ctx), "everything handed over is written")
	require.NotZero(t, hs.Release())
	o = <-done
	require.NoError(t, o.err)
	require.Equal(t, cheetah.StatusCompleted, o.res.Status, "the caller still learns the end once durable")
	goleak.VerifyNone(t, ignore)
	require.Equal(t, ended, len(rec.Ended()), "nothing of the registry ran after Close")
}
