package owner

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// memStore records owners in memory, as the state engine does, and
// counts the calls that reach it.
type memStore struct {
	mu     sync.Mutex
	owners map[string]string // session id → recorded owner
	fail   error
	// takeOverFail fails TakeOver alone.
	takeOverFail error
	claims       atomic.Int64
	lives        map[string]time.Duration // the life each key was last claimed for
	calls        atomic.Int64
	hold         chan struct{} // while open, Owner waits for it to close
}

func newMemStore() *memStore { return &memStore{owners: map[string]string{}} }

func (m *memStore) Owner(ctx context.Context, id string) (string, bool, error) {
	m.calls.Add(1)
	if m.hold != nil {
		<-m.hold
		if ctx.Err() != nil {
			return "", false, ctx.Err() // the engine's answer to a request that left
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return "", false, m.fail
	}
	o, ok := m.owners[id]
	return o, ok, nil
}

func (m *memStore) TakeOver(_ context.Context, id, from, to string) (string, bool, error) {
	m.calls.Add(1)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return "", false, m.fail
	}
	if m.takeOverFail != nil {
		return "", false, m.takeOverFail
	}
	o, ok := m.owners[id]
	if !ok {
		return "", false, nil
	}
	if o == from || o == "" {
		m.owners[id] = to
		return to, true, nil
	}
	return o, true, nil
}

// clock is a hand-moved clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

var (
	ownerA = Owner{ID: "aaaa", Addr: "10.0.0.1:8080"}
	ownerB = Owner{ID: "bbbb", Addr: "10.0.0.2:8080"}
)

// newDir is instance self, on clock c, which sees ownerA and ownerB hold
// leases.
func newDir(self string, c *clock) *Directory {
	return dirSeeingAAndB(self, c.now)
}

// newRealDir is newDir on the system clock.
func newRealDir(self string) *Directory { return dirSeeingAAndB(self, time.Now) }

func dirSeeingAAndB(self string, now func() time.Time) *Directory {
	l := newMemLeases(&clock{})
	for _, o := range []Owner{ownerA, ownerB} {
		l.leases[o.ID] = lease{o.Addr, time.Time{}.Add(1000 * time.Hour), 1, false}
	}
	d := NewDirectory(NewMembership(self, func() Leases { return l }, now), 100, time.Hour, now)
	d.Members().Refresh(context.Background())
	return d
}

func noLeases() Leases { return nil }

// memLeases keeps leases in memory, as the state engine does, on the
// test's clock.
type memLeases struct {
	mu     sync.Mutex
	c      *clock
	leases map[string]lease
	fail   error
}

type lease struct {
	addr    string
	until   time.Time
	epoch   uint64
	dropped bool
}

func newMemLeases(c *clock) *memLeases { return &memLeases{c: c, leases: map[string]lease{}} }

func (l *memLeases) Renew(_ context.Context, id, addr string, life time.Duration) (Renewal, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fail != nil {
		return Renewal{}, l.fail
	}
	old, ok := l.leases[id]
	r := Renewal{Epoch: 1, Existed: ok}
	if ok {
		r.Epoch = old.epoch
		if !old.until.After(l.c.now()) {
			r.Epoch++
		} else {
			r.Holder = old.addr
		}
	}
	l.leases[id] = lease{addr, l.c.now().Add(life), r.Epoch, false}
	return r, nil
}

func (l *memLeases) Drop(_ context.Context, id string, lapsed time.Duration) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ls, ok := l.leases[id]; ok {
		ls.until, ls.dropped = l.c.now().Add(-lapsed), true
		l.leases[id] = ls
	}
	return l.fail
}

func (l *memLeases) Members(context.Context) (map[string]Lease, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fail != nil {
		return nil, l.fail
	}
	m := map[string]Lease{}
	for id, ls := range l.leases {
		lapsed := time.Duration(0)
		if !ls.until.After(l.c.now()) {
			lapsed = max(time.Nanosecond, l.c.now().Sub(ls.until))
		}
		m[id] = Lease{Addr: ls.addr, Lapsed: lapsed, Dropped: ls.dropped}
	}
	return m, nil
}

// forget makes the engine forget every lease, as a restart does.
func (l *memLeases) forget() {
	l.mu.Lock()
	clear(l.leases)
	l.mu.Unlock()
}

// leasedDir is an instance whose membership keeps its lease in l.
func leasedDir(o Owner, l *memLeases) *Directory {
	m := NewMembership(o.ID, func() Leases { return l }, l.c.now)
	m.SetAddr(o.Addr)
	return NewDirectory(m, 100, time.Hour, l.c.now)
}

// lapse lets a's lease lapse (a is frozen: it stops renewing) and the
// others see it lapsed for the lock delay.
func lapse(l *memLeases, a Owner, others ...*Directory) {
	for _, d := range others {
		d.Members().Refresh(context.Background())
	}
	l.c.add(LeaseLife)
	for _, d := range others {
		d.Members().Renew(context.Background())
		d.Members().Refresh(context.Background())
	}
	l.c.add(lockDelay)
	for _, d := range others {
		d.Members().Renew(context.Background())
		d.Members().Refresh(context.Background())
	}
}

