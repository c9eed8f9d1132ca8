package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/cluster"
	"github.com/cheetahbroker/cheetah/server/auth"
)

const keyCtx = "cheetah.key"

func (s *Server) routes() *gin.Engine {
	gin.SetMode(gin.ReleaseMode)
	g := gin.New()
	// Route on the raw path so an escaped "/" inside an id (a task id such as
	// "catalog/42") stays inside its segment.
	g.UseRawPath = true
	// A path with a trailing slash is an unknown path: gin would answer it
	// with a redirect and an HTML body, outside the one error envelope.
	g.RedirectTrailingSlash = false
	// A known path asked with another method is 405 with an Allow header
	// (set by gin), in the one envelope, not a 404.
	g.HandleMethodNotAllowed = true
	g.Use(s.observe, s.recoverPanic, s.checkHost, s.nameReplica)
	g.GET("/ws/v1/client", func(c *gin.Context) {
		if !s.originAllowed(c.GetHeader("Origin")) {
			s.fail(c, &cheetah.Error{Code: cheetah.CodeForbidden, Message: "this Origin may not open a client connection"})
			return
		}
		if s.draining.Load() {
			s.fail(c, errDraining)
			return
		}
		if m := s.cfg.Cluster; m != nil && !m.Valid() {
			s.fail(c, errFenced)
			return
		}
		if !s.admitHello() {
			c.Header("Retry-After", "1")
			s.fail(c, &cheetah.Error{Code: cheetah.CodeOverloaded,
				Message: fmt.Sprintf("%d connections are waiting to say hello; try again shortly", s.cfg.MaxPendingHellos)})
			return
		}
		s.handleClient(c.Writer, c.Request)
	})
	g.GET("/healthz", func(c *gin.Context) { c.JSON(http.StatusOK, gin.H{"status": "ok"}) })
	g.GET("/readyz", s.readyz)
	// Prometheus scrapes without a key, as it does /healthz: the metrics
	// carry counts, never ids, tokens or keys.
	g.GET("/metrics", func(c *gin.Context) {
		if s.cfg.Metrics == nil {
			s.fail(c, cheetah.NotFoundf("metrics are not enabled on this server"))
			return
		}
		s.cfg.Metrics.ServeHTTP(c.Writer, c.Request)
	})
	// The API's description is public: it holds nothing a key protects.
	g.GET("/api/v1/openapi.json", func(c *gin.Context) { c.Data(http.StatusOK, "application/json", openAPI) })

	api := g.Group("/api/v1", s.clusterGate, s.authenticate(auth.App, auth.Admin), s.checkParams)
	api.POST("/acquire", s.acquire)
	api.POST("/commands", s.toHolder, s.sendCommand)
	api.POST("/commands/wait", s.toHolder, s.sendAndWait)
	api.POST("/lease/renew", s.toHolder, s.renew)
	api.POST("/lease/release", s.toHolder, s.release)
	api.POST("/lease/wait", s.toHolder, s.leaseWait)
	api.POST("/lease/release-all", s.releaseAll)
	api.GET("/users/:user_id/contexts/available", s.available)
	api.GET("/users/:user_id/tasks/:task_id/leases", s.taskLeases)
	api.GET("/users/:user_id/commands/:command_id", s.readCommand)
	api.GET("/users/:user_id/commands", s.listCommands)

	s.adminRoutes(g.Group("/api/v1/admin", s.clusterGate, s.authenticate(auth.Admin), s.checkParams))
	// What only another replica asks (server/cluster.go).
	internal := g.Group("/internal/v1", s.clusterGate, s.peerOnly)
	internal.POST("/keys/:id/disconnect", s.authenticate(auth.Admin), s.checkParams, s.disconnectKey)
	internal.POST("/acquire/idle-since", s.authenticate(auth.App, auth.Admin), s.checkParams, s.idleSince)
	internal.POST("/acquire/withdraw", s.withdrawWait)
	internal.POST("/leases/held", s.held)
	internal.POST("/users/:user_id/clients/:client_id/hand-over", s.checkParams, s.handOver)

	g.NoRoute(func(c *gin.Context) {
		if s.console.Serve(c) { // the admin console's page, outside the API
			return
		}
		s.fail(c, cheetah.NotFoundf("no route %s %s", c.Request.Method, c.Request.URL.Path))
	})
	g.NoMethod(func(c *gin.Context) {
		s.fail(c, &cheetah.Error{Code: cheetah.CodeMethodNotAllowed,
			Message: fmt.Sprintf("%s is not allowed here; allowed: %s", c.Request.Method, c.Writer.Header().Get("Allow"))})
	})
	return g
}

