package server

import (
	"fmt"
	"log/slog"
	"net/http"
	"sync"

	"github.com/gin-gonic/gin"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/quota"
)

// QuotaFile is the quota funnel's file (--quota-file, DESIGN §10), loaded
// into a registry at start, on SIGHUP and by POST
// /api/v1/admin/quotas/reload. A file is taken whole or not at all: a
// broken one puts the registry in the fail-closed state (quota_unavailable
// for the acquires the quotas last in force govern) until a good one loads.
type QuotaFile struct {
	path string
	reg  *registry.Registry
	log  *slog.Logger
	mu   sync.Mutex // one load at a time, so the last one read wins
}

// OpenQuotaFile loads path into reg, and fails when it cannot: a broker does
// not start on a broken quota file.
func OpenQuotaFile(path string, reg *registry.Registry, log *slog.Logger) (*QuotaFile, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s, err := quota.Load(path)
	if err != nil {
		return nil, err
	}
	reg.SetQuotas(s)
	return &QuotaFile{path: path, reg: reg, log: log}, nil
}

// Reload reads the file again. On success its quotas are in force; on
// failure the registry fails closed and the error says why.
func (f *QuotaFile) Reload() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, err := quota.Load(f.path)
	if err != nil {
		f.reg.QuotasBroken(err)
		f.log.Error("quotas: the quota file could not be loaded; acquires its quotas govern are refused until a good one is", "err", err)
		return err
	}
	f.reg.SetQuotas(s)
	f.log.Info("quotas: reloaded", "quotas", s.Len())
	return nil
}

// ReloadOnSIGHUP makes every SIGHUP the process gets call Reload, until
// the returned stop is called; stop waits for the goroutine it started.
func (f *QuotaFile) ReloadOnSIGHUP() (stop func()) {
	return onSIGHUP(func() { _ = f.Reload() }) // Reload logs the outcome
}

// quotas answers GET /api/v1/admin/quotas.
func (s *Server) quotas(c *gin.Context) {
	c.JSON(http.StatusOK, s.reg.Quotas())
}

// reloadQuotas answers POST /api/v1/admin/quotas/reload.
func (s *Server) reloadQuotas(c *gin.Context) {
	f := s.cfg.Quotas
	if f == nil {
		s.fail(c, cheetah.Invalidf("this broker runs without a quota file (--quota-file)"))
		return
	}
	if err := f.Reload(); err != nil {
		s.fail(c, &cheetah.Error{Code: cheetah.CodeQuotaUnavailable,
			Message: fmt.Sprintf("%v; acquires its quotas govern are refused until a good file is loaded", err)})
		return
	}
	c.JSON(http.StatusOK, gin.H{"reloaded": true, "quotas": len(s.reg.Quotas().Quotas)})
}
