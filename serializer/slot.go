package serializer

import "slices"

// A session's slot, as one state machine: which request may go upstream
// now, and which may go beside it. Every change of the slot and of the
// line of waiting requests is made here, by a function named for the
// event that causes it; other files ask for a transition and read the
// state, never write it. The gate, which decides what the slot may take,
// is the other machine (gate.go).
//
// The slot is free, or held by one request:
//   - slotExchange: its exchange runs upstream; or, for a session met
//     first through a request with a Store, the lookup of its record holds
//     the slot (lookupHoldsSlot), so that requests arriving meanwhile
//     queue in arrival order; or the exchange an overtaker went beside
//     has ended and the overtaker, still upstream, holds the slot alone;
//   - slotStreaming: the exchange's response is an event stream
//     (responseStreams), which may wait for the client's replies.
//
// When may a request overtake? A message carrying only replies or
// cancellations goes beside the holder while it streams, once the gate
// is open and no other overtaker runs (canOvertake): overtakers go one at
// a time, and the slot is free only once the holder and its overtaker
// have both ended, so the next request never runs beside either. The
// holder never waits for its overtaker: it may be waiting for that very
// reply. Every other request waits for the free slot in arrival order,
// and only for one its gate admits. dispatch hands out whatever turns the
// state allows; every transition that can free a turn ends with it.

type slotState uint8

const (
	slotFree slotState = iota
	slotExchange
	slotStreaming
)

// arrival is what becomes of a request that reaches the session.
type arrival uint8

const (
	arrivalWaits     arrival = iota // in the line, for its turn
	arrivalTakesSlot                // the slot was free and the gate admits it
	arrivalOvertakes                // beside the slot's holder
)

// canOvertake reports whether a request with these traits may go beside
// the slot's holder. Caller holds s.mu.
func (s *Session) canOvertake(t Traits) bool {
	return t.Has(RepliesOnly) && s.slot == slotStreaming && s.gate == gateOpen && !s.overtaker
}

// initializeBegan: Begin's initialize exchange holds the slot of the
// session it creates. Called before the session is published.
func (s *Session) initializeBegan() { s.slot = slotExchange }

// lookupHoldsSlot: the lookup of a session met first through a request
// holds its slot until lookupEnded. Called before the session is
// published.
func (s *Session) lookupHoldsSlot() { s.slot = slotExchange }

// lookupEnded: the record's answer has settled the gate (adopt); the slot
// goes to whoever waits. Caller holds s.mu.
func (s *Session) lookupEnded() {
	s.slot = slotFree
	s.dispatch()
}

// requestArrived: a request reached the session. It overtakes, takes the
// free slot, is refused (ErrNotInitialized by a rejecting gate,
// ErrQueueFull), or waits: the caller then queues it with waitInLine.
// Caller holds s.mu; dispatch keeps "slot free and an admitted request
// waiting" from ever lasting, so a free slot means nobody admitted is
// ahead.
func (s *Session) requestArrived(traits Traits, maxQueue int) (arrival, error) {
	switch {
	case s.canOvertake(traits):
		s.overtaker = true
		return arrivalOvertakes, nil
	case s.gate == gateRejecting && !traits.Has(CarriesInitialized):
		return arrivalWaits, ErrNotInitialized
	case s.slot == slotFree && s.admits(traits):
		s.slot = slotExchange
		return arrivalTakesSlot, nil
	case len(s.waiting) >= maxQueue:
		return arrivalWaits, ErrQueueFull
	}
	return arrivalWaits, nil
}

// waitInLine puts w at the end of the line. Caller holds s.mu.
func (s *Session) waitInLine(w *waiter) { s.waiting = append(s.waiting, w) }

// stopWaiting: w stops waiting, for err (queue_timeout, or its client
// left), unless its turn came first. It returns once w is settled, so
// the caller can read its outcome.
func (s *Session) stopWaiting(w *waiter, err error) {
	s.mu.Lock()
	for i, x := range s.waiting {
		if x == w {
			// slices.Delete clears the freed element: the line's backing
			// array must not keep an ended request (body, headers) alive.
			s.waiting = slices.Delete(s.waiting, i, i+1)
			w.err = err
			close(w.ready)
			break
		}
	}
	s.mu.Unlock()
	<-w.ready
}

// responseStreams: the holder's response is an event stream, which lets
// replies and cancellations overtake it. Caller holds s.mu.
func (s *Session) responseStreams() {
	s.slot = slotStreaming
	s.dispatch()
}

// exchangeEnded: an exchange has ended, or its request left before it
// went upstream. The slot is free once the holder and the overtaker
// beside it, if any, have both ended; a holder that ends first leaves the
// slot to its overtaker. Caller holds s.mu, after the exchange's other
// effects on the session (a gate opened).
func (s *Session) exchangeEnded(overtook bool) {
	switch {
	case overtook:
		s.overtaker = false
		if s.slot != slotStreaming {
			s.slot = slotFree // the exchange it went beside had ended
		}
	case s.overtaker:
		s.slot = slotExchange // held by the overtaker until it ends
	default:
		s.slot = slotFree
	}
	s.dispatch()
}

// grant removes waiting[i] and gives it a turn. Caller holds s.mu.
func (s *Session) grant(i int, overtake bool) {
	w := s.waiting[i]
	s.waiting = slices.Delete(s.waiting, i, i+1) // clears the freed element
	w.overtake = overtake
	if overtake {
		s.overtaker = true
	} else {
		s.slot = slotExchange
	}
	close(w.ready)
}

// dispatch hands out whatever turns the session's state allows. Caller
// holds s.mu; it runs after every change of that state, the gate's
// included.
func (s *Session) dispatch() {
	if s.gate == gateRejecting {
		kept := s.waiting[:0]
		for _, w := range s.waiting {
			if w.traits.Has(CarriesInitialized) {
				kept = append(kept, w)
				continue
			}
			w.err = ErrNotInitialized
			close(w.ready)
		}
		clear(s.waiting[len(kept):])
		s.waiting = kept
	}
	for i := 0; i < len(s.waiting); {
		w := s.waiting[i]
		switch {
		case s.canOvertake(w.traits):
			s.grant(i, true)
		case s.slot == slotFree && s.admits(w.traits):
			s.grant(i, false)
		default:
			i++
		}
		if s.slot == slotExchange {
			return // nothing else can go until the slot is free
		}
	}
}

// answerAll answers every waiting request with err and returns how many
// there were. Caller holds s.mu.
func (s *Session) answerAll(err error) int {
	n := len(s.waiting)
	for _, w := range s.waiting {
		w.err = err
		close(w.ready)
	}
	clear(s.waiting)
	s.waiting = nil
	return n
}