// readyz answers 200 while the store answers and no shutdown has begun. The
// writer's health counts too: on SQLite a query can answer while another
// process holds the write lock, and the broker cannot record a command.
func (s *Server) readyz(c *gin.Context) {
	if s.draining.Load() {
		s.fail(c, errDraining)
		return
	}
	err := s.store.Health()
	if err == nil {
		err = s.store.Ping(c.Request.Context())
	}
	if m := s.cfg.Cluster; err == nil && m != nil && !m.Valid() {
		err = errFenced
	}
	if err != nil {
		s.fail(c, cheetah.StoreUnavailable("readyz", err))
		return
	}
	c.JSON(http.StatusOK, gin.H{"status": "ready"})
}

// authenticate admits requests whose bearer key is of one of kinds.
func (s *Server) authenticate(kinds ...auth.Kind) gin.HandlerFunc {
	return func(c *gin.Context) {
		if keyID := c.GetHeader(cluster.PeerKeyHeader); keyID != "" && fromPeer(c) {
			// Another replica authenticated the caller (server/cluster.go).
			key, err := s.keys.Active(c.Request.Context(), keyID)
			if err != nil {
				s.fail(c, &cheetah.Error{Code: cheetah.CodeUnauthorized, Message: "the key is not valid"})
				return
			}
			s.admit(c, key, kinds)
			return
		}
		if c.GetHeader("Authorization") == "" {
			// The admin console's session cookie stands for the admin key
			// that signed in (with a CSRF token on every change).
			if key, ok, err := s.console.Authenticate(c.Request); ok {
				if err != nil {
					s.fail(c, err)
					return
				}
				s.admit(c, key, kinds)
				return
			}
		}
		// The scheme is case-insensitive (RFC 9110 §11.1).
		scheme, token, ok := strings.Cut(c.GetHeader("Authorization"), " ")
		token = strings.TrimLeft(token, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
			s.fail(c, &cheetah.Error{Code: cheetah.CodeUnauthorized, Message: "an Authorization: Bearer key is required"})
			return
		}
		key, err := s.keys.Verify(c.Request.Context(), token)
		if err != nil {
			if !errors.Is(err, cheetah.ErrUnauthorized) {
				s.fail(c, cheetah.StoreUnavailable("verify key", err))
				return
			}
			s.fail(c, &cheetah.Error{Code: cheetah.CodeUnauthorized, Message: "the key is not valid"})
			return
		}
		s.admit(c, key, kinds)
	}
}

// admit lets the request of key through when key is of one of kinds.
func (s *Server) admit(c *gin.Context, key auth.Key, kinds []auth.Kind) {
	for _, k := range kinds {
		if key.Kind == k {
			c.Set(keyCtx, key)
			s.rateLimit(c)
			if !c.IsAborted() {
				c.Next()
			}
			return
		}
	}
	article := "a" // a client key; an app or admin key
	if key.Kind == auth.App || key.Kind == auth.Admin {
		article = "an"
	}
	s.fail(c, &cheetah.Error{Code: cheetah.CodeForbidden, Message: fmt.Sprintf("%s %s key may not do this", article, key.Kind)})
}

var statusOf = map[string]int{
	cheetah.CodeInvalidRequest:     http.StatusBadRequest,
	cheetah.CodeUnauthorized:       http.StatusUnauthorized,
	cheetah.CodeForbidden:          http.StatusForbidden,
	cheetah.CodeNotFound:           http.StatusNotFound,
	cheetah.CodeNoContextAvailable: http.StatusConflict,
	cheetah.CodePayloadTooLarge:    http.StatusRequestEntityTooLarge,
	cheetah.CodeMethodNotAllowed:   http.StatusMethodNotAllowed,
	cheetah.CodeLeaseLost:          http.StatusLocked,
	cheetah.CodeHeld:               http.StatusLocked,
	cheetah.CodeRateLimited:        http.StatusTooManyRequests,
	cheetah.CodeStoreUnavailable:   http.StatusServiceUnavailable,
	cheetah.CodeOverloaded:         http.StatusServiceUnavailable,
	cheetah.CodeQuotaUnavailable:   http.StatusServiceUnavailable,
}

