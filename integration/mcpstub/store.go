package mcpstub

import (
	"crypto/rand"
	"encoding/hex"
	"sync"
	"time"
)

// Record is the whole state of one session as a handler sees it. It is a
// plain value: handlers work on their own copy, the way a PHP worker works on
// the array it unserialized from the cache, and the copy that is saved last
// wins.
type Record struct {
	ID              string
	ProtocolVersion string
	ClientName      string
	Initialized     bool
	LogLevel        string
	// Handled counts the messages processed for the session. Being part of
	// the record, it loses increments to concurrent saves like any field.
	Handled int
	Created time.Time
	Saved   time.Time
}

// store is the shared session store (the DB table, Redis or cache file of a
// real deployment). The mutex protects the map only: it makes each load and
// each save atomic, never a whole request, so nothing orders a handler's
// load-work-save against another's.
type store struct {
	mu       sync.Mutex
	sessions map[string]Record
}

func newStore() *store { return &store{sessions: make(map[string]Record)} }

func (s *store) load(id string) (Record, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.sessions[id]
	return r, ok
}

// save writes the whole record back. Like an UPDATE of a row it only touches
// a record that still exists: a session deleted while a handler worked stays
// deleted.
func (s *store) save(r Record) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.sessions[r.ID]; !ok {
		return false
	}
	r.Saved = time.Now()
	s.sessions[r.ID] = r
	return true
}

func (s *store) create(r Record) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r.Created = time.Now()
	r.Saved = r.Created
	s.sessions[r.ID] = r
}

func (s *store) remove(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.sessions[id]
	delete(s.sessions, id)
	return ok
}

func (s *store) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions)
}

// newSessionID returns 32 random hex digits, the shape php-mcp uses.
func newSessionID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b[:])
}
