package serializer

import (
	"context"
	"time"
)

// A session's initialization gate, as one state machine. Every change of
// the gate, and of the fields that go with it, is made here, by a function
// named for the event that causes it; other files ask for a transition and
// read the state, never write it.
//
// When does the gate open? A session begun here (Begin) or adopted from a
// Store record still initializing is gateInitializing: it holds every
// message but one carrying notifications/initialized. It leaves that state
//   - to open, when such a message is answered 2xx (initializedAcknowledged);
//   - at init_timeout (initTimeoutExpired), by OnInitTimeout: open
//     (Forward), rejecting (Reject), or open once the synthesized
//     notification has ended, whatever its answer (synthesizeEnded); with a
//     Store, open quietly instead if another instance saw initialized
//     acknowledged, or if the record is gone (the session ended elsewhere)
//     and no request here waits (initTimeoutConfirmed);
//   - with a Store, to open when its record says open while requests are
//     held here (openedElsewhere): the client's notifications/initialized
//     was acknowledged on another instance;
//   - to open when the session ends (endedUpstream: a 404, or a DELETE
//     answered 2xx) or an operator drops it (droppedByOperator), so that
//     nothing waits for a gate nobody will open.
// A rejecting gate opens only by initializedAcknowledged. An open gate
// never closes again. A session met first through a request, with a
// Store, is initializing while its record is looked up (lookupStarted),
// then as the record says (recordSaysInitializing, recordSaysOpen).
//
// An initializing session no request holds is idle gated in the table:
// evicted, oldest first, only when no idle open session is left
// (forgottenWhileIdle stops its init timeout), and never expired. When its
// gate leaves initializing, the transitions run by timers tell the table
// (gateSettled), which then treats it as an ordinary idle session.

type gateState uint8

const (
	gateOpen gateState = iota
	// gateInitializing holds every message but one carrying
	// notifications/initialized.
	gateInitializing
	// gateRejecting answers every message but one carrying
	// notifications/initialized with ErrNotInitialized.
	gateRejecting
)

// initGate is the gate's part of a Session, guarded by Session.mu.
type initGate struct {
	gate      gateState
	gateOpens chan struct{} // closed when the gate leaves gateInitializing
	stopInit  func() bool   // cancels the init timeout
	synth     func(context.Context) bool
	lookingUp bool // with a Store: the gate awaits the record's answer
	dropped   bool // by an operator (Table.Drop): waiters get ErrSessionDropped
	// gone: the table forgot the session, or will once no request holds
	// it (endedUpstream); its timers change nothing.
	gone bool
	// With a Store: a goroutine reads the record while requests are held
	// here, since the gate may open on another instance (remote.go).
	gateWatched bool
}

// sessionBegun: the upstream has just created the session (Begin). It is
// initializing until notifications/initialized is acknowledged, at most
// initTimeout. Called before the session is published in the table.
func (s *Session) sessionBegun(synth func(context.Context) bool, initTimeout time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gate = gateInitializing
	s.gateOpens = make(chan struct{})
	s.synth = synth
	s.stopInit = s.table.clock.AfterFunc(initTimeout, s.initTimeoutExpired)
}

// lookupStarted: a session met first through a request, with a Store, is
// held at the gate until the store has answered. Called before the
// session is published in the table.
func (s *Session) lookupStarted() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lookingUp = true
	s.gate = gateInitializing
	s.gateOpens = make(chan struct{})
}

// recordSaysInitializing: the Store's record says the session is still
// initializing on another instance. The gate stays closed until the
// creating instance's deadline, then OnInitTimeout applies as for a
// session begun here; at once if the deadline has passed. The sender of
// the Synthesize action comes from the first waiting request that can
// supply one. Caller holds s.mu.
func (s *Session) recordSaysInitializing(deadline time.Time) {
	cfg := s.table.config()
	s.lookingUp = false
	if cfg.OnInitTimeout == Synthesize && s.synth == nil {
		for _, w := range s.waiting {
			if w.src == nil {
				continue
			}
			if s.synth = w.src.Synthesizer(s.id); s.synth != nil {
				break
			}
		}
	}
	left := deadline.Sub(s.table.clock.Now())
	if left <= 0 {
		// The record said initializing a moment ago: no need to ask again.
		s.applyInitTimeout()
		return
	}
	s.stopInit = s.table.clock.AfterFunc(left, s.initTimeoutExpired)
}

