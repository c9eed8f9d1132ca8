package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	cheetah "github.com/cheetahbroker/cheetah"
	"github.com/cheetahbroker/cheetah/cluster"
	"github.com/cheetahbroker/cheetah/context/registry"
	"github.com/cheetahbroker/cheetah/history"
	"github.com/cheetahbroker/cheetah/protocol"
	"github.com/cheetahbroker/cheetah/server/auth"
)

// The replicas of one PostgreSQL (DESIGN §9) answer every route alike. A
// replica's registry holds the clients connected to it and their leases; a
// request that concerns another replica's client is passed to that replica
// as it came (the caller's key, body and headers, signed by this replica),
// so its answer, codes and invariants are those of one node. How a request
// finds its replica:
//   - with a lease token (send, wait, renew, release): the token begins
//     with the id of the replica that issued it;
//   - acquire: this replica's contexts first, then each other replica's;
//   - views and admin actions: every replica, answers merged.

// peerCtx is the gin key of the id of the replica that passed a request on.
const peerCtx = "cheetah.peer"

// fromPeer reports whether another replica passed the request on: it is
// answered here, never passed on again.
func fromPeer(c *gin.Context) bool {
	_, ok := c.Get(peerCtx)
	return ok
}

// acquireSlice is how long an acquire that may wait waits for a context of
// this replica before it asks the others again.
const acquireSlice = 100 * time.Millisecond

// errFenced answers every request while this replica cannot be sure it is
// still a member: another replica may be taking its clients over.
var errFenced = cheetah.StoreUnavailable("cluster", errors.New("this replica cannot reach the database to renew its membership"))

// fencedReason closes the clients of a replica that fenced.
const fencedReason = "this replica lost the database; connect to another"

// errForgotten ends a hello under way when its replica fenced: the
// registry forgot its clients since the hello began (registry.Registry.Forgets).
var errForgotten = errors.New("the replica fenced while the client said hello")

// nameReplica says on every answer of a replica which one answered: for
// whoever debugs a balancer, and for a replica that starts with this one's
// URL (cluster.Config.Probe).
func (s *Server) nameReplica(c *gin.Context) {
	if m := s.cfg.Cluster; m != nil {
		c.Header(cluster.ReplicaHeader, m.ID())
	}
}

// clusterGate refuses every request while the replica is fenced, and
// checks the signature of a request another replica passed on.
func (s *Server) clusterGate(c *gin.Context) {
	m := s.cfg.Cluster
	if m == nil {
		return
	}
	if !m.Valid() {
		s.fail(c, errFenced)
		return
	}
	if c.Request.Header.Get(cluster.PeerHeader) != "" {
		// Verify reads the body whole: no more of it than the API takes.
		c.Request.Body = s.limitBody(c)
	}
	id, signed, err := m.Verify(c.Request)
	if !signed {
		return
	}
	if err != nil {
		s.fail(c, &cheetah.Error{Code: cheetah.CodeForbidden, Message: "the peer signature does not hold"})
		return
	}
	c.Set(peerCtx, id)
}

// peerOnly admits only requests another replica passed on.
func (s *Server) peerOnly(c *gin.Context) {
	if !fromPeer(c) {
		s.fail(c, cheetah.NotFoundf("no route %s %s", c.Request.Method, c.Request.URL.Path))
	}
}

// toHolder passes a request with a lease token to the replica that holds
// its lease. The token names the replica that issued it; a replica that
// handed the lease over with its client knows where it went (MovedTo), and
// when neither tells (the issuer is gone, or forgot the lease when it was
// fenced), every replica is asked (holderOf). A lease held here, or that
// ended here recently enough to say how, is answered here. Each hop is
// signed and counted, never goes back to the replica it came from, and
// stops after maxHops.
func (s *Server) toHolder(c *gin.Context) {
	m := s.cfg.Cluster
	token := c.GetHeader("X-Lease")
	tag, ok := registry.TokenTagOf(token)
	if m == nil || !ok || s.reg.Holds(token) || hopsOf(c) >= maxHops {
		return
	}
	from := c.GetString(peerCtx)
	var next cluster.Peer
	found := false
	if to, moved := s.reg.MovedTo(token); moved {
		next, found = m.Peer(to)
	} else if tag != m.ID() && !fromPeer(c) {
		next, found = m.Peer(tag)
	}
	if found && next.ID == from {
		found = false
	}
	if !found && !s.reg.Knows(token) {
		next, found = s.holderOf(c, token, from)
	}
	if found {
		s.pass(c, next)
		c.Abort()
		return
	}
	if !s.reg.Knows(token) {
		// No replica holds it: if its row is there, its replica died and
		// the lease awaits adoption by the replica its client reconnects
		// to. Told lease_lost now, the caller would give up a lease that
		// is back in a moment.
		held, err := s.store.LeaseRowHeld(c.Request.Context(), registry.TokenDigest(token))
		if err != nil {
			s.fail(c, err)
			c.Abort()
		} else if held {
			s.fail(c, errLeaseAdrift)
			c.Abort()
		}
	}
}

// errLeaseAdrift answers a request on a lease whose replica died and that
// no replica has adopted yet: the replica its client reconnects to adopts
// it within a few seconds.
var errLeaseAdrift = cheetah.StoreUnavailable("cluster", errors.New("the replica that held this lease is gone and the lease awaits adoption: try again shortly"))

// maxHops bounds how many replicas pass one request on.
const maxHops = 3