// fail answers err in the envelope. An error of no known kind is logged and
// answered as a 500 without its text.
func (s *Server) fail(c *gin.Context, err error) {
	code, reason, msg := cheetah.Classify(err)
	status, ok := statusOf[code]
	if !ok {
		s.reqLog(c).Error("internal error", "route", c.FullPath(), "err", err)
		code, status, msg = "internal", http.StatusInternalServerError, "internal error"
	}
	if status == http.StatusUnauthorized {
		// Every 401 says which scheme would do (RFC 9110 §11.6.1).
		c.Header("WWW-Authenticate", "Bearer")
	}
	if code == cheetah.CodeStoreUnavailable {
		s.reqLog(c).Warn("store unavailable", "route", c.FullPath(), "err", err)
	}
	c.AbortWithStatusJSON(status, cheetah.Envelope{Error: &cheetah.EnvelopeError{Code: code, Message: msg, Reason: reason, Details: cheetah.Details(err)}})
}

func (s *Server) acquire(c *gin.Context) {
	var b cheetah.AcquireBody
	if !s.bind(c, &b) {
		return
	}
	if err := cheetah.CheckLabels("labels", b.Labels); err != nil {
		s.fail(c, err)
		return
	}
	req := cheetah.AcquireRequest{UserID: b.UserID, TaskID: b.TaskID, ClientType: b.ClientType,
		ClientID: b.ClientID, Labels: b.Labels, RenewOnUse: b.RenewOnUse,
		TenantID: b.TenantID, AffinityKey: b.AffinityKey, ClearState: b.ClearState}
	if b.LeaseWebhook != "" {
		// Delivered when the lease is lost, signed with the requesting
		// key's webhook secret, as result deliveries are.
		hooks := s.cfg.Webhooks
		if hooks == nil {
			s.fail(c, cheetah.Invalidf("lease_webhook: webhook delivery is not enabled on this broker"))
			return
		}
		key, _ := c.Get(keyCtx)
		req.LeaseWebhook, req.LeaseWebhookKeyID = b.LeaseWebhook, key.(auth.Key).ID
		if err := hooks.CheckLeaseWebhook(c.Request.Context(), req); err != nil {
			s.fail(c, err)
			return
		}
	}
	// A tenant-bound app key acts for its tenant alone (DESIGN §10).
	if key, _ := c.Get(keyCtx); key.(auth.Key).TenantID != "" {
		bound := key.(auth.Key).TenantID
		if b.TenantID != "" && b.TenantID != bound {
			s.fail(c, &cheetah.Error{Code: cheetah.CodeForbidden, Message: "this key is bound to another tenant: it may act for its own alone"})
			return
		}
		req.TenantID = bound
	}
	if b.Create != nil {
		req.Create = &cheetah.CreateSpec{URL: b.Create.URL}
		if t := b.Create.TimeoutMS; t != nil {
			if *t < 1 || *t > cheetah.MaxCreateTimeout.Milliseconds() {
				s.fail(c, cheetah.Invalidf("%s", cheetah.MsgCreateTimeout))
				return
			}
			req.Create.Timeout = time.Duration(*t) * time.Millisecond
		}
	}
	if b.TTLS != nil {
		ttl, ok := ttlOf(*b.TTLS)
		if !ok {
			s.fail(c, cheetah.Invalidf("%s", cheetah.MsgTTL))
			return
		}
		req.TTL = ttl
	}
	if b.WaitMS != nil {
		if *b.WaitMS < 0 || *b.WaitMS > cheetah.MaxWait.Milliseconds() {
			s.fail(c, cheetah.Invalidf("%s", cheetah.MsgWait))
			return
		}
		req.Wait = time.Duration(*b.WaitMS) * time.Millisecond
	}
	ctx := c.Request.Context()
	l, err := s.acquireAnywhere(c, req, b)
	if ctx.Err() != nil {
		// The caller went away while it waited: nobody would learn of a
		// lease, so it is given back at once.
		if err == nil {
			s.releaseAnywhere(c, l)
		}
		return
	}
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusCreated, gin.H{"lease": l})
}

