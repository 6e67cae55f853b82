package owner

import (
	"context"
	"net"
	"sync"
	"time"
)

// Leases is where instances keep their leases: the state engine. Every
// call is bounded by the engine.
type Leases interface {
	// Renew keeps the lease of instance id, reached at addr, for life
	// more on the engine's clock (Renewal says what it found).
	Renew(ctx context.Context, id, addr string, life time.Duration) (Renewal, error)
	// Drop ends id's lease as if it had lapsed that long ago, marked as
	// ended by its instance (Lease.Dropped).
	Drop(ctx context.Context, id string, lapsed time.Duration) error
	// Members lists the leases, those that lapsed within a day included.
	Members(ctx context.Context) (map[string]Lease, error)
}

// Renewal is what a renewal of a lease found.
type Renewal struct {
	// Epoch is 1 for a new lease, one more each time it had lapsed. An
	// epoch above the last one seen means the lease lapsed in between,
	// even if the answer of the renewal that found it lapsed was lost.
	Epoch uint64
	// Existed false: the engine had no trace of it (it restarted empty,
	// or this is the first).
	Existed bool
	// Holder is the address the lease named before, if it still stood:
	// one other than this instance's says that another instance renewed
	// it since, under the same ID.
	Holder string
}

// Lease is an instance's lease as listed.
type Lease struct {
	Addr string
	// Lapsed is how long ago the lease lapsed; 0 while it stands.
	Lapsed time.Duration
	// Dropped: its instance ended it (Drop), handing its sessions over.
	Dropped bool
}

// How leases are kept. An instance renews its lease every renewEvery, so
// a live instance's lease never lapses while the engine answers it; the
// others take its sessions over only once they have seen its lease absent
// for lockDelay, which a live instance would have used to renew it after
// an engine restart (Chubby's lock-delay).
const (
	LeaseLife  = 3 * time.Second
	renewEvery = time.Second
	lockDelay  = LeaseLife
	// staleAfter: an instance whose last renewal attempt is older than
	// this was frozen (or its loop starved) and renews before it sends
	// anything more upstream.
	staleAfter = 2 * renewEvery
	// verifyDelay: after its lease lapsed, an instance waits this long
	// before it reads who owns its sessions, so that a takeover decided
	// on a listing from before its renewal has landed.
	verifyDelay = time.Second
	// renewRetryEvery spaces the renewals tried while this instance does
	// not know whether its lease stands (see Membership.unsure).
	renewRetryEvery = 100 * time.Millisecond
	// sharedSightings: a renewal that finds the lease renewed from
	// another address tells OnShared if the last that did was at most
	// this many renewals before.
	sharedSightings = 4
)

// Liveness is what an instance knows of another's lease.
type Liveness uint8

const (
	// Unknown: never listed since this instance started (it may run a
	// release without leases, or have died before).
	Unknown Liveness = iota
	// Alive: listed in the last listing, or absent for less than the
	// lock delay.
	Alive
	// Lapsed: absent from the listings for at least the lock delay.
	Lapsed
)

// Membership is one instance's lease and its view of the others'. The
// view lives in memory, refreshed in the background, so that an engine
// outage changes no routing: nobody is seen to lapse while the engine
// answers nobody.
type Membership struct {
	leases                            func() Leases // the running config's engine; nil while none
	now                               func() time.Time
	life, every, delay, stale, verify time.Duration
	mu                                sync.Mutex
	self                              string
	addr                              string
	held                              bool // a renewal has succeeded
	// leaseEpoch is the engine's epoch of the lease at the last renewal.
	leaseEpoch  uint64
	onForgotten func()    // see OnForgotten
	attempt     time.Time // when the last renewal attempt ended, whatever its answer
	// renewedAddr is the address of the last renewal that succeeded;
	// renewals counts them, and sighted is the count at the last that
	// found the lease renewed from another address since.
	renewedAddr string
	renewals    uint64
	sighted     uint64
	// sharedAt and sharedWith: when a renewal last found this lease
	// renewed from another address since (see OnShared), and that address.
	sharedAt   time.Time
	sharedWith string
	onShared   func(addr string)
	// unsure: the last renewal failed a lease's life or more after the
	// attempt before it ended, or was answered that long after it was
	// sent (this instance was paused, or stuck in the call), and none has
	// been answered in time since. Its lease may have lapsed while the
	// others could reach the engine and took its sessions over, so it
	// sends nothing upstream until a renewal tells it. Failures in a
	// steady rhythm (an engine outage for all) leave it sure: nobody can
	// take a session over without the engine.
	unsure   bool
	epoch    uint64    // how many times the lease was found lapsed
	lapsedAt time.Time // when it was last found lapsed
	members  map[string]*member
	// lastListed is when the last listing ended, whatever its answer.
	lastListed time.Time
	listings   int           // listings ended, whatever their answer
	renewing   chan struct{} // closed when the renewal in flight ends; nil for none
	listing    chan struct{} // likewise for a listing

	stop chan struct{}
	done chan struct{}
}

