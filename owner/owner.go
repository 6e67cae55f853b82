// Package owner knows which instance serves each session when several
// Caddy instances share a state engine: the instance that created the
// session owns it, the others forward its requests there, and an owner
// that cannot be reached is replaced by the instance that noticed. Order
// and the initialization gate stay where they are proven, on one
// instance: the owner's session table.
//
// It is pure Go; the state engine records owners (Store) and the Caddy
// module forwards requests.
package owner

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Owner is an instance as the state engine records it: ID names one
// session table in one running Caddy (a restarted Caddy has a new one, so
// it never serves a session it lost), Addr is host:port where the other
// instances reach it.
type Owner struct {
	ID, Addr string
}

// String is the owner as recorded: its ID, a space, its address.
func (o Owner) String() string { return o.ID + " " + o.Addr }

// Parse reads a recorded owner; false for anything else (a record
// written before owners were recorded has none).
func Parse(s string) (Owner, bool) {
	id, addr, ok := strings.Cut(s, " ")
	if !ok || id == "" || addr == "" || strings.ContainsAny(addr, " /") {
		return Owner{}, false
	}
	return Owner{ID: id, Addr: addr}, true
}

// NewID returns a fresh instance ID: 64 random bits in hex.
func NewID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// Store is where owners are recorded: with each session's record in the
// state engine. Calls are bounded by the store.
type Store interface {
	// Owner reads the owner recorded for session id: "" when its record
	// names none, found false when there is no record.
	Owner(ctx context.Context, id string) (owner string, found bool, err error)
	// TakeOver records to as the owner of session id if from still is
	// (or none is), atomically, and returns the owner recorded then: to,
	// or whoever took the session over first.
	TakeOver(ctx context.Context, id, from, to string) (owner string, found bool, err error)
}

// Claimer is a Store that also records owners for queues that have no
// record of their own: those of the key setting.
type Claimer interface {
	Store
	// Claim records me as the owner of id unless one is, creating its
	// record if there is none, and returns the owner recorded then; a
	// record me owns lives one session's life more.
	Claim(ctx context.Context, id, me string) (owner string, err error)
}

// RunningStore marks a session's record while its owner's exchange runs
// long, so that an instance taking the session over waits for it: a
// PHP-FPM worker finishes its script even after its client is gone.
type RunningStore interface {
	// MarkRunning records that me's exchange of session id runs for life
	// more, or clears me's mark when life is 0.
	MarkRunning(ctx context.Context, id, me string, life time.Duration) error
	// RunningFor reads how long the mark says an exchange still runs.
	RunningFor(ctx context.Context, id string) (time.Duration, error)
}

// How an owner marks its long exchanges: from markAfter into an
// exchange, for markLife at a time, renewed every markLife/3. A mark
// that is not renewed (its instance died) lapses within markLife.
const (
	markAfter = time.Second
	markLife  = 5 * time.Second
)

// Directory is one instance's view of who owns which session: asked of
// the Store the first time the instance meets a session, then kept, so
// a front that keeps a session on one instance costs no engine call.
type Directory struct {
	self     string // this instance's ID
	maxKnown int
	ttl      time.Duration
	downFor  time.Duration
	now      func() time.Time

	takeovers atomic.Int64
	// How this instance marks its long exchanges (markAfter, markLife).
	markAfter, markLife time.Duration

	mu       sync.Mutex
	known    map[string]known       // by session id
	down     map[string]time.Time   // owners that did not answer, until when
	learning map[string]*lookupCall // lookups in flight, by session id
}

// lookupCall is one lookup of a session's owner, which the requests of
// the session arriving meanwhile wait for rather than ask again: a client
// sends notifications/initialized and its next requests at once.
type lookupCall struct {
	done    chan struct{}
	owner   Owner
	ok      bool
	waiters int // requests waiting for it; guarded by Directory.mu
}

type known struct {
	owner   Owner
	learned time.Time
	// tookOver: this instance took the session over and has not yet seen
	// the previous owner's running mark gone (AwaitPrevious).
	tookOver bool
}

// maxDown bounds the owners remembered as unreachable.
const maxDown = 1024

// NewDirectory returns the directory of the instance named self. It
// remembers up to maxKnown sessions' owners, each for ttl after it learned
// it (the session's life), and an owner that did not answer for downFor:
// meanwhile the sessions it owns are taken over without trying it again.
func NewDirectory(self string, maxKnown int, ttl, downFor time.Duration, now func() time.Time) *Directory {
	if now == nil {
		now = time.Now
	}
	return &Directory{
		self: self, maxKnown: max(maxKnown, 1), ttl: ttl, downFor: downFor, now: now,
		markAfter: markAfter, markLife: markLife,
		known: map[string]known{}, down: map[string]time.Time{}, learning: map[string]*lookupCall{},
	}
}

