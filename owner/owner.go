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
	"crypto/sha256"
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

// IDFor returns the ID of the session table named table on the instance
// named name: the same at each of its starts, so that the sessions its
// upstream keeps in memory come back to it after its restart, and
// another for each table, whose sessions another upstream holds.
func IDFor(name, table string) string {
	sum := sha256.Sum256([]byte("mcp_serializer instance\x00" + name + "\x00" + table))
	return hex.EncodeToString(sum[:8])
}

// Gone is the owner Route names, with pinned sessions (SetPinned), for a
// session whose instance's lease has lapsed and whose address is unknown:
// only that instance's upstream held the session, so nobody can serve it
// now.
var Gone = Owner{ID: "gone"}

// lapsedPinned routes a pinned session whose instance's lease has lapsed:
// to its last address, since it may live on, cut off from the engine
// (the caller answers Gone if nothing answers there as that instance),
// or Gone if that is unknown.
func (d *Directory) lapsedPinned(id, addr string) (Owner, bool, bool) {
	if addr == "" {
		return Gone, false, false
	}
	return Owner{ID: id, Addr: addr}, true, false
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
	// record me owns lives life more (0: one session's life).
	Claim(ctx context.Context, id, me string, life time.Duration) (owner string, err error)
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
// a front that keeps a session on one instance costs no engine call. An
// owner is alive while its lease stands (Membership): a session is taken
// over only from an owner whose lease lapsed, never because one dial
// failed.
type Directory struct {
	self     string // this instance's ID
	members  *Membership
	maxKnown int
	ttl      atomic.Int64 // session_ttl, in ns: SetTTL
	now      func() time.Time

	takeovers atomic.Int64
	pinned    atomic.Bool // see SetPinned
	// How this instance marks its long exchanges (markAfter, markLife).
	markAfter, markLife time.Duration

	mu    sync.Mutex
	known map[string]known // by session id
	// trials: the keys remembered on trial, oldest first (some may have
	// been promoted or dropped since), the only entries a key on trial
	// may displace.
	trials   []string
	learning map[string]*lookupCall // lookups in flight, by session id
	refused  map[string]string      // by session id: see refusedBy
}

// lookupCall is one lookup of a session's owner, which the requests of
// the session arriving meanwhile wait for rather than ask again: a client
// sends notifications/initialized and its next requests at once.
type lookupCall struct {
	done    chan struct{}
	owner   Owner
	ok      bool
	waiters int // requests waiting for it; guarded by Directory.mu
	// abandoned: the request asking left before the answer.
	abandoned bool
}

type known struct {
	owner   Owner
	learned time.Time
	// tookOver: this instance took the session over and has not yet seen
	// the previous owner's running mark gone (AwaitPrevious).
	tookOver bool
	// epoch: the lease epoch (Membership.Current) in which this instance
	// last knew the session its own.
	epoch uint64
	key   bool // a key's queue
	// trial: a key this instance claimed for keyTrialLife (RouteKey), or
	// one another instance owns: an entry cheap to learn again, which
	// never pushes another out of a full directory.
	trial bool
}

// NewDirectory returns the directory of the instance members names. It
// remembers up to maxKnown sessions' owners, each for ttl after it learned
// it (the session's life).
func NewDirectory(members *Membership, maxKnown int, ttl time.Duration, now func() time.Time) *Directory {
	if now == nil {
		now = time.Now
	}
	d := &Directory{
		self: members.Self(), members: members, maxKnown: max(maxKnown, 1), now: now,
		markAfter: markAfter, markLife: markLife,
		known: map[string]known{}, learning: map[string]*lookupCall{}, refused: map[string]string{},
	}
	d.SetTTL(ttl)
	return d
}

// Self is this instance's ID.
func (d *Directory) Self() string { return d.self }

// SetTTL is told the session_ttl of a config being loaded: a reload may
// shorten it, and a key's owner must claim again within its record's
// life.
func (d *Directory) SetTTL(ttl time.Duration) { d.ttl.Store(int64(ttl)) }

func (d *Directory) sessionTTL() time.Duration { return time.Duration(d.ttl.Load()) }

// SetPinned is told whether sessions live in their instance's own
// upstream (one in-memory replica per instance): then a session is never
// taken over, since no other upstream knows it, and once its instance's
// lease has lapsed Route still sends it to that instance's last address
// (lapsedPinned).
func (d *Directory) SetPinned(pinned bool) { d.pinned.Store(pinned) }

// Members is this instance's membership.
func (d *Directory) Members() *Membership { return d.members }

// Created records that this instance, reached at addr, owns a session it
// has just created. The Store learns it with the session's record.
func (d *Directory) Created(id, addr string) {
	d.members.SetAddr(addr)
	d.remember(id, Owner{ID: d.self, Addr: addr})
}

// Route says where a request of session id goes: forward true, to the
// owner returned; false, served here (this instance owns the session or
// has just taken it over, or the Store does not know the session). wait
// true: neither can be decided now (the owner's lease stands but a
// takeover or lookup got no answer); the caller tries again shortly.
// named is the instance the client's session id names (SplitOwner), ""
// for none: a live instance named there is the owner, with no lookup, so
// routing holds while the Store has lost or never had the record. here is
// the address at which this request reached this instance, recorded if it
// takes the session over ("" for none: it then serves the request without
// taking the session over).
func (d *Directory) Route(ctx context.Context, s Store, id, named, here string) (o Owner, forward, wait bool) {
	o, ok := d.lookup(id)
	refused := named != "" && d.refusedBy(id) == named
	if refused {
		named = "" // it answered that it does not serve the session
	}
	if named != "" && (!ok || o.ID == named) {
		if named == d.self {
			if ok {
				return o, false, false
			}
			// Not known here as ours (it aged out, or the client wrote
			// this instance's ID itself): the record says whose it is.
			named = ""
		}
	}
	if named != "" && (!ok || o.ID == named) {
		// Only an instance whose lease the last listing showed: an id
		// naming one the cluster never knew is routed by its record,
		// never by the id, and so is one that handed its sessions over.
		addr, listed := d.members.Listed(named)
		if !listed {
			d.members.RefreshStale(ctx) // it may have started since the last listing
			addr, listed = d.members.Listed(named)
		}
		if listed {
			return Owner{ID: named, Addr: addr}, true, false
		}
	}
	if !ok {
		var found bool
		if o, found = d.learn(ctx, id, d.remember, func(ctx context.Context) (string, bool, error) { return s.Owner(ctx, id) }); !found {
			// No record (the engine restarted empty, or was down when
			// the session began): a named instance whose lease may
			// still stand keeps it, and one whose lease lapsed (it
			// stopped or died) is replaced by the first instance to
			// claim the session, so that the others forward to it.
			live, addr := Unknown, ""
			if named != "" {
				live, addr = d.members.Status(named)
			}
			if d.pinned.Load() && named != "" {
				// Only the named instance's upstream holds the session:
				// never served here, nor claimed. An instance never
				// listed is not noticed (liveness would): ids a client
				// made up must not fill the members.
				if live == Unknown {
					d.members.RefreshStale(ctx)
					live, addr = d.members.Status(named)
				}
				switch live {
				case Alive:
					if addr != "" {
						return Owner{ID: named, Addr: addr}, true, false
					}
				case Lapsed:
					return d.lapsedPinned(named, addr)
				}
				return Owner{}, false, true
			}
			switch c, claims := s.(Claimer); {
			case live == Alive && addr != "":
				return Owner{ID: named, Addr: addr}, true, false
			case (live == Lapsed || refused) && claims:
				return d.claimLost(ctx, c, id, here)
			}
			return Owner{}, false, false
		}
	}
	return d.routeTo(ctx, s, id, o, here, false)
}

// RouteKey is Route for a key's queue, which has no record until an
// instance claims it: the first instance to meet the key owns it, for
// keyTrialLife only until the upstream has answered one of its requests
// (KeyAnswered), so that a flood of made-up values leaves nothing in the
// engine for long. The owner claims it again, which keeps its record
// alive, once half a session's life has passed since it last did, whether
// its requests arrive directly or forwarded.
func (d *Directory) RouteKey(ctx context.Context, s Claimer, id, here string) (o Owner, forward, wait bool) {
	if here == "" {
		return Owner{}, false, false
	}
	d.members.SetAddr(here)
	k, known := d.entry(id)
	if known && !(k.trial && k.owner.ID == d.self) {
		return d.routeKeyTo(ctx, s, id, k.owner, here)
	}
	// Claimed again at each request while on trial: its claim lapses in
	// the engine keyTrialLife after the last, and another instance may
	// have claimed it since.
	me := Owner{ID: d.self, Addr: here}
	keep := func(id string, o Owner) { d.rememberKey(id, o, true) }
	o, ok := d.learn(ctx, id, keep, func(ctx context.Context) (string, bool, error) {
		rec, err := s.Claim(ctx, id, me.String(), keyTrialLife)
		return rec, err == nil, err
	})
	if !ok {
		if known && !d.claimHolds(k) {
			// Its claim here has lapsed and the engine did not say
			// whether another instance claimed it since.
			return Owner{}, false, true
		}
		return Owner{}, false, false
	}
	return d.routeKeyTo(ctx, s, id, o, here)
}

// routeKeyTo is routeTo for a key: one this instance takes over from a
// lapsed owner is kept on trial, so that its next requests claim it again
// (the record lives only as long as the previous owner's last claim).
func (d *Directory) routeKeyTo(ctx context.Context, s Store, id string, o Owner, here string) (Owner, bool, bool) {
	o, forward, wait := d.routeTo(ctx, s, id, o, here, true)
	if !forward && !wait && o.ID == d.self {
		d.mu.Lock()
		if k, ok := d.known[id]; ok && !k.key {
			k.key, k.trial = true, true
			d.put(id, k)
		}
		d.mu.Unlock()
	}
	return o, forward, wait
}

// claimHolds reports whether this instance's claim on key k, made when it
// was learned, still stands in the engine: its trial claim lives
// keyTrialLife from then (less a second for the way there).
func (d *Directory) claimHolds(k known) bool {
	return !k.trial || d.now().Sub(k.learned) < keyTrialLife-time.Second
}

// keyTrialLife is how long a key's claim lives before the upstream has
// answered one of its requests.
const keyTrialLife = 30 * time.Second

// KeyAnswered is told that the upstream answered a request of key id
// served here with a 2xx: the claim is made to last a session's life the
// first time, and renewed once half of it has passed.
func (d *Directory) KeyAnswered(ctx context.Context, s Claimer, id, here string) {
	k, ok := d.entry(id)
	if ok && (k.owner.ID != d.self || !k.trial && d.now().Sub(k.learned) < d.sessionTTL()/2) {
		return
	}
	if here == "" {
		here = d.members.Addr()
	}
	if here == "" {
		return
	}
	rec, err := s.Claim(ctx, id, Owner{ID: d.self, Addr: here}.String(), 0)
	if o, parsed := Parse(rec); err == nil && parsed {
		d.rememberKey(id, o, o.ID != d.self)
	}
}

// ReclaimKeys claims again every key this instance owns, at once: called
// when the engine forgot this instance's lease, and so the keys' records,
// since a key has no id that names its owner and the others would route
// it by its hash meanwhile.
func (d *Directory) ReclaimKeys(ctx context.Context, s Claimer) {
	d.mu.Lock()
	mine := map[string]bool{} // on trial
	for id, k := range d.known {
		if k.key && k.owner.ID == d.self {
			mine[id] = k.trial
		}
	}
	d.mu.Unlock()
	for id, trial := range mine {
		if ctx.Err() != nil {
			return
		}
		life := time.Duration(0) // a session's
		if trial {
			life = keyTrialLife
		}
		rec, err := s.Claim(ctx, id, Owner{ID: d.self, Addr: d.members.Addr()}.String(), life)
		if o, parsed := Parse(rec); err == nil && parsed {
			d.rememberKey(id, o, trial || o.ID != d.self)
		}
	}
}

// rememberKey remembers key id's owner; trial: claimed for keyTrialLife.
func (d *Directory) rememberKey(id string, o Owner, trial bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	k := known{owner: o, learned: d.now(), epoch: d.members.Epoch(), key: true, trial: trial}
	if old, ok := d.known[id]; ok && old.owner == o {
		k.tookOver = old.tookOver // its previous owner's exchange may still run
	}
	d.put(id, k)
}

// routeTo says where a request goes whose session (or key) o owns: the
// zero Owner for a record that names none (its owner handed it over).
func (d *Directory) routeTo(ctx context.Context, s Store, id string, o Owner, here string, key bool) (Owner, bool, bool) {
	if o.ID == d.self {
		return o, false, false
	}
	if o.ID == "" {
		return d.takeOver(ctx, s, id, o, here, key)
	}
	live, addr := d.liveness(ctx, o.ID)
	if live == Lapsed {
		// Seen lapsed on a listing made now, not one from before its
		// owner could renew.
		d.members.Refresh(ctx)
		if live, addr = d.members.Status(o.ID); live == Lapsed {
			if d.pinned.Load() && !key {
				return d.lapsedPinned(o.ID, addr)
			}
			return d.takeOver(ctx, s, id, o, here, key)
		}
	}
	if live != Alive {
		// Never listed: what answers at its recorded address may be
		// anything, so nothing is sent there. It is taken over once it
		// has been seen absent for the lock delay.
		return Owner{}, false, true
	}
	return Owner{ID: o.ID, Addr: addr}, true, false // where its lease says
}

// liveness is what this instance knows of owner id's lease, listing the
// members once more if it never saw id: a session created elsewhere a
// moment ago names an instance that started since the last listing.
func (d *Directory) liveness(ctx context.Context, id string) (Liveness, string) {
	live, addr := d.members.Status(id)
	if live == Unknown {
		d.members.RefreshStale(ctx)
		if live, addr = d.members.Status(id); live == Unknown {
			return d.members.Noticed(id), ""
		}
	}
	return live, addr
}

// learn asks for session id's owner with ask, once for all the session's
// requests that arrive while it asks, and keeps what it learned with
// keep. found: the record exists (o is the zero Owner if it names none).
func (d *Directory) learn(ctx context.Context, id string, keep func(id string, o Owner), ask func(context.Context) (owner string, found bool, err error)) (o Owner, found bool) {
	d.mu.Lock()
	for c := d.learning[id]; c != nil; c = d.learning[id] {
		c.waiters++
		d.mu.Unlock()
		select {
		case <-c.done:
		case <-ctx.Done():
			return Owner{}, false
		}
		if !c.abandoned {
			return c.owner, c.ok
		}
		// The request that asked left before the answer: ask again, as
		// its client's leaving says nothing of the session's owner.
		d.mu.Lock()
	}
	c := &lookupCall{done: make(chan struct{})}
	d.learning[id] = c
	d.mu.Unlock()

	rec, found, err := ask(ctx)
	c.abandoned = err != nil && ctx.Err() != nil
	if err == nil && found {
		c.ok = true
		if o, ok := Parse(rec); ok {
			c.owner = o
			keep(id, o)
		}
	}
	d.mu.Lock()
	delete(d.learning, id)
	d.mu.Unlock()
	close(c.done)
	return c.owner, c.ok
}

// Unreachable is told that a request forwarded to o did not reach it:
// refused or timed out before it was sent. What is known of the session
// is dropped, so that the next Route reads its record again: o may have
// handed it over or been taken over; while o's lease stands, the request
// waits.
func (d *Directory) Unreachable(id string, o Owner) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if k, ok := d.known[id]; ok && k.owner == o {
		delete(d.known, id)
	}
}

