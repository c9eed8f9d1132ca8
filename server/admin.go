package server

import (
	"net/http"

	"github.com/gin-gonic/gin"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/server/auth"
)

// adminRoutes registers the admin endpoints; every one needs an admin key.
func (s *Server) adminRoutes(admin *gin.RouterGroup) {
	admin.POST("/keys", s.createKey)
	admin.GET("/keys", s.listKeys)
	admin.DELETE("/keys/:id", s.revokeKey)
	admin.GET("/pools", s.pools)
	admin.GET("/clients", s.clients)
	admin.GET("/leases", s.leases)
	admin.POST("/users/:user_id/clients/:client_id/contexts/:context_id/revoke", s.revoke)
	admin.DELETE("/users/:user_id/clients/:client_id", s.disconnect)
	admin.GET("/quotas", s.quotas)
	admin.POST("/quotas/reload", s.reloadQuotas)
}

func (s *Server) pools(c *gin.Context) {
	c.JSON(http.StatusOK, gin.H{"pools": s.reg.Pools()})
}

func (s *Server) clients(c *gin.Context) {
	c.JSON(http.StatusOK, gin.H{"clients": s.reg.Clients(c.Query("user_id"))})
}

// leases lists active leases; no admin view ever shows a token.
func (s *Server) leases(c *gin.Context) {
	c.JSON(http.StatusOK, gin.H{"leases": s.reg.Leases(c.Query("user_id"), c.Query("task_id"))})
}

// revoke ends the lease on a context with reason revoked; the client gets an
// assignment frame saying so.
func (s *Server) revoke(c *gin.Context) {
	ok := s.reg.Revoke(c.Param("user_id"), c.Param("client_id"), c.Param("context_id"))
	c.JSON(http.StatusOK, gin.H{"revoked": ok})
}

// disconnect closes a client's connection with 4403.
func (s *Server) disconnect(c *gin.Context) {
	ok := s.reg.DisconnectClient(c.Param("user_id"), c.Param("client_id"), protocol.CloseForbidden, "disconnected by an admin")
	c.JSON(http.StatusOK, gin.H{"disconnected": ok})
}

func (s *Server) createKey(c *gin.Context) {
	var b cheetah.CreateKeyBody
	if !s.bind(c, &b) {
		return
	}
	created, err := s.keys.Make(c.Request.Context(), auth.Spec{Kind: auth.Kind(b.Kind), UserID: b.UserID, TenantID: b.TenantID, Name: b.Name})
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusCreated, created)
}

func (s *Server) listKeys(c *gin.Context) {
	keys, err := s.keys.List(c.Request.Context())
	if err != nil {
		s.fail(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"keys": keys})
}

// revokeKey revokes a key and disconnects its clients with 4403.
func (s *Server) revokeKey(c *gin.Context) {
	id := c.Param("id")
	ok, err := s.keys.Revoke(c.Request.Context(), id)
	if err != nil {
		s.fail(c, err)
		return
	}
	if !ok {
		s.fail(c, cheetah.NotFoundf("no active key %q", id))
		return
	}
	n := s.reg.DisconnectKey(id, protocol.CloseForbidden, "the client key was revoked")
	c.JSON(http.StatusOK, gin.H{"revoked": true, "disconnected": n})
}