// Self is this instance's ID.
func (d *Directory) Self() string { return d.self }

// Created records that this instance, reached at addr, owns a session it
// has just created. The Store learns it with the session's record.
func (d *Directory) Created(id, addr string) {
	d.remember(id, Owner{ID: d.self, Addr: addr})
}

// Route says where a request of session id goes: forward true, to the
// owner returned; false, served here (this instance owns the session, or
// no owner can be learned: the Store does not know the session or does
// not answer). here is the address at which this request reached this
// instance, recorded if it takes the session over ("" for none: it then
// serves the request without taking the session over).
func (d *Directory) Route(ctx context.Context, s Store, id, here string) (Owner, bool) {
	o, ok := d.lookup(id)
	if !ok {
		if o, ok = d.learn(ctx, id, func(ctx context.Context) (string, bool, error) { return s.Owner(ctx, id) }); !ok {
			return Owner{}, false
		}
	}
	return d.routeTo(ctx, s, id, o, here)
}

// RouteKey is Route for a key's queue, which has no record until an
// instance claims it: the first instance to meet the key owns it. The
// owner claims it again, which keeps its record alive, once half a
// session's life has passed since it last did, and never serves it on
// older knowledge than that.
func (d *Directory) RouteKey(ctx context.Context, s Claimer, id, here string) (Owner, bool) {
	if here == "" {
		return Owner{}, false
	}
	k, ok := d.entry(id)
	if ok && (k.owner.ID != d.self || d.now().Sub(k.learned) < d.ttl/2) {
		return d.routeTo(ctx, s, id, k.owner, here)
	}
	me := Owner{ID: d.self, Addr: here}.String()
	o, ok := d.learn(ctx, id, func(ctx context.Context) (string, bool, error) {
		rec, err := s.Claim(ctx, id, me)
		return rec, err == nil, err
	})
	if !ok {
		return Owner{}, false
	}
	return d.routeTo(ctx, s, id, o, here)
}

// routeTo says where a request goes whose session (or key) o owns.
func (d *Directory) routeTo(ctx context.Context, s Store, id string, o Owner, here string) (Owner, bool) {
	if o.ID == d.self {
		return o, false
	}
	if d.isDown(o) {
		return d.takeOver(ctx, s, id, o, here)
	}
	return o, true
}

// learn asks for session id's owner with ask, once for all the session's
// requests that arrive while it asks.
func (d *Directory) learn(ctx context.Context, id string, ask func(context.Context) (owner string, found bool, err error)) (Owner, bool) {
	d.mu.Lock()
	if c := d.learning[id]; c != nil {
		c.waiters++
		d.mu.Unlock()
		select {
		case <-c.done:
			return c.owner, c.ok
		case <-ctx.Done():
			return Owner{}, false
		}
	}
	c := &lookupCall{done: make(chan struct{})}
	d.learning[id] = c
	d.mu.Unlock()

	rec, found, err := ask(ctx)
	if err == nil && found {
		c.owner, c.ok = Parse(rec)
	}
	if c.ok {
		d.remember(id, c.owner)
	}
	d.mu.Lock()
	delete(d.learning, id)
	d.mu.Unlock()
	close(c.done)
	return c.owner, c.ok
}

// Unreachable is told that a request forwarded to o did not reach it as
// owner: refused or timed out before it was sent (dialFailed), or o
// answered that it does not serve session id. It takes the session over,
// unless another instance did first, and says where the request goes now,
// as Route does. An owner whose dial failed is not tried again for
// downFor, for any session.
func (d *Directory) Unreachable(ctx context.Context, s Store, id string, o Owner, here string, dialFailed bool) (Owner, bool) {
	if dialFailed {
		d.markDown(o)
	}
	return d.takeOver(ctx, s, id, o, here)
}

func (d *Directory) takeOver(ctx context.Context, s Store, id string, from Owner, here string) (Owner, bool) {
	if here == "" {
		return Owner{}, false // no address to be reached at: served here, not recorded
	}
	me := Owner{ID: d.self, Addr: here}
	rec, found, err := s.TakeOver(ctx, id, from.String(), me.String())
	o, ok := Parse(rec)
	if err != nil || !found || !ok {
		// Unknown: served here, and asked again next time.
		d.Forget(id)
		return Owner{}, false
	}
	// Known as taken over from the same moment as known, so that no
	// request of the session can skip AwaitPrevious.
	d.rememberTakenOver(id, o, o == me)
	if o == me {
		d.takeovers.Add(1)
	}
	if o.ID == d.self || d.isDown(o) {
		return o, false
	}
	return o, true
}

