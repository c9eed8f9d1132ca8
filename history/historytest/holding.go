package historytest

import (
	"sync"

	"github.com/cheetahbroker/cheetah/history"
)

// Holding is a history store whose WriteAsync callbacks are held, once
// SetHold(true) was called, until Release: as if its commits took their
// time. What it writes is written; only the telling waits.
type Holding struct {
	*history.Store
	mu   sync.Mutex
	hold bool
	held []func()
}

// WriteAsync writes ops, and holds done's call while holding.
func (s *Holding) WriteAsync(done func(error), ops ...history.Op) {
	s.Store.WriteAsync(func(err error) {
		s.mu.Lock()
		if s.hold {
			s.held = append(s.held, func() {
				if done != nil {
					done(err)
				}
			})
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		if done != nil {
			done(err)
		}
	}, ops...)
}

// SetHold holds the callbacks from now on, or stops holding new ones.
func (s *Holding) SetHold(v bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hold = v
}

// Held is how many callbacks are held.
func (s *Holding) Held() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.held)
}

// Release stops holding and runs the callbacks held, in order; it returns
// how many there were.
func (s *Holding) Release() int {
	s.mu.Lock()
	held := s.held
	s.held, s.hold = nil, false
	s.mu.Unlock()
	for _, f := range held {
		f()
	}
	return len(held)
}