type member struct {
	addr string
	// absent: the last listing did not show it; absentSince is the first
	// listing since that did not, and absentSeen the last.
	absent                  bool
	absentSince, absentSeen time.Time
	listed                  bool // ever listed
}

// NewMembership returns the membership of the instance named self;
// leases gives the engine to keep leases in (nil while there is none).
func NewMembership(self string, leases func() Leases, now func() time.Time) *Membership {
	if now == nil {
		now = time.Now
	}
	return &Membership{
		leases: leases, now: now, self: self,
		life: LeaseLife, every: renewEvery, delay: lockDelay, stale: staleAfter, verify: verifyDelay,
		members: map[string]*member{},
	}
}

// Self is this instance's ID.
func (m *Membership) Self() string { return m.self }

// SetAddr records where the other instances reach this one, sent with the
// next renewal. The first address sticks, except that a loopback address
// gives way to another, since other hosts cannot dial it.
func (m *Membership) SetAddr(addr string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if addr == "" || addr == m.addr || (m.addr != "" && !isLoopback(m.addr)) {
		return
	}
	first := m.addr == ""
	m.addr = addr
	if first && m.stop != nil {
		// Listed at once: the others meet its first session any moment.
		go m.Renew(context.Background())
	}
}

// Addr is where the other instances reach this one; "" until known.
func (m *Membership) Addr() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.addr
}

// Start renews the lease and refreshes the view every renewEvery until
// Stop.
func (m *Membership) Start() {
	m.mu.Lock()
	if m.stop != nil {
		m.mu.Unlock()
		return
	}
	stop, done := make(chan struct{}), make(chan struct{})
	m.stop, m.done = stop, done
	m.mu.Unlock()
	go func() {
		defer close(done)
		t := time.NewTicker(m.every)
		defer t.Stop()
		for {
			m.Renew(context.Background())
			m.Refresh(context.Background())
			select {
			case <-t.C:
			case <-stop:
				return
			}
		}
	}()
}

// Stop ends the background work and, with leases, drops the lease, so
// that the others need not wait for it to lapse.
func (m *Membership) Stop(ctx context.Context, leases Leases) {
	m.mu.Lock()
	stop, done := m.stop, m.done
	m.stop = nil
	m.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
	if leases != nil {
		_ = leases.Drop(ctx, m.self, m.delay)
	}
}

// StopKeeping ends the background work and keeps the lease for life
// more: an instance whose sessions only its own upstream holds, stopping
// to start again, so that the others wait for it rather than give its
// sessions up.
func (m *Membership) StopKeeping(ctx context.Context, leases Leases, life time.Duration) {
	m.Stop(ctx, nil)
	m.mu.Lock()
	addr := m.addr
	m.mu.Unlock()
	if leases != nil && addr != "" {
		_, _ = leases.Renew(ctx, m.self, addr, life)
	}
}