// recordSaysOpen: the Store's record is open, missing or expired, or the
// store did not answer: the session is queue only. Caller holds s.mu.
func (s *Session) recordSaysOpen() {
	s.lookingUp = false
	if s.gate == gateInitializing {
		s.openGate()
	}
}

// openedElsewhere: while requests were held here, the record said another
// instance saw notifications/initialized acknowledged. The gate opens here
// too, without a write: the record is open already. Caller holds s.mu.
func (s *Session) openedElsewhere() {
	if s.gate == gateInitializing && !s.gone {
		s.openGate()
		s.dispatch()
	}
}

// synthesizerOffered: a request of a session adopted gated before
// Synthesize applied to it (or before a reload turned it on) can supply
// the sender that action needs. Caller holds s.mu.
func (s *Session) synthesizerOffered(src SynthSource) {
	if s.gate == gateInitializing && s.synth == nil && src != nil && !s.lookingUp &&
		s.table.config().OnInitTimeout == Synthesize {
		s.synth = src.Synthesizer(s.id)
	}
}

// initializedAcknowledged: a message carrying notifications/initialized
// was answered 2xx. The record is marked open even when the gate here was
// open already: it may have opened only because the record could not be
// read (the engine was failing over), and the other instances wait for
// this write. Caller holds s.mu.
func (s *Session) initializedAcknowledged() {
	if s.gate != gateOpen {
		s.openGate()
	}
	s.record(opOpened)
}

// initTimeoutExpired: init_timeout has passed (the timer of sessionBegun
// or recordSaysInitializing). With a Store it first asks whether the gate
// opened on another instance.
func (s *Session) initTimeoutExpired() {
	if store := s.table.config().Store; store != nil {
		go s.initTimeoutConfirmed(store)
		return
	}
	s.mu.Lock()
	s.applyInitTimeout()
	s.mu.Unlock()
	s.table.gateSettled(s)
}

// initTimeoutConfirmed: init_timeout has passed and, with a Store, the
// record was read. If another instance saw initialized acknowledged (a
// front that hashes the session id sends the follow-ups of a session
// created here elsewhere), the gate opens here too, quietly; else
// OnInitTimeout applies as without a Store.
func (s *Session) initTimeoutConfirmed(store Store) {
	rec, found, err := lookupRecord(store, s.table.config(), s.id)
	s.mu.Lock()
	if s.gate == gateInitializing && !s.gone {
		switch {
		case err == nil && found && rec.Open:
			s.stopInit = nil
			s.openGate()
			s.dispatch()
		case err == nil && !found && s.refs.Load() == 0:
			// The record is gone: the session ended on another instance
			// (a hashing front sent its DELETE there), and no request
			// here waits for it. Nothing timed out that anyone meets.
			s.stopInit = nil
			s.openGate()
		default:
			s.applyInitTimeout()
		}
	}
	s.mu.Unlock()
	s.table.gateSettled(s)
}

// applyInitTimeout applies OnInitTimeout to a session still initializing.
// Caller holds s.mu.
func (s *Session) applyInitTimeout() {
	cfg := s.table.config()
	if s.gate != gateInitializing || s.gone {
		return
	}
	s.stopInit = nil
	cfg.Events.GateTimedOut(s.id, cfg.OnInitTimeout)
	switch {
	case cfg.OnInitTimeout == Reject:
		s.gate = gateRejecting
		close(s.gateOpens)
		s.gateOpens = nil
		s.synth = nil
		s.dispatch()
	case cfg.OnInitTimeout == Synthesize && s.synth != nil:
		go s.synthesize(s.synth, cfg.QueueTimeout)
	default:
		s.openGate()
		s.dispatch()
	}
}