func TestAnOwnerParsesBackFromWhatIsRecorded(t *testing.T) {
	o, ok := Parse(ownerA.String())
	if !ok || o != ownerA {
		t.Fatalf("Parse(%q) = %v, %v", ownerA.String(), o, ok)
	}
	for _, bad := range []string{"", "aaaa", " 10.0.0.1:8080", "aaaa ", "aaaa 10.0.0.1:8080 x", "aaaa http://10.0.0.1:8080"} {
		if _, ok := Parse(bad); ok {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}

func TestASessionCreatedHereIsServedHereWithoutAskingTheStore(t *testing.T) {
	s, c := newMemStore(), &clock{}
	d := newDir(ownerA.ID, c)
	d.Created("s1", ownerA.Addr)
	for range 5 {
		if _, forward, _ := d.Route(context.Background(), s, "s1", "", ownerA.Addr); forward {
			t.Fatal("a session created here was forwarded")
		}
	}
	if n := s.calls.Load(); n != 0 {
		t.Fatalf("%d store calls, want 0", n)
	}
}

func TestAnotherInstancesSessionIsAskedForOnceThenForwardedToItsOwner(t *testing.T) {
	s, c := newMemStore(), &clock{}
	s.owners["s1"] = ownerA.String()
	d := newDir(ownerB.ID, c)
	for range 5 {
		o, forward, _ := d.Route(context.Background(), s, "s1", "", ownerB.Addr)
		if !forward || o != ownerA {
			t.Fatalf("Route = %v, %v; want forwarded to %v", o, forward, ownerA)
		}
		c.add(30 * time.Second)
	}
	if n := s.calls.Load(); n != 1 {
		t.Fatalf("%d store calls for 5 requests, want 1", n)
	}
}

func TestAnOwnerKnownLongerThanTheSessionsLifeIsAskedForAgain(t *testing.T) {
	s, c := newMemStore(), &clock{}
	s.owners["s1"] = ownerA.String()
	d := newDir(ownerB.ID, c)
	d.Route(context.Background(), s, "s1", "", ownerB.Addr)
	c.add(time.Hour)
	d.Route(context.Background(), s, "s1", "", ownerB.Addr)
	if n := s.calls.Load(); n != 2 {
		t.Fatalf("%d store calls, want 2 (the owner asked again after the session's life)", n)
	}
}

func TestWithoutAnAnswerFromTheStoreARequestIsServedHereAndAskedAgainNextTime(t *testing.T) {
	s, c := newMemStore(), &clock{}
	d := newDir(ownerB.ID, c)
	s.fail = errors.New("engine down")
	if _, forward, _ := d.Route(context.Background(), s, "s1", "", ownerB.Addr); forward {
		t.Fatal("forwarded without an owner")
	}
	s.fail = nil
	if _, forward, _ := d.Route(context.Background(), s, "unknown", "", ownerB.Addr); forward {
		t.Fatal("a session the store does not know was forwarded")
	}
	s.owners["s1"] = ownerA.String()
	if o, forward, _ := d.Route(context.Background(), s, "s1", "", ownerB.Addr); !forward || o != ownerA {
		t.Fatalf("once the store answers: Route = %v, %v; want forwarded to %v", o, forward, ownerA)
	}
}

func TestARecordWithoutAnOwnerIsServedHere(t *testing.T) {
	s, c := newMemStore(), &clock{}
	s.owners["s1"] = ""
	if _, forward, _ := newDir(ownerB.ID, c).Route(context.Background(), s, "s1", "", ownerB.Addr); forward {
		t.Fatal("a record without an owner was forwarded")
	}
}

func TestALapsedOwnersSessionIsTakenOverByOneInstanceOnly(t *testing.T) {
	s, l := newMemStore(), newMemLeases(&clock{})
	s.owners["s1"] = ownerA.String()
	a := leasedDir(ownerA, l)
	a.Members().Renew(context.Background())
	b, other := leasedDir(ownerB, l), leasedDir(Owner{ID: "cccc", Addr: "10.0.0.3:8080"}, l)
	lapse(l, ownerA, b, other)

	o, forward, _ := b.Route(context.Background(), s, "s1", "", ownerB.Addr)
	if forward || o != ownerB {
		t.Fatalf("first to meet it: %v, %v; want served here as %v", o, forward, ownerB)
	}
	o, forward, _ = other.Route(context.Background(), s, "s1", "", "10.0.0.3:8080")
	if !forward || o != ownerB {
		t.Fatalf("second to meet it: %v, %v; want forwarded to the new owner %v", o, forward, ownerB)
	}
	if s.owners["s1"] != ownerB.String() {
		t.Fatalf("recorded owner %q, want %q", s.owners["s1"], ownerB.String())
	}
	if b.TakeOvers() != 1 || other.TakeOvers() != 0 {
		t.Fatalf("takeovers counted %d and %d, want 1 and 0", b.TakeOvers(), other.TakeOvers())
	}
}

func TestAnOwnerWhoseLeaseStandsIsNeverTakenOverWhenAForwardFails(t *testing.T) {
	s, l := newMemStore(), newMemLeases(&clock{})
	s.owners["s1"] = ownerA.String()
	a, b := leasedDir(ownerA, l), leasedDir(ownerB, l)
	a.Members().Renew(context.Background())
	for range 3 {
		o, forward, _ := b.Route(context.Background(), s, "s1", "", ownerB.Addr)
		if !forward || o != ownerA {
			t.Fatalf("Route = %v, %v; want forwarded to %v while its lease stands", o, forward, ownerA)
		}
		b.Unreachable("s1", o) // the dial failed: a blip, or the owner is handing over
		l.c.add(2 * time.Second)
		a.Members().Renew(context.Background())
		b.Members().Refresh(context.Background())
	}
	if s.owners["s1"] != ownerA.String() || b.TakeOvers() != 0 {
		t.Fatalf("recorded owner %q and %d takeovers after failed forwards to a live owner", s.owners["s1"], b.TakeOvers())
	}
}

func TestNoOwnerLapsesWhileTheEngineAnswersNobody(t *testing.T) {
	s, l := newMemStore(), newMemLeases(&clock{})
	s.owners["s1"] = ownerA.String()
	a, b := leasedDir(ownerA, l), leasedDir(ownerB, l)
	a.Members().Renew(context.Background())
	b.Members().Refresh(context.Background())
	l.fail = errors.New("engine down")
	l.c.add(10 * lockDelay)
	b.Members().Refresh(context.Background())
	if live, _ := b.Members().Status(ownerA.ID); live != Alive {
		t.Fatalf("after an outage of 10 lock delays, the owner is %v, want alive", live)
	}
	l.fail = nil
	// The engine restarted empty: the owner renews within renewEvery.
	l.forget()
	b.Members().Refresh(context.Background())
	l.c.add(renewEvery)
	a.Members().Renew(context.Background())
	b.Members().Refresh(context.Background())
	if o, forward, _ := b.Route(context.Background(), s, "s1", "", ownerB.Addr); !forward || o != ownerA {
		t.Fatalf("after the engine came back: Route = %v, %v; want forwarded to %v", o, forward, ownerA)
	}
}

func TestAnInstanceServesAForwardedRequestOnlyAsTheOwnerItWasSentTo(t *testing.T) {
	s, c := newMemStore(), &clock{}
	d := newDir(ownerA.ID, c)
	bg := context.Background()
	d.Created("s1", ownerA.Addr)
	if !d.Serves(bg, s, "s1", ownerA.ID) {
		t.Fatal("refused a request sent to it as owner")
	}
	if d.Serves(bg, s, "s1", "restarted") {
		t.Fatal("served a request sent to another instance at its address (an earlier process)")
	}
	// Another instance took s1 over, and this one learned it.
	s.owners["s1"] = ownerB.String()
	d.Forget("s1")
	d.Route(bg, s, "s1", "", ownerA.Addr)
	if d.Serves(bg, s, "s1", ownerA.ID) {
		t.Fatal("served a session it knows another instance took over")
	}
	// A session it does not know, sent to it by ID (a client can read
	// instance IDs in its session ids): served only if its record says so.
	s.owners["s2"] = ownerB.String()
	if d.Serves(bg, s, "s2", ownerA.ID) {
		t.Fatal("served another instance's session because the request named this one")
	}
}

func TestTheDirectoryKeepsAtMostItsBoundOfSessions(t *testing.T) {
	c := &clock{}
	d := NewDirectory(NewMembership(ownerA.ID, noLeases, c.now), 10, time.Hour, c.now)
	for i := range 100 {
		d.Created(string(rune('a'+i%26))+string(rune('a'+i/26)), ownerA.Addr)
	}
	if n := d.Known(); n != 10 {
		t.Fatalf("%d sessions known, want the bound, 10", n)
	}
}

func TestAnInstanceWithoutAnAddressServesALapsedOwnersSessionWithoutTakingItOver(t *testing.T) {
	s, l := newMemStore(), newMemLeases(&clock{})
	s.owners["s1"] = ownerA.String()
	a, b := leasedDir(ownerA, l), leasedDir(ownerB, l)
	a.Members().Renew(context.Background())
	lapse(l, ownerA, b)
	if _, forward, _ := b.Route(context.Background(), s, "s1", "", ""); forward {
		t.Fatal("forwarded to an owner whose lease lapsed")
	}
	if s.owners["s1"] != ownerA.String() || b.TakeOvers() != 0 {
		t.Fatalf("recorded %q after a takeover without an address", s.owners["s1"])
	}
}

func TestAHandedOverSessionIsTakenOverAtOnce(t *testing.T) {
	s, l := newMemStore(), newMemLeases(&clock{})
	a, b := leasedDir(ownerA, l), leasedDir(ownerB, l)
	a.Created("s1", ownerA.Addr)
	s.owners["s1"] = ownerA.String()
	a.Created("s2", ownerA.Addr)
	s.owners["s2"] = ownerB.String() // taken over meanwhile: not A's to hand over
	a.Members().Renew(context.Background())
	if n := a.Release(context.Background(), s); n != 1 {
		t.Fatalf("Release handed %d sessions over, want 1", n)
	}
	if s.owners["s2"] != ownerB.String() {
		t.Fatalf("Release changed another owner's session: %q", s.owners["s2"])
	}
	// A's lease still stands: the handover, not a lapse, lets B in.
	if o, forward, _ := b.Route(context.Background(), s, "s1", "", ownerB.Addr); forward || o != ownerB {
		t.Fatalf("Route = %v, %v; want taken over at once", o, forward)
	}
}

func TestATakeoverWithoutAnAnswerWaitsRatherThanServing(t *testing.T) {
	s, l := newMemStore(), newMemLeases(&clock{})
	s.owners["s1"] = ownerA.String()
	a, b := leasedDir(ownerA, l), leasedDir(ownerB, l)
	a.Members().Renew(context.Background())
	b.Route(context.Background(), s, "s1", "", ownerB.Addr)
	lapse(l, ownerA, b)
	s.takeOverFail = errors.New("no answer within 250ms")
	if _, forward, wait := b.Route(context.Background(), s, "s1", "", ownerB.Addr); forward || !wait {
		t.Fatalf("a takeover without an answer: forward %v, wait %v; want wait", forward, wait)
	}
	s.takeOverFail = nil
	if o, forward, wait := b.Route(context.Background(), s, "s1", "", ownerB.Addr); forward || wait || o != ownerB {
		t.Fatalf("asked again: %v, forward %v, wait %v; want taken over", o, forward, wait)
	}
}

func TestAnOwnerWhoseLeaseLapsedServesASessionAgainOnlyIfNobodyTookItOver(t *testing.T) {
	s, l := newMemStore(), newMemLeases(&clock{})
	a, b := leasedDir(ownerA, l), leasedDir(ownerB, l)
	for _, id := range []string{"kept", "lost"} {
		a.Created(id, ownerA.Addr)
		s.owners[id] = ownerA.String()
	}
	a.Members().Renew(context.Background())
	if !a.Confirm(context.Background(), s, "kept", ownerA.Addr) {
		t.Fatal("an owner whose lease stands was refused its own session")
	}
	calls := s.calls.Load()
	a.Confirm(context.Background(), s, "kept", ownerA.Addr)
	if s.calls.Load() != calls {
		t.Fatal("Confirm asked the store while the lease stood")
	}
	// A is frozen past its lease; B takes one of its sessions over.
	lapse(l, ownerA, b)
	b.Route(context.Background(), s, "lost", "", ownerB.Addr)
	l.c.add(verifyDelay)
	if a.Confirm(context.Background(), s, "lost", ownerA.Addr) {
		t.Fatal("the resumed owner would send a session upstream that another instance took over")
	}
	if !a.Confirm(context.Background(), s, "kept", ownerA.Addr) {
		t.Fatal("the resumed owner was refused a session nobody took over")
	}
	if o, forward, _ := a.Route(context.Background(), s, "lost", "", ownerA.Addr); !forward || o.ID != ownerB.ID {
		t.Fatalf("the resumed owner routes the lost session to %v, %v; want forwarded to %v", o, forward, ownerB)
	}
}

// Two requests of a session queued at its owner while the owner was
// frozen: on waking, the first learns that the session was taken over;
// the second, which was routed here before that, must not go upstream
// either (the instance now knows the session as another's).
func TestAResumedOwnerSendsNoQueuedRequestOfASessionItLearnedWasTakenOver(t *testing.T) {
	s, l := newMemStore(), newMemLeases(&clock{})
	a, b := leasedDir(ownerA, l), leasedDir(ownerB, l)
	a.Created("s1", ownerA.Addr)
	s.owners["s1"] = ownerA.String()
	a.Members().Renew(context.Background())
	// Both routed here, to be served in turn, before the freeze.
	for range 2 {
		if _, forward, wait := a.Route(context.Background(), s, "s1", ownerA.ID, ownerA.Addr); forward || wait {
			t.Fatal("the owner did not serve its own session")
		}
	}
	lapse(l, ownerA, b)
	b.Route(context.Background(), s, "s1", ownerA.ID, ownerB.Addr)
	l.c.add(verifyDelay)
	if a.Confirm(context.Background(), s, "s1", ownerA.Addr) {
		t.Fatal("the first queued request would go upstream beside the instance that took its session over")
	}
	if a.Confirm(context.Background(), s, "s1", ownerA.Addr) {
		t.Fatal("the second queued request would go upstream beside the instance that took its session over")
	}
}

func TestRequestsOfASessionArrivingTogetherAskForItsOwnerOnce(t *testing.T) {
	s, c := newMemStore(), &clock{}
	s.owners["s1"] = ownerA.String()
	s.hold = make(chan struct{})
	d := newDir(ownerB.ID, c)
	routed := make(chan Owner, 5)
	for range 5 {
		go func() {
			o, _, _ := d.Route(context.Background(), s, "s1", "", ownerB.Addr)
			routed <- o
		}()
	}
	// Released once the four others wait for the first one's lookup.
	deadline := time.Now().Add(5 * time.Second)
	for waiting(d, "s1") < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests wait for the lookup in flight, want 4; %d lookups", waiting(d, "s1"), s.calls.Load())
		}
		time.Sleep(time.Millisecond)
	}
	close(s.hold)
	for range 5 {
		if o := <-routed; o != ownerA {
			t.Fatalf("a request was routed to %v, want %v", o, ownerA)
		}
	}
	if n := s.calls.Load(); n != 1 {
		t.Fatalf("%d lookups for five requests arriving together, want 1", n)
	}
}

