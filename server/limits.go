package server

import (
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"golang.org/x/time/rate"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/server/auth"
)

// newLimiter returns a token bucket of perSecond with a burst of one
// second's worth, or nil for no limit (0): the application is trusted and
// is not throttled unless the operator asks.
func newLimiter(perSecond float64) *rate.Limiter {
	if perSecond <= 0 {
		return nil
	}
	return rate.NewLimiter(rate.Limit(perSecond), max(1, int(math.Ceil(perSecond))))
}

// keyLimits holds one token bucket per API key.
type keyLimits struct {
	perSecond float64
	mu        sync.Mutex
	byKey     map[string]*rate.Limiter
}

func (k *keyLimits) limiter(keyID string) *rate.Limiter {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.byKey[keyID]
	if l == nil {
		l = newLimiter(k.perSecond)
		k.byKey[keyID] = l
	}
	return l
}

// rateLimit answers 429 with Retry-After once a key spends its bucket. It
// runs after authentication, so it counts per key, never per address.
func (s *Server) rateLimit(c *gin.Context) {
	if s.keyLimits == nil {
		return
	}
	key := c.MustGet(keyCtx).(auth.Key)
	lim := s.keyLimits.limiter(key.ID)
	r := lim.ReserveN(s.clock.Now(), 1)
	if d := r.DelayFrom(s.clock.Now()); d > 0 {
		r.CancelAt(s.clock.Now())
		c.Header("Retry-After", strconv.Itoa(int(math.Ceil(d.Seconds()))))
		s.fail(c, &cheetah.Error{Code: cheetah.CodeRateLimited, Message: "the key's request rate limit is spent; retry after " + d.Round(time.Millisecond).String()})
		return
	}
}

// checkHost refuses a request whose Host is not a loopback name when the
// broker listens on loopback: a page on another origin that rebinds its DNS
// name to 127.0.0.1 still sends its own name in Host.
func (s *Server) checkHost(c *gin.Context) {
	if !s.cfg.LoopbackOnly {
		return
	}
	host := c.Request.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if host == "localhost" {
		return
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return
	}
	s.fail(c, &cheetah.Error{Code: cheetah.CodeForbidden, Message: "this broker answers only requests addressed to a loopback host"})
}

// originAllowed reports whether a WebSocket upgrade may proceed.
func (s *Server) originAllowed(origin string) bool {
	if origin == "" || len(s.cfg.AllowedOrigins) == 0 {
		return true
	}
	for _, o := range s.cfg.AllowedOrigins {
		if strings.EqualFold(o, origin) {
			return true
		}
	}
	return false
}