// NotOwner is told that o answered that it does not serve session id: as
// Unreachable, and a client's id naming o no longer sends the session
// there.
func (d *Directory) NotOwner(id string, o Owner) {
	d.Unreachable(id, o)
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.refused) >= d.maxKnown {
		for other := range d.refused {
			delete(d.refused, other)
			break
		}
	}
	d.refused[id] = o.ID
}

// refusedBy is the instance that last answered that it does not serve
// session id, so that a client's id naming it does not send the session
// back there; "" for none.
func (d *Directory) refusedBy(id string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.refused[id]
}

func (d *Directory) takeOver(ctx context.Context, s Store, id string, from Owner, here string, key bool) (Owner, bool, bool) {
	if here == "" {
		return Owner{}, false, false // no address to be reached at: served here, not recorded
	}
	d.members.SetAddr(here)
	me := Owner{ID: d.self, Addr: here}
	fromRec := ""
	if from.ID != "" {
		fromRec = from.String()
	}
	rec, found, err := s.TakeOver(ctx, id, fromRec, me.String())
	if err != nil {
		// The takeover may or may not have been applied: ask again.
		d.Forget(id)
		return Owner{}, false, true
	}
	o, ok := Parse(rec)
	if !found || !ok {
		// No record (it expired, or the engine restarted empty): served
		// here, and asked again next time.
		d.Forget(id)
		return Owner{}, false, false
	}
	// Known as taken over from the same moment as known, so that no
	// request of the session can skip AwaitPrevious.
	d.rememberTakenOver(id, o, o == me)
	if o == me {
		d.takeovers.Add(1)
		return o, false, false
	}
	return d.routeTo(ctx, s, id, o, here, key)
}