func waiting(d *Directory, id string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if c := d.learning[id]; c != nil {
		return c.waiters
	}
	return 0
}

func (m *memStore) Claim(_ context.Context, id, me string, life time.Duration) (string, error) {
	m.calls.Add(1)
	m.claims.Add(1)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return "", m.fail
	}
	if o := m.owners[id]; o != "" && o != me {
		return o, nil
	}
	m.owners[id] = me
	if m.lives == nil {
		m.lives = map[string]time.Duration{}
	}
	m.lives[id] = life
	return me, nil
}

// The first instance to meet a key claims it, and the others forward to
// it; the claim lives keyTrialLife until the upstream has answered one of
// the key's requests, then a session's life.
func TestTheFirstInstanceToMeetAKeyOwnsItAndTheOthersForwardToIt(t *testing.T) {
	s, c := newMemStore(), &clock{}
	a, b := newDir(ownerA.ID, c), newDir(ownerB.ID, c)
	if o, forward, _ := a.RouteKey(bg, s, "key k", ownerA.Addr); forward || o != ownerA {
		t.Fatalf("first to meet the key: %v, %v; want it served here", o, forward)
	}
	for range 3 {
		if o, forward, _ := b.RouteKey(bg, s, "key k", ownerB.Addr); !forward || o != ownerA {
			t.Fatalf("second: %v, %v; want forwarded to %v", o, forward, ownerA)
		}
	}
	if n := s.calls.Load(); n != 2 {
		t.Fatalf("%d store calls, want 2 (one claim per instance)", n)
	}
	if life := s.lives["key k"]; life != keyTrialLife {
		t.Fatalf("claimed for %v before any answer, want %v", life, keyTrialLife)
	}
	a.KeyAnswered(bg, s, "key k", ownerA.Addr)
	if life := s.lives["key k"]; life != 0 {
		t.Fatalf("claimed for %v once answered, want a session's life (0)", life)
	}
}

// A flood of made-up key values, none answered, leaves claims that lapse
// within keyTrialLife, never a session's life.
func TestKeysNoUpstreamAnsweredAreClaimedBriefly(t *testing.T) {
	s, c := newMemStore(), &clock{}
	a := newDir(ownerA.ID, c)
	for i := range 100 {
		a.RouteKey(bg, s, fmt.Sprintf("key %d", i), ownerA.Addr)
	}
	for id, life := range s.lives {
		if life != keyTrialLife {
			t.Fatalf("%s claimed for %v with nothing answered, want %v", id, life, keyTrialLife)
		}
	}
}

func TestAKeysOwnerClaimsItAgainOnlyAfterHalfASessionsLife(t *testing.T) {
	s, c := newMemStore(), &clock{}
	a := newDir(ownerA.ID, c) // sessions live an hour
	claims := func() int64 { return s.claims.Load() }
	for range 3 {
		a.KeyAnswered(bg, s, "key k", ownerA.Addr)
		c.add(10 * time.Minute)
	}
	if n := claims(); n != 1 {
		t.Fatalf("%d claims within half an hour, want 1", n)
	}
	c.add(time.Minute)
	if _, forward, _ := a.RouteKey(bg, s, "key k", ownerA.Addr); forward {
		t.Fatal("the owner forwarded its own key")
	}
	a.KeyAnswered(bg, s, "key k", ownerA.Addr)
	if n := claims(); n != 2 {
		t.Fatalf("%d claims after half an hour, want 2", n)
	}
	// A reload that shortens session_ttl shortens the wait.
	a.SetTTL(10 * time.Minute)
	c.add(6 * time.Minute)
	a.KeyAnswered(bg, s, "key k", ownerA.Addr)
	if n := claims(); n != 3 {
		t.Fatalf("%d claims after a reload shortened session_ttl, want 3", n)
	}
}

func TestAKeyWhoseOwnerLapsedIsTakenOver(t *testing.T) {
	s, l := newMemStore(), newMemLeases(&clock{})
	a, b := leasedDir(ownerA, l), leasedDir(ownerB, l)
	a.KeyAnswered(bg, s, "key k", ownerA.Addr)
	a.Members().Renew(bg)
	if _, forward, _ := b.RouteKey(bg, s, "key k", ownerB.Addr); !forward {
		t.Fatal("a live owner's key was not forwarded to it")
	}
	lapse(l, ownerA, b)
	if o, forward, _ := b.RouteKey(bg, s, "key k", ownerB.Addr); forward || o != ownerB {
		t.Fatalf("RouteKey = %v, %v; want taken over", o, forward)
	}
}

var bg = context.Background()

// runningStore keeps running marks in memory, as the state engine does:
// by session, with who made each and until when.
type runningStore struct {
	*memStore
	mu     sync.Mutex
	marks  map[string]string    // session id → the instance that marked it
	until  map[string]time.Time // session id → when the mark lapses
	fail   error
	reads  atomic.Int64
	marked chan string // every mark and clear, as "mark id" or "clear id"
}

func newRunningStore() *runningStore {
	return &runningStore{memStore: newMemStore(), marks: map[string]string{}, until: map[string]time.Time{}, marked: make(chan string, 100)}
}

func (r *runningStore) MarkRunning(_ context.Context, id, me string, life time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return r.fail
	}
	if life == 0 {
		if r.marks[id] == me {
			delete(r.marks, id)
			delete(r.until, id)
		}
		r.marked <- "clear " + id
		return nil
	}
	r.marks[id], r.until[id] = me, time.Now().Add(life)
	r.marked <- "mark " + id
	return nil
}

func (r *runningStore) RunningFor(_ context.Context, id string) (time.Duration, error) {
	r.reads.Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return 0, r.fail
	}
	return max(time.Until(r.until[id]), 0), nil
}

func (r *runningStore) get() RunningStore { return r }

func nextMark(t *testing.T, r *runningStore) string {
	t.Helper()
	select {
	case m := <-r.marked:
		return m
	case <-time.After(5 * time.Second):
		t.Fatal("no mark or clear within 5s")
		return ""
	}
}

// An owner's exchange that runs past markAfter marks the session's record
// until it ends, renewing the mark, and clears it at its end; a short one
// writes nothing, and neither does an exchange of a session owned
// elsewhere.
func TestAnOwnersLongExchangeMarksTheRecordUntilItEnds(t *testing.T) {
	store := newRunningStore()
	d := newRealDir(ownerA.ID)
	d.markAfter, d.markLife = 10*time.Millisecond, 60*time.Millisecond
	d.Created("s", ownerA.Addr)

	ended := d.ExchangeBegan(store.get, "s")
	for range 3 { // the first mark and two renewals
		if m := nextMark(t, store); m != "mark s" {
			t.Fatalf("got %q, want a mark", m)
		}
	}
	ended()
	if m := nextMark(t, store); m != "clear s" {
		t.Fatalf("got %q at the exchange's end, want the mark cleared", m)
	}
	if left, _ := store.RunningFor(bg, "s"); left != 0 {
		t.Fatalf("the mark outlived its exchange by %v", left)
	}

	d.ExchangeBegan(store.get, "s")() // over before markAfter
	store.memStore.owners["elsewhere"] = ownerB.String()
	if o, forward, _ := d.Route(bg, store, "elsewhere", "", ownerA.Addr); !forward || o != ownerB {
		t.Fatalf("Route = %v, %v", o, forward)
	}
	defer d.ExchangeBegan(store.get, "elsewhere")()
	time.Sleep(5 * d.markAfter)
	select {
	case m := <-store.marked:
		t.Fatalf("%q for a short exchange or a session owned elsewhere", m)
	default:
	}
}

