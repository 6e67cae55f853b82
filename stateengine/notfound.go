package stateengine

import (
	"hash/maphash"
	"sync"
	"time"
)

// The adapter's memory of keys an engine answered "not found" for, so
// that requests repeating an unknown Mcp-Session-Id (a client retrying a
// session that ended, or one sending made-up ids) do not cost an engine
// call each.
const (
	// notFoundTTL is short: a record is not expected to appear for an id
	// already seen unknown (Created precedes the id reaching any client),
	// and a second is enough to absorb a client's retries.
	notFoundTTL = time.Second
	// notFoundEntries bounds the memory under a flood of unique ids (a
	// few hundred KB); the oldest entry makes room.
	notFoundEntries = 4096
	// notFoundStripes spreads the in-flight Created calls a lookup's
	// answer is checked against over this many groups of keys.
	notFoundStripes = 256
)

// notFoundCache remembers keys answered "not found" for notFoundTTL, at
// most notFoundEntries of them, in O(1) per call. A Created for a key
// drops its entry and keeps any lookup that overlapped it (in the key's
// stripe) from adding one: that answer may predate the write.
type notFoundCache struct {
	mu   sync.Mutex
	seed maphash.Seed
	keys map[string]notFoundEntry
	ring []string // keys in the order added; next is the oldest's slot
	next int

	stripes [notFoundStripes]struct {
		version  uint64 // moves on when a Created for one of its keys ends
		creating int    // Created calls for its keys not yet answered
	}
}

type notFoundEntry struct {
	until time.Time
	slot  int // its place in ring
}

func newNotFoundCache() *notFoundCache {
	return &notFoundCache{seed: maphash.MakeSeed()}
}

func (c *notFoundCache) stripe(key string) int {
	return int(maphash.String(c.seed, key) % notFoundStripes)
}

// has reports whether key was answered "not found" less than notFoundTTL
// ago.
func (c *notFoundCache) has(key string, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.keys[key]
	if ok && !now.Before(e.until) {
		delete(c.keys, key)
		return false
	}
	return ok
}

// version is what add checks a lookup's answer against: take it before
// asking the engine.
func (c *notFoundCache) version(key string) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stripes[c.stripe(key)].version
}

// add remembers key as not found, unless a Created for a key of its
// stripe ended since version was taken or is still in flight.
func (c *notFoundCache) add(key string, version uint64, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st := &c.stripes[c.stripe(key)]; st.version != version || st.creating > 0 {
		return
	}
	if c.keys == nil {
		c.keys = make(map[string]notFoundEntry)
		c.ring = make([]string, notFoundEntries)
	}
	if e, ok := c.keys[key]; ok {
		c.keys[key] = notFoundEntry{now.Add(notFoundTTL), e.slot}
		return
	}
	// The slot's old key goes, unless it was dropped and added again
	// since (then its entry names another slot).
	if old := c.ring[c.next]; old != "" && c.keys[old].slot == c.next {
		delete(c.keys, old)
	}
	c.ring[c.next] = key
	c.keys[key] = notFoundEntry{now.Add(notFoundTTL), c.next}
	c.next = (c.next + 1) % notFoundEntries
}

// drop forgets key's entry.
func (c *notFoundCache) drop(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.keys, key)
}

// creating drops key's entry and holds off entries for its stripe until
// the returned function is called, when the engine's Created answered.
func (c *notFoundCache) creating(key string) (done func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.keys, key)
	st := &c.stripes[c.stripe(key)]
	st.creating++
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		st.creating--
		st.version++
	}
}