// claimLost makes this instance the owner of session id, whose record is
// gone and whose owner's lease lapsed, unless another instance claimed it
// first; it says where the request goes, as Route does.
func (d *Directory) claimLost(ctx context.Context, c Claimer, id, here string) (Owner, bool, bool) {
	if here == "" {
		return Owner{}, false, false
	}
	d.members.SetAddr(here)
	me := Owner{ID: d.self, Addr: here}
	rec, err := c.Claim(ctx, id, me.String(), 0)
	if err != nil {
		return Owner{}, false, true
	}
	o, ok := Parse(rec)
	if !ok {
		return Owner{}, false, true
	}
	d.remember(id, o)
	if o == me {
		d.takeovers.Add(1)
		return o, false, false
	}
	return d.routeTo(ctx, c, id, o, here, false)
}

// Release hands every session this instance owns over: each record then
// names no owner, so that the next instance to meet the session takes it
// over at once, without waiting for this one's lease to lapse. Called
// once this instance has finished what it had queued and running.
func (d *Directory) Release(ctx context.Context, s Store) (released int) {
	d.mu.Lock()
	var mine []string
	for id, k := range d.known {
		if k.owner.ID == d.self {
			mine = append(mine, id)
			mine = append(mine, k.owner.String())
		}
	}
	d.mu.Unlock()
	work := make(chan [2]string)
	var wg sync.WaitGroup
	var n atomic.Int64
	for range min(releaseWorkers, len(mine)/2) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for w := range work {
				if rec, found, err := s.TakeOver(ctx, w[0], w[1], ""); err == nil && found && rec == "" {
					n.Add(1)
				}
			}
		}()
	}
	for i := 0; i+1 < len(mine) && ctx.Err() == nil; i += 2 {
		work <- [2]string{mine[i], mine[i+1]}
	}
	close(work)
	wg.Wait()
	return int(n.Load())
}

