//go:build unix

package server

import (
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestCertReloaderReloadsOnSIGHUP(t *testing.T) {
	g := newReloaderRig(t)
	stop := g.r.ReloadOnSIGHUP()
	defer stop()
	c, k := selfSigned(t, 4)
	g.write(g.keyFile, k)
	g.write(g.certFile, c)
	// The rig's clock stands still, so only the signal can load the pair;
	// Certificate reads what is in use without looking at the files.
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	require.Eventually(t, func() bool { return g.r.Certificate().SerialNumber.Int64() == 4 }, 10*time.Second, 5*time.Millisecond)
	stop()
	stop() // idempotent
}
