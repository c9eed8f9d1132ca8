package history

// A PostgreSQL session runs a batch's statements on one core while the
// writer waits for them and for the log's flush. So on PostgreSQL the
// writer keeps up to two batches in flight, each on a connection and a
// goroutine of its own: while one commits, the next is written beside it.
// Two batches in flight touch no command in common, so they may commit in
// either order, or one without the other, with the result of one after the
// other; a batch that shares a command with the batch in flight waits for
// it to land. What orders writes across commands makes the writer land
// every flight and write the batch alone, as it always did: the held writes
// of an outage (nothing overtakes them), a Write with no ops (it waits for
// everything before it), and lease rows (a lease's row is durable before
// any later write, the commands sent under it included, and the rows of
// one context's leases change in the registry's order).

// maxFlights is how many batches the PostgreSQL writer keeps in flight.
const maxFlights = 2

// flight is one batch being written beside the writer goroutine.
type flight struct {
	batch []request
	keys  map[string]struct{} // the commands its ops touch
	plan  writePlan
	seen  uint64 // s.marks when it took off, for noteHealth
	// Set by write: each request's outcome, and the error of the database
	// not answering, if it did not.
	outcome []error
	err     error
	told    bool // the flight told its callers itself
}

// take makes f the flight of batch.
func (f *flight) take(batch []request, seen uint64) {
	f.batch, f.seen, f.err, f.told = batch, seen, nil, false
	if f.keys == nil {
		f.keys = make(map[string]struct{})
	}
	clear(f.keys)
	for _, r := range batch {
		for _, op := range r.ops {
			f.keys[opKey(op)] = struct{}{}
		}
	}
}

// shares reports whether batch touches a command f does.
func (f *flight) shares(batch []request) bool {
	for _, r := range batch {
		for _, op := range r.ops {
			if _, ok := f.keys[opKey(op)]; ok {
				return true
			}
		}
	}
	return false
}

// write writes f's batch as commit does, recording the outcomes instead of
// telling the callers: the flight tells them once the database answered,
// and the writer goroutine otherwise (land), after what the failure does
// to health and to the held writes.
func (s *Store) write(f *flight) {
	f.outcome = append(f.outcome[:0], make([]error, len(f.batch))...)
	heard := 0
	n, err := s.applyGroup(&f.plan, f.batch, func(_ request, err error) {
		f.outcome[heard] = err
		heard++
	})
	for i := n; i < len(f.batch); i++ {
		f.outcome[i] = err
	}
	f.err = err
}

// opKey is the command op is about. Lease ops never fly (see ordered).
func opKey(op Op) string {
	switch o := op.(type) {
	case InsertCommand:
		return o.Rec.CommandID
	case SetStatus:
		return o.CommandID
	case AppendMessage:
		return o.CommandID
	case SetDelivery:
		return o.CommandID
	}
	return ""
}

// dispatch writes batch: in a flight of its own where it can, else alone
// once every flight has landed.
func (s *Store) dispatch(batch []request) {
	if s.dialect != DialectPostgres || ordered(batch) {
		s.landAll()
		s.commit(batch)
		return
	}
	for _, f := range s.flying {
		if f.shares(batch) {
			s.landAll()
			break
		}
	}
	// Asked after landing: a flight that failed has held its writes, and
	// a batch that shares a command with them goes after them (commit
	// drains them first), never beside them.
	if s.down.Load() != nil || len(s.held) > 0 {
		s.landAll()
		s.commit(batch)
		return
	}
	if len(s.flying) > 0 {
		s.stats.overlapped.Add(1)
	}
	f := s.idle[len(s.idle)-1]
	s.idle = s.idle[:len(s.idle)-1]
	f.take(batch, s.marks.Load())
	s.flying = append(s.flying, f)
	go func() {
		s.write(f)
		if f.err == nil {
			// The database answered: no write of the flight's is held
			// and health has nothing to say first, so its callers hear
			// now rather than after a wake-up of the writer goroutine.
			// Its ops share no command with the other flight's, whose
			// callers may hear at the same time.
			for i, r := range f.batch {
				r.done(f.outcome[i])
			}
			f.told = true
		}
		s.landed <- f
	}()
}

// ordered reports whether batch must be written in order with every other:
// it holds a Write with no ops, which waits for everything enqueued before
// it, or a lease op.
func ordered(batch []request) bool {
	for _, r := range batch {
		if len(r.ops) == 0 {
			return true
		}
		for _, op := range r.ops {
			switch op.(type) {
			case PutLease, DeleteLease:
				return true
			}
		}
	}
	return false
}

// land tells the callers of a flight that has landed how their writes went,
// as commit does.
func (s *Store) land(f *flight) {
	for i, g := range s.flying {
		if g == f {
			s.flying = append(s.flying[:i], s.flying[i+1:]...)
			break
		}
	}
	s.noteHealth(f.err, f.seen)
	if !f.told {
		for i, r := range f.batch {
			s.finish(r, f.outcome[i])
		}
	}
	clear(f.batch) // let go of the ops
	f.batch = nil
	s.idle = append(s.idle, f)
}

// landAll waits for every flight to land.
func (s *Store) landAll() {
	for len(s.flying) > 0 {
		s.land(<-s.landed)
	}
}