// releaseWorkers is how many sessions Release hands over at once.
const releaseWorkers = 16

// Confirm is asked before an exchange of session id goes upstream from
// this instance. If this instance owns the session but its lease lapsed
// since it last knew that (it was frozen, or cut off from the engine
// while the others were not), it reads who owns the session now and
// answers false if another instance does (the session is known as
// theirs from then on) or if that cannot be read. A session known as
// another's was routed here before this instance learned that (a request
// queued before it found the session taken over): it is routed again as
// Route would, from here, the address the request reached this instance
// at, and false unless it is to be served here: taken over from a lapsed
// owner (then checked as this instance's own), or served without a
// takeover where here is "". Otherwise true, at the cost of no engine
// call.
func (d *Directory) Confirm(ctx context.Context, s Store, id, here string) bool {
	k, ok := d.entry(id)
	if ok && k.owner.ID != d.self {
		var forward, wait bool
		if k.key {
			_, forward, wait = d.routeKeyTo(ctx, s, id, k.owner, here)
		} else {
			_, forward, wait = d.routeTo(ctx, s, id, k.owner, here, false)
		}
		if forward || wait {
			return false
		}
		if k, ok = d.entry(id); ok && k.owner.ID != d.self {
			return true // served without a takeover, as Route serves it
		}
	}
	epoch, lapsedAt, sure := d.members.Current(ctx)
	if !sure {
		// Paused, and the engine has not said since whether its lease
		// lapsed: another instance may serve the session now.
		return false
	}
	if ok && k.epoch >= epoch || !ok && epoch == 0 {
		return true
	}
	if !ok {
		// Not known here any more (aged out or evicted) after a lapse:
		// read it as if it were ours.
		k = known{owner: Owner{ID: d.self, Addr: d.members.Addr()}}
	}
	if wait := d.members.VerifyAfter(lapsedAt).Sub(d.now()); wait > 0 {
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return false
		}
	}
	// Taking it over from itself both reads and keeps it: false only if
	// another instance took it over meanwhile.
	rec, found, err := s.TakeOver(ctx, id, k.owner.String(), k.owner.String())
	if err != nil {
		return false
	}
	o, parsed := Parse(rec)
	if found && parsed && o.ID != d.self {
		d.remember(id, o)
		return false
	}
	d.mu.Lock()
	if k, ok := d.known[id]; ok {
		k.epoch = epoch
		d.known[id] = k
	}
	d.mu.Unlock()
	return true
}