// An instance that took a session over holds its first exchange while the
// record says the previous owner's exchange still runs, and sends it once
// the mark is cleared; later exchanges read nothing.
func TestATakenOverSessionWaitsForThePreviousOwnersExchange(t *testing.T) {
	// A's lease lapsed (TestALapsedOwnersSessionIsTakenOverByOneInstanceOnly).
	store, b := tookOverWhileMarked(t)
	done := make(chan bool, 1)
	go func() { done <- b.AwaitPrevious(bg, store.get, "s", time.Now().Add(time.Hour)) }()
	for store.reads.Load() < 2 { // it read the mark, and again after a pause
		select {
		case <-done:
			t.Fatal("the first exchange went while the previous owner's was marked as running")
		case <-time.After(time.Millisecond):
		}
	}
	_ = store.MarkRunning(bg, "s", ownerA.String(), 0)
	select {
	case ok := <-done:
		if !ok {
			t.Fatal("AwaitPrevious gave up after the mark was cleared")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("still held 5s after the mark was cleared")
	}
	reads := store.reads.Load()
	if !b.AwaitPrevious(bg, store.get, "s", time.Now()) || store.reads.Load() != reads {
		t.Fatal("a later exchange read the mark again")
	}
}

// The wait for a previous owner's exchange has a bound: at the deadline
// the request gives up (and is refused by the caller), and a Store that
// does not answer is not waited for.
func TestTheWaitForAPreviousOwnerEndsAtItsDeadlineOrWithoutAStore(t *testing.T) {
	store := newRunningStore()
	store.memStore.owners["s"] = ownerA.String()
	_ = store.MarkRunning(bg, "s", ownerA.String(), time.Hour)
	b := newRealDir(ownerB.ID)
	b.takeOver(bg, store, "s", ownerA, ownerB.Addr, false)
	if b.AwaitPrevious(bg, store.get, "s", time.Now().Add(50*time.Millisecond)) {
		t.Fatal("AwaitPrevious went while the mark had an hour left, past its deadline")
	}
	store.mu.Lock()
	store.fail = errors.New("down")
	store.mu.Unlock()
	if !b.AwaitPrevious(bg, store.get, "s", time.Now().Add(time.Hour)) {
		t.Fatal("AwaitPrevious waited for a Store that does not answer")
	}
}

func TestASessionIDNamingALiveOwnerIsRoutedThereWithoutTheStore(t *testing.T) {
	s, l := newMemStore(), newMemLeases(&clock{})
	a, b := leasedDir(ownerA, l), leasedDir(ownerB, l)
	a.Members().Renew(context.Background())
	b.Members().Refresh(context.Background())
	// No record: the engine restarted empty, or was down when the
	// session began.
	if o, forward, _ := b.Route(context.Background(), s, "s1", ownerA.ID, ownerB.Addr); !forward || o != ownerA {
		t.Fatalf("Route = %v, %v; want forwarded to %v, the instance the id names", o, forward, ownerA)
	}
	if n := s.calls.Load(); n != 0 {
		t.Fatalf("%d store calls, want 0", n)
	}
	if _, forward, _ := a.Route(context.Background(), s, "s1", ownerA.ID, ownerA.Addr); forward {
		t.Fatal("the owner the id names forwarded its own session")
	}
	// An id naming an instance the cluster never knew is routed by the
	// record alone: here, none, so served here and never forwarded.
	if _, forward, _ := b.Route(context.Background(), s, "s2", "ffffffffffffffff", ownerB.Addr); forward {
		t.Fatal("forwarded to an instance only the client's id names")
	}
}

var ownerC = Owner{ID: "cccc", Addr: "10.0.0.3:8080"}

// A stopping owner drops its lease and hands its sessions over; a request
// whose id names it must then be taken over at once, as one whose id
// names nobody is (TestAHandedOverSessionIsTakenOverAtOnce).
func TestAHandedOverSessionWhoseIDNamesItsOwnerIsTakenOverAtOnce(t *testing.T) {
	ctx := context.Background()
	s, l := newMemStore(), newMemLeases(&clock{})
	a, b := leasedDir(ownerA, l), leasedDir(ownerB, l)
	a.Created("s1", ownerA.Addr)
	s.owners["s1"] = ownerA.String()
	a.Members().Renew(ctx)
	b.Members().Renew(ctx)
	b.Members().Refresh(ctx)
	// SIGTERM: handOver drops the lease, then releases.
	a.Members().Stop(ctx, l)
	if n := a.Release(ctx, s); n != 1 {
		t.Fatalf("Release handed %d sessions over, want 1", n)
	}
	b.Members().Refresh(ctx)
	if o, forward, wait := b.Route(ctx, s, "s1", ownerA.ID, ownerB.Addr); forward || wait || o != ownerB {
		t.Fatalf("Route = %v, forward %v, wait %v; want taken over at once, not forwarded to the instance that handed it over", o, forward, wait)
	}
}

// A session taken over from an owner that then comes back (SIGCONT, a
// partition healed) still carries the old owner's name in the client's
// id. Once that owner answers that it does not serve the session, the
// next attempt must go elsewhere, not to it again until queue_timeout.
func TestAnIDNamingAnInstanceThatWasTakenOverReachesTheNewOwner(t *testing.T) {
	ctx := context.Background()
	s, l := newMemStore(), newMemLeases(&clock{})
	a, b, c := leasedDir(ownerA, l), leasedDir(ownerB, l), leasedDir(ownerC, l)
	a.Created("s1", ownerA.Addr)
	s.owners["s1"] = ownerA.String()
	for _, d := range []*Directory{a, b, c} {
		d.Members().Renew(ctx)
	}
	lapse(l, ownerA, b, c)
	if o, forward, _ := b.Route(ctx, s, "s1", ownerA.ID, ownerB.Addr); forward || o != ownerB {
		t.Fatalf("B did not take the lapsed owner's session over: %v, %v", o, forward)
	}
	// A resumes and renews; C has not met the session.
	a.Members().Renew(ctx)
	l.c.add(verifyDelay)
	c.Members().Refresh(ctx)
	for attempt := range 3 {
		o, forward, _ := c.Route(ctx, s, "s1", ownerA.ID, ownerC.Addr)
		if !forward {
			t.Fatalf("attempt %d: served at C", attempt)
		}
		if o.ID == ownerB.ID {
			return
		}
		// A answers 421: it learned B took the session over.
		if a.Serves(context.Background(), s, "s1", o.ID) {
			a.Confirm(ctx, s, "s1", ownerA.Addr) // 503 owner_moved; A learns B's
		}
		c.NotOwner("s1", o)
	}
	t.Fatal("every attempt went to A, which no longer serves the session; the request waits for queue_timeout and is answered 503")
}

// lossyLeases applies a renewal and then loses its answer, once.
type lossyLeases struct {
	*memLeases
	lose bool
}

func (l *lossyLeases) Renew(ctx context.Context, id, addr string, life time.Duration) (Renewal, error) {
	r, err := l.memLeases.Renew(ctx, id, addr, life)
	if l.lose {
		l.lose = false
		return Renewal{}, errors.New("no answer within 250ms")
	}
	return r, err
}

// An owner frozen past its lease whose first renewal on waking is applied
// but unanswered does not know whether its lease lapsed: it sends nothing
// upstream until a renewal answers, and then learns from the lease's
// epoch that it lapsed (the next renewal finds it standing).
func TestAResumedOwnerWhoseRenewalAnswerWasLostStillConfirmsBeforeServing(t *testing.T) {
	ctx := context.Background()
	ml := newMemLeases(&clock{})
	ll := &lossyLeases{memLeases: ml}
	s, a, b := ownersOfS1(ll, ml)
	// A is frozen; B takes s1 over.
	lapse(ml, ownerA, b)
	if o, forward, _ := b.Route(ctx, s, "s1", "", ownerB.Addr); forward || o != ownerB {
		t.Fatalf("B did not take s1 over: %v, %v", o, forward)
	}
	// A wakes: its first renewal is applied, the answer lost.
	ll.lose = true
	if a.Confirm(ctx, s, "s1", ownerA.Addr) {
		t.Fatal("A, woken with its renewal unanswered, would send s1 upstream while B, which took it over, serves it")
	}
	if o, forward, _ := a.Route(ctx, s, "s1", "", ownerA.Addr); !forward || o.ID != ownerB.ID {
		t.Fatalf("A routes s1 to %v, %v; want forwarded to B, which took it over", o, forward)
	}
}

// An owner woken from a pause past its lease, whose renewals then fail
// (the engine is slow to answer it alone), sends nothing upstream: its
// lease may have lapsed and its session been taken over meanwhile. Once a
// renewal succeeds it serves what is still its own.
func TestAResumedOwnerWhoseRenewalsFailSendsNothingUpstreamUntilOneSucceeds(t *testing.T) {
	ctx := context.Background()
	s, l := newMemStore(), newMemLeases(&clock{})
	a, b := leasedDir(ownerA, l), leasedDir(ownerB, l)
	a.Created("s1", ownerA.Addr)
	s.owners["s1"] = ownerA.String()
	a.Members().Renew(ctx)
	b.Members().Renew(ctx)
	lapse(l, ownerA, b)
	b.Route(ctx, s, "s1", "", ownerB.Addr)
	// A wakes; the engine does not answer it.
	l.mu.Lock()
	l.fail = errors.New("no answer within 250ms")
	l.mu.Unlock()
	gone, leave := context.WithCancel(ctx)
	leave() // the client left: Current gives up at once
	if a.Confirm(gone, s, "s1", ownerA.Addr) {
		t.Fatal("A, woken past its lease with its renewal failed, would send s1 upstream while B serves it")
	}
	if _, _, sure := a.Members().Current(gone); sure {
		t.Fatal("after a pause past its lease and a failed renewal, A is sure of its lease")
	}
	// Failures in a steady rhythm afterwards (an outage for all) leave it
	// unsure until one succeeds.
	l.c.add(renewEvery)
	a.Members().Renew(ctx)
	if _, _, sure := a.Members().Current(gone); sure {
		t.Fatal("a later failed renewal made A sure of its lease")
	}
	l.mu.Lock()
	l.fail = nil
	l.mu.Unlock()
	l.c.add(renewEvery)
	a.Members().Renew(ctx)
	if _, _, sure := a.Members().Current(ctx); !sure {
		t.Fatal("A is still unsure after a renewal succeeded")
	}
	l.c.add(verifyDelay)
	if a.Confirm(ctx, s, "s1", ownerA.Addr) {
		t.Fatal("A would send s1 upstream while B, which took it over, serves it")
	}
}

// stuckLeases runs during, once, A's next renewal after the engine applied
// it and before its answer arrives.
type stuckLeases struct {
	*memLeases
	during func()
}

func (l *stuckLeases) Renew(ctx context.Context, id, addr string, life time.Duration) (Renewal, error) {
	r, err := l.memLeases.Renew(ctx, id, addr, life)
	if during := l.during; during != nil && id == ownerA.ID {
		l.during = nil
		during()
	}
	return r, err
}

// A renewal whose answer arrives a lease's life after it was sent (the
// owner was paused in the call) says the lease stood when the engine
// applied it, not now: the owner sends nothing upstream until a renewal
// answered in time says whether it lapsed meanwhile.
func TestARenewalAnsweredALeasesLifeLateDoesNotMakeTheOwnerSure(t *testing.T) {
	ctx := context.Background()
	ml := newMemLeases(&clock{})
	sl := &stuckLeases{memLeases: ml}
	s, a, b := ownersOfS1(sl, ml)
	sl.during = func() {
		// A is frozen with the answer on its way; B takes s1 over.
		lapse(ml, ownerA, b)
		b.Route(ctx, s, "s1", "", ownerB.Addr)
	}
	a.Members().Renew(ctx)
	if a.Confirm(ctx, s, "s1", ownerA.Addr) {
		t.Fatal("A, whose renewal was answered a lease's life late, would send s1 upstream while B, which took it over, serves it")
	}
}

// Renewals that fail in a steady rhythm (the engine down for every
// instance) leave an owner serving its sessions: nobody can take one over
// without the engine.
func TestAnOwnerKeepsServingWhileTheEngineAnswersNobody(t *testing.T) {
	ctx := context.Background()
	s, l := newMemStore(), newMemLeases(&clock{})
	a := leasedDir(ownerA, l)
	a.Created("s1", ownerA.Addr)
	s.owners["s1"] = ownerA.String()
	a.Members().Renew(ctx)
	l.mu.Lock()
	l.fail = errors.New("connection refused")
	l.mu.Unlock()
	for range 10 {
		l.c.add(renewEvery)
		a.Members().Renew(ctx)
		if !a.Confirm(ctx, s, "s1", ownerA.Addr) {
			t.Fatalf("the owner stopped serving its session %v into an outage of the engine", l.c.now().Sub(time.Time{}))
		}
	}
}

// An owner's entry for its session ages out session_ttl after it was
// learned, however busy the session; an owner whose lease then lapses
// serves the session without reading who owns it now.
func TestAnOwnerWhoseLeaseLapsedConfirmsALongLivedSession(t *testing.T) {
	ctx := context.Background()
	s, l := newMemStore(), newMemLeases(&clock{})
	a, b := leasedDir(ownerA, l), leasedDir(ownerB, l)
	a.Created("s1", ownerA.Addr)
	s.owners["s1"] = ownerA.String()
	// The session is in use for more than session_ttl (an hour here).
	for range 61 {
		l.c.add(time.Minute)
		a.Members().Renew(ctx)
		b.Members().Renew(ctx)
		if _, forward, _ := a.Route(ctx, s, "s1", ownerA.ID, ownerA.Addr); forward {
			t.Fatal("the owner forwarded its own session")
		}
	}
	lapse(l, ownerA, b)
	if o, forward, _ := b.Route(ctx, s, "s1", "", ownerB.Addr); forward || o != ownerB {
		t.Fatalf("B did not take s1 over: %v, %v", o, forward)
	}
	a.Members().Renew(ctx) // A resumes and learns its lease lapsed
	l.c.add(verifyDelay)
	if _, forward, _ := a.Route(ctx, s, "s1", ownerA.ID, ownerA.Addr); !forward && a.Confirm(ctx, s, "s1", ownerA.Addr) {
		t.Fatal("A serves s1 upstream beside B, which took it over")
	}
}

// The engine restarted empty, and the owner a session's id names has since
// stopped: the first instance to meet the session claims it, and the
// others forward to it instead of each serving it.
func TestALostRecordOfALapsedOwnerIsClaimedByOneInstance(t *testing.T) {
	bg := context.Background()
	s, l := newMemStore(), newMemLeases(&clock{})
	a, b, c := leasedDir(ownerA, l), leasedDir(ownerB, l), leasedDir(ownerC, l)
	for _, d := range []*Directory{a, b, c} {
		d.Members().Renew(bg)
	}
	a.Members().Stop(bg, l) // no record to hand over: the engine forgot it
	b.Members().Refresh(bg)
	c.Members().Refresh(bg)
	o, forward, _ := b.Route(bg, s, "s1", ownerA.ID, ownerB.Addr)
	if forward || o != ownerB {
		t.Fatalf("first to meet it: %v, %v; want claimed and served here", o, forward)
	}
	if o, forward, _ := c.Route(bg, s, "s1", ownerA.ID, ownerC.Addr); !forward || o.ID != ownerB.ID {
		t.Fatalf("second to meet it: %v, %v; want forwarded to %v", o, forward, ownerB)
	}
}

// A session whose record is gone (the engine restarted empty) and whose
// named owner could not be dialed (it is stopping, finishing its
// requests) is not served here: its requests keep going to the owner
// while its lease stands.
func TestAFailedDialToANamedOwnerWithoutARecordKeepsTheRequestWaiting(t *testing.T) {
	bg := context.Background()
	s, l := newMemStore(), newMemLeases(&clock{})
	a, b := leasedDir(ownerA, l), leasedDir(ownerB, l)
	a.Members().Renew(bg)
	b.Members().Refresh(bg)
	for attempt := range 3 {
		o, forward, wait := b.Route(bg, s, "s1", ownerA.ID, ownerB.Addr)
		if !forward && !wait {
			t.Fatalf("attempt %d: served here while the owner's lease stands", attempt)
		}
		b.Unreachable("s1", o)
	}
}

// The engine restarted empty, and the instance now at the named owner's
// address is a new process that answers it does not serve the session:
// the session is claimed by one instance, not served by each.
func TestALostRecordWhoseNamedOwnerAnswersNotOwnerIsClaimedByOneInstance(t *testing.T) {
	bg := context.Background()
	s, l := newMemStore(), newMemLeases(&clock{})
	a, b, c := leasedDir(ownerA, l), leasedDir(ownerB, l), leasedDir(ownerC, l)
	for _, d := range []*Directory{a, b, c} {
		d.Members().Renew(bg)
		d.Members().Refresh(bg)
	}
	for _, d := range []*Directory{b, c} {
		o, forward, _ := d.Route(bg, s, "s1", ownerA.ID, d.Members().Addr())
		if !forward || o.ID != ownerA.ID {
			t.Fatalf("%v, %v; want forwarded to the named owner", o, forward)
		}
		d.NotOwner("s1", o) // a process restarted at A's address answers 421
	}
	o, forward, _ := b.Route(bg, s, "s1", ownerA.ID, ownerB.Addr)
	if forward || o != ownerB {
		t.Fatalf("first after the 421: %v, %v; want claimed and served here", o, forward)
	}
	if o, forward, _ := c.Route(bg, s, "s1", ownerA.ID, ownerC.Addr); !forward || o.ID != ownerB.ID {
		t.Fatalf("second after the 421: %v, %v; want forwarded to %v", o, forward, ownerB)
	}
}

// The requests of a session waiting for one lookup of its owner ask again
// when the request that asked leaves before the answer: they are not
// served here beside the owner.
func TestRequestsWaitingForALookupAskAgainWhenTheAskingClientLeaves(t *testing.T) {
	s, c := newMemStore(), &clock{}
	s.owners["s1"] = ownerA.String()
	s.hold = make(chan struct{})
	d := newDir(ownerB.ID, c)
	first, leave := context.WithCancel(context.Background())
	firstDone := make(chan struct{})
	go func() {
		defer close(firstDone)
		d.Route(first, s, "s1", "", ownerB.Addr)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for s.calls.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the first request never asked")
		}
		time.Sleep(time.Millisecond)
	}
	routed := make(chan bool, 1)
	go func() {
		_, forward, _ := d.Route(context.Background(), s, "s1", "", ownerB.Addr)
		routed <- forward
	}()
	for waiting(d, "s1") < 1 {
		if time.Now().After(deadline) {
			t.Fatal("the second request never waited for the lookup")
		}
		time.Sleep(time.Millisecond)
	}
	leave()
	close(s.hold)
	<-firstDone
	if forward := <-routed; !forward {
		t.Fatal("the waiting request was served here when the asking client left")
	}
}

