package mcpstub

import (
	"net/http"
	"slices"
	"sync"
	"time"
)

// Seen is one HTTP request as the Backend received it.
type Seen struct {
	Seq        int       // arrival order, from 1
	At         time.Time // arrival
	Done       time.Time // handler return; zero while still running
	HTTPMethod string
	SessionID  string // Mcp-Session-Id as received; "" for none
	// NewSessionID is the id the Backend assigned when this request was an
	// initialize that created a session.
	NewSessionID string
	Messages     []SeenMessage // JSON-RPC messages of a POST body, in order
	Status       int           // HTTP status answered; 0 while still running
}

// SeenMessage is one JSON-RPC message of a received POST body.
type SeenMessage struct {
	Method   string // "" for responses and invalid elements
	ID       string // raw JSON id; "" for notifications
	Response bool   // a JSON-RPC response sent by the client
}

// Methods returns the JSON-RPC methods of the request, in body order.
func (s Seen) Methods() []string {
	out := make([]string, 0, len(s.Messages))
	for _, m := range s.Messages {
		out = append(out, m.Method)
	}
	return out
}

// Has reports whether the request carried a message with the given method.
func (s Seen) Has(method string) bool {
	return slices.ContainsFunc(s.Messages, func(m SeenMessage) bool { return m.Method == method })
}

// SessionStats counts what the Backend did for one session id.
type SessionStats struct {
	Requests int // POST and DELETE requests carrying the id (plus the creating initialize)
	Streams  int // GET streams opened
	Rejected int // requests answered "Client session not initialized."
	InFlight int // POST/DELETE handlers running now
	// MaxInFlight is the most POST/DELETE handlers of the session that ran
	// at once. A serializing proxy in front keeps it at 1. GET streams are
	// not counted: they run beside the session's exchanges by design.
	MaxInFlight int
}

// requestLog is the Backend's observation record. It has its own mutex so
// that observing does not order anything the store would not.
type requestLog struct {
	mu       sync.Mutex
	count    int
	gen      int // bumped by ResetLog; older tracks no longer index entries
	keep     bool
	entries  []Seen
	stats    map[string]*SessionStats
	rejected int
}

// track is the log's handle on one running request.
type track struct {
	idx     int    // index in entries, -1 when entries are not kept
	gen     int    // requestLog.gen when idx was taken
	session string // stats key whose InFlight this request holds, "" for none
}

func newRequestLog(keep bool) *requestLog {
	return &requestLog{keep: keep, stats: make(map[string]*SessionStats)}
}

func (l *requestLog) statsFor(id string) *SessionStats {
	s := l.stats[id]
	if s == nil {
		s = &SessionStats{}
		l.stats[id] = s
	}
	return s
}

func (l *requestLog) begin(method, session string) *track {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.count++
	t := &track{idx: -1, gen: l.gen}
	if l.keep {
		t.idx = len(l.entries)
		l.entries = append(l.entries, Seen{Seq: l.count, At: time.Now(), HTTPMethod: method, SessionID: session})
	}
	if session == "" {
		return t
	}
	s := l.statsFor(session)
	switch method {
	case http.MethodPost, http.MethodDelete:
		s.Requests++
		l.enter(t, session, s)
	case http.MethodGet:
		s.Streams++
	}
	return t
}

func (l *requestLog) enter(t *track, session string, s *SessionStats) {
	t.session = session
	s.InFlight++
	s.MaxInFlight = max(s.MaxInFlight, s.InFlight)
}

func (l *requestLog) messages(t *track, msgs []Message) {
	if t.idx < 0 {
		return
	}
	seen := make([]SeenMessage, len(msgs))
	for i, m := range msgs {
		seen[i] = SeenMessage{Method: m.Method, ID: string(m.ID), Response: m.IsResponse()}
	}
	l.mu.Lock()
	if l.current(t) {
		l.entries[t.idx].Messages = seen
	}
	l.mu.Unlock()
}

// created attributes an initialize request to the session it created, so the
// initialize exchange counts towards that session's overlap.
func (l *requestLog) created(t *track, id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.current(t) {
		l.entries[t.idx].NewSessionID = id
	}
	s := l.statsFor(id)
	s.Requests++
	l.enter(t, id, s)
}

// current reports whether t still indexes an entry (caller holds mu).
func (l *requestLog) current(t *track) bool { return t.idx >= 0 && t.gen == l.gen }

func (l *requestLog) reject(session string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rejected++
	if session != "" {
		l.statsFor(session).Rejected++
	}
}

func (l *requestLog) end(t *track, status int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.current(t) {
		if status == 0 {
			status = http.StatusOK
		}
		l.entries[t.idx].Done = time.Now()
		l.entries[t.idx].Status = status
	}
	if t.session != "" {
		l.stats[t.session].InFlight--
	}
}

// Requests returns a copy of every request received so far, in arrival
// order. It is empty when DisableRequestLog is set.
func (b *Backend) Requests() []Seen {
	l := b.observer()
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Seen, len(l.entries))
	for i, e := range l.entries {
		e.Messages = slices.Clone(e.Messages)
		out[i] = e
	}
	return out
}

// Count returns the number of HTTP requests received so far.
func (b *Backend) Count() int {
	l := b.observer()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.count
}

// Rejected returns how many requests, over all sessions, were answered
// "Client session not initialized.".
func (b *Backend) Rejected() int {
	l := b.observer()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rejected
}

// Stats returns the counters of one session id (zero if never seen).
func (b *Backend) Stats(sessionID string) SessionStats {
	l := b.observer()
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := l.stats[sessionID]; s != nil {
		return *s
	}
	return SessionStats{}
}

// AllStats returns the counters of every session id seen so far.
func (b *Backend) AllStats() map[string]SessionStats {
	l := b.observer()
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]SessionStats, len(l.stats))
	for id, s := range l.stats {
		out[id] = *s
	}
	return out
}

// MaxInFlight returns the largest MaxInFlight over all sessions: 1 when every
// session's POST/DELETE exchanges were strictly one at a time.
func (b *Backend) MaxInFlight() int {
	l := b.observer()
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.stats {
		n = max(n, s.MaxInFlight)
	}
	return n
}

// ResetLog forgets the received requests and all counters. Sessions stay.
func (b *Backend) ResetLog() {
	l := b.observer()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.count, l.rejected = 0, 0
	l.entries = nil
	l.gen++
	for id, s := range l.stats {
		// Running handlers still hold InFlight; keep it so end() balances.
		l.stats[id] = &SessionStats{InFlight: s.InFlight}
	}
}