// synthesize sends notifications/initialized on the client's behalf; its
// turn opens the gate on a 2xx (initializedAcknowledged).
func (s *Session) synthesize(send func(context.Context) bool, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	send(ctx)
	s.synthesizeEnded()
}

// synthesizeEnded: the synthesized notification has ended. On any failure
// the gate opens anyway, as with Forward, so that nothing stays held.
func (s *Session) synthesizeEnded() {
	s.mu.Lock()
	if s.gate == gateInitializing {
		s.openGate()
		s.dispatch()
	}
	s.mu.Unlock()
	s.table.gateSettled(s)
}

// endedUpstream: the session ended (DELETE answered 2xx) or the upstream
// no longer knows it (404); the table forgets it once no request holds it
// (unref). A message still held would otherwise wait for a gate nobody
// opens: it goes.
func (s *Session) endedUpstream() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gone = true
	s.record(opForget)
	if s.gate == gateInitializing {
		s.openGate()
		s.dispatch()
	}
}

// droppedByOperator: an operator dropped the session (Table.Drop), which
// the table has forgotten. Every waiting request is answered
// ErrSessionDropped, GET streams at the gate included; the exchange in
// flight is left to finish. It returns the number of requests answered.
func (s *Session) droppedByOperator() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropped = true
	s.gone = true
	s.record(opForget)
	answered := s.answerAll(ErrSessionDropped)
	if s.gate == gateInitializing {
		s.openGate() // wakes GET streams at the gate; they see dropped
	}
	return answered
}

// forgottenWhileIdle: the table let an idle session go (evicted, or
// expired). No request holds it; its init timeout, if any, must not act
// on it.
func (s *Session) forgottenWhileIdle() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gone = true
	if s.stopInit != nil {
		s.stopInit()
		s.stopInit = nil
	}
	s.synth = nil
}

// openGate lets held messages go. Caller holds s.mu.
func (s *Session) openGate() {
	if s.gate == gateInitializing {
		close(s.gateOpens)
	}
	s.gateOpens = nil // waiters hold their own copy; an idle session keeps none
	s.gate = gateOpen
	if s.stopInit != nil {
		s.stopInit()
		s.stopInit = nil
	}
	s.synth = nil
}

// What the gate lets through.

// admits reports whether the gate lets a request with these traits go.
// Caller holds s.mu.
func (s *Session) admits(t Traits) bool {
	return s.gate == gateOpen || t.Has(CarriesInitialized)
}

// awaitsInitialized reports whether the gate holds messages until the
// client's notifications/initialized. Caller holds s.mu.
func (s *Session) awaitsInitialized() bool { return s.gate == gateInitializing }

// waitGate blocks until the gate is open, for requests that do not take
// the slot (the GET stream).
func (s *Session) waitGate(ctx context.Context) error {
	cfg := s.table.config()
	s.mu.Lock()
	gate, opens, lookingUp := s.gate, s.gateOpens, s.lookingUp
	s.mu.Unlock()
	if gate == gateInitializing {
		if !lookingUp {
			cfg.Events.Held()
			s.mu.Lock()
			s.watchGateIfHeld()
			s.mu.Unlock()
		}
		expired := make(chan struct{})
		stop := s.table.clock.AfterFunc(cfg.QueueTimeout, func() { close(expired) })
		defer stop()
		select {
		case <-opens:
		case <-expired:
			return ErrQueueTimeout
		case <-ctx.Done():
			return ctx.Err()
		}
		s.mu.Lock()
		gate = s.gate
		dropped := s.dropped
		s.mu.Unlock()
		if dropped {
			return ErrSessionDropped
		}
	}
	if gate == gateRejecting {
		return ErrNotInitialized
	}
	return nil
}