// A Redis that restarts from its last RDB snapshot (the default for
// redis:7 with a /data volume) lists every lease as it was then: lapsed
// long ago. A live owner renews within renewEvery; the lock delay is
// there to give it that second. Its sessions must not be taken over
// before it.
func TestALeaseRestoredFromAnOldSnapshotIsNotTakenOverBeforeTheLockDelay(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	l := newMemLeases(c)
	a, b := leasedDir(ownerA, l), leasedDir(ownerB, l)
	for _, d := range []*Directory{a, b} {
		d.Members().Renew(ctx)
	}
	for _, d := range []*Directory{a, b} {
		d.Members().Refresh(ctx)
	}
	s := newMemStore()
	s.owners["s1"] = ownerB.String()
	b.Created("s1", ownerB.Addr)

	// Redis restarts and loads a snapshot taken a minute ago: both
	// leases are there with their expiry of then, epochs unchanged.
	l.mu.Lock()
	for id, ls := range l.leases {
		ls.until = c.now().Add(-time.Minute)
		l.leases[id] = ls
	}
	l.mu.Unlock()

	a.Members().Refresh(ctx) // A's background listing meets the restored hash first
	o, forward, _ := a.Route(ctx, s, "s1", "", ownerA.Addr)
	if !forward || o.ID != ownerB.ID {
		t.Fatalf("right after the engine restarted from a snapshot, A routed B's session to %v (forward %v), "+
			"before B had its renewal second: B's lease lapsed only in the snapshot; record now %q",
			o, forward, s.owners["s1"])
	}
}