// Renew renews the lease now, or waits for the renewal in flight.
func (m *Membership) Renew(ctx context.Context) {
	end, first := m.join(ctx, &m.renewing)
	if !first {
		return
	}
	defer end()
	m.mu.Lock()
	addr := m.addr
	m.mu.Unlock()

	var r Renewal
	var err error
	l := m.leases()
	began := m.now()
	if l != nil && addr != "" {
		call, cancel := context.WithTimeout(ctx, m.every)
		r, err = l.Renew(call, m.self, addr, m.life)
		cancel()
	}
	epoch, existed := r.Epoch, r.Existed
	forgotten, shared := false, ""

	m.mu.Lock()
	now := m.now()
	// A call begun a lease's life or more after the last one ended, or
	// answered that long after it began, says nothing of the lease now:
	// this instance was paused long enough for it to lapse. Each call is
	// bounded by renewEvery, so that an engine that does not answer
	// anyone (an outage for all) never looks like that.
	paused := m.held && began.Sub(m.attempt) >= m.life
	slow := m.held && now.Sub(began) >= m.life
	late := err != nil && paused || slow
	m.attempt = now
	if err == nil && l != nil && addr != "" {
		m.renewals++
		if m.held && r.Holder != "" && r.Holder != addr && r.Holder != m.renewedAddr {
			// Renewed since from another address (this instance's own
			// last renewal named renewedAddr), and not for the first
			// time lately: two instances under one ID see each other at
			// nearly every renewal, where an engine that went back in
			// time (a failover, a restore) shows an old address once.
			if m.sighted != 0 && m.renewals-m.sighted <= sharedSightings {
				shared, m.sharedAt, m.sharedWith = r.Holder, now, r.Holder
			}
			m.sighted = m.renewals
		}
		m.renewedAddr = addr
	}
	switch {
	case l == nil || addr == "":
	case err != nil:
		// Nobody can take a session over without the engine either,
		// unless this instance alone went without it.
		m.unsure = m.unsure || late
	case m.held && epoch > m.leaseEpoch:
		// It lapsed since the last renewal seen: sessions may have been
		// taken over meanwhile.
		m.unsure = false
		m.epoch++
		m.lapsedAt = m.now()
		m.leaseEpoch = epoch
	default:
		// The first renewal, or the engine forgot every lease (it
		// restarted empty): nobody saw this one lapse.
		forgotten = m.held && !existed
		m.unsure = slow
		if forgotten && (paused || slow) {
			// Forgotten by an engine that restarted while this instance
			// did not run for a lease's life: the others may have seen
			// it absent that long and taken sessions over.
			m.unsure = false
			m.epoch++
			m.lapsedAt = now
		}
		m.held, m.leaseEpoch = true, epoch
	}
	onForgotten, onShared := m.onForgotten, m.onShared
	m.mu.Unlock()
	if forgotten && onForgotten != nil {
		onForgotten()
	}
	if shared != "" && onShared != nil {
		onShared(shared)
	}
}

// OnShared sets what to do when a renewal finds that another instance
// renewed this instance's lease since this one last did, from address
// addr: two instances run under one ID (one instance_name given to both),
// and each takes the other's sessions for its own.
func (m *Membership) OnShared(f func(addr string)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.onShared = f
}

// Shared is when a renewal last found this instance's lease renewed by
// another instance, and that instance's address; the zero time if never.
func (m *Membership) Shared() (at time.Time, addr string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sharedAt, m.sharedWith
}

// OnForgotten sets what to do when a renewal finds that the engine forgot
// this instance's lease (it restarted empty, or failed over and lost
// it): what else it held of this instance is gone too.
func (m *Membership) OnForgotten(f func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.onForgotten = f
}

// join begins a call of which one runs at a time, *running marking the one
// in flight: first false, it waited for the one running (or ctx) instead;
// first true, end must be called when it is over.
func (m *Membership) join(ctx context.Context, running *chan struct{}) (end func(), first bool) {
	m.mu.Lock()
	if c := *running; c != nil {
		m.mu.Unlock()
		select {
		case <-c:
		case <-ctx.Done():
		}
		return nil, false
	}
	c := make(chan struct{})
	*running = c
	m.mu.Unlock()
	return func() {
		m.mu.Lock()
		*running = nil
		m.mu.Unlock()
		close(c)
	}, true
}

// Current makes sure this instance's lease was renewed recently before it
// sends an exchange upstream: an instance that was frozen renews first,
// and learns whether its lease lapsed meanwhile. It returns the lease's
// epoch (how many times it was found lapsed) and when the latest lapse
// was found; sure is false if, after a pause, no renewal succeeded within
// a lease's life (or before ctx ended), so that whether the lease lapsed
// is not known.
func (m *Membership) Current(ctx context.Context) (epoch uint64, lapsedAt time.Time, sure bool) {
	m.mu.Lock()
	stale := m.held && m.now().Sub(m.attempt) >= m.stale
	m.mu.Unlock()
	if stale {
		m.Renew(ctx)
	}
	ctx, cancel := context.WithTimeout(ctx, m.life)
	defer cancel()
	for {
		m.mu.Lock()
		// Still stale: the renewal waited for ended with ctx, not with
		// an answer.
		stale := m.held && m.now().Sub(m.attempt) >= m.stale
		epoch, lapsedAt, sure = m.epoch, m.lapsedAt, !m.unsure && !stale
		m.mu.Unlock()
		if sure {
			return epoch, lapsedAt, true
		}
		select {
		case <-time.After(renewRetryEvery):
		case <-ctx.Done():
			return epoch, lapsedAt, false
		}
		m.Renew(ctx)
	}
}

