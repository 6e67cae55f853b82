package mcpstub

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
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
//
// With dir set, records live in that directory, one JSON file per session
// (named by a hash of the id), so that several Backend processes share their
// sessions the way app servers share a database table. Each load and save is
// then atomic by rename, and the race between handlers stays what it is.
type store struct {
	mu       sync.Mutex
	sessions map[string]Record
	dir      string
}

func newStore() *store { return &store{sessions: make(map[string]Record)} }

func newDirStore(dir string) *store { return &store{dir: dir} }

func (s *store) path(id string) string {
	sum := sha256.Sum256([]byte(id))
	return filepath.Join(s.dir, hex.EncodeToString(sum[:16])+".json")
}

func (s *store) load(id string) (Record, bool) {
	if s.dir != "" {
		data, err := os.ReadFile(s.path(id))
		var r Record
		if err != nil || json.Unmarshal(data, &r) != nil {
			return Record{}, false
		}
		return r, true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.sessions[id]
	return r, ok
}

// save writes the whole record back. Like an UPDATE of a row it only touches
// a record that still exists: a session deleted while a handler worked stays
// deleted.
func (s *store) save(r Record) bool {
	if s.dir != "" {
		if _, err := os.Stat(s.path(r.ID)); err != nil {
			return false
		}
		r.Saved = time.Now()
		return s.write(r) == nil
	}
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
	r.Created = time.Now()
	r.Saved = r.Created
	if s.dir != "" {
		_ = s.write(r) // a failed write shows as "Session not found" later
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sessions[r.ID] = r
}

// write replaces the record's file whole, through a temporary file and a
// rename, so that a concurrent load never reads half a record.
func (s *store) write(r Record) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(s.dir, ".tmp-*")
	if err != nil {
		return err
	}
	_, werr := f.Write(data)
	cerr := f.Close()
	if werr != nil || cerr != nil {
		os.Remove(f.Name())
		return os.ErrInvalid
	}
	if err := os.Rename(f.Name(), s.path(r.ID)); err != nil {
		os.Remove(f.Name())
		return err
	}
	return nil
}

func (s *store) remove(id string) bool {
	if s.dir != "" {
		return os.Remove(s.path(id)) == nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.sessions[id]
	delete(s.sessions, id)
	return ok
}

func (s *store) len() int {
	if s.dir != "" {
		entries, _ := os.ReadDir(s.dir)
		n := 0
		for _, e := range entries {
			if strings.HasSuffix(e.Name(), ".json") {
				n++
			}
		}
		return n
	}
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
