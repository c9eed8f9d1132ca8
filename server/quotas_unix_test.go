//go:build unix

package server_test

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/history/historytest"
	"github.com/cheetahbroker/cheetah/server"
)

// SIGHUP reads the quota file again: a good file is in force, a broken one
// fails closed and says why.
func TestQuotaFileReloadsOnSIGHUP(t *testing.T) {
	reg, err := registry.New(context.Background(), registry.Config{Store: historytest.NewSQLite(t)})
	require.NoError(t, err)
	defer reg.Close()
	path := filepath.Join(t.TempDir(), "quotas.yaml")
	writeFile(t, path, "quotas: [{name: one, levels: {user: 1}}]\n")
	f, err := server.OpenQuotaFile(path, reg, nil)
	require.NoError(t, err)
	stop := f.ReloadOnSIGHUP()
	defer stop()

	writeFile(t, path, "quotas: [{name: two, levels: {user: 2}}]\n")
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	require.Eventually(t, func() bool {
		v := reg.Quotas()
		return len(v.Quotas) == 1 && v.Quotas[0].Name == "two"
	}, 10*time.Second, 5*time.Millisecond)

	writeFile(t, path, "quotas: [{name: two, levels: {user: 2}, typo: 1}]\n")
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	require.Eventually(t, func() bool { return reg.Quotas().Broken != "" }, 10*time.Second, 5*time.Millisecond)
	require.Equal(t, "two", reg.Quotas().Quotas[0].Name, "nothing of the broken file is applied")
	stop()
}