// commandRequest reads the lease header and the command body.
func (s *Server) commandRequest(c *gin.Context, mode cheetah.ResponseMode) (cheetah.Lease, cheetah.Command, cheetah.SendOptions, bool) {
	lease, ok := s.leaseHeader(c)
	if !ok {
		return lease, cheetah.Command{}, cheetah.SendOptions{}, false
	}
	var b cheetah.CommandBody
	if !s.bind(c, &b) {
		return lease, cheetah.Command{}, cheetah.SendOptions{}, false
	}
	so := cheetah.SendOptions{Target: nullIsAbsent(b.Target), Options: nullIsAbsent(b.Options), ResponseMode: mode}
	if b.ResponseMode != "" {
		so.ResponseMode = b.ResponseMode
	}
	if b.TimeoutMS != nil {
		if *b.TimeoutMS < 1 || *b.TimeoutMS > cheetah.MaxCommandTimeout.Milliseconds() {
			s.fail(c, cheetah.Invalidf("%s", cheetah.MsgTimeout))
			return lease, cheetah.Command{}, cheetah.SendOptions{}, false
		}
		so.Timeout = time.Duration(*b.TimeoutMS) * time.Millisecond
	}
	if u := c.GetHeader("X-Callback-Url"); u != "" {
		// Delivered once the command ends, signed with the requesting key's
		// webhook secret (docs/behaviour.md, "Webhooks").
		hooks := s.cfg.Webhooks
		if hooks == nil {
			s.fail(c, cheetah.Invalidf("X-Callback-Url: webhook delivery is not enabled on this broker"))
			return lease, cheetah.Command{}, cheetah.SendOptions{}, false
		}
		key, _ := c.Get(keyCtx)
		so.CallbackURL, so.CallbackKeyID = u, key.(auth.Key).ID
		if err := hooks.Check(c.Request.Context(), so); err != nil {
			s.fail(c, err)
			return lease, cheetah.Command{}, cheetah.SendOptions{}, false
		}
	}
	cmd := cheetah.Command{Name: b.Name}
	if p := nullIsAbsent(b.Params); p != nil {
		cmd.Params = p
	}
	return lease, cmd, so, true
}

func nullIsAbsent(m json.RawMessage) json.RawMessage {
	if len(m) == 0 || string(bytes.TrimSpace(m)) == "null" {
		return nil
	}
	return m
}

func (s *Server) leaseHeader(c *gin.Context) (cheetah.Lease, bool) {
	token := c.GetHeader("X-Lease")
	if token == "" {
		s.fail(c, cheetah.Invalidf("the X-Lease header is required"))
		return cheetah.Lease{}, false
	}
	return cheetah.Lease{LeaseToken: token}, true
}

func (s *Server) sendCommand(c *gin.Context) {
	lease, cmd, so, ok := s.commandRequest(c, cheetah.ModeAsync)
	if !ok {
		return
	}
	sent, err := s.reg.Send(c.Request.Context(), lease, cmd, so)
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusAccepted, sent)
}

// sendAndWait holds the request open until the command resolves. A caller
// that closes the request is a caller that went away: the command ends
// cancelled and the lease keeps nothing of the wait.
func (s *Server) sendAndWait(c *gin.Context) {
	lease, cmd, so, ok := s.commandRequest(c, cheetah.ModeRPC)
	if !ok {
		return
	}
	// Name the command as soon as it is durable, so a caller that goes away
	// before the resolution still knows which command it started.
	so.OnAdmitted = func(sent cheetah.Sent) {
		c.Header("X-Command-Id", sent.CommandID)
		c.Header("X-Trace-Id", sent.TraceID)
		// The headers go now, so they say now what the body will be.
		c.Header("Content-Type", "application/json; charset=utf-8")
		c.Writer.WriteHeader(http.StatusOK)
		c.Writer.Flush()
	}
	res, err := s.reg.SendAndWait(c.Request.Context(), lease, cmd, so)
	if err != nil {
		if c.Request.Context().Err() != nil {
			return // nobody is listening
		}
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"resolution": res})
}

func (s *Server) renew(c *gin.Context) {
	lease, ok := s.leaseHeader(c)
	if !ok {
		return
	}
	var b cheetah.RenewBody
	if !s.bind(c, &b) {
		return
	}
	var ttl time.Duration
	if b.TTLS != nil {
		if ttl, ok = ttlOf(*b.TTLS); !ok {
			s.fail(c, cheetah.Invalidf("%s", cheetah.MsgTTL))
			return
		}
	}
	l, err := s.reg.Renew(c.Request.Context(), lease, ttl)
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"lease": l})
}

