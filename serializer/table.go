package serializer

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Table tracks sessions by id. It is safe for concurrent use, and is
// reconfigured in place so that sessions outlive a config reload.
//
// Each tracked session is in one of three lists, so that finding, adding,
// evicting or expiring a session costs the same however many are tracked:
// busy (a request holds it: waiting, in flight or at the gate), idle open
// (least recently used first) and idle gated (initializing with no request
// holding it: the initialize exchange is over and the client has not sent
// notifications/initialized yet; oldest first). A session moves when its
// count of requests goes between 0 and 1, or when the gate of an idle
// gated session opens. Both idle lists are in the order of lastUsed.
type Table struct {
	clock  Clock
	cfg    atomic.Pointer[Config]
	stop   chan struct{}
	closed sync.WaitGroup

	// mu guards sessions, the lists, and each session's refs, tracked and
	// list links. Lock order: mu, then a session's mu; never the reverse.
	mu        sync.Mutex
	sessions  map[string]*Session
	busy      sessionList
	idleOpen  sessionList
	idleGated sessionList

	// With a Store: when the last round of Touch began (unix nanoseconds,
	// guarded by mu), and whether one is still running.
	touchedAt int64
	touching  atomic.Bool
}

// NewTable returns a table with its janitor running; Close stops it.
func NewTable(cfg Config) *Table {
	t := &Table{clock: cfg.Clock, stop: make(chan struct{}), sessions: map[string]*Session{}}
	if t.clock == nil {
		t.clock = systemClock{}
	}
	t.touchedAt = t.clock.Now().UnixNano()
	t.Configure(cfg)
	t.closed.Add(1)
	go t.janitor()
	return t
}

// Configure applies new limits to the table and its live sessions. A
// smaller MaxSessions evicts idle sessions at once, as a new session
// would (see Saturated).
func (t *Table) Configure(cfg Config) {
	if cfg.Events == nil {
		cfg.Events = noEvents{}
	}
	cfg.Clock = t.clock
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cfg.Store(&cfg)
	t.evictDownTo(cfg.MaxSessions)
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
func (t *Table) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.sessions)
}

// Saturated reports whether a new session would make the table grow past
// MaxSessions: it holds that many or more and none is idle, that is,
// every one has a request waiting, in flight or at the gate. A new
// session then still gets in (the table grows rather than drop a session
// with a request); the caller may refuse it first.
//
// Every session-less POST asks, so the usual answer takes no lock: a
// saturated table has at least MaxSessions busy sessions.
func (t *Table) Saturated() bool {
	limit := t.config().MaxSessions
	if t.busy.len.Load() < int64(limit) {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.sessions) >= limit && t.idleOpen.len.Load() == 0 && t.idleGated.len.Load() == 0
}

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
	return t.AcquireInLine(ctx, id, Line{}, traits, src)
}

// A Line is the queue of a key (AcquireKeyed) that requests of several
// sessions share, so that they go upstream one at a time: a backend may
// keep all of a user's sessions in one record.
type Line struct {
	Key string // "" for none, unless Admit names one
	// Admit, if set, decides, once the request's session's turn has
	// come, which line it joins instead of Key ("" for none): a
	// credential the backend refused joins no line, so that nobody holds
	// a user's line with a name alone, and one whose user is known only
	// once it is proven joins that user's. Its wait counts against
	// QueueTimeout through ctx's deadline, but not in the turn's Waited.
	Admit func(ctx context.Context) (key string, err error)
}

// AcquireInLine is AcquireFrom for a request that also waits in line. The
// request joins the line once its session's turn has come, so each
// session keeps its own order and gate, and no request waits in the line
// for a gate. One that overtakes in its session (a reply its stream waits
// for) neither waits in the line nor is admitted. QueueTimeout bounds the
// waits together. An empty line is AcquireFrom.
func (t *Table) AcquireInLine(ctx context.Context, id string, line Line, traits Traits, src SynthSource) (Turn, error) {
	return t.takeTurn(ctx, t.ref(id, true), line, traits, src, 0)
}