// hopsOf is how many replicas passed the request on before this one.
func hopsOf(c *gin.Context) int {
	if !fromPeer(c) {
		return 0
	}
	n, _ := strconv.Atoi(c.GetHeader(cluster.PeerHopsHeader))
	return n
}

// holderOf asks every other replica but except whether it holds the lease
// of token.
func (s *Server) holderOf(c *gin.Context, token, except string) (cluster.Peer, bool) {
	peers := slices.DeleteFunc(slices.Clone(s.cfg.Cluster.Peers()), func(p cluster.Peer) bool { return p.ID == except })
	holds := make([]bool, len(peers))
	var wg sync.WaitGroup
	for i, p := range peers {
		wg.Go(func() {
			a := s.ask(c.Request.Context(), c, p, http.MethodPost, "/internal/v1/leases/held", nil, "X-Lease", token)
			holds[i] = a != nil && a.status == http.StatusOK && anyTrue([][]byte{a.body}, "held")
		})
	}
	wg.Wait()
	for i, h := range holds {
		if h {
			return peers[i], true
		}
	}
	return cluster.Peer{}, false
}

// held is the internal route behind holderOf.
func (s *Server) held(c *gin.Context) {
	c.JSON(http.StatusOK, gin.H{"held": s.reg.Holds(c.GetHeader("X-Lease"))})
}

// handOverTimeout bounds how long a client's hello waits for the other
// replicas to hand it over.
const handOverTimeout = 5 * time.Second

// adoptFromPeers asks every other replica to hand over the client that
// just said hello here, and adopts what one hands over: a client that
// reconnects through a balancer to another replica keeps its leases. It
// returns the epoch floor of the client here: the highest epoch issued
// anywhere by then, which its contexts' epochs here must exceed (blocks of
// epochs reserved by several replicas interleave). forgets is what
// Registry.Forgets said as the hello began: once the replica fenced since,
// it asks nobody and adopts nothing (errForgotten).
func (s *Server) adoptFromPeers(ctx context.Context, forgets uint64, userID, clientID string) (int64, error) {
	m := s.cfg.Cluster
	if m == nil {
		return 0, nil
	}
	if err := s.handOverFrom(ctx, m, forgets, userID, clientID); err != nil {
		return 0, err
	}
	return s.store.EpochHighWater(ctx)
}

// handOverFrom adopts the client from the replica that holds it, or its
// orphaned leases; it fails when it cannot tell which of its contexts
// another replica still holds leases of, rather than let them be leased.
func (s *Server) handOverFrom(ctx context.Context, m *cluster.Member, forgets uint64, userID, clientID string) error {
	ctx, cancel := context.WithTimeout(ctx, handOverTimeout)
	defer cancel()
	defer s.reg.Moving(userID, clientID)()
	// A hand-over closes the client's connection where it is (4409): a
	// hello of a replica that fenced since it began must not ask for one,
	// as its client may be connected to that replica now.
	if s.reg.Forgets() != forgets {
		return errForgotten
	}
	peers := m.Peers()
	got := make([]*registry.HandedOver, len(peers))
	var wg sync.WaitGroup
	for i, p := range peers {
		wg.Go(func() {
			uri := "/internal/v1/users/" + url.PathEscape(userID) + "/clients/" + url.PathEscape(clientID) + "/hand-over?to=" + url.QueryEscape(m.ID())
			a := s.askPeer(ctx, p, http.MethodPost, uri, nil, nil)
			if a == nil || a.status != http.StatusOK {
				return
			}
			var h struct {
				Client *registry.HandedOver `json:"client"`
			}
			if json.Unmarshal(a.body, &h) == nil {
				got[i] = h.Client
			}
		})
	}
	wg.Wait()
	for _, h := range got {
		if h != nil {
			if _, ok := s.reg.Adopt(forgets, userID, clientID, *h); !ok {
				// The other replica made orphans of its leases' rows as it
				// handed them over (orphanHanded): the replica the client
				// reconnects to next adopts them.
				return errForgotten
			}
			return nil
		}
	}
	// No live replica held it: its replica may have died, leaving its
	// leases orphaned, or may not be reaped yet, or may be cut off from
	// this one: the contexts it holds leases of wait for them
	// (lapseAwaiting). The orphans are claimed first, so that they are
	// not among the leases held elsewhere.
	rows, err := s.store.ClaimOrphanedLeases(ctx, userID, clientID)
	if err != nil {
		return err
	}
	h := registry.HandedOver{Contexts: make([]registry.HandedContext, 0, len(rows))}
	for _, row := range rows {
		h.Contexts = append(h.Contexts, registry.HandedContext{ID: row.ContextID, Lease: &registry.HandedLease{
			TokenDigest: hex.EncodeToString(row.TokenDigest[:]), TaskID: row.TaskID, Epoch: row.Epoch,
			TTL: row.TTL, ExpiresAt: row.ExpiresAt, RenewOnUse: row.RenewOnUse, ClearState: row.ClearState,
			Generation: row.Generation, Claimed: true}})
	}
	elsewhere, err := s.store.LeasedElsewhere(ctx, userID, clientID)
	if err != nil {
		s.settle(ctx, forgets, registry.AllBack(rows))
		return err
	}
	until := s.cfg.Clock.Now().Add(awaitFor(m, s.reg.ReconnectGrace()))
	for _, id := range elsewhere {
		h.Contexts = append(h.Contexts, registry.HandedContext{ID: id, AwaitUntil: until})
	}
	if len(h.Contexts) > 0 {
		untaken, ok := s.reg.Adopt(forgets, userID, clientID, h)
		s.settle(ctx, forgets, untaken)
		if !ok {
			return errForgotten
		}
	}
	if len(elsewhere) > 0 {
		s.log.Info("cluster: contexts wait for their leases, held by a replica that did not hand them over",
			"user_id", userID, "client_id", clientID, "contexts", len(elsewhere))
	}
	return nil
}

