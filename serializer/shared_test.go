package serializer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeStore is an in-memory Store shared by the tables of a test, as Redis
// would be by instances. It counts calls, logs writes in the order they
// arrive, and can be made slow, blocked or failing.
type fakeStore struct {
	mu      sync.Mutex
	records map[string]Record
	calls   map[string]int
	writes  []string // "op id", in arrival order
	latency time.Duration
	block   chan struct{} // non-nil: calls wait until it is closed (or their deadline)
	fail    error         // non-nil: every call fails with it
}

func newFakeStore() *fakeStore {
	return &fakeStore{records: map[string]Record{}, calls: map[string]int{}}
}

var errStoreDown = errors.New("store down")

// call counts op and applies the configured latency, block and failure.
func (f *fakeStore) call(ctx context.Context, op string) error {
	f.mu.Lock()
	f.calls[op]++
	latency, block, fail := f.latency, f.block, f.fail
	f.mu.Unlock()
	if latency > 0 {
		select {
		case <-time.After(latency):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return fail
}

func (f *fakeStore) write(ctx context.Context, op, id string, apply func(rec Record, found bool) (Record, bool)) error {
	if err := f.call(ctx, op); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.writes = append(f.writes, op+" "+id)
	rec, found := f.records[id]
	if rec, keep := apply(rec, found); keep {
		f.records[id] = rec
	} else {
		delete(f.records, id)
	}
	return nil
}

func (f *fakeStore) Created(ctx context.Context, id string, deadline time.Time) error {
	return f.write(ctx, "Created", id, func(Record, bool) (Record, bool) {
		return Record{InitDeadline: deadline, InitializeInFlight: true}, true
	})
}

func (f *fakeStore) InitializeEnded(ctx context.Context, id string) error {
	return f.write(ctx, "InitializeEnded", id, func(rec Record, found bool) (Record, bool) {
		rec.InitializeInFlight = false
		return rec, found
	})
}

func (f *fakeStore) Opened(ctx context.Context, id string) error {
	return f.write(ctx, "Opened", id, func(rec Record, found bool) (Record, bool) {
		return Record{Open: true}, found
	})
}

func (f *fakeStore) Touch(ctx context.Context, id string) error {
	return f.write(ctx, "Touch", id, func(rec Record, found bool) (Record, bool) { return rec, found })
}

func (f *fakeStore) Forget(ctx context.Context, id string) error {
	return f.write(ctx, "Forget", id, func(Record, bool) (Record, bool) { return Record{}, false })
}

func (f *fakeStore) Lookup(ctx context.Context, id string) (Record, bool, error) {
	if err := f.call(ctx, "Lookup"); err != nil {
		return Record{}, false, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	rec, found := f.records[id]
	return rec, found, nil
}

func (f *fakeStore) count(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

func (f *fakeStore) total() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		n += c
	}
	return n
}

func (f *fakeStore) record(id string) (Record, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rec, found := f.records[id]
	return rec, found
}

func (f *fakeStore) put(id string, rec Record) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.records[id] = rec
}

func (f *fakeStore) writeLog() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.writes)
}

// newInstances returns n tables on one fake clock sharing store, as n
// Caddy instances behind one front would.
func newInstances(t *testing.T, n int, store Store, edit func(*Config)) ([]*Table, *fakeClock) {
	t.Helper()
	clock := newFakeClock()
	tabs := make([]*Table, n)
	for i := range tabs {
		cfg := Defaults()
		cfg.Clock = clock
		cfg.Store = store
		if edit != nil {
			edit(&cfg)
		}
		tabs[i] = NewTable(cfg)
		t.Cleanup(tabs[i].Close)
	}
	return tabs, clock
}

