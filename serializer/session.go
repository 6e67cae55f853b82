package serializer

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Errors returned by Table.Acquire and Table.WaitGate. A caller cancelled
// through its context gets the context's error instead.
var (
	ErrQueueFull      = errors.New("session queue is full")
	ErrQueueTimeout   = errors.New("timed out waiting for the session's turn")
	ErrNotInitialized = errors.New("session was not initialized within init_timeout")
	// ErrAlreadyInitialized answers Table.AcquireSynthesized when the
	// client's own notifications/initialized was acknowledged first.
	ErrAlreadyInitialized = errors.New("session's notifications/initialized was already acknowledged")
)

// Session is one MCP session's queue and initialization gate.
type Session struct {
	table *Table
	id    string
	keyed bool // a key's queue (AcquireKeyed), not a session

	created time.Time
	// lastUsed is when a request last entered or left, in unix
	// nanoseconds. It changes under the table's mu whenever s goes idle,
	// which keeps each idle list in its order.
	lastUsed atomic.Int64

	// refs counts requests holding the session (waiting, in flight or at
	// the gate); only a session with none may be evicted or expire. It
	// goes from 0 to 1 and from 1 to 0 under the table's mu only.
	refs atomic.Int32
	// Guarded by the table's mu: whether s is the table's session for its
	// id, and the table's list holding it (see Table).
	tracked    bool
	list       *sessionList
	prev, next *Session

	mu      sync.Mutex
	slot    slotState // written in slot.go only
	waiting []*waiter // arrival order, held ones included; slot.go only
	// overtaker: a reply or cancellation that overtook the slot's holder
	// is upstream; written in slot.go only.
	overtaker bool
	// overtakerLine: the line the overtaken exchange held, which the
	// overtaker frees when it ends (leaveLineToOvertaker).
	overtakerLine *Session
	initGate      // written in gate.go only

	// With a Store only; the writes are written in writes.go only.
	writing    bool          // a write is on its way to the Store, or waits to be tried again
	nextWrite  storeOp       // the write to send once that one is answered; writeNone if none
	retryPause time.Duration // while the write on its way fails: the last pause before a try,
	retried    time.Duration // and all of them since it last succeeded
}

// waiter is a request waiting for its turn.
type waiter struct {
	traits   Traits
	src      SynthSource   // nil unless the caller gave one
	ready    chan struct{} // closed once decided
	err      error         // the decision: nil is a turn
	overtake bool          // the turn is outside the slot (RepliesOnly)
}

// Turn is a request's permission to go upstream. Done must be called
// exactly once when the upstream exchange has ended.
type Turn struct {
	s        *Session
	traits   Traits
	overtake bool
	begins   bool          // the initialize exchange that created the session
	held     bool          // at the gate, waiting for initialized
	waited   time.Duration // before the turn; 0 when it went straight through
	line     *Session      // the line's queue it also holds (AcquireInLine), if any
}

// Streaming records that the response is an event stream, which lets
// replies and cancellations overtake it.
func (t Turn) Streaming() {
	if t.s == nil || t.overtake {
		return
	}
	s := t.s
	s.mu.Lock()
	s.responseStreams()
	s.mu.Unlock()
}

// Done ends the exchange with the upstream's HTTP status (0 when no
// response was sent) and hands the slot to the next request.
func (t Turn) Done(status int) {
	s := t.s
	if s == nil {
		return
	}
	ok := status >= 200 && status < 300
	t.end(func() {
		if t.begins {
			s.record(opInitializeEnded)
		}
		if ok && t.traits.Has(CarriesInitialized) {
			s.initializedAcknowledged()
		}
	})
	// A key's queue has no session upstream to end: its requests keep
	// their order whatever the answer. A session's state outlives its end
	// until no other request of it waits or runs (unref forgets it), so
	// that the id's next request still waits for those.
	if !s.keyed && (status == 404 || (ok && t.traits.Has(EndsSession))) {
		s.endedUpstream()
	}
	s.unref()
	line := t.line
	if t.overtake {
		line = s.lineLeftToOvertaker()
	} else if line != nil && s.leaveLineToOvertaker(line) {
		line = nil
	}
	if line != nil {
		Turn{s: line}.Done(status)
	}
}