// settle disposes of the claimed orphans the registry did not take: the
// rows of leases lost for good are deleted, the others given back as
// orphans. Until then they are this replica's and in no registry, so it
// tries again while the database does not answer (untilWritten); forgets
// is what Registry.Forgets said before the claim.
func (s *Server) settle(ctx context.Context, forgets uint64, u registry.Untaken) {
	if len(u.Lost)+len(u.Back) == 0 {
		return
	}
	ops := make([]history.Op, len(u.Lost))
	for i, d := range u.Lost {
		ops[i] = history.DeleteLease{TokenDigest: d}
	}
	err := s.untilWritten(ctx, forgets, func(ctx context.Context) error {
		if err := s.store.Write(ctx, ops...); err != nil {
			return err
		}
		return s.store.GiveBackLeases(ctx, u.Back)
	})
	if err != nil {
		// They stay this replica's until it gives its rows up or their
		// expiry: leased by nobody meanwhile, never twice.
		s.log.Warn("cluster: could not settle the orphaned leases this replica did not take",
			"lost", len(u.Lost), "given_back", len(u.Back), "err", err)
	}
}

// untilWritten runs write, each time within handOverTimeout, until it
// succeeds, this replica forgets its clients (Forgets moved on from
// forgets: it fenced, and coming back gives all its rows up), or its
// membership's TTL has passed, by when it would have fenced had the
// database not answered. It is for the lease rows that are this replica's
// while no registry holds their leases: left so, they would stand for
// leases nobody can reach until their expiry. ctx's deadline holds, not its
// end: the caller may have gone, and the rows still need it.
func (s *Server) untilWritten(ctx context.Context, forgets uint64, write func(context.Context) error) error {
	ctx = context.WithoutCancel(ctx)
	giveUp := s.cfg.Clock.Now().Add(s.cfg.Cluster.TTL())
	for {
		tctx, cancel := context.WithTimeout(ctx, handOverTimeout)
		err := write(tctx)
		cancel()
		if err == nil || s.reg.Forgets() != forgets || !s.cfg.Clock.Now().Before(giveUp) {
			return err
		}
		t := s.cfg.Clock.NewTimer(acquireSlice)
		<-t.Chan()
	}
}

// awaitFor bounds how long a context waits for a lease another replica
// holds and did not hand over: that replica, if dead, is reaped within
// about two TTLs, and its orphans adopted at the next tick; if alive but
// cut off from this one, it ends the lease once its client has been away
// for the reconnect grace. The wait ends sooner once the lease's row is
// gone or adopted.
func awaitFor(m *cluster.Member, grace time.Duration) time.Duration {
	return grace + 3*m.TTL()
}

// lapseAwaiting ends the waits of contexts whose lease rows no other
// replica holds and no orphan stands for (released there, adopted here by
// adoptOrphans, or deleted unadopted), or whose wait ran out. The member
// runs it every tick.
func (s *Server) lapseAwaiting(ctx context.Context) {
	for _, uc := range s.reg.Awaiting() {
		held, err := s.store.LeasedElsewhere(ctx, uc[0], uc[1])
		if err != nil {
			return
		}
		s.reg.StopAwaiting(uc[0], uc[1], held)
	}
}

// adoptOrphans gives back the leases of replicas that died to their
// clients connected here: a client that reconnected before its old replica
// was reaped finds its leases once it is. The member runs it every tick.
func (s *Server) adoptOrphans(ctx context.Context) {
	if err := s.store.OrphanLeases(ctx, s.reg.ReconnectGrace()); err != nil {
		return
	}
	forgets := s.reg.Forgets()
	clients, err := s.store.OrphanedClients(ctx)
	if err != nil {
		return
	}
	for _, uc := range clients {
		if !s.reg.Connected(uc[0], uc[1]) {
			continue
		}
		done := s.reg.Moving(uc[0], uc[1])
		rows, err := s.store.ClaimOrphanedLeases(ctx, uc[0], uc[1])
		if err != nil {
			done()
			return
		}
		n, untaken := s.reg.AdoptOrphans(forgets, uc[0], uc[1], rows)
		s.settle(ctx, forgets, untaken)
		done()
		if n > 0 {
			s.log.Info("cluster: leases of a lost replica adopted", "user_id", uc[0], "client_id", uc[1], "adopted", n)
		}
	}
}

// handOver is the internal route behind adoptFromPeers.
func (s *Server) handOver(c *gin.Context) {
	to := c.Query("to")
	if _, ok := s.cfg.Cluster.Peer(to); !ok {
		s.fail(c, cheetah.Invalidf("to names no live replica"))
		return
	}
	// Until their rows are orphans, the leases are in no registry while
	// their rows are this replica's (Moving).
	defer s.reg.Moving(c.Param("user_id"), c.Param("client_id"))()
	forgets := s.reg.Forgets()
	h, ok := s.reg.HandOver(c.Param("user_id"), c.Param("client_id"), to)
	if !ok {
		c.JSON(http.StatusOK, gin.H{"client": nil})
		return
	}
	s.orphanHanded(c.Request.Context(), forgets, h)
	c.JSON(http.StatusOK, gin.H{"client": h})
}

