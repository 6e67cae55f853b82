package serializer

import (
	"errors"
	"time"
)

// ErrSessionDropped answers the requests that were waiting in a session an
// operator dropped (Table.Drop).
var ErrSessionDropped = errors.New("session was dropped by an operator")

// Waited returns how long the request waited for its turn, in the queue or
// at the gate; 0 when it went straight through. After Acquire failed, it
// is how long the request waited before it was answered.
func (t Turn) Waited() time.Duration { return t.waited }

// Held reports whether the request waited at the initialization gate for
// notifications/initialized.
func (t Turn) Held() bool { return t.held }

// GateState is a session's initialization gate, as operators see it.
type GateState string

// Gate states.
const (
	GateInitializing GateState = "initializing" // held until initialized is acknowledged
	GateOpen         GateState = "open"
	GateRejecting    GateState = "rejecting" // init_timeout passed with on_init_timeout reject
)

func (g gateState) public() GateState {
	switch g {
	case gateInitializing:
		return GateInitializing
	case gateRejecting:
		return GateRejecting
	}
	return GateOpen
}

// SessionStatus is one session at one moment, for operators.
type SessionStatus struct {
	ID        string // a credential: hash it before showing it
	Gate      GateState
	InFlight  bool // an exchange holds the session's turn
	Streaming bool // and its response is an event stream
	Waiting   int  // requests queued or held at the gate
	Age       time.Duration
	Idle      time.Duration // since a request last entered or left
}

// TableStatus counts a table's sessions by state.
type TableStatus struct {
	Sessions     int
	Initializing int
	Open         int
	Rejecting    int
	InFlight     int // sessions with an exchange in flight
	Streaming    int // of which streaming
	Waiting      int // sessions with requests waiting
	WaitingTotal int // requests waiting, all sessions
}

// Inspect calls each with every session, least recently used first (stuck
// sessions come early), and returns the counts. Sessions change meanwhile:
// each is read consistently, the whole is not one instant.
func (t *Table) Inspect(each func(SessionStatus)) TableStatus {
	now := t.clock.Now()
	var sum TableStatus
	for _, u := range t.snapshot() {
		st := u.s.status(now, u.lastUsed)
		sum.Sessions++
		switch st.Gate {
		case GateInitializing:
			sum.Initializing++
		case GateRejecting:
			sum.Rejecting++
		default:
			sum.Open++
		}
		if st.InFlight {
			sum.InFlight++
		}
		if st.Streaming {
			sum.Streaming++
		}
		if st.Waiting > 0 {
			sum.Waiting++
			sum.WaitingTotal += st.Waiting
		}
		if each != nil {
			each(st)
		}
	}
	return sum
}

func (s *Session) status(now time.Time, lastUsed int64) SessionStatus {
	s.mu.Lock()
	st := SessionStatus{
		ID:        s.id,
		Gate:      s.gate.public(),
		InFlight:  s.slot != slotFree,
		Streaming: s.slot == slotStreaming,
		Waiting:   len(s.waiting),
	}
	s.mu.Unlock()
	st.Age = now.Sub(s.created)
	st.Idle = now.Sub(time.Unix(0, lastUsed))
	return st
}

// Busy reports whether requests of session (or key) id are held here:
// waiting for their turn, upstream, or at its gate.
func (t *Table) Busy(id string) bool {
	t.mu.Lock()
	s, ok := t.sessions[id]
	t.mu.Unlock()
	return ok && s.refs.Load() > 0
}

// Gated reports whether session id is known here and waiting for its
// notifications/initialized.
func (t *Table) Gated(id string) bool {
	t.mu.Lock()
	s, ok := t.sessions[id]
	t.mu.Unlock()
	if !ok {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.awaitsInitialized()
}