// After the engine restarted empty, session s1 lives at B, which created
// it and knows it. Its client rewrites the instance its id names to A
// ("mcps1.<A>.<x>" and "mcps1.<B>.<x>" are one upstream session x), or
// sends Mcp-Serializer-Owner naming A straight to A: every other instance
// forwards the first to A, and A serves it, while B serves the second.
func TestAnInstanceThatNeverOwnedASessionWithoutARecordDoesNotServeItBesideItsOwner(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	l := newMemLeases(c)
	a, b := leasedDir(ownerA, l), leasedDir(ownerB, l)
	for _, d := range []*Directory{a, b} {
		d.Members().Renew(ctx)
		d.Members().Refresh(ctx)
	}
	s := newMemStore() // restarted empty: no record of s1
	b.Created("s1", ownerB.Addr)

	_, bForwards, bWaits := b.Route(ctx, s, "s1", ownerB.ID, ownerB.Addr)
	bServes := !bForwards && !bWaits
	aServes := a.Serves(ctx, s, "s1", ownerA.ID)
	if aServes && bServes {
		t.Fatal("A, which never owned s1, serves it as forwarded to it while B, its owner, serves it too")
	}
}

// A key claimed by A, whose record the engine then forgets (it restarts
// empty, leases included): A claims its keys again as soon as its
// renewal finds its lease gone, so that B, meeting the key, forwards it to
// A rather than claim it and serve it beside A.
func TestAKeyIsClaimedAgainByItsOwnerWhenTheEngineForgetsIt(t *testing.T) {
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	s, l := newMemStore(), newMemLeases(c)
	a, b := leasedDir(ownerA, l), leasedDir(ownerB, l)
	a.Members().Renew(bg)
	b.Members().Renew(bg)
	a.Members().OnForgotten(func() { a.ReclaimKeys(bg, s) })
	a.RouteKey(bg, s, "key k", ownerA.Addr)
	a.KeyAnswered(bg, s, "key k", ownerA.Addr)

	s.mu.Lock()
	clear(s.owners) // the engine restarts empty: records and leases gone
	s.mu.Unlock()
	l.forget()
	a.Members().Renew(bg)
	b.Members().Renew(bg)
	if o, forward, _ := b.RouteKey(bg, s, "key k", ownerB.Addr); !forward || o.ID != ownerA.ID {
		t.Fatalf("B after the engine forgot the key: %v, %v; want forwarded to A, which serves it from what it knows", o, forward)
	}
}

// slowDownLeases is an engine that does not answer (Redis stopped with
// SIGSTOP, or black-holed during an ElastiCache failover): every call
// fails after the state timeout, which the clock shows passing.
type slowDownLeases struct {
	*memLeases
	timeout time.Duration
	down    bool
}

func (l *slowDownLeases) Renew(ctx context.Context, id, addr string, life time.Duration) (Renewal, error) {
	if err := ctx.Err(); err != nil {
		return Renewal{}, err // bounded: a caller gone gets its answer at once
	}
	if l.down {
		l.c.add(l.timeout)
		return Renewal{}, errors.New("no answer within " + l.timeout.String())
	}
	return l.memLeases.Renew(ctx, id, addr, life)
}

func (l *slowDownLeases) Members(ctx context.Context) (map[string]Lease, error) {
	if l.down {
		l.c.add(l.timeout)
		return nil, errors.New("no answer within " + l.timeout.String())
	}
	return l.memLeases.Members(ctx)
}

// With `timeout 2s` (a documented setting with no upper bound), an
// outage for every instance in which calls time out rather than being
// refused spaces the background loop's renewals (Renew, then Refresh) 4 s
// apart: more than a lease's life, so each failure counts as "late" and
// the owner becomes unsure and stops sending its sessions upstream,
// although nobody can take a session over without the engine
// (guarantees.md: "Redis unreachable ... no overlap ... never cut").
func TestAnOwnerKeepsServingThroughAnOutageWhoseCallsTimeOut(t *testing.T) {
	ctx := context.Background()
	s := newMemStore()
	ml := newMemLeases(&clock{})
	sl := &slowDownLeases{memLeases: ml, timeout: 2 * time.Second}
	m := NewMembership(ownerA.ID, func() Leases { return sl }, ml.c.now)
	m.SetAddr(ownerA.Addr)
	a := NewDirectory(m, 100, time.Hour, ml.c.now)
	a.Created("s1", ownerA.Addr)
	s.owners["s1"] = ownerA.String()
	m.Renew(ctx)
	m.Refresh(ctx)
	sl.down = true
	// A quiet spell: only the background loop (Start) runs, Renew then
	// Refresh, each failing after the timeout.
	for range 3 {
		m.Renew(ctx)
		m.Refresh(ctx)
	}
	// A request arrives. Its client has left, so that Current does not
	// spend its 3 s of retries: only whether it is sure matters.
	gone, leave := context.WithCancel(ctx)
	leave()
	if _, _, sure := m.Current(gone); !sure {
		t.Fatalf("an outage for all whose calls time out after %v made the owner unsure of its lease: "+
			"each of its sessions' requests waits 3 s, then 503 owner_moved, on every instance", sl.timeout)
	}
	if !a.Confirm(gone, s, "s1", ownerA.Addr) {
		t.Fatal("the owner stopped serving its session during an outage for all")
	}
}

// deadlineLeases records the deadline of each call's context.
type deadlineLeases struct {
	*memLeases
	left []time.Duration
}

func (l *deadlineLeases) Renew(ctx context.Context, id, addr string, life time.Duration) (Renewal, error) {
	l.note(ctx)
	return l.memLeases.Renew(ctx, id, addr, life)
}

func (l *deadlineLeases) Members(ctx context.Context) (map[string]Lease, error) {
	l.note(ctx)
	return l.memLeases.Members(ctx)
}

func (l *deadlineLeases) note(ctx context.Context) {
	d, ok := ctx.Deadline()
	if !ok {
		l.left = append(l.left, -1)
		return
	}
	l.left = append(l.left, time.Until(d))
}

// Each lease call is bounded by renewEvery whatever the engine's own
// timeout, so that an engine answering nobody spaces the calls no more
// than that and an owner never takes an outage for all for a pause.
func TestLeaseCallsAreBoundedByTheRenewalInterval(t *testing.T) {
	dl := &deadlineLeases{memLeases: newMemLeases(&clock{})}
	m := NewMembership(ownerA.ID, func() Leases { return dl }, dl.c.now)
	m.SetAddr(ownerA.Addr)
	m.Renew(context.Background())
	m.Refresh(context.Background())
	if len(dl.left) != 2 {
		t.Fatalf("%d calls seen, want a renewal and a listing", len(dl.left))
	}
	for i, left := range dl.left {
		if left < 0 || left > renewEvery {
			t.Fatalf("call %d: %v left before its deadline (-1: none); want at most %v", i, left, renewEvery)
		}
	}
}

// A key met first by A is claimed for keyTrialLife, but A's directory
// keeps the key as its own for session_ttl. Its first exchange runs past
// 30 s (a long tool call under PHP-FPM), or was answered 401 (a stranger
// naming the user with a wrong password): the engine drops the record
// (claimScript's PEXPIRE), B meets the key, claims it and serves it, and
// A goes on serving it from its entry: two instances serve one key.
func TestAKeyWhoseTrialClaimLapsedIsNotServedByTwoInstances(t *testing.T) {
	s, c := newMemStore(), &clock{}
	a, b := newDir(ownerA.ID, c), newDir(ownerB.ID, c)
	if o, forward, wait := a.RouteKey(bg, s, "key k", ownerA.Addr); forward || wait || o != ownerA {
		t.Fatalf("first to meet the key: %v, %v, %v; want served at A", o, forward, wait)
	}
	if life := s.lives["key k"]; life != keyTrialLife {
		t.Fatalf("claimed for %v, want %v", life, keyTrialLife)
	}
	// No 2xx within keyTrialLife: the engine lets the record go.
	c.add(keyTrialLife + time.Second)
	s.mu.Lock()
	delete(s.owners, "key k")
	s.mu.Unlock()

	_, bFwd, bWait := b.RouteKey(bg, s, "key k", ownerB.Addr)
	_, aFwd, aWait := a.RouteKey(bg, s, "key k", ownerA.Addr)
	if !bFwd && !bWait && !aFwd && !aWait {
		t.Fatalf("after A's trial claim lapsed in the engine, both A (from its entry) and B (its new claimer, record %q) serve the key", s.owners["key k"])
	}
}

// Made-up key values (a rotating Authorization header, no credential
// needed) each get an entry in the directory since keys are claimed on
// first sight, and a full directory evicts whichever entry the map
// yields: here the entry of a session B has just taken over from A, whose
// exchange is still marked as running. Its AwaitPrevious then finds no
// entry and lets B's first exchange go beside A's.
func TestAFloodOfMadeUpKeysDoesNotLetATakenOverSessionSkipThePreviousOwnersExchange(t *testing.T) {
	store, b := tookOverWhileMarked(t)
	for i := range 2000 { // each eviction spares s with odds 99/100
		b.RouteKey(bg, store, fmt.Sprintf("key made-up-%d", i), ownerB.Addr)
	}
	if b.AwaitPrevious(bg, store.get, "s", time.Now()) {
		t.Fatal("after a flood of made-up key values, B's first exchange of the session it took over went while A's was marked as running")
	}
}