// Serves reports whether this instance serves a request forwarded to the
// owner named ownerID: only if that is this instance and it has not
// learned that another took the session over.
func (d *Directory) Serves(ctx context.Context, s Store, id, ownerID string) bool {
	if ownerID != d.self {
		return false
	}
	k, ok := d.entry(id)
	o := k.owner
	if ok && k.trial && o.ID == d.self {
		// A key on trial: its claim may have lapsed and another instance
		// claimed it since, or it is kept for keyTrialLife more.
		c, claims := s.(Claimer)
		if !claims {
			return true
		}
		rec, err := c.Claim(ctx, id, o.String(), keyTrialLife)
		if err != nil {
			return d.claimHolds(k)
		}
		if now, parsed := Parse(rec); parsed && now.ID != d.self {
			d.rememberKey(id, now, true)
			return false
		}
		return true
	}
	if !ok {
		// Not known here (aged out, or a client wrote the header): the
		// record says.
		var found bool
		o, found = d.learn(ctx, id, d.remember, func(ctx context.Context) (string, bool, error) { return s.Owner(ctx, id) })
		// Without a record, a session this instance does not know may
		// live on the instance its client's other id names.
		return found && (o.ID == "" || o.ID == d.self)
	}
	return o.ID == d.self
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
	if d.now().Sub(k.learned) >= d.sessionTTL() {
		delete(d.known, id)
		return known{}, false
	}
	return k, true
}