// leaseWait is the long poll behind the remote SDK's Handle.Done: it
// answers 423 lease_lost (with the reason) as soon as the lease ends, or
// 200 {"alive":true} when timeout_ms passed with the lease alive. It is
// answered by the replica that holds the lease (toHolder), whose registry
// hears of the end first.
func (s *Server) leaseWait(c *gin.Context) {
	lease, ok := s.leaseHeader(c)
	if !ok {
		return
	}
	var b cheetah.LeaseWaitBody
	if !s.bind(c, &b) {
		return
	}
	wait := cheetah.DefaultLeaseWait
	if b.TimeoutMS != nil {
		if *b.TimeoutMS < 0 || *b.TimeoutMS > cheetah.MaxLeaseWait.Milliseconds() {
			s.fail(c, cheetah.Invalidf("timeout_ms must be 0 to %d", cheetah.MaxLeaseWait.Milliseconds()))
			return
		}
		wait = time.Duration(*b.TimeoutMS) * time.Millisecond
	}
	ended := make(chan cheetah.LostReason, 1)
	stop := s.reg.WatchLease(lease, func(r cheetah.LostReason) { ended <- r })
	defer stop()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case r := <-ended:
		// The end is decided before its row commits: told once it has.
		if err := s.reg.LeaseRowsDurable(c.Request.Context()); err != nil {
			s.fail(c, err)
			return
		}
		s.fail(c, &cheetah.LeaseLostError{Reason: r})
	case <-t.C:
		c.JSON(http.StatusOK, cheetah.LeaseWaitAnswer{Alive: true})
	case <-c.Request.Context().Done():
	}
}

func (s *Server) release(c *gin.Context) {
	lease, ok := s.leaseHeader(c)
	if !ok {
		return
	}
	released, err := s.reg.Release(c.Request.Context(), lease)
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"released": released})
}

// MaxReleaseAll bounds the tokens of one release-all request.
const MaxReleaseAll = cheetah.MaxReleaseAll

// ttlOf turns ttl_s into a duration within the lease limits.
func ttlOf(secs int64) (time.Duration, bool) {
	if secs < int64(cheetah.MinTTL/time.Second) || secs > int64(cheetah.MaxTTL/time.Second) {
		return 0, false
	}
	return time.Duration(secs) * time.Second, true
}

func (s *Server) releaseAll(c *gin.Context) {
	var b cheetah.ReleaseAllBody
	if !s.bind(c, &b) {
		return
	}
	if b.LeaseTokens == nil {
		s.fail(c, cheetah.Invalidf("lease_tokens is required"))
		return
	}
	if len(b.LeaseTokens) > MaxReleaseAll {
		s.fail(c, cheetah.Invalidf("at most %d lease_tokens", MaxReleaseAll))
		return
	}
	n, err := s.reg.ReleaseAll(c.Request.Context(), b.LeaseTokens)
	if err != nil {
		s.fail(c, err)
		return
	}
	// Each token is known to one replica at most, so the counts add up.
	body, _ := json.Marshal(b)
	answers, lost, _ := s.gatherAct(c, body, http.StatusOK)
	if lost {
		s.fail(c, errActionLost)
		return
	}
	n += countOf(answers, "released")
	c.JSON(http.StatusOK, gin.H{"released": n})
}

func (s *Server) available(c *gin.Context) {
	ctxs, err := s.reg.ListAvailable(c.Request.Context(), c.Param("user_id"), cheetah.ClientType(c.Query("client_type")))
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"contexts": selectionOrder(mergeList(ctxs, s.gather(c, nil, http.StatusOK), "contexts"))})
}

func (s *Server) taskLeases(c *gin.Context) {
	ls, err := s.reg.TaskContexts(c.Request.Context(), c.Param("user_id"), c.Param("task_id"))
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"leases": sortByEpoch(mergeList(ls, s.gather(c, nil, http.StatusOK), "leases"))})
}

func (s *Server) readCommand(c *gin.Context) {
	rec, err := s.reg.ReadCommand(c.Request.Context(), c.Param("user_id"), c.Param("command_id"))
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"command": rec})
}

func (s *Server) listCommands(c *gin.Context) {
	q := cheetah.ListQuery{TaskID: c.Query("task_id"), Cursor: c.Query("cursor")}
	if l := c.Query("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > cheetah.MaxListLimit {
			s.fail(c, cheetah.Invalidf("%s", cheetah.MsgListLimit))
			return
		}
		q.Limit = n
	}
	page, err := s.reg.ListCommands(c.Request.Context(), c.Param("user_id"), q)
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, page)
}