// Serves reports whether this instance serves a request forwarded to the
// owner named ownerID: only if that is this instance and it has not
// learned that another took the session over.
func (d *Directory) Serves(id, ownerID string) bool {
	if ownerID != d.self {
		return false
	}
	o, ok := d.lookup(id)
	return !ok || o.ID == d.self
}

// ExchangeBegan is told that an exchange of session id begins here; the
// returned function, that it ended. If this instance owns the session and
// the exchange runs past markAfter, the session's record is marked as
// running until it ends, so that an instance taking the session over
// meanwhile waits for it (AwaitPrevious). A short exchange costs a timer,
// and nothing ever waits for the marks to be written. store is asked for
// the Store at each mark: a reload may replace it while the exchange runs.
func (d *Directory) ExchangeBegan(store func() RunningStore, id string) (ended func()) {
	k, ok := d.entry(id)
	if !ok || k.owner.ID != d.self {
		return func() {}
	}
	me := k.owner.String()
	mark := func(life time.Duration) {
		s := store()
		if s == nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), d.markLife/3)
		defer cancel()
		_ = s.MarkRunning(ctx, id, me, life) // a mark not made lapses within markLife
	}
	stop := make(chan struct{})
	timer := time.AfterFunc(d.markAfter, func() {
		for {
			mark(d.markLife)
			select {
			case <-stop:
				mark(0)
				return
			case <-time.After(d.markLife / 3):
			}
		}
	})
	return func() {
		close(stop)
		timer.Stop()
	}
}

// AwaitPrevious holds the first exchange of a session this instance took
// over while its record says the previous owner's exchange still runs,
// until the mark is gone or lapses, deadline passes (false: the exchange
// may still run), or ctx ends (false). Other sessions, and this one once
// the mark is gone, cost nothing. A Store that does not answer is not
// waited for. store is asked for the Store at each read, as in
// ExchangeBegan.
func (d *Directory) AwaitPrevious(ctx context.Context, store func() RunningStore, id string, deadline time.Time) bool {
	for {
		k, ok := d.entry(id)
		if !ok || !k.tookOver || k.owner.ID != d.self {
			return true
		}
		s := store()
		if s == nil {
			return true
		}
		left, err := s.RunningFor(ctx, id)
		if ctx.Err() != nil {
			return false
		}
		if err != nil || left <= 0 {
			d.previousEnded(id)
			return true
		}
		wait := min(left, awaitPoll)
		if !d.now().Add(wait).Before(deadline) {
			return false
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return false
		}
	}
}

// awaitPoll is how often AwaitPrevious reads the mark: the previous
// owner clears it when its exchange ends.
const awaitPoll = 500 * time.Millisecond

// previousEnded records that the previous owner's exchange of id is over.
func (d *Directory) previousEnded(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if k, ok := d.known[id]; ok {
		k.tookOver = false
		d.known[id] = k
	}
}

// Forget drops what is known of session id (it ended).
func (d *Directory) Forget(id string) {
	d.mu.Lock()
	delete(d.known, id)
	d.mu.Unlock()
}

// TakeOvers counts the sessions this instance has taken over.
func (d *Directory) TakeOvers() int64 { return d.takeovers.Load() }

// Known counts the sessions whose owner this instance knows.
func (d *Directory) Known() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.known)
}

func (d *Directory) lookup(id string) (Owner, bool) {
	k, ok := d.entry(id)
	return k.owner, ok
}

// entry is what is known of id's owner, and since when.
func (d *Directory) entry(id string) (known, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	k, ok := d.known[id]
	if !ok {
		return known{}, false
	}
	if d.now().Sub(k.learned) >= d.ttl {
		delete(d.known, id)
		return known{}, false
	}
	return k, true
}

func (d *Directory) remember(id string, o Owner) { d.rememberTakenOver(id, o, false) }

func (d *Directory) rememberTakenOver(id string, o Owner, tookOver bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.known[id]; !ok && len(d.known) >= d.maxKnown {
		// Full: one entry goes, whichever the map yields first; it costs
		// one engine call if its session comes back.
		for other := range d.known {
			delete(d.known, other)
			break
		}
	}
	d.known[id] = known{owner: o, learned: d.now(), tookOver: tookOver}
}

func (d *Directory) markDown(o Owner) {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.now()
	if len(d.down) >= maxDown {
		for k, until := range d.down {
			if !now.Before(until) {
				delete(d.down, k)
			}
		}
		if len(d.down) >= maxDown {
			clear(d.down)
		}
	}
	d.down[o.String()] = now.Add(d.downFor)
}

func (d *Directory) isDown(o Owner) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	until, ok := d.down[o.String()]
	if ok && !d.now().Before(until) {
		delete(d.down, o.String())
		return false
	}
	return ok
}