// takeTurn waits for a request's turn in s, which it holds a reference to,
// then in line unless it has none, for what spent left of QueueTimeout.
// The references are dropped unless a turn is returned.
func (t *Table) takeTurn(ctx context.Context, s *Session, line Line, traits Traits, src SynthSource, spent time.Duration) (Turn, error) {
	cfg := t.config()
	turn, err := s.enter(ctx, traits, src, cfg.QueueTimeout-spent)
	if err != nil {
		s.unref()
		return turn, err
	}
	if (line.Key != "" || line.Admit != nil) && !turn.overtake {
		if turn, err = t.joinLine(ctx, turn, line, cfg.QueueTimeout-spent); err != nil {
			return turn, err
		}
	}
	cfg.Events.Waited(turn.waited)
	return turn, nil
}

// joinLine waits in line for what is left of wait once turn's request has
// waited in its session and been admitted. On error the session's turn is
// given back.
func (t *Table) joinLine(ctx context.Context, turn Turn, line Line, wait time.Duration) (Turn, error) {
	wait -= turn.waited
	if line.Admit != nil {
		start := t.clock.Now()
		admitCtx, cancel := context.WithTimeout(ctx, wait)
		key, err := line.Admit(admitCtx)
		cancel()
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
				err = ErrQueueTimeout
			}
			turn.giveBack()
			return Turn{waited: turn.waited, held: turn.held}, err
		}
		if line.Key = key; key == "" {
			return turn, nil
		}
		wait -= t.clock.Now().Sub(start)
	}
	l := t.refKey(line.Key)
	inLine, err := l.enter(ctx, 0, nil, wait)
	turn.waited += inLine.waited
	if err != nil {
		l.unref()
		turn.giveBack()
		return Turn{waited: turn.waited, held: turn.held}, err
	}
	turn.line = l
	return turn, nil
}

// AcquireKeyed waits for the request's turn in the queue of key, a value
// the caller derives from a request (an MCP 2026-07-28 handle, or a
// credential): one at a time per key, in arrival order, with a session's
// bounds; never gated, and never looked up in the Store, since no
// instance creates a record for it. Keys share the table, and
// MaxSessions, with sessions: the caller keeps the two apart (no session
// id can equal a key it makes).
func (t *Table) AcquireKeyed(ctx context.Context, key string, traits Traits) (Turn, error) {
	return t.AcquireKeyedAfter(ctx, key, traits, 0)
}

// AcquireKeyedAfter is AcquireKeyed for a request that waited spent before
// it (for its credential's proof): QueueTimeout bounds the two waits
// together.
func (t *Table) AcquireKeyedAfter(ctx context.Context, key string, traits Traits, spent time.Duration) (Turn, error) {
	return t.takeTurn(ctx, t.refKey(key), Line{}, traits, nil, spent)
}

// Now is the time on the table's clock, which its waits are timed by: a
// caller that waits before them times its wait by it too.
func (t *Table) Now() time.Time { return t.clock.Now() }

// AcquireAside is AcquireKeyed for work the caller does beside the
// requests, such as proving a credential before its requests join a
// line: its wait is not a request's, and Events do not see it.
func (t *Table) AcquireAside(ctx context.Context, key string) (Turn, error) {
	s := t.refKey(key)
	turn, err := s.enter(ctx, 0, nil, t.config().QueueTimeout)
	if err != nil {
		s.unref()
	}
	return turn, err
}