// orphanHanded makes orphans of the rows of the leases this replica just
// handed over, which it no longer holds: the replica the client went to
// claims them as it adopts the client; should it never (it fenced before
// the adoption, died, or never heard the answer), the replica the client
// reconnects to next adopts them, instead of their contexts waiting out
// their expiry. The rows are this replica's once what it wrote before is
// durable (its claim of a lease that came here may still be queued), so it
// waits for that first. forgets is what Registry.Forgets said before the
// hand-over.
func (s *Server) orphanHanded(ctx context.Context, forgets uint64, h registry.HandedOver) {
	digests := h.Digests()
	if len(digests) == 0 {
		return
	}
	err := s.untilWritten(ctx, forgets, func(ctx context.Context) error {
		if err := s.reg.Flush(ctx); err != nil {
			return err
		}
		return s.store.GiveBackLeases(ctx, digests)
	})
	if err != nil && s.reg.Forgets() == forgets {
		// They stay this replica's until it gives its rows up or their
		// expiry.
		s.log.Warn("cluster: could not make orphans of the leases this replica handed over", "leases", len(digests), "err", err)
	}
}

// hopHeaders are the headers of one connection, never passed on
// (RFC 9110 §7.6.1).
var hopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func copyHeaders(dst, src http.Header) {
	for k, vs := range src {
		dst[k] = slices.Clone(vs)
	}
	for _, k := range hopHeaders {
		dst.Del(k)
	}
}

// pass hands the request to peer and copies its answer back as it comes:
// the early headers of a wait go on at once. A wait's answer (a small
// resolution) is read whole before it is passed on, so that should the
// peer go away in the middle of it, the command its headers named is
// answered as history tells its end (interrupted, once the survivors mark
// it), as one node answers a wait whose command was interrupted. Any other
// answer cut short is cut short for the caller too: its connection is
// dropped, never ended as if the answer were whole.
func (s *Server) pass(c *gin.Context, p cluster.Peer) {
	ctx := c.Request.Context()
	req, err := http.NewRequestWithContext(ctx, c.Request.Method, p.URL+c.Request.URL.RequestURI(), s.limitBody(c))
	if err != nil {
		s.fail(c, err)
		return
	}
	copyHeaders(req.Header, c.Request.Header)
	req.Header.Del(cluster.PeerKeyHeader) // the caller's own says nothing
	for h := callerHeaders(c); len(h) > 1; h = h[2:] {
		req.Header.Set(h[0], h[1])
	}
	req.Header.Set(cluster.PeerHopsHeader, strconv.Itoa(hopsOf(c)+1))
	// The signature covers the body, which Sign reads whole: as large as
	// this replica would take itself.
	if err := s.cfg.Cluster.Sign(req); err != nil {
		s.fail(c, s.bodyError(err))
		return
	}
	resp, err := s.peerClient.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("cluster: a replica did not answer", "replica", p.ID, "err", err)
			s.fail(c, errPeerGone)
		}
		return
	}
	defer resp.Body.Close()
	copyHeaders(c.Writer.Header(), resp.Header)
	c.Writer.WriteHeader(resp.StatusCode)
	c.Writer.Flush()
	if id := resp.Header.Get("X-Command-Id"); id != "" && resp.StatusCode == http.StatusOK {
		answer, err := io.ReadAll(io.LimitReader(resp.Body, maxWaitAnswer))
		switch {
		case err == nil:
			_, _ = c.Writer.Write(answer)
		case ctx.Err() == nil:
			s.log.Warn("cluster: a replica went away before it answered a wait", "replica", p.ID, "err", err)
			s.awaitEnd(c, id)
		}
		return
	}
	if _, err := io.Copy(c.Writer, resp.Body); err != nil && ctx.Err() == nil {
		s.log.Warn("cluster: a replica went away in the middle of an answer", "replica", p.ID, "err", err)
		panic(http.ErrAbortHandler)
	}
}

// maxWaitAnswer bounds the answer of a wait read from another replica: a
// resolution, with its error's details.
const maxWaitAnswer = 1 << 20

var errPeerGone = cheetah.StoreUnavailable("cluster", errors.New("the replica that holds this client did not answer"))

