package serializer

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
)

// Table tracks sessions by id. It is safe for concurrent use, and is
// reconfigured in place so that sessions outlive a config reload.
type Table struct {
	clock  Clock
	cfg    atomic.Pointer[Config]
	mu     sync.Mutex // guards get-or-create and eviction decisions
	lru    *lru.Cache[string, *Session]
	stop   chan struct{}
	closed sync.WaitGroup

	// With a Store: when the last round of Touch began (unix nanoseconds,
	// guarded by mu), and whether one is still running.
	touchedAt int64
	touching  atomic.Bool
}

// NewTable returns a table with its janitor running; Close stops it.
func NewTable(cfg Config) *Table {
	t := &Table{clock: cfg.Clock, stop: make(chan struct{})}
	if t.clock == nil {
		t.clock = systemClock{}
	}
	t.touchedAt = t.clock.Now().UnixNano()
	// The cache never evicts by itself: add makes room first, skipping
	// sessions in use, so the callback has nothing to do.
	t.lru, _ = lru.NewWithEvict[string, *Session](max(cfg.MaxSessions, 1), nil)
	t.Configure(cfg)
	t.closed.Add(1)
	go t.janitor()
	return t
}

// Configure applies new limits to the table and its live sessions.
func (t *Table) Configure(cfg Config) {
	if cfg.Events == nil {
		cfg.Events = noEvents{}
	}
	cfg.Clock = t.clock
	t.mu.Lock()
	defer t.mu.Unlock()
	if old := t.cfg.Load(); old != nil && old.MaxSessions > cfg.MaxSessions {
		t.evictDownTo(cfg.MaxSessions)
	}
	t.lru.Resize(max(cfg.MaxSessions, t.lru.Len(), 1))
	t.cfg.Store(&cfg)
}

func (t *Table) config() *Config { return t.cfg.Load() }

// Close stops the janitor. Sessions keep working; nothing expires.
func (t *Table) Close() {
	select {
	case <-t.stop:
	default:
		close(t.stop)
	}
	t.closed.Wait()
}

// Len returns the number of sessions tracked.
func (t *Table) Len() int { return t.lru.Len() }

// Acquire waits for the request's turn in session id, tracking the session
// if it is unknown: queue only, no gate, or, with a Store, as its record
// says (see AcquireFrom).
func (t *Table) Acquire(ctx context.Context, id string, traits Traits) (Turn, error) {
	return t.AcquireFrom(ctx, id, traits, nil)
}

// AcquireFrom is Acquire for a request that can supply, through src, the
// sender of the Synthesize action should its session be adopted gated.
//
// With a Store, the first request for an id unknown here has the record
// looked up, once: the new session holds its own slot meanwhile, so that
// requests arriving in between queue in arrival order. A record still
// initializing makes the session gated, with what is left of its
// init_timeout; anything else (open, missing, or no answer within
// StoreTimeout) leaves it queue only. A session known here never costs a
// Store call per request.
func (t *Table) AcquireFrom(ctx context.Context, id string, traits Traits, src SynthSource) (Turn, error) {
	s := t.ref(id, true)
	turn, err := s.enter(ctx, traits, src)
	if err != nil {
		s.unref()
	}
	return turn, err
}

// AcquireSynthesized waits for the turn of a notifications/initialized
// sent on the client's behalf (the Synthesize action), as Acquire with
// CarriesInitialized does. If the gate opened while it waited (the
// client's own initialized was acknowledged), sending it again is not
// needed: the turn is released and ErrAlreadyInitialized returned.
func (t *Table) AcquireSynthesized(ctx context.Context, id string) (Turn, error) {
	turn, err := t.Acquire(ctx, id, CarriesInitialized)
	if err != nil {
		return turn, err
	}
	s := turn.s
	s.mu.Lock()
	open := s.gate == gateOpen
	s.mu.Unlock()
	if open {
		turn.release()
		s.unref()
		return Turn{}, ErrAlreadyInitialized
	}
	return turn, nil
}

// WaitGate waits until session id may stream to its client: at once unless
// the session is still initializing. Without a Store an unknown session
// is not tracked; with one it is looked up as by Acquire.
func (t *Table) WaitGate(ctx context.Context, id string) error {
	s := t.ref(id, t.config().Store != nil)
	if s == nil {
		return nil
	}
	defer s.unref()
	return s.waitGate(ctx)
}

// Begin registers a session the upstream has just created, gated until
// notifications/initialized is acknowledged. The returned turn holds the
// session's slot for the rest of the initialize exchange. synth, used by
// the Synthesize action, sends notifications/initialized upstream through
// Acquire and reports its success. ok is false if id was known already.
//
// Call it before the session id reaches the client: with a Store, Begin
// writes the session's record (Created) before it returns, so that no
// follow-up can reach another instance first. It waits at most
// StoreTimeout for that, and a failed write only leaves the session
// unknown elsewhere.
func (t *Table) Begin(id string, synth func(context.Context) bool) (turn Turn, ok bool) {
	cfg := t.config()
	t.mu.Lock()
	if t.lru.Contains(id) {
		t.mu.Unlock()
		return Turn{}, false
	}
	// Filled in before it is published: Inspect may read it at once.
	s := t.newSession(id)
	s.refs.Add(1)
	s.inFlight = true // the initialize exchange's
	s.sessionBegun(synth, cfg.InitTimeout)
	t.add(s)
	t.mu.Unlock()
	if cfg.Store != nil {
		// Outside the table lock: other sessions must not wait on the
		// store. The slot is held, so none of this session's can go.
		deadline := t.clock.Now().Add(cfg.InitTimeout)
		ctx, cancel := context.WithTimeout(context.Background(), cfg.StoreTimeout)
		_ = cfg.Store.Created(ctx, id, deadline)
		cancel()
	}
	return Turn{s: s, begins: true}, true
}