// A key on trial reaching its claimer forwarded (Serves) is claimed again
// there, as a direct request is: once its claim lapsed and another
// instance claimed it, the first claimer answers that it does not serve it.
func TestAForwardedRequestOfAKeyOnTrialIsServedOnlyWhileItsClaimHolds(t *testing.T) {
	s, c := newMemStore(), &clock{}
	a, b := newDir(ownerA.ID, c), newDir(ownerB.ID, c)
	a.RouteKey(bg, s, "key k", ownerA.Addr)
	if !a.Serves(bg, s, "key k", ownerA.ID) {
		t.Fatal("the key's claimer refused a forwarded request while its claim holds")
	}
	c.add(keyTrialLife + time.Second)
	s.mu.Lock()
	delete(s.owners, "key k")
	s.mu.Unlock()
	if o, forward, _ := b.RouteKey(bg, s, "key k", ownerB.Addr); forward || o != ownerB {
		t.Fatalf("b after a's claim lapsed: %v, %v; want b claims it", o, forward)
	}
	if a.Serves(bg, s, "key k", ownerA.ID) {
		t.Fatal("a serves a forwarded request of a key b claimed after a's claim lapsed")
	}
}

// A's key on trial was claimed more than keyTrialLife ago; the engine let
// it go and B claimed it and serves it. A's claim at the key's next
// request gets no answer (a timeout at the state timeout; the engine may
// well have answered "B"): A serves the key from its stale trial entry,
// directly (RouteKey answers "served here") and forwarded (Serves answers
// true), beside B.
func TestAKeyOnTrialWhoseClaimGetsNoAnswerIsNotServedPastItsClaim(t *testing.T) {
	s, c := newMemStore(), &clock{}
	a, b := newDir(ownerA.ID, c), newDir(ownerB.ID, c)
	a.RouteKey(bg, s, "key k", ownerA.Addr)
	c.add(keyTrialLife + time.Second)
	s.mu.Lock()
	delete(s.owners, "key k")
	s.mu.Unlock()
	if o, forward, _ := b.RouteKey(bg, s, "key k", ownerB.Addr); forward || o != ownerB {
		t.Fatalf("b after a's claim lapsed: %v, %v; want b claims it", o, forward)
	}
	s.mu.Lock()
	s.fail = errors.New("i/o timeout")
	s.mu.Unlock()
	if _, forward, wait := a.RouteKey(bg, s, "key k", ownerA.Addr); !forward && !wait {
		t.Error("a, whose trial claim lapsed 30 s ago, serves the key b now owns when its claim gets no answer")
	}
	if a.Serves(bg, s, "key k", ownerA.ID) {
		t.Error("a serves a forwarded request of the key b now owns when its claim gets no answer")
	}
}

// Keys on trial at another instance are remembered here as proven
// (RouteKey's keep marks trial only when o is this instance): a flood of
// made-up values, each sent twice (the first reaches C, which claims it on
// trial; round robin brings the second to B), fills B's directory with
// entries that evict whatever the map yields, here the entry of a
// session B has just taken over from A, whose exchange is still marked
// running: B's first exchange then skips AwaitPrevious.
func TestKeysOnTrialElsewhereDoNotPushATakenOverSessionOut(t *testing.T) {
	ownerC := Owner{ID: "cccc", Addr: "10.0.0.3:8080"}
	store, b := tookOverWhileMarked(t)
	for i := range 2000 {
		id := fmt.Sprintf("key made-up-%d", i)
		// C met the value first: its claim, on trial, names C.
		store.memStore.mu.Lock()
		store.memStore.owners[id] = ownerC.String()
		store.memStore.mu.Unlock()
		b.RouteKey(bg, store, id, ownerB.Addr)
	}
	if b.AwaitPrevious(bg, store.get, "s", time.Now()) {
		t.Fatal("made-up key values on trial at another instance pushed the entry of a session B took over out of B's directory: its first exchange went while A's was marked running")
	}
}

// A owns session s. Redis restarts empty (or fails over to a replica
// that lacks the leases) while A is frozen (SIGSTOP, a paused VM) past
// the lock delay: the others see A's lease absent that long and B claims
// s (its record names B). A wakes; its renewal is answered in time and
// finds its lease forgotten, which A takes as "nobody saw it lapse"
// (Renew's default case) though A knows it went a lease's life and more
// without renewing: Confirm trusts A's entry and A serves s beside B.
func TestAnOwnerFrozenAcrossAnEngineRestartConfirmsBeforeServing(t *testing.T) {
	s, l := newMemStore(), newMemLeases(&clock{})
	a := leasedDir(ownerA, l)
	a.Members().Renew(bg)
	a.remember("s", ownerA)
	s.owners["s"] = ownerA.String()
	if !a.Confirm(bg, s, "s", ownerA.Addr) {
		t.Fatal("a live owner did not confirm its session")
	}
	// Frozen past the lease and the lock delay; meanwhile Redis restarts
	// empty and B claims s (claimLost: A's lease seen absent that long).
	l.c.add(LeaseLife + lockDelay + time.Second)
	l.forget()
	s.mu.Lock()
	s.owners["s"] = ownerB.String()
	s.mu.Unlock()
	if a.Confirm(bg, s, "s", ownerA.Addr) {
		t.Fatal("a, frozen past its lease across an engine restart, confirmed s, whose record names b: both serve it")
	}
}

// A flood of made-up key values (a rotating Authorization header) leaves
// keys on trial at A. Redis then restarts empty: A's renewal finds its
// lease forgotten and ReclaimKeys claims every key A owns, trial or not,
// for a session's life, and remembers each as proven. The made-up values
// then live session_ttl in Redis and count as proven entries in A's
// directory, where they may push sessions out.
func TestAnEngineRestartKeepsKeysOnTrialOnTrial(t *testing.T) {
	s, c := newMemStore(), &clock{}
	a := newDir(ownerA.ID, c)
	for i := range 10 {
		a.RouteKey(bg, s, fmt.Sprintf("key made-up-%d", i), ownerA.Addr)
	}
	// Redis restarts empty.
	s.mu.Lock()
	clear(s.owners)
	s.mu.Unlock()
	a.ReclaimKeys(bg, s)
	for i := range 10 {
		id := fmt.Sprintf("key made-up-%d", i)
		s.mu.Lock()
		life, claimed := s.lives[id]
		s.mu.Unlock()
		if claimed && life != keyTrialLife {
			t.Fatalf("%s, never answered by the upstream, reclaimed for %v after an engine restart; want %v", id, life, keyTrialLife)
		}
		if k, ok := a.entry(id); ok && !k.trial {
			t.Fatalf("%s, never answered by the upstream, is remembered as proven after an engine restart", id)
		}
	}
}

// A meets key k (a stranger's wrong password, or a user's first request)
// and claims it on trial, for 30 s. A is killed; B takes the key over
// (takeOverScript changes the owner and leaves the record's life, the
// rest of A's 30 s) and remembers it as a plain session it took over:
// neither a key nor on trial, so B never claims it again at its requests
// and KeyAnswered waits half a session's life. The record lapses; C meets
// the key, claims it and serves it; B still serves it from its entry.
func TestAKeyOnTrialTakenOverFromAKilledOwnerIsNotServedByTwoInstances(t *testing.T) {
	ownerC := Owner{ID: "cccc", Addr: "10.0.0.3:8080"}
	s, l := newMemStore(), newMemLeases(&clock{})
	a, b, c := leasedDir(ownerA, l), leasedDir(ownerB, l), leasedDir(ownerC, l)
	for _, d := range []*Directory{a, b, c} {
		d.Members().Renew(bg)
		d.Members().Refresh(bg)
	}
	if o, forward, _ := a.RouteKey(bg, s, "key k", ownerA.Addr); forward || o != ownerA {
		t.Fatalf("a meets the key: %v, %v; want served at a", o, forward)
	}
	lapse(l, ownerA, b, c) // a is killed
	if o, forward, _ := b.RouteKey(bg, s, "key k", ownerB.Addr); forward || o != ownerB {
		t.Fatalf("b after a died: %v, %v; want taken over", o, forward)
	}
	// The rest of a's 30 s claim passes: the engine lets the record go.
	s.mu.Lock()
	delete(s.owners, "key k")
	s.mu.Unlock()
	if o, forward, _ := c.RouteKey(bg, s, "key k", ownerC.Addr); forward || o != ownerC {
		t.Fatalf("c after the record lapsed: %v, %v; want c claims it", o, forward)
	}
	if _, forward, wait := b.RouteKey(bg, s, "key k", ownerB.Addr); !forward && !wait {
		t.Fatalf("b serves the key c now owns (record %q): b took it over as a plain session and never claims it again", s.owners["key k"])
	}
}

// tookOverWhileMarked is B (remembering 100 owners, as max_sessions) just
// after it took session s over from A, whose exchange is marked running.
func tookOverWhileMarked(t *testing.T) (*runningStore, *Directory) {
	t.Helper()
	store := newRunningStore()
	store.memStore.owners["s"] = ownerA.String()
	_ = store.MarkRunning(bg, "s", ownerA.String(), time.Hour)
	<-store.marked
	b := newRealDir(ownerB.ID)
	if o, forward, _ := b.takeOver(bg, store, "s", ownerA, ownerB.Addr, false); forward || o != ownerB {
		t.Fatalf("after the takeover: %v, forward %v; want served here", o, forward)
	}
	return store, b
}