// awaitEnd answers a wait whose replica went away with its command's end,
// once history has it: the survivors mark a lost replica's commands within
// its TTL and their grace; a replica that only this one lost sight of ends
// the command by its timeout at the latest. The answer's 200 went already,
// so a failure is an error envelope in its body, as a wait's own is.
func (s *Server) awaitEnd(c *gin.Context, commandID string) {
	ctx, cancel := context.WithTimeout(c.Request.Context(), cheetah.MaxCommandTimeout+time.Minute)
	defer cancel()
	wait := 100 * time.Millisecond
	for {
		if ref, err := s.store.Lookup(ctx, commandID); err == nil && ref.Status.Terminal() {
			if rec, err := s.store.Get(ctx, ref.UserID, commandID); err == nil {
				c.JSON(http.StatusOK, gin.H{"resolution": rec.Resolution()})
				return
			}
		}
		select {
		case <-ctx.Done():
			if c.Request.Context().Err() == nil {
				s.fail(c, errPeerGone)
			}
			return
		case <-s.cfg.Clock.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// peerAnswer is one replica's answer to a request passed on. lost: the
// request went out and its answer did not come back (status is 0): the
// peer may have acted on it.
type peerAnswer struct {
	status int
	body   []byte
	lost   bool
	// replica is the id of the replica that answered: not always the one
	// asked, as a replica started again at the same address answers there
	// until the others read the members again.
	replica string
}

// ask sends one request to peer on behalf of c's caller: its key, the
// method and path given, and body. It returns nil when the request could
// not be sent, and an answer that is lost when it went out and no answer
// came.
func (s *Server) ask(ctx context.Context, c *gin.Context, p cluster.Peer, method, uri string, body []byte, headers ...string) *peerAnswer {
	return s.askPeer(ctx, p, method, uri, body, append(headers, callerHeaders(c)...))
}

// callerHeaders say who the caller is to another replica: its key, and the
// id of the key this replica authenticated it with (a console session has
// no key to pass on).
func callerHeaders(c *gin.Context) []string {
	h := []string{"Authorization", c.GetHeader("Authorization")}
	if k, ok := c.Get(keyCtx); ok {
		h = append(h, cluster.PeerKeyHeader, k.(auth.Key).ID)
	}
	return h
}

// askPeer sends one request of this replica's own to peer, with headers
// (name, value pairs).
func (s *Server) askPeer(ctx context.Context, p cluster.Peer, method, uri string, body []byte, headers []string) *peerAnswer {
	req, err := http.NewRequestWithContext(ctx, method, p.URL+uri, bytes.NewReader(body))
	if err != nil {
		return nil
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if s.cfg.Cluster.Sign(req) != nil {
		return nil
	}
	resp, err := s.peerClient.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			s.cfg.Log.Warn("cluster: a replica did not answer", "replica", p.ID, "err", err)
		}
		if notSent(err) {
			return nil
		}
		return &peerAnswer{lost: true}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return &peerAnswer{lost: true}
	}
	return &peerAnswer{status: resp.StatusCode, body: b, replica: resp.Header.Get(cluster.ReplicaHeader)}
}

// notSent reports whether err, from sending a request, means it never
// reached the peer: no connection could be made.
func notSent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// gather asks every other replica the request c came with (method, path
// and query, body), at once, and returns the answers that came with want.
// A replica that does not answer is left out: views show what answered.
func (s *Server) gather(c *gin.Context, body []byte, want int) [][]byte {
	answers, _, _ := s.gatherAct(c, body, want)
	return answers
}

// gatherAct is gather for an action (revoke, release-all): lost reports
// that a replica took the request and its answer did not come back, so
// that it may have acted without saying; answered names this replica and
// the peers asked that answered with want themselves.
func (s *Server) gatherAct(c *gin.Context, body []byte, want int) (answers [][]byte, lost bool, answered []string) {
	m := s.cfg.Cluster
	if m == nil || fromPeer(c) {
		return nil, false, nil
	}
	peers := m.Peers()
	all := make([]*peerAnswer, len(peers))
	var wg sync.WaitGroup
	for i, p := range peers {
		wg.Go(func() {
			all[i] = s.ask(c.Request.Context(), c, p, c.Request.Method, c.Request.URL.RequestURI(), body)
		})
	}
	wg.Wait()
	answers, answered = make([][]byte, 0, len(all)), append(make([]string, 0, len(all)+1), m.ID())
	for i, a := range all {
		lost = lost || (a != nil && a.lost)
		if a != nil && a.status == want {
			answers = append(answers, a.body)
			if a.replica == peers[i].ID {
				answered = append(answered, a.replica)
			}
		}
	}
	return answers, lost, answered
}

// errActionLost answers an action that a replica may have done without
// its answer coming back: whether it did is unknown, and asking again
// tells.
var errActionLost = cheetah.StoreUnavailable("cluster", errors.New("a replica asked did not answer: whether it acted is unknown"))

// mergeList appends to local the list under field of every answer.
func mergeList[T any](local []T, answers [][]byte, field string) []T {
	for _, a := range answers {
		var m map[string]json.RawMessage
		if json.Unmarshal(a, &m) != nil {
			continue
		}
		var more []T
		if json.Unmarshal(m[field], &more) == nil {
			local = append(local, more...)
		}
	}
	return local
}

// countOf sums the number under field of every answer.
func countOf(answers [][]byte, field string) int {
	n := 0
	for _, a := range answers {
		var m map[string]json.RawMessage
		if json.Unmarshal(a, &m) != nil {
			continue
		}
		var k int
		if json.Unmarshal(m[field], &k) == nil {
			n += k
		}
	}
	return n
}

// anyTrue reports whether field is true in some answer.
func anyTrue(answers [][]byte, field string) bool {
	for _, a := range answers {
		var m map[string]json.RawMessage
		if json.Unmarshal(a, &m) == nil && string(m[field]) == "true" {
			return true
		}
	}
	return false
}

// acquireAnywhere gives the context idle longest in the whole cluster, as
// one registry would: it asks every replica since when its best match has
// been idle (one round trip to all at once), then acquires on the oldest,
// falling back to the next should another acquire take it first. An
// acquire that found nothing and may wait then waits on every replica at
// once (waitEverywhere).
func (s *Server) acquireAnywhere(c *gin.Context, req cheetah.AcquireRequest, b cheetah.AcquireBody) (cheetah.Lease, error) {
	ctx := c.Request.Context()
	m := s.cfg.Cluster
	if m == nil {
		return s.reg.Acquire(ctx, req)
	}
	if fromPeer(c) {
		if ticket := c.GetHeader(waitTicketHeader); ticket != "" {
			return s.standIn(ctx, ticket, req)
		}
		return s.reg.Acquire(ctx, req)
	}
	deadline := s.cfg.Clock.Now().Add(req.Wait)
	b.WaitMS = nil // the others are asked without waiting
	body, err := json.Marshal(b)
	if err != nil {
		return cheetah.Lease{}, err
	}
	local := req
	local.Wait = 0
	err = &cheetah.NoContextError{Reason: cheetah.ReasonNoEligibleClient}
	for _, cand := range s.candidates(c, req, m.Peers(), body) {
		if cand.peer == nil {
			l, lerr := s.reg.Acquire(ctx, local)
			if !errors.Is(lerr, cheetah.ErrNoContextAvailable) {
				return l, lerr
			}
			err = betterReason(err, lerr)
			continue
		}
		o := s.acquireOn(ctx, c, *cand.peer, body)
		switch {
		case o.err == nil:
			return o.lease, nil
		case o.err == errNoAnswer:
			// A replica draining, fenced or busy has nothing to give: as
			// one that did not answer, not a failure of the acquire.
		case !errors.Is(o.err, cheetah.ErrNoContextAvailable):
			// errAcquireLost among them: nothing may be handed out on top
			// of a lease that replica may have made.
			return cheetah.Lease{}, o.err
		default:
			err = betterReason(err, o.err)
		}
	}
	if s.cfg.Clock.Now().Before(deadline) && ctx.Err() == nil {
		return s.waitEverywhere(c, req, b, deadline, err)
	}
	return cheetah.Lease{}, err
}

// waitTicketHeader names, on an acquire that another replica passes on to
// wait here in its stead, that wait: the replica withdraws it by this
// name once the acquire is served or ends (POST /internal/v1/acquire/withdraw).
const waitTicketHeader = "Cheetah-Wait-Ticket"

// withdrawGrace bounds how long a served or ended acquire waits for the
// answers of the waits it withdrew, so that a lease one of them got
// meanwhile is given back rather than left to expire; past it, a replica
// that has not answered is cut off.
const withdrawGrace = 2 * time.Second

// errNoAnswer is the outcome of asking a replica that could not be
// reached, or could not act (draining, fenced, overloaded): it has nothing
// to give.
var errNoAnswer = errors.New("cluster: the replica did not answer")

// errAcquireLost ends an acquire that another replica may have served:
// its answer was lost (the replica died or the connection broke under
// it), and a lease it made, if any, is held by no caller until its TTL
// runs out or an admin revokes it. Another lease handed out on top would
// be a second one for one acquire.
var errAcquireLost = cheetah.StoreUnavailable("cluster", errors.New("a replica asked for a context did not answer: whether it gave one is unknown"))

// acquireOutcome is what one replica answered an acquire: a lease, or why
// not. peer is nil for this replica.
type acquireOutcome struct {
	peer  *cluster.Peer
	lease cheetah.Lease
	err   error
}

// acquireOn passes the acquire body on to peer, with headers (name, value
// pairs).
func (s *Server) acquireOn(ctx context.Context, c *gin.Context, peer cluster.Peer, body []byte, headers ...string) acquireOutcome {
	o := acquireOutcome{peer: &peer, err: errNoAnswer}
	a := s.ask(ctx, c, peer, http.MethodPost, "/api/v1/acquire", body, headers...)
	switch {
	case a != nil && a.lost && ctx.Err() == nil:
		o.err = errAcquireLost
	case a == nil, a.lost, a.status >= http.StatusInternalServerError, a.status == http.StatusTooManyRequests:
	case a.status == http.StatusCreated:
		var got struct{ Lease cheetah.Lease }
		if json.Unmarshal(a.body, &got) == nil {
			o.lease, o.err = got.Lease, nil
		}
	default:
		o.err = envelopeErr(a.body)
	}
	return o
}

// waitEverywhere waits for a context on every replica at once, until
// deadline: the acquire queues in each replica's registry (a stand-in on
// the others), so that a context freed on any replica goes to the acquire
// that has waited there the longest, first come first served across the
// cluster as in one registry. The first lease wins; then every other wait
// is withdrawn, and a lease one of them got meanwhile is given back. A
// replica that joins meanwhile, or did not answer, is asked again a slice
// later. miss is why the first round found nothing.
func (s *Server) waitEverywhere(c *gin.Context, req cheetah.AcquireRequest, b cheetah.AcquireBody, deadline time.Time, miss error) (cheetah.Lease, error) {
	ctx := c.Request.Context()
	m := s.cfg.Cluster
	// The first round asked for a creation already: waiting, every
	// replica looks for a context that comes free, not for a new one.
	req.Create, b.Create = nil, nil
	ticket := newWaitTicket()
	// The waits outlive the caller just long enough to be withdrawn and
	// answered: a lease that one got is given back, never stranded.
	waitCtx, cancelWaits := context.WithDeadline(context.WithoutCancel(ctx), deadline.Add(withdrawGrace))
	defer cancelWaits()
	localCtx, withdrawLocal := context.WithCancel(waitCtx)
	defer withdrawLocal()

	outcomes := make(chan acquireOutcome)
	pending := 0
	waiting := map[string]cluster.Peer{} // replicas a wait was sent to and has not ended on
	start := func(p *cluster.Peer) {
		pending++
		left := deadline.Sub(s.cfg.Clock.Now())
		if p == nil {
			local := req
			local.Wait = left
			go func() {
				l, err := s.reg.Acquire(localCtx, local)
				outcomes <- acquireOutcome{lease: l, err: err}
			}()
			return
		}
		waiting[p.ID] = *p
		pb := b
		ms := max(1, left.Milliseconds())
		pb.WaitMS = &ms
		body, err := json.Marshal(pb)
		go func() {
			o := acquireOutcome{peer: p, err: err}
			if err == nil {
				o = s.acquireOn(waitCtx, c, *p, body, waitTicketHeader, ticket)
			}
			outcomes <- o
		}()
	}
	start(nil)
	for _, p := range m.Peers() {
		start(&p)
	}

	timer := s.cfg.Clock.NewTimer(deadline.Sub(s.cfg.Clock.Now()))
	defer timer.Stop()
	slice := s.cfg.Clock.NewTicker(acquireSlice)
	defer slice.Stop()
	var won *acquireOutcome
	fail := miss
	for ended := false; !ended; {
		select {
		case o := <-outcomes:
			pending--
			if o.peer != nil {
				delete(waiting, o.peer.ID)
			}
			switch {
			case o.err == nil:
				won, ended = &o, true
			case o.err == errNoAnswer:
				// Asked again on the next slice, if still a member.
			case errors.Is(o.err, cheetah.ErrNoContextAvailable):
				fail = betterReason(fail, o.err)
				ended = o.peer == nil // this replica's wait ran out: so did the time
			default:
				fail, ended = o.err, true
			}
		case <-slice.Chan():
			for _, p := range m.Peers() {
				if _, ok := waiting[p.ID]; !ok {
					start(&p)
				}
			}
		case <-timer.Chan():
			ended = true
		case <-ctx.Done():
			fail, ended = ctx.Err(), true
		}
	}

	// Withdraw the other waits, then hear every one out.
	withdrawLocal()
	var withdrawn sync.WaitGroup
	for _, p := range waiting {
		withdrawn.Go(func() {
			s.askPeer(waitCtx, p, http.MethodPost, "/internal/v1/acquire/withdraw", nil, []string{waitTicketHeader, ticket})
		})
	}
	grace := s.cfg.Clock.NewTimer(withdrawGrace)
	defer grace.Stop()
	for pending > 0 {
		select {
		case o := <-outcomes:
			pending--
			if o.err == nil {
				s.releaseAnywhere(c, o.lease)
			}
		case <-grace.Chan():
			cancelWaits() // a replica that does not answer is cut off
		}
	}
	withdrawn.Wait()
	if won != nil {
		return won.lease, nil
	}
	return cheetah.Lease{}, fail
}

// newWaitTicket names one acquire's waits across the cluster.
func newWaitTicket() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// standIn waits for a context in this replica's registry on behalf of an
// acquire another replica admitted, until that replica withdraws the wait
// named ticket (waitEverywhere).
func (s *Server) standIn(ctx context.Context, ticket string, req cheetah.AcquireRequest) (cheetah.Lease, error) {
	waitCtx, done, ok := s.standIns.begin(ctx, ticket)
	if !ok {
		return cheetah.Lease{}, errWithdrawn
	}
	defer done()
	l, err := s.reg.AcquireStandIn(waitCtx, req)
	if err != nil && waitCtx.Err() != nil && ctx.Err() == nil {
		return cheetah.Lease{}, errWithdrawn
	}
	return l, err
}

// errWithdrawn answers a stand-in wait that was withdrawn: the replica
// that withdrew it reads no more than that it got nothing here.
var errWithdrawn = &cheetah.NoContextError{Reason: cheetah.ReasonNoIdleWorker}

// standIns are the waits this replica holds for acquires other replicas
// admitted, by ticket, and the tickets withdrawn before their wait came.
type standIns struct {
	mu        sync.Mutex
	waiting   map[string]context.CancelFunc
	withdrawn map[string]time.Time
}

// begin registers the wait named ticket: its context ends when the wait is
// withdrawn, and done forgets it. ok is false when it was withdrawn
// before it came.
func (w *standIns) begin(ctx context.Context, ticket string) (_ context.Context, done func(), ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, gone := w.withdrawn[ticket]; gone {
		delete(w.withdrawn, ticket)
		return nil, nil, false
	}
	if w.waiting == nil {
		w.waiting = map[string]context.CancelFunc{}
	}
	ctx, cancel := context.WithCancel(ctx)
	w.waiting[ticket] = cancel
	return ctx, func() {
		w.mu.Lock()
		delete(w.waiting, ticket)
		w.mu.Unlock()
		cancel()
	}, true
}

// withdraw ends the wait named ticket, or keeps it from starting should it
// not have come yet (requests may overtake each other between replicas).
func (w *standIns) withdraw(ticket string, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if cancel, ok := w.waiting[ticket]; ok {
		cancel()
		return
	}
	if w.withdrawn == nil {
		w.withdrawn = map[string]time.Time{}
	}
	for t, at := range w.withdrawn {
		// A wait withdrawn this long ago can no longer come: the acquire
		// that sent it ended, and with it the request.
		if now.Sub(at) > cheetah.MaxWait+withdrawGrace {
			delete(w.withdrawn, t)
		}
	}
	w.withdrawn[ticket] = now
}

// withdrawWait is POST /internal/v1/acquire/withdraw: the replica that
// sent the wait named by the ticket header withdraws it.
func (s *Server) withdrawWait(c *gin.Context) {
	ticket := c.GetHeader(waitTicketHeader)
	if ticket == "" {
		s.fail(c, cheetah.Invalidf("%s is required", waitTicketHeader))
		return
	}
	s.standIns.withdraw(ticket, s.cfg.Clock.Now())
	c.Status(http.StatusNoContent)
}

// candidate is a replica that has a match for an acquire: nil peer is
// this one.
type candidate struct {
	peer  *cluster.Peer
	since time.Time
}

// candidates returns the replicas that have a match for req, the longest
// idle first. A replica with none is still tried last, once, so that its
// reason for having none counts.
func (s *Server) candidates(c *gin.Context, req cheetah.AcquireRequest, peers []cluster.Peer, body []byte) []candidate {
	type seen struct {
		candidate
		ok bool
	}
	all := make([]seen, len(peers)+1)
	var wg sync.WaitGroup
	for i := range peers {
		wg.Go(func() {
			all[i+1].peer = &peers[i]
			a := s.ask(c.Request.Context(), c, peers[i], http.MethodPost, "/internal/v1/acquire/idle-since", body)
			if a == nil || a.status != http.StatusOK {
				return
			}
			var got struct {
				IdleSince *time.Time `json:"idle_since"`
			}
			if json.Unmarshal(a.body, &got) == nil && got.IdleSince != nil {
				all[i+1].since, all[i+1].ok = *got.IdleSince, true
			}
		})
	}
	all[0].since, all[0].ok = s.reg.IdleSince(req)
	wg.Wait()
	// Stable: on a tie this replica comes first, then the others by id.
	slices.SortStableFunc(all, func(a, b seen) int {
		if a.ok != b.ok {
			if a.ok {
				return -1
			}
			return 1
		}
		return a.since.Compare(b.since)
	})
	out := make([]candidate, len(all))
	for i, x := range all {
		out[i] = x.candidate
	}
	return out
}

// selectionOrder orders the idle contexts of several replicas as one
// registry lists them: browsers first, then the longest idle first.
func selectionOrder(cs []cheetah.ContextSnapshot) []cheetah.ContextSnapshot {
	rank := func(t cheetah.ClientType) int {
		if t == cheetah.Browser {
			return 0
		}
		return 1
	}
	slices.SortStableFunc(cs, func(a, b cheetah.ContextSnapshot) int {
		if r := rank(a.ClientType) - rank(b.ClientType); r != 0 {
			return r
		}
		if a.IdleSince == nil || b.IdleSince == nil {
			return 0
		}
		return a.IdleSince.Compare(*b.IdleSince)
	})
	return cs
}

// idleSince is the internal route behind candidates.
func (s *Server) idleSince(c *gin.Context) {
	var b cheetah.AcquireBody
	if !s.bind(c, &b) {
		return
	}
	since, ok := s.reg.IdleSince(cheetah.AcquireRequest{UserID: b.UserID, TaskID: b.TaskID,
		ClientType: b.ClientType, ClientID: b.ClientID, Labels: b.Labels})
	if !ok {
		c.JSON(http.StatusOK, gin.H{"idle_since": nil})
		return
	}
	c.JSON(http.StatusOK, gin.H{"idle_since": since})
}

// betterReason keeps the reason that says more: any other replica having an
// eligible client beats no_eligible_client.
func betterReason(have, other error) error {
	var h *cheetah.NoContextError
	if errors.As(have, &h) && h.Reason == cheetah.ReasonNoEligibleClient {
		return other
	}
	return have
}

// envelopeErr turns an error envelope back into the SDK's error.
func envelopeErr(body []byte) error {
	var env cheetah.Envelope
	if json.Unmarshal(body, &env) != nil || env.Err() == nil {
		return errors.New("cluster: a replica answered without an error envelope")
	}
	return env.Err()
}

// releaseAnywhere gives back a lease that nobody will learn of (its caller
// went away), on whichever replica issued it.
func (s *Server) releaseAnywhere(c *gin.Context, l cheetah.Lease) {
	ctx := context.WithoutCancel(c.Request.Context())
	tag, _ := registry.TokenTagOf(l.LeaseToken)
	if m := s.cfg.Cluster; m != nil && tag != m.ID() {
		if p, ok := m.Peer(tag); ok {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.URL+"/api/v1/lease/release", nil)
			if err != nil {
				return
			}
			req.Header.Set("Authorization", c.GetHeader("Authorization"))
			req.Header.Set("X-Lease", l.LeaseToken)
			if m.Sign(req) != nil {
				return
			}
			if resp, err := s.peerClient.Do(req); err == nil {
				_ = resp.Body.Close()
			}
		}
		return
	}
	_, _ = s.reg.Release(ctx, l)
}

// disconnectKeyEverywhere closes the clients of a revoked key on every
// replica, each of which also forgets the key it may have cached.
func (s *Server) disconnectKeyEverywhere(c *gin.Context, keyID string) int {
	n := s.reg.DisconnectKey(keyID, protocol.CloseForbidden, "the client key was revoked")
	if m := s.cfg.Cluster; m != nil && !fromPeer(c) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for _, p := range m.Peers() {
			wg.Go(func() {
				a := s.ask(c.Request.Context(), c, p, http.MethodPost, "/internal/v1/keys/"+url.PathEscape(keyID)+"/disconnect", nil)
				if a != nil && a.status == http.StatusOK {
					mu.Lock()
					n += countOf([][]byte{a.body}, "disconnected")
					mu.Unlock()
				}
			})
		}
		wg.Wait()
	}
	return n
}

// disconnectKey is the internal route behind disconnectKeyEverywhere.
func (s *Server) disconnectKey(c *gin.Context) {
	s.keys.Forget(c.Param("id"))
	n := s.reg.DisconnectKey(c.Param("id"), protocol.CloseForbidden, "the client key was revoked")
	c.JSON(http.StatusOK, gin.H{"disconnected": n})
}