// Epoch is how many times this instance's lease was found lapsed.
func (m *Membership) Epoch() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.epoch
}

// VerifyAfter is when, after a lapse found at lapsedAt, this instance may
// read who owns its sessions.
func (m *Membership) VerifyAfter(lapsedAt time.Time) time.Time { return lapsedAt.Add(m.verify) }

// Refresh lists the members now, or waits for the listing in flight.
func (m *Membership) Refresh(ctx context.Context) {
	end, first := m.join(ctx, &m.listing)
	if !first {
		return
	}
	defer end()

	var listed map[string]Lease
	var err error
	if l := m.leases(); l != nil {
		call, cancel := context.WithTimeout(ctx, m.every)
		listed, err = l.Members(call)
		cancel()
	}

	m.mu.Lock()
	m.lastListed = m.now()
	m.listings++
	if err == nil && listed != nil {
		m.listed(listed, m.now())
	}
	m.mu.Unlock()
}

// RefreshStale lists the members unless a listing ended less than
// minRelist ago: what a request asks for, so that requests naming
// instances nobody knows cost the engine at most one listing per
// minRelist.
func (m *Membership) RefreshStale(ctx context.Context) {
	m.mu.Lock()
	fresh := m.listings > 0 && m.now().Sub(m.lastListed) < minRelist
	m.mu.Unlock()
	if !fresh {
		m.Refresh(ctx)
	}
}

// minRelist spaces the listings requests ask for.
const minRelist = 250 * time.Millisecond

// maxMembers bounds the instances remembered; far more than a cluster has.
const maxMembers = 4096

// listed applies a successful listing made at now. Guarded by mu.
func (m *Membership) listed(listed map[string]Lease, now time.Time) {
	for id, l := range listed {
		mb := m.members[id]
		if mb == nil {
			if len(m.members) >= maxMembers {
				continue
			}
			mb = &member{}
			m.members[id] = mb
		}
		mb.addr, mb.listed = l.Addr, true
		switch {
		case l.Lapsed <= 0:
			mb.absent = false
		case l.Dropped && !mb.absent:
			// Ended by its instance, which will not renew it: no delay.
			mb.absent, mb.absentSince = true, now.Add(-m.delay)
		case !mb.absent:
			// The lock delay counts from here, not from when the engine
			// says it lapsed: an engine restored from an old snapshot
			// lists every lease as lapsed long ago, and the live ones
			// renew within a second.
			mb.absent, mb.absentSince = true, now
		}
		if mb.absent {
			mb.absentSeen = now
		}
	}
	for id, mb := range m.members {
		if _, ok := listed[id]; ok {
			continue
		}
		// Not even lapsed: the engine forgot it (a restart) or it is
		// long gone.
		if !mb.absent {
			mb.absent, mb.absentSince = true, now
		}
		mb.absentSeen = now
		if mb.absentSeen.Sub(mb.absentSince) >= 10*m.delay && len(m.members) >= maxMembers/2 {
			delete(m.members, id)
		}
	}
}

// Status says what this instance knows of instance id's lease, and the
// address its lease names ("" if none was listed).
func (m *Membership) Status(id string) (Liveness, string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	mb := m.members[id]
	switch {
	case mb == nil:
		return Unknown, ""
	case !mb.absent:
		return Alive, mb.addr
	case mb.absentSeen.Sub(mb.absentSince) >= m.delay:
		return Lapsed, mb.addr
	case !mb.listed:
		return Unknown, ""
	}
	return Alive, mb.addr
}

// Listed reports whether the last listing showed instance id's lease, and
// the address it names.
func (m *Membership) Listed(id string) (addr string, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	mb := m.members[id]
	if mb == nil || mb.absent {
		return "", false
	}
	return mb.addr, true
}

// Noticed starts the clock on an instance named by a record but never
// listed: if it stays absent for the lock delay, it is lapsed. It returns
// its liveness now.
func (m *Membership) Noticed(id string) Liveness {
	m.mu.Lock()
	if m.members[id] == nil && len(m.members) < maxMembers {
		now := m.now()
		m.members[id] = &member{absent: true, absentSince: now, absentSeen: now}
	}
	m.mu.Unlock()
	l, _ := m.Status(id)
	return l
}

func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