func gateOf(tab *Table, id string) (gateState, bool) {
	s, ok := tracked(tab, id)
	if !ok {
		return 0, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gate, true
}

// adoptionDone reports whether tab has settled id's lookup.
func adoptionDone(tab *Table, id string) bool {
	s, ok := tracked(tab, id)
	if !ok {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.lookingUp
}

// idle reports whether tab tracks id with nothing holding it: its lookup
// settled, its slot freed and its last reference dropped, so that it sits
// on an idle list. The slot is freed a moment after the lookup settles.
func idle(tab *Table, id string) bool {
	tab.mu.Lock()
	defer tab.mu.Unlock()
	s, ok := tab.sessions[id]
	if !ok || s.refs.Load() != 0 {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.lookingUp && s.slot == slotFree
}

// synthSource counts the synthesizers asked of it.
type synthSource struct {
	asked atomic.Int32
	send  func(context.Context) bool
}

func (s *synthSource) Synthesizer(string) func(context.Context) bool {
	s.asked.Add(1)
	return s.send
}

func TestCreatedIsWrittenBeforeBeginReturns(t *testing.T) {
	store := newFakeStore()
	store.latency = 10 * time.Millisecond // an engine a network away
	tabs, clock := newInstances(t, 1, store, nil)
	initialize, ok := tabs[0].Begin("s", nil)
	if !ok {
		t.Fatal("Begin refused a new session")
	}
	defer initialize.Done(200)
	rec, found := store.record("s")
	if !found {
		t.Fatal("no record when Begin returned: a follow-up could reach another instance first")
	}
	if !rec.InitializeInFlight || rec.Open || !rec.InitDeadline.Equal(clock.Now().Add(10*time.Second)) {
		t.Fatalf("record = %+v, want initializing, in flight, deadline now+init_timeout", rec)
	}
}

func TestFailedCreatedStillBeginsTheSession(t *testing.T) {
	store := newFakeStore()
	store.fail = errStoreDown
	tabs, _ := newInstances(t, 1, store, nil)
	initialize, ok := tabs[0].Begin("s", nil)
	if g, _ := gateOf(tabs[0], "s"); !ok || g != gateInitializing {
		t.Fatal("a store failure refused or ungated a new session")
	}
	initialize.Done(200)
	held := acquireAsync(t, tabs[0], bg, "s", 0)
	mustWait(t, held) // the local gate holds as without a store
	mustGet(t, acquireAsync(t, tabs[0], bg, "s", CarriesInitialized)).turn.Done(202)
	mustGet(t, held).turn.Done(200)
}

func TestFollowUpOnAnotherInstanceIsHeldUntilInitializedAck(t *testing.T) {
	store := newFakeStore()
	tabs, _ := newInstances(t, 2, store, nil)
	creator, other := tabs[0], tabs[1]
	initialize, _ := creator.Begin("s", nil)
	initialize.Done(200)
	eventually(t, func() bool { rec, _ := store.record("s"); return !rec.InitializeInFlight })

	// The client pipelines; the front sends both to the other instance.
	setLevel := acquireAsync(t, other, bg, "s", 0)
	initialized := acquireAsync(t, other, bg, "s", CarriesInitialized)
	r := mustGet(t, initialized)
	if r.err != nil {
		t.Fatal(r.err)
	}
	mustWait(t, setLevel) // not before the upstream answered initialized
	r.turn.Done(202)
	mustGet(t, setLevel).turn.Done(200)
	eventually(t, func() bool { rec, _ := store.record("s"); return rec.Open })
}

// An instance that could not read a session's record (the engine was
// failing over) lets its requests through without a gate; when
// notifications/initialized is acknowledged there, it still marks the
// record open, which the session's creator waits for.
func TestInitializedAcknowledgedWhereTheRecordWasUnreadableStillOpensIt(t *testing.T) {
	store := newFakeStore()
	tabs, _ := newInstances(t, 2, store, nil)
	creator, other := tabs[0], tabs[1]
	initialize, _ := creator.Begin("s", nil)
	initialize.Done(200)
	eventually(t, func() bool { rec, _ := store.record("s"); return !rec.InitializeInFlight })

	store.mu.Lock()
	store.fail = errStoreDown
	store.mu.Unlock()
	initialized := mustGet(t, acquireAsync(t, other, bg, "s", CarriesInitialized))
	if g, _ := gateOf(other, "s"); initialized.err != nil || g != gateOpen {
		t.Fatalf("with the record unreadable: err=%v gate=%v, want the request through", initialized.err, g)
	}
	store.mu.Lock()
	store.fail = nil
	store.mu.Unlock()
	initialized.turn.Done(202)
	eventually(t, func() bool { rec, _ := store.record("s"); return rec.Open })
}

func TestConcurrentFirstRequestsShareOneLookup(t *testing.T) {
	store := newFakeStore()
	store.put("s", Record{Open: true})
	store.block = make(chan struct{})
	tabs, _ := newInstances(t, 1, store, nil)
	var waiting []<-chan result
	for range 5 {
		waiting = append(waiting, acquireAsync(t, tabs[0], bg, "s", 0))
	}
	close(store.block)
	for i, ch := range waiting {
		r := mustGet(t, ch)
		if r.err != nil {
			t.Fatalf("request %d: %v", i, r.err)
		}
		for _, later := range waiting[i+1:] {
			mustWait(t, later) // arrival order, one at a time
		}
		r.turn.Done(200)
	}
	if n := store.count("Lookup"); n != 1 {
		t.Fatalf("lookups = %d, want 1 for five concurrent first requests", n)
	}
}

func TestKnownSessionNeverCallsTheStore(t *testing.T) {
	store := newFakeStore()
	store.put("adopted", Record{Open: true})
	tabs, _ := newInstances(t, 1, store, nil)
	tab := tabs[0]
	initialize, _ := tab.Begin("created", nil)
	initialize.Done(200)
	turn, _ := tab.Acquire(bg, "created", CarriesInitialized)
	turn.Done(202)
	turn, _ = tab.Acquire(bg, "adopted", 0)
	turn.Done(200)
	eventually(t, func() bool { return store.count("Opened") == 1 })
	before := store.total()

	src := &synthSource{}
	for range 100 {
		for _, id := range []string{"created", "adopted"} {
			turn, err := tab.AcquireFrom(bg, id, 0, src)
			if err != nil {
				t.Fatal(err)
			}
			turn.Done(200)
			if err := tab.WaitGate(bg, id); err != nil {
				t.Fatal(err)
			}
		}
	}
	if after := store.total(); after != before {
		t.Fatalf("store calls went from %d to %d over 400 requests of known sessions", before, after)
	}
	if n := src.asked.Load(); n != 0 {
		t.Fatalf("asked known open sessions' requests for a synthesizer %d times", n)
	}
}

func TestAdoptedSessionKeepsRemainingInitTimeout(t *testing.T) {
	var timedOut atomic.Int32
	store := newFakeStore()
	tabs, clock := newInstances(t, 1, store, func(c *Config) {
		c.Events = &countingEvents{gateTimeouts: &timedOut}
	})
	store.put("s", Record{InitDeadline: clock.Now().Add(4 * time.Second)})
	held := acquireAsync(t, tabs[0], bg, "s", 0)
	eventually(t, func() bool { return adoptionDone(tabs[0], "s") })
	clock.Advance(3 * time.Second)
	mustWait(t, held)
	clock.Advance(time.Second) // the creator's deadline, not 10s from now
	if r := mustGet(t, held); r.err != nil {
		t.Fatalf("held request after the remaining init_timeout: %v", r.err)
	} else {
		r.turn.Done(200)
	}
	if timedOut.Load() != 1 {
		t.Fatalf("gate timeouts = %d, want 1", timedOut.Load())
	}
}

func TestAdoptedSessionPastItsDeadlineAppliesTheActionAtOnce(t *testing.T) {
	store := newFakeStore()
	tabs, clock := newInstances(t, 1, store, func(c *Config) { c.OnInitTimeout = Reject })
	store.put("s", Record{InitDeadline: clock.Now().Add(-time.Second)})
	if r := mustGet(t, acquireAsync(t, tabs[0], bg, "s", 0)); !errors.Is(r.err, ErrNotInitialized) {
		t.Fatalf("err = %v, want ErrNotInitialized", r.err)
	}
	mustGet(t, acquireAsync(t, tabs[0], bg, "s", CarriesInitialized)).turn.Done(202)
}

func TestAdoptedSessionSynthesizesWithAWaitingRequestsSender(t *testing.T) {
	store := newFakeStore()
	tabs, clock := newInstances(t, 1, store, func(c *Config) { c.OnInitTimeout = Synthesize })
	tab := tabs[0]
	store.put("s", Record{InitDeadline: clock.Now().Add(time.Second)})
	var sent atomic.Int32
	src := &synthSource{send: func(ctx context.Context) bool {
		turn, err := tab.Acquire(ctx, "s", CarriesInitialized)
		if err != nil {
			return false
		}
		sent.Add(1)
		turn.Done(202)
		return true
	}}
	held := make(chan result, 1)
	go func() {
		turn, err := tab.AcquireFrom(bg, "s", 0, src)
		held <- result{turn, err}
	}()
	eventually(t, func() bool { return adoptionDone(tab, "s") && src.asked.Load() == 1 })
	mustWait(t, held)
	clock.Advance(time.Second)
	if r := mustGet(t, held); r.err != nil {
		t.Fatal(r.err)
	} else {
		r.turn.Done(200)
	}
	if sent.Load() != 1 || src.asked.Load() != 1 {
		t.Fatalf("synthesized %d times from %d senders, want 1 from 1", sent.Load(), src.asked.Load())
	}
}

func TestFollowUpsWaitWhileInitializeIsInFlightElsewhere(t *testing.T) {
	store := newFakeStore()
	tabs, clock := newInstances(t, 2, store, nil)
	creator, other := tabs[0], tabs[1]
	initialize, _ := creator.Begin("s", nil) // its response still streaming

	initialized := acquireAsync(t, other, bg, "s", CarriesInitialized)
	for range 20 {
		clock.Advance(inFlightMaxBackoff)
		mustWait(t, initialized)
	}
	if n := store.count("Lookup"); n < 2 {
		t.Fatalf("lookups = %d, want the record read again while in flight", n)
	}
	initialize.Done(200)
	eventually(t, func() bool { rec, _ := store.record("s"); return !rec.InitializeInFlight })
	var r result
	eventually(t, func() bool {
		clock.Advance(inFlightMaxBackoff)
		select {
		case r = <-initialized:
			return true
		default:
			return false
		}
	})
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.turn.Done(202)
}

func TestStoreErrorFallsBackToQueueOnlyWithinTheBound(t *testing.T) {
	store := newFakeStore()
	store.fail = errStoreDown
	tabs, _ := newInstances(t, 1, store, nil)
	first := mustGet(t, acquireAsync(t, tabs[0], bg, "s", 0))
	if g, _ := gateOf(tabs[0], "s"); first.err != nil || g != gateOpen {
		t.Fatalf("first request with the store failing: err=%v gate=%v", first.err, g)
	}
	second := acquireAsync(t, tabs[0], bg, "s", 0)
	mustWait(t, second) // still one at a time
	first.turn.Done(200)
	mustGet(t, second).turn.Done(200)
	if err := tabs[0].WaitGate(bg, "other"); err != nil {
		t.Fatalf("GET with the store failing: %v", err)
	}
}

func TestSlowStoreNeverDelaysARequestPastItsBound(t *testing.T) {
	store := newFakeStore()
	store.block = make(chan struct{}) // never answers; honours deadlines
	defer close(store.block)
	tabs, _ := newInstances(t, 1, store, func(c *Config) { c.StoreTimeout = 20 * time.Millisecond })
	tab := tabs[0]

	begun := make(chan Turn, 1)
	go func() { turn, _ := tab.Begin("created", nil); begun <- turn }()
	select {
	case turn := <-begun:
		turn.Done(200) // its InitializeEnded must not hold this up either
	case <-time.After(5 * time.Second):
		t.Fatal("Begin waited on a store that never answers")
	}
	r := mustGet(t, acquireAsync(t, tab, bg, "unknown", 0))
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.turn.Done(200)
	got := make(chan error, 1)
	go func() { got <- tab.WaitGate(bg, "unknown-get") }()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("GET waited on a store that never answers")
	}
}

func TestCreatorDoesNotActOnTimeoutWhenOpenedElsewhere(t *testing.T) {
	var timedOut atomic.Int32
	var synthesized atomic.Int32
	store := newFakeStore()
	tabs, clock := newInstances(t, 2, store, func(c *Config) {
		c.OnInitTimeout = Synthesize
		c.Events = &countingEvents{gateTimeouts: &timedOut}
	})
	creator, other := tabs[0], tabs[1]
	initialize, _ := creator.Begin("s", func(context.Context) bool { synthesized.Add(1); return true })
	initialize.Done(200)
	eventually(t, func() bool { rec, _ := store.record("s"); return !rec.InitializeInFlight })
	mustGet(t, acquireAsync(t, other, bg, "s", CarriesInitialized)).turn.Done(202)
	eventually(t, func() bool { rec, _ := store.record("s"); return rec.Open })

	clock.Advance(10 * time.Second)
	eventually(t, func() bool { g, _ := gateOf(creator, "s"); return g == gateOpen })
	if timedOut.Load() != 0 || synthesized.Load() != 0 {
		t.Fatalf("creator reported %d gate timeouts and synthesized %d times for a session opened elsewhere",
			timedOut.Load(), synthesized.Load())
	}
}

func TestCreatorActsOnTimeoutWhenNotOpenedAnywhere(t *testing.T) {
	var timedOut atomic.Int32
	store := newFakeStore()
	tabs, clock := newInstances(t, 1, store, func(c *Config) {
		c.OnInitTimeout = Reject
		c.Events = &countingEvents{gateTimeouts: &timedOut}
	})
	initialize, _ := tabs[0].Begin("s", nil)
	initialize.Done(200)
	held := acquireAsync(t, tabs[0], bg, "s", 0)
	clock.Advance(10 * time.Second)
	if r := mustGet(t, held); !errors.Is(r.err, ErrNotInitialized) {
		t.Fatalf("err = %v, want ErrNotInitialized", r.err)
	}
	if timedOut.Load() != 1 {
		t.Fatalf("gate timeouts = %d, want 1", timedOut.Load())
	}
}

func TestRestartedInstanceRecoversGatedSession(t *testing.T) {
	store := newFakeStore()
	tabs, _ := newInstances(t, 2, store, nil)
	before, restarted := tabs[0], tabs[1]
	initialize, _ := before.Begin("s", nil)
	initialize.Done(200)
	eventually(t, func() bool { rec, _ := store.record("s"); return !rec.InitializeInFlight })
	before.Close() // its table is gone; the record stays

	got := make(chan error, 1)
	go func() { got <- restarted.WaitGate(bg, "s") }()
	held := acquireAsync(t, restarted, bg, "s", 0)
	mustWait(t, held)
	select {
	case err := <-got:
		t.Fatalf("GET passed the gate of a recovered session: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	mustGet(t, acquireAsync(t, restarted, bg, "s", CarriesInitialized)).turn.Done(202)
	mustGet(t, held).turn.Done(200)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

func TestDropForgetsTheRecord(t *testing.T) {
	store := newFakeStore()
	store.latency = time.Millisecond // writes overlap unless kept in order
	tabs, _ := newInstances(t, 1, store, nil)
	tab := tabs[0]

	initialize, _ := tab.Begin("deleted", nil)
	initialize.Done(200)
	turn, _ := tab.Acquire(bg, "deleted", CarriesInitialized)
	turn.Done(202)
	turn, _ = tab.Acquire(bg, "deleted", EndsSession)
	turn.Done(200)

	initialize, _ = tab.Begin("unknown-upstream", nil)
	initialize.Done(404)

	// Writes queued while another is sent go as the strongest of them
	// (writes.go): which ones the store sees depends on timing, their
	// order does not.
	byID := func() map[string][]string {
		ops := map[string][]string{}
		for _, w := range store.writeLog() {
			var op, id string
			fmt.Sscan(w, &op, &id)
			ops[id] = append(ops[id], op)
		}
		return ops
	}
	eventually(t, func() bool {
		ops := byID()
		return len(ops["deleted"]) > 0 && ops["deleted"][len(ops["deleted"])-1] == "Forget" &&
			len(ops["unknown-upstream"]) > 0 && ops["unknown-upstream"][len(ops["unknown-upstream"])-1] == "Forget"
	})
	inOrder := func(ops, order []string) bool {
		for _, op := range ops {
			i := slices.Index(order, op)
			if i < 0 {
				return false
			}
			order = order[i+1:]
		}
		return true
	}
	ops := byID()
	if deleted := ops["deleted"]; deleted[0] != "Created" || !inOrder(deleted, []string{"Created", "InitializeEnded", "Opened", "Forget"}) {
		t.Fatalf("writes after DELETE = %v, want Created, then some of InitializeEnded and Opened, then Forget, in that order", deleted)
	}
	if notFound := ops["unknown-upstream"]; notFound[0] != "Created" || !inOrder(notFound, []string{"Created", "InitializeEnded", "Forget"}) {
		t.Fatalf("writes after 404 = %v, want Created, perhaps InitializeEnded, then Forget", notFound)
	}
	for _, id := range []string{"deleted", "unknown-upstream"} {
		if _, found := store.record(id); found {
			t.Fatalf("record of %q kept after the session ended", id)
		}
	}
}

// An adopted gated session is kept as one begun here: idle open sessions
// are evicted first, and it never expires.
func TestAdoptedGatedSessionOutlivesIdleOpenOnesAndNeverExpires(t *testing.T) {
	store := newFakeStore()
	tabs, clock := newInstances(t, 1, store, func(c *Config) {
		c.MaxSessions = 2
		c.SessionTTL = time.Minute
		c.InitTimeout = time.Hour
	})
	tab := tabs[0]
	store.put("gated", Record{InitDeadline: clock.Now().Add(time.Hour)})
	r := mustGet(t, acquireAsync(t, tab, bg, "gated", CarriesInitialized))
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.turn.Done(500) // not acknowledged: the gate stays closed
	for i := range 5 {
		turn, _ := tab.Acquire(bg, fmt.Sprint("flood-", i), 0)
		turn.Done(200)
		eventually(t, func() bool { return idle(tab, fmt.Sprint("flood-", i)) })
	}
	clock.Advance(2 * time.Minute)
	tab.Sweep()
	if g, ok := gateOf(tab, "gated"); !ok || g != gateInitializing {
		t.Fatalf("adopted gated session: tracked=%v gate=%v, want kept and gated", ok, g)
	}
	if n := tab.Len(); n != 1 {
		t.Fatalf("Len = %d after the sweep, want only the gated session", n)
	}
}

func TestTouchRefreshesUsedRecordsAFewTimesPerTTL(t *testing.T) {
	store := newFakeStore()
	tabs, clock := newInstances(t, 1, store, func(c *Config) { c.SessionTTL = time.Hour })
	tab := tabs[0]
	for _, id := range []string{"busy", "quiet"} {
		turn, _ := tab.Acquire(bg, id, 0)
		turn.Done(200)
		// Its lookup lets go of it a moment later, which counts as a use:
		// it must come before the clock moves.
		eventually(t, func() bool { return idle(tab, id) })
	}
	sweep := func() {
		tab.Sweep()
		eventually(t, func() bool { return !tab.touching.Load() }) // the round ended
	}
	sweep()
	if n := store.count("Touch"); n != 0 {
		t.Fatalf("touched %d records before a third of the TTL", n)
	}
	clock.Advance(20 * time.Minute)
	sweep()
	for range 1000 {
		turn, _ := tab.Acquire(bg, "busy", 0)
		turn.Done(200)
	}
	sweep()
	clock.Advance(10 * time.Minute)
	sweep()
	clock.Advance(10 * time.Minute)
	sweep()
	want := []string{"Touch busy", "Touch quiet", "Touch busy"}
	got := store.writeLog()
	slices.Sort(got[:min(2, len(got))])
	if !slices.Equal(got, want) {
		t.Fatalf("touches = %v, want %v: both once, then only the one used since", got, want)
	}
}

func TestLookupSlowerThanHalfTheQueueTimeoutFallsBackToQueueOnly(t *testing.T) {
	store := newFakeStore()
	store.block = make(chan struct{})
	defer close(store.block)
	tabs, _ := newInstances(t, 1, store, func(c *Config) {
		c.StoreTimeout = time.Hour // a store bound set too high
		c.QueueTimeout = 40 * time.Millisecond
	})
	r := mustGet(t, acquireAsync(t, tabs[0], bg, "s", 0))
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.turn.Done(200)
}

func TestInitializeStuckElsewhereHoldsFollowUpsAtMostHalfTheQueueTimeout(t *testing.T) {
	store := newFakeStore()
	tabs, clock := newInstances(t, 2, store, func(c *Config) { c.QueueTimeout = 2 * time.Second })
	creator, other := tabs[0], tabs[1]
	initialize, _ := creator.Begin("s", nil) // never ends
	defer initialize.Done(200)
	initialized := acquireAsync(t, other, bg, "s", CarriesInitialized)
	var r result
	eventually(t, func() bool {
		clock.Advance(inFlightMaxBackoff)
		select {
		case r = <-initialized:
			return true
		default:
			return false
		}
	})
	if r.err != nil {
		t.Fatalf("initialized behind an initialize stuck elsewhere: %v, want its turn before queue_timeout", r.err)
	}
	r.turn.Done(202)
}

// Behind a hashing front a session's follow-ups, its DELETE included, go
// to another instance than its initialize: the creator's init_timeout
// then finds the record gone, and nothing here was held.
func TestSessionEndedElsewhereTimesOutQuietlyOnItsCreator(t *testing.T) {
	var timedOut atomic.Int32
	store := newFakeStore()
	tabs, clock := newInstances(t, 2, store, func(c *Config) {
		c.Events = &countingEvents{gateTimeouts: &timedOut}
	})
	creator, other := tabs[0], tabs[1]
	initialize, _ := creator.Begin("s", nil)
	initialize.Done(200)
	eventually(t, func() bool { rec, _ := store.record("s"); return !rec.InitializeInFlight })
	mustGet(t, acquireAsync(t, other, bg, "s", CarriesInitialized)).turn.Done(202)
	mustGet(t, acquireAsync(t, other, bg, "s", EndsSession)).turn.Done(200)
	eventually(t, func() bool { _, found := store.record("s"); return !found })

	clock.Advance(10 * time.Second)
	eventually(t, func() bool { g, _ := gateOf(creator, "s"); return g == gateOpen })
	if n := timedOut.Load(); n != 0 {
		t.Fatalf("the creator reported %d gate timeouts for a session that ended elsewhere", n)
	}
}

// A session's Opened that the store fails (an engine with no call slot
// free, a dropped connection) is sent again: otherwise the other instances
// would keep its gate closed until init_timeout, and reject its requests
// with on_init_timeout reject.
func TestFailedOpenedIsSentAgainAfterAPause(t *testing.T) {
	store := newFakeStore()
	tabs, clock := newInstances(t, 1, store, nil)
	initialize, _ := tabs[0].Begin("s", nil)
	initialize.Done(200)
	eventually(t, func() bool { rec, _ := store.record("s"); return !rec.InitializeInFlight })
	store.mu.Lock()
	store.fail = errStoreDown
	store.mu.Unlock()
	mustGet(t, acquireAsync(t, tabs[0], bg, "s", CarriesInitialized)).turn.Done(202)
	eventually(t, func() bool { return store.count("Opened") == 1 })
	store.mu.Lock()
	store.fail = nil
	store.mu.Unlock()
	// Advanced until the retry's pause, set once the failure is answered,
	// has run.
	eventually(t, func() bool {
		clock.Advance(firstWriteRetryPause)
		rec, _ := store.record("s")
		return rec.Open
	})
}

// A failing write is tried for as long as init_timeout, the longest the
// other instances hold a session's follow-ups for its Opened, and no
// longer: with init_timeout 10 s, after pauses of 0.1, 0.2, 0.4, 0.8 s and
// then 1 s eight times (9.5 s in all), 13 tries.
func TestFailingWriteIsTriedForAsLongAsInitTimeout(t *testing.T) {
	store := newFakeStore()
	tabs, clock := newInstances(t, 1, store, func(cfg *Config) { cfg.InitTimeout = 10 * time.Second })
	initialize, _ := tabs[0].Begin("s", nil)
	store.mu.Lock()
	store.fail = errStoreDown
	store.mu.Unlock()
	initialize.Done(200)
	const want = 13
	// The clock moves until the tries stop coming, a pause at a time (each
	// try's pause is set once its failure is answered); then further.
	eventually(t, func() bool {
		clock.Advance(maxWriteRetryPause)
		return store.count("InitializeEnded") >= want
	})
	for range 20 {
		clock.Advance(maxWriteRetryPause)
		time.Sleep(time.Millisecond)
	}
	if n := store.count("InitializeEnded"); n != want {
		t.Fatalf("%d attempts, want %d", n, want)
	}
}

// With GateReadAfter (order owner), a gate held that long reads its
// session's record, and opens when another instance served the session's
// notifications/initialized (it could not learn the owner while the Store
// was down); before that, a held request costs no read.
func TestAGateHeldPastGateReadAfterOpensWhenTheRecordSaysOpen(t *testing.T) {
	const readAfter = 500 * time.Millisecond
	store := newFakeStore()
	tabs, clock := newInstances(t, 2, store, func(c *Config) { c.GateReadAfter = readAfter })
	owner, other := tabs[0], tabs[1]
	initialize, _ := owner.Begin("s", nil)
	initialize.Done(200)
	eventually(t, func() bool { rec, _ := store.record("s"); return !rec.InitializeInFlight })
	toolsList := acquireAsync(t, owner, bg, "s", 0)
	mustWait(t, toolsList)
	mustGet(t, acquireAsync(t, other, bg, "s", CarriesInitialized)).turn.Done(202)
	eventually(t, func() bool { rec, _ := store.record("s"); return rec.Open })

	lookups := store.count("Lookup")
	clock.Advance(readAfter - time.Millisecond)
	mustWait(t, toolsList)
	if n := store.count("Lookup"); n != lookups {
		t.Fatalf("%d reads of the record before GateReadAfter, want none", n-lookups)
	}
	r := resultAsTheClockMoves(t, clock, toolsList, readAfter/5, "the held request stayed held after the record opened")
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.turn.Done(200)
}

// A record gone (Redis restarted without its data) counts as open, as at
// a first sight: a request held at its gate goes at the next read.
func TestAHeldRequestGoesWhenTheRecordIsLost(t *testing.T) {
	const readAfter = 500 * time.Millisecond
	store := newFakeStore()
	tabs, clock := newInstances(t, 1, store, func(c *Config) { c.GateReadAfter = readAfter })
	store.put("s", Record{InitDeadline: clock.Now().Add(time.Hour)}) // created elsewhere
	held := acquireAsync(t, tabs[0], bg, "s", 0)
	eventually(t, func() bool { return adoptionDone(tabs[0], "s") })
	mustWait(t, held)
	store.mu.Lock()
	delete(store.records, "s")
	store.mu.Unlock()
	r := resultAsTheClockMoves(t, clock, held, readAfter/5, "the request stayed held after the record was lost (until init_timeout)")
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.turn.Done(200)
}

// Without GateReadAfter a held request costs no read: behind a front that
// keeps a session on one instance, the notifications/initialized that
// opens the gate comes there.
func TestAHeldRequestCostsNoReadWithoutGateReadAfter(t *testing.T) {
	store := newFakeStore()
	tabs, clock := newInstances(t, 2, store, nil)
	initialize, _ := tabs[0].Begin("s", nil)
	initialize.Done(200)
	eventually(t, func() bool { rec, _ := store.record("s"); return !rec.InitializeInFlight })
	setLevel := acquireAsync(t, tabs[1], bg, "s", 0)
	eventually(t, func() bool { return adoptionDone(tabs[1], "s") })
	lookups := store.count("Lookup") // the first sight's
	initialized := mustGet(t, acquireAsync(t, tabs[1], bg, "s", CarriesInitialized))
	for range 5 {
		clock.Advance(time.Second)
	}
	mustWait(t, setLevel)
	initialized.turn.Done(202)
	mustGet(t, setLevel).turn.Done(200)
	if n := store.count("Lookup"); n != lookups {
		t.Fatalf("%d lookups while the request was held, want none", n-lookups)
	}
}

// resultAsTheClockMoves moves the clock on by step until ch has a result,
// failing with why after 50 steps.
func resultAsTheClockMoves(t *testing.T, clock *fakeClock, ch <-chan result, step time.Duration, why string) result {
	t.Helper()
	for range 50 {
		clock.Advance(step)
		select {
		case r := <-ch:
			return r
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatal(why)
	return result{}
}