// ref finds (or, with create, makes) session id and counts a reference,
// under the table lock so eviction never takes a session being entered.
// A session made here with a Store starts its lookup.
func (t *Table) ref(id string, create bool) *Session {
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.lru.Get(id)
	if !ok {
		if !create {
			return nil
		}
		s = t.newSession(id)
		store := t.config().Store
		if store != nil {
			// The lookup's own reference and slot: s must not be evicted
			// meanwhile, and requests arriving in between queue.
			s.refs.Add(1)
			s.inFlight = true
			s.lookupStarted()
		}
		t.add(s)
		if store != nil {
			go s.adopt(store)
		}
	}
	s.refs.Add(1)
	s.lastUsed.Store(t.clock.Now().UnixNano())
	return s
}

func (t *Table) newSession(id string) *Session {
	s := &Session{table: t, id: id, created: t.clock.Now()}
	s.lastUsed.Store(s.created.UnixNano())
	return s
}

// add publishes a new session, first evicting least recently used idle ones
// until there is room: more than one when the table grew past MaxSessions
// while its sessions were busy. Caller holds t.mu.
func (t *Table) add(s *Session) {
	limit := t.config().MaxSessions
	t.evictDownTo(limit - 1)
	if t.lru.Len() >= limit {
		// Every session is in use: grow rather than drop one with waiters.
		t.lru.Resize(t.lru.Len() + 1)
	}
	t.lru.Add(s.id, s)
}

// evictDownTo evicts idle sessions until at most n are tracked or none
// is idle. Caller holds t.mu.
func (t *Table) evictDownTo(n int) {
	for t.lru.Len() > n && t.evictOne() {
	}
}

// evictOne forgets the least recently used idle session. Sessions in use
// met on the way count as used now. It reports whether one was evicted.
// Caller holds t.mu.
func (t *Table) evictOne() bool {
	for range t.lru.Len() {
		id, s, ok := t.lru.GetOldest()
		if !ok {
			return false
		}
		if !s.idle() {
			t.lru.Get(id) // in use: move to the recent end
			continue
		}
		t.lru.Remove(id)
		t.config().Events.Evicted()
		return true
	}
	return false
}

// drop forgets s if it is still the table's session for its id.
func (t *Table) drop(s *Session) {
	t.mu.Lock()
	if cur, ok := t.lru.Peek(s.id); ok && cur == s {
		t.lru.Remove(s.id)
	}
	t.mu.Unlock()
	s.endedUpstream()
}

// Drop forgets session id at an operator's request and answers every
// request waiting in it, queued or held at the gate, with
// ErrSessionDropped. An exchange in flight is left to finish; the id's
// next request starts afresh as an unknown session (queue only, no gate).
// With a Store, the session's record goes too: otherwise the next request
// would adopt the stuck gate again. It returns the number of requests
// answered, and false if id was not tracked.
func (t *Table) Drop(id string) (answered int, ok bool) {
	t.mu.Lock()
	s, ok := t.lru.Peek(id)
	if ok {
		t.lru.Remove(id)
	}
	t.mu.Unlock()
	if !ok {
		return 0, false
	}
	return s.droppedByOperator(), true
}

// Sweep forgets sessions idle for longer than SessionTTL and, with a
// Store, refreshes the records of sessions used lately (see touchRecords).
// The janitor calls it periodically; tests call it directly.
func (t *Table) Sweep() {
	cfg := t.config()
	cutoff := t.clock.Now().Add(-cfg.SessionTTL).UnixNano()
	t.mu.Lock()
	defer t.mu.Unlock()
	if cfg.Store != nil {
		t.touchRecords(cfg)
	}
	for range t.lru.Len() {
		id, s, ok := t.lru.GetOldest()
		if !ok {
			return
		}
		switch {
		case !s.idle():
			t.lru.Get(id) // in use: not idle
		case s.lastUsed.Load() < cutoff:
			t.lru.Remove(id)
		default:
			return // the rest were used more recently
		}
	}
}

func (t *Table) janitor() {
	defer t.closed.Done()
	for {
		// Re-read the TTL each round: a reload may have changed it.
		wait := time.NewTimer(sweepInterval(t.config().SessionTTL))
		select {
		case <-t.stop:
			wait.Stop()
			return
		case <-wait.C:
			t.Sweep()
		}
	}
}

// sweepInterval checks a few times per TTL, within [1s, 1m].
func sweepInterval(ttl time.Duration) time.Duration {
	return min(max(ttl/4, time.Second), time.Minute)
}
