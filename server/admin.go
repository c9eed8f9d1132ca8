package server

import (
	"cmp"
	"maps"
	"net/http"
	"slices"

	"github.com/gin-gonic/gin"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/context/registry"
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

// Every admin view covers every replica (server/cluster.go).

func (s *Server) pools(c *gin.Context) {
	c.JSON(http.StatusOK, gin.H{"pools": mergePools(mergeList(s.reg.Pools(), s.gather(c, nil, http.StatusOK), "pools"))})
}

func (s *Server) clients(c *gin.Context) {
	local := s.reg.Clients(c.Query("user_id"))
	if m := s.cfg.Cluster; m != nil {
		for i := range local {
			local[i].Replica = m.ID()
		}
	}
	all := mergeList(local, s.gather(c, nil, http.StatusOK), "clients")
	slices.SortStableFunc(all, func(a, b registry.ClientView) int {
		return cmp.Or(cmp.Compare(a.UserID, b.UserID), cmp.Compare(a.ClientID, b.ClientID))
	})
	c.JSON(http.StatusOK, gin.H{"clients": all})
}

// leases lists active leases; no admin view ever shows a token.
func (s *Server) leases(c *gin.Context) {
	local := s.reg.Leases(c.Query("user_id"), c.Query("task_id"))
	c.JSON(http.StatusOK, gin.H{"leases": sortByEpoch(mergeList(local, s.gather(c, nil, http.StatusOK), "leases"))})
}

// sortByEpoch orders leases of several replicas as one registry does.
func sortByEpoch(ls []cheetah.Lease) []cheetah.Lease {
	slices.SortStableFunc(ls, func(a, b cheetah.Lease) int { return cmp.Compare(a.Epoch, b.Epoch) })
	return ls
}

// mergePools adds up the pools of one user that several replicas report,
// and orders them by user id.
func mergePools(ps []registry.PoolView) []registry.PoolView {
	byUser := map[string]int{}
	out := ps[:0:0]
	for _, p := range ps {
		i, seen := byUser[p.UserID]
		if !seen {
			byUser[p.UserID] = len(out)
			q := p
			q.Contexts = maps.Clone(p.Contexts)
			out = append(out, q)
			continue
		}
		q := &out[i]
		q.Clients += p.Clients
		q.Leases += p.Leases
		q.Waiters += p.Waiters
		for k, v := range p.Contexts {
			q.Contexts[k] += v
		}
	}
	slices.SortFunc(out, func(a, b registry.PoolView) int { return cmp.Compare(a.UserID, b.UserID) })
	return out
}

// revoke ends the lease on a context with reason revoked; the client gets an
// assignment frame saying so.
//
// With replicas, one that no replica could do answers "no lease" only if
// no row of the context's lease stands that none of the replicas that
// answered holds, as read before this replica looked and after the others
// answered: an orphan may be claimed, by this replica or another, between
// a replica's "not here" and a later read, and it was a lease all along.
func (s *Server) revoke(c *gin.Context) {
	userID, clientID, contextID := c.Param("user_id"), c.Param("client_id"), c.Param("context_id")
	var before []string
	if s.cfg.Cluster != nil && !fromPeer(c) {
		var err error
		if before, err = s.store.ContextLeaseHolders(c.Request.Context(), userID, clientID, contextID); err != nil {
			s.fail(c, err)
			return
		}
	}
	ok, err := s.reg.Revoke(c.Request.Context(), userID, clientID, contextID)
	if err != nil {
		s.fail(c, err)
		return
	}
	if !ok {
		answers, lost, answered := s.gatherAct(c, nil, http.StatusOK)
		if ok = anyTrue(answers, "revoked"); !ok && lost {
			s.fail(c, errActionLost)
			return
		}
		if !ok && answered != nil {
			after, err := s.store.ContextLeaseHolders(c.Request.Context(), userID, clientID, contextID)
			if err != nil {
				s.fail(c, err)
				return
			}
			// Logged for the histories that show a revoke's answer wrong.
			s.log.Debug("revoke: no replica that answered holds a lease", "user_id", userID, "client_id", clientID,
				"context_id", contextID, "holders_before", before, "holders_after", after, "answered", answered)
			for _, h := range append(before, after...) {
				if !slices.Contains(answered, h) {
					s.fail(c, errLeaseAdrift)
					return
				}
			}
		}
	}
	c.JSON(http.StatusOK, gin.H{"revoked": ok})
}

// disconnect closes a client's connection with 4403.
func (s *Server) disconnect(c *gin.Context) {
	ok := s.reg.DisconnectClient(c.Param("user_id"), c.Param("client_id"), protocol.CloseForbidden, "disconnected by an admin")
	if !ok {
		ok = anyTrue(s.gather(c, nil, http.StatusOK), "disconnected")
	}
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
	n := s.disconnectKeyEverywhere(c, id)
	c.JSON(http.StatusOK, gin.H{"revoked": true, "disconnected": n})
}