func (d *Directory) remember(id string, o Owner) { d.rememberTakenOver(id, o, false) }

func (d *Directory) rememberTakenOver(id string, o Owner, tookOver bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.put(id, known{owner: o, learned: d.now(), tookOver: tookOver, epoch: d.members.Epoch()})
}

// put remembers k for id, d.mu held. When the directory is full the
// oldest key on trial goes first; a key on trial never displaces anything
// else (it is then claimed again at its next request), so that a flood of
// made-up key values cannot push out what a session taken over or served
// here needs. Otherwise one entry goes, whichever the map yields first;
// it costs one engine call if its session comes back.
func (d *Directory) put(id string, k known) {
	old, ok := d.known[id]
	if !ok && len(d.known) >= d.maxKnown && !d.evictTrial() {
		if k.trial {
			return
		}
		for other := range d.known {
			delete(d.known, other)
			break
		}
	}
	d.known[id] = k
	if k.trial && !(ok && old.trial) {
		d.trials = append(d.trials, id)
		if len(d.trials) > 2*d.maxKnown {
			kept := d.trials[:0]
			for _, t := range d.trials {
				if e, ok := d.known[t]; ok && e.trial {
					kept = append(kept, t)
				}
			}
			d.trials = kept
		}
	}
}

// evictTrial drops the oldest key on trial, d.mu held; false if none.
func (d *Directory) evictTrial() bool {
	for len(d.trials) > 0 {
		id := d.trials[0]
		d.trials = d.trials[1:]
		if k, ok := d.known[id]; ok && k.trial && !k.tookOver {
			delete(d.known, id)
			return true
		}
	}
	return false
}