// AcquireSynthesized waits for the turn of a notifications/initialized
// sent on the client's behalf (the Synthesize action), as AcquireInLine
// with CarriesInitialized does. If the gate opened while it waited (the
// client's own initialized was acknowledged), sending it again is not
// needed: the turn is given back and ErrAlreadyInitialized returned.
func (t *Table) AcquireSynthesized(ctx context.Context, id string, line Line) (Turn, error) {
	turn, err := t.AcquireInLine(ctx, id, line, CarriesInitialized, nil)
	if err != nil {
		return turn, err
	}
	s := turn.s
	s.mu.Lock()
	open := s.gate == gateOpen
	s.mu.Unlock()
	if open {
		turn.giveBack()
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
	return t.BeginOwned(id, "", synth)
}

// BeginOwned is Begin for a session whose Store record names owner.
func (t *Table) BeginOwned(id, owner string, synth func(context.Context) bool) (turn Turn, ok bool) {
	cfg := t.config()
	t.mu.Lock()
	if _, known := t.sessions[id]; known {
		t.mu.Unlock()
		return Turn{}, false
	}
	// Filled in before it is published: Inspect may read it at once.
	s := t.newSession(id)
	s.initializeBegan()
	s.sessionBegun(synth, cfg.InitTimeout)
	t.add(s)
	t.hold(s)
	t.mu.Unlock()
	if cfg.Store != nil {
		// Outside the table lock: other sessions must not wait on the
		// store. The slot is held, so none of this session's can go.
		deadline := t.clock.Now().Add(cfg.InitTimeout)
		ctx, cancel := context.WithTimeout(context.Background(), cfg.StoreTimeout)
		if os, ok := cfg.Store.(OwnerStore); ok && owner != "" {
			_ = os.CreatedOwned(ctx, id, deadline, owner)
		} else {
			_ = cfg.Store.Created(ctx, id, deadline)
		}
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
	s := t.sessions[id]
	if s == nil {
		if !create {
			return nil
		}
		s = t.newSession(id)
		store := t.config().Store
		if store != nil {
			// The lookup holds its own slot, so that requests arriving
			// meanwhile queue, and its own reference until it ends.
			s.lookupHoldsSlot()
			s.lookupStarted()
		}
		t.add(s)
		if store != nil {
			t.hold(s)
			go s.adopt(store)
		}
	}
	t.hold(s)
	s.lastUsed.Store(t.clock.Now().UnixNano())
	return s
}

// refKey finds or makes the queue of key and counts a reference, without
// a lookup: a key is queue only.
func (t *Table) refKey(key string) *Session {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.sessions[key]
	if s == nil {
		s = t.newSession(key)
		s.keyed = true
		t.add(s)
	}
	t.hold(s)
	s.lastUsed.Store(t.clock.Now().UnixNano())
	return s
}

func (t *Table) newSession(id string) *Session {
	s := &Session{table: t, id: id, created: t.clock.Now()}
	s.lastUsed.Store(s.created.UnixNano())
	return s
}

// add publishes s, filled in already, first making room for it (see
// evictDownTo). Its caller holds a reference at once. Caller holds t.mu.
func (t *Table) add(s *Session) {
	t.evictDownTo(t.config().MaxSessions - 1)
	t.sessions[s.id] = s
	s.tracked = true
}

// hold counts a reference to s: a busy session is never evicted nor
// expires. Caller holds t.mu.
func (t *Table) hold(s *Session) {
	if s.refs.Add(1) == 1 && s.tracked {
		if s.list != nil {
			s.list.remove(s)
		}
		t.busy.pushBack(s)
	}
}

// unref drops a reference to s; the last one makes s idle, gated if its
// gate still waits for notifications/initialized, or forgets s if it has
// ended upstream.
func (s *Session) unref() {
	t := s.table
	// Not the last: s stays busy, and the table lock is not needed.
	for n := s.refs.Load(); n > 1; n = s.refs.Load() {
		if s.refs.CompareAndSwap(n, n-1) {
			s.lastUsed.Store(t.clock.Now().UnixNano())
			return
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	s.lastUsed.Store(t.clock.Now().UnixNano())
	if s.refs.Add(-1) > 0 || !s.tracked {
		return
	}
	s.mu.Lock()
	gated, ended := s.awaitsInitialized(), s.gone
	s.mu.Unlock()
	if ended {
		t.untrack(s) // ended upstream (endedUpstream); nothing of it runs now
		return
	}
	t.busy.remove(s)
	if gated {
		t.idleGated.pushBack(s)
	} else {
		t.idleOpen.pushBack(s)
	}
}

// gateSettled moves s to the idle open list if it is idle gated and its
// gate no longer waits for notifications/initialized (init_timeout acted
// while no request held it). The move counts as a use, which keeps the
// list in the order of lastUsed.
func (t *Table) gateSettled(s *Session) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s.list != &t.idleGated {
		return
	}
	s.mu.Lock()
	gated := s.awaitsInitialized()
	s.mu.Unlock()
	if !gated {
		t.idleGated.remove(s)
		s.lastUsed.Store(t.clock.Now().UnixNano())
		t.idleOpen.pushBack(s)
	}
}

// evictDownTo evicts idle sessions until at most n are tracked or none is
// idle: the least recently used idle open one first, else the oldest
// idle gated one. When every session is busy the table grows past
// MaxSessions instead, bounded by the requests in flight, which hold a
// connection and a goroutine each anyway; it shrinks back as they end.
// Caller holds t.mu.
func (t *Table) evictDownTo(n int) {
	events := t.config().Events
	for len(t.sessions) > n {
		gated := false
		s := t.idleOpen.head
		if s == nil {
			s, gated = t.idleGated.head, true
		}
		if s == nil {
			return
		}
		t.untrack(s)
		s.forgottenWhileIdle()
		events.Evicted(gated)
	}
}

// untrack forgets s. Caller holds t.mu.
func (t *Table) untrack(s *Session) {
	delete(t.sessions, s.id)
	s.tracked = false
	if s.list != nil {
		s.list.remove(s)
	}
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
	s, ok := t.sessions[id]
	if ok {
		t.untrack(s)
	}
	t.mu.Unlock()
	if !ok {
		return 0, false
	}
	return s.droppedByOperator(), true
}

// Sweep forgets idle open sessions unused for longer than SessionTTL, at a
// cost in the number it forgets; a gated one never expires (it goes by
// eviction or at init_timeout). With a Store it also refreshes the
// records of sessions used lately (see touchRecords). The janitor calls
// it periodically; tests call it directly.
func (t *Table) Sweep() {
	cfg := t.config()
	cutoff := t.clock.Now().Add(-cfg.SessionTTL).UnixNano()
	t.mu.Lock()
	defer t.mu.Unlock()
	if cfg.Store != nil {
		t.touchRecords(cfg)
	}
	for s := t.idleOpen.head; s != nil && s.lastUsed.Load() < cutoff; s = t.idleOpen.head {
		t.untrack(s)
		s.forgottenWhileIdle()
	}
}

// snapshot copies the tracked sessions and when each was last used, least
// recently used first: under the table lock only the copy, the order
// after it.
func (t *Table) snapshot() []usedSession {
	t.mu.Lock()
	out := make([]usedSession, 0, len(t.sessions))
	for _, l := range []*sessionList{&t.idleOpen, &t.idleGated, &t.busy} {
		for s := l.head; s != nil; s = s.next {
			out = append(out, usedSession{s, s.lastUsed.Load()})
		}
	}
	t.mu.Unlock()
	slices.SortStableFunc(out, func(a, b usedSession) int { return cmp.Compare(a.lastUsed, b.lastUsed) })
	return out
}

type usedSession struct {
	s        *Session
	lastUsed int64 // unix nanoseconds
}

// sessionList is an intrusive doubly linked list of sessions, through
// their prev and next. Guarded by the table's mu; len may be read
// without it.
type sessionList struct {
	head, tail *Session
	len        atomic.Int64
}

func (l *sessionList) pushBack(s *Session) {
	s.list, s.prev, s.next = l, l.tail, nil
	if l.tail != nil {
		l.tail.next = s
	} else {
		l.head = s
	}
	l.tail = s
	l.len.Add(1)
}

func (l *sessionList) remove(s *Session) {
	if s.prev != nil {
		s.prev.next = s.next
	} else {
		l.head = s.next
	}
	if s.next != nil {
		s.next.prev = s.prev
	} else {
		l.tail = s.prev
	}
	s.list, s.prev, s.next = nil, nil, nil
	l.len.Add(-1)
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