// leaveLineToOvertaker hands the line the session's ended exchange held
// to the reply that overtook it, if one is still upstream: the line's
// other sessions save the same record, so they wait for it too. It
// reports whether it did.
func (s *Session) leaveLineToOvertaker(line *Session) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.overtaker {
		return false
	}
	s.overtakerLine = line
	return true
}

// lineLeftToOvertaker takes back the line an ended overtaker now frees,
// if its stream left it one.
func (s *Session) lineLeftToOvertaker() *Session {
	s.mu.Lock()
	defer s.mu.Unlock()
	line := s.overtakerLine
	s.overtakerLine = nil
	return line
}

// release gives the slot back without any effect of an upstream answer,
// and an overtaker the line its stream left it.
func (t Turn) release() {
	t.end(nil)
	if t.overtake {
		if line := t.s.lineLeftToOvertaker(); line != nil {
			Turn{s: line}.Done(0)
		}
	}
}

// giveBack gives back a turn that will not go upstream: its slots, line's
// included, without effect, and its references.
func (t Turn) giveBack() {
	t.release()
	t.s.unref()
	if t.line != nil {
		Turn{s: t.line}.release()
		t.line.unref()
	}
}

// end ends the turn's exchange: answered's effects on the session (nil:
// none), then the slot passed on.
func (t Turn) end(answered func()) {
	s := t.s
	s.mu.Lock()
	if answered != nil {
		answered()
	}
	s.exchangeEnded(t.overtake)
	s.mu.Unlock()
}

// Overtook reports whether the turn went ahead of the in-flight exchange.
func (t Turn) Overtook() bool { return t.overtake }

// enter waits for the request's turn in s: at once, beside the slot's
// holder, or in the line until dispatch grants it, wait passes
// (ErrQueueTimeout) or ctx ends.
func (s *Session) enter(ctx context.Context, traits Traits, src SynthSource, wait time.Duration) (Turn, error) {
	cfg := s.table.config()
	if err := ctx.Err(); err != nil {
		return Turn{}, err
	}
	s.mu.Lock()
	s.synthesizerOffered(src)
	switch a, err := s.requestArrived(traits, cfg.MaxQueue); {
	case err != nil:
		s.mu.Unlock()
		return Turn{}, err
	case a == arrivalOvertakes:
		s.mu.Unlock()
		return Turn{s: s, traits: traits, overtake: true}, nil
	case a == arrivalTakesSlot:
		s.mu.Unlock()
		return Turn{s: s, traits: traits}, nil
	}
	// The wait is timed from before the request joins the line, so that a
	// request seen waiting always has its deadline (stopWaiting takes s.mu,
	// which the timer's function therefore waits for).
	w := &waiter{traits: traits, src: src, ready: make(chan struct{})}
	start := s.table.clock.Now()
	stop := s.table.clock.AfterFunc(wait, func() { s.stopWaiting(w, ErrQueueTimeout) })
	s.waitInLine(w)
	held := !s.admits(traits) && !s.lookingUp
	if held {
		s.watchGateIfHeld()
	}
	s.mu.Unlock()
	if held {
		cfg.Events.Held()
	}

	select {
	case <-w.ready:
	case <-ctx.Done():
		s.stopWaiting(w, ctx.Err())
	}
	stop()
	if w.err == nil && ctx.Err() != nil {
		// Our turn came as the client left: never forward, pass the slot on.
		Turn{s: s, traits: traits &^ CarriesInitialized, overtake: w.overtake}.release()
		return Turn{}, ctx.Err()
	}
	waited := s.table.clock.Now().Sub(start)
	if w.err != nil {
		return Turn{waited: waited, held: held}, w.err // for logs only
	}
	return Turn{s: s, traits: traits, overtake: w.overtake, waited: waited, held: held}, nil
}

// ID returns the session id. It is a credential: hash it before logging.
func (s *Session) ID() string { return s.id }