// ownersOfS1 is A, keeping its lease in l (over ml's engine), owning s1,
// and B on ml, both renewed.
func ownersOfS1(l Leases, ml *memLeases) (*memStore, *Directory, *Directory) {
	s := newMemStore()
	am := NewMembership(ownerA.ID, func() Leases { return l }, ml.c.now)
	am.SetAddr(ownerA.Addr)
	a := NewDirectory(am, 100, time.Hour, ml.c.now)
	b := leasedDir(ownerB, ml)
	a.Created("s1", ownerA.Addr)
	s.owners["s1"] = ownerA.String()
	a.Members().Renew(bg)
	b.Members().Renew(bg)
	return s, a, b
}

// A client's made-up session ids naming instances nobody knows must not
// keep an instance that starts later out of the membership: with
// upstream_sessions instance (pinned), Route on such an id calls
// liveness, whose Noticed fills the members table up to maxMembers.
func TestMadeUpInstanceIDsDoNotKeepANewInstanceOutOfTheMembership(t *testing.T) {
	bg := context.Background()
	l := newMemLeases(&clock{})
	for _, o := range []Owner{ownerA, ownerB} {
		l.leases[o.ID] = lease{o.Addr, time.Time{}.Add(1000 * time.Hour), 1, false}
	}
	d := NewDirectory(NewMembership(ownerB.ID, func() Leases { return l }, nil), 100, time.Hour, nil)
	d.Members().Refresh(bg)
	d.SetPinned(true)
	store := newMemStore()
	for i := range maxMembers {
		made := fmt.Sprintf("%016x", 0xfeed0000+i)
		d.Route(bg, store, fmt.Sprintf("s%d", i), made, ownerB.Addr)
	}
	ownerC := Owner{ID: "cccc", Addr: "10.0.0.3:8080"}
	l.mu.Lock()
	l.leases[ownerC.ID] = lease{ownerC.Addr, time.Time{}.Add(1000 * time.Hour), 1, false}
	l.mu.Unlock()
	d.Members().Refresh(bg)
	if live, addr := d.Members().Status(ownerC.ID); live != Alive || addr != ownerC.Addr {
		t.Fatalf("a new instance listed after %d made-up ids: %v %q; want Alive at its address", maxMembers, live, addr)
	}
}

// Two instances started under one ID (one instance_name given to both)
// renew one lease from two addresses: each renewal after its first finds
// it renewed from the other's, and the second such says so; neither a
// lone instance whose address changed nor one that finds its previous
// run's lease standing is told so.
func TestTwoInstancesRenewingOneIDAreToldOfEachOther(t *testing.T) {
	l := newMemLeases(&clock{})
	member := func(id, addr string) *Membership {
		m := NewMembership(id, func() Leases { return l }, l.c.now)
		m.SetAddr(addr)
		return m
	}
	renew := func(ms ...*Membership) {
		for _, m := range ms {
			l.c.add(100 * time.Millisecond)
			m.Renew(context.Background())
		}
	}
	var told []string
	first, second := member("same", "10.0.0.1:80"), member("same", "10.0.0.2:80")
	first.OnShared(func(addr string) { told = append(told, addr) })
	renew(first, first)
	if at, _ := first.Shared(); !at.IsZero() || len(told) != 0 {
		t.Fatalf("a lone instance was told another renews its lease (%v)", told)
	}
	renew(second, first, second)
	if at, _ := first.Shared(); !at.IsZero() {
		t.Fatal("one sighting of another address made the first instance tell; an engine gone back in time shows one too")
	}
	renew(first, second)
	if at, addr := first.Shared(); at.IsZero() || addr != "10.0.0.2:80" || len(told) != 1 {
		t.Fatalf("the first instance learned of the second at %v, %q (told %v); want it told of 10.0.0.2:80", at, addr, told)
	}
	if at, addr := second.Shared(); at.IsZero() || addr != "10.0.0.1:80" {
		t.Fatalf("the second instance learned of the first at %v, %q; want it told of 10.0.0.1:80", at, addr)
	}

	moved := member("moved", "127.0.0.1:80")
	renew(moved)
	moved.SetAddr("10.0.0.3:80") // a loopback address gives way
	renew(moved, moved)
	if at, _ := moved.Shared(); !at.IsZero() {
		t.Fatal("an instance whose own address changed was told another renews its lease")
	}

	l.leases["again"] = lease{"10.0.0.4:80", l.c.now().Add(15 * time.Second), 1, false} // its previous run kept it
	again := member("again", "10.0.0.5:80")
	renew(again, again)
	if at, _ := again.Shared(); !at.IsZero() {
		t.Fatal("an instance started again at a new address was told its previous run's lease is another instance's")
	}
}

// A request that reaches an instance at no address another instance could
// dial (over TLS without advertise, a unix socket, a listener wrapper it
// cannot see through) for a session whose owner's lease lapsed: Route
// serves it here without taking the session over, so the directory still
// knows the session as the lapsed owner's. Confirm lets it go upstream;
// refused, it would be routed here again and answered 503 every time.
func TestARequestServedHereWithoutAnAddressForALapsedOwnersSessionGoesUpstream(t *testing.T) {
	s, l := newMemStore(), newMemLeases(&clock{})
	a, b := leasedDir(ownerA, l), leasedDir(ownerB, l)
	a.Created("s1", ownerA.Addr)
	s.owners["s1"] = ownerA.String()
	a.Members().Renew(context.Background())
	b.Members().Renew(context.Background())
	b.Members().Refresh(context.Background())
	// b meets the session while a lives: forwarded there.
	if o, forward, _ := b.Route(context.Background(), s, "s1", "", ownerB.Addr); !forward || o.ID != ownerA.ID {
		t.Fatalf("b routes a's session to %v, forward %v; want a", o, forward)
	}
	lapse(l, ownerA, b)
	// Now a request of it reaches b where b has no address (TLS).
	o, forward, wait := b.Route(context.Background(), s, "s1", "", "")
	if forward || wait {
		t.Fatalf("Route: %v forward %v wait %v; want served here (no address to take it over with)", o, forward, wait)
	}
	if !b.Confirm(context.Background(), s, "s1", "") {
		t.Fatal("Confirm refuses the request Route just served here: serveMoved routes it here again and answers 503 owner_moved, every time")
	}
}

// A resumed owner (a) learns that b took its session over and sends its
// first queued request on to b; b is then killed and c takes the session
// over from it. a's next queued request must not go upstream at a: the
// session is c's, and a serving it without a takeover would run beside
// c's requests, unmarked.
func TestAQueuedRequestOfASessionKnownAsALapsedOwnersIsRoutedAgainNotServedHere(t *testing.T) {
	s, l := newMemStore(), newMemLeases(&clock{})
	a, b, c := leasedDir(ownerA, l), leasedDir(ownerB, l), leasedDir(ownerC, l)
	a.Created("s1", ownerA.Addr)
	s.owners["s1"] = ownerA.String()
	a.Members().Renew(bg)
	for range 2 { // two requests queued at a before its freeze
		if _, forward, wait := a.Route(bg, s, "s1", ownerA.ID, ownerA.Addr); forward || wait {
			t.Fatal("the owner did not serve its own session")
		}
	}
	lapse(l, ownerA, b, c)
	b.Route(bg, s, "s1", ownerA.ID, ownerB.Addr)
	l.c.add(verifyDelay)
	if a.Confirm(bg, s, "s1", ownerA.Addr) {
		t.Fatal("the first queued request would go upstream beside b")
	}
	// The first is sent on to b (a's turn held); b is killed meanwhile.
	lapse(l, ownerB, a, c)
	if o, forward, _ := c.Route(bg, s, "s1", "", ownerC.Addr); forward || o != ownerC {
		t.Fatalf("c routes the session to %v, forward %v; want taken over by c", o, forward)
	}
	if a.Confirm(bg, s, "s1", ownerA.Addr) {
		t.Fatal("a's second queued request goes upstream at a while c owns the session (record " + s.owners["s1"] + ")")
	}
	if o, forward, _ := a.Route(bg, s, "s1", ownerA.ID, ownerA.Addr); !forward || o.ID != ownerC.ID {
		t.Fatalf("a routes the session to %v, forward %v; want c", o, forward)
	}
}

// A pinned instance started again at a new address (a pod rescheduled:
// the same instance_name, a new IP) while its previous run's lease, kept
// 15 s, still stands at the old one; then the engine fails over to a
// replica that had not received its renewals yet (or is restored from a
// snapshot taken in those seconds), so that one renewal finds the lease
// at the old address. One sighting after the engine went back in time is
// not two instances sharing an ID, which see each other at every renewal.
func TestAFailoverThatForgetsARestartedInstancesRenewalsIsNotASharedID(t *testing.T) {
	l := newMemLeases(&clock{})
	l.leases["p"] = lease{"10.0.0.4:80", l.c.now().Add(15 * time.Second), 1, false}
	kept := l.leases["p"]
	m := NewMembership("p", func() Leases { return l }, l.c.now)
	m.SetAddr("10.0.0.5:80")
	var told []string
	m.OnShared(func(addr string) { told = append(told, addr) })
	for range 2 {
		l.c.add(time.Second)
		m.Renew(bg)
	}
	l.mu.Lock()
	l.leases["p"] = kept // the engine failed over to a replica that lost those renewals
	l.mu.Unlock()
	for range 4 {
		l.c.add(time.Second)
		m.Renew(bg)
	}
	if at, addr := m.Shared(); !at.IsZero() || len(told) != 0 {
		t.Fatalf("one instance, its engine failed over, was told another renews its lease from %q (told %v)", addr, told)
	}
}
