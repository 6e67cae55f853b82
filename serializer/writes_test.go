package serializer

import (
	"context"
	"slices"
	"sync"
	"testing"
)

func TestStrongestWriteDoesAllTheQueuedWritesDo(t *testing.T) {
	for _, c := range []struct {
		ops  []storeOp
		want storeOp
	}{
		{[]storeOp{opInitializeEnded}, opInitializeEnded},
		{[]storeOp{opInitializeEnded, opOpened}, opOpened},
		{[]storeOp{opOpened, opInitializeEnded}, opOpened},
		{[]storeOp{opInitializeEnded, opForget}, opForget},
		{[]storeOp{opInitializeEnded, opOpened, opForget}, opForget},
		{[]storeOp{opForget, opOpened}, opForget},
		{[]storeOp{opForget, opForget}, opForget},
	} {
		if got := strongestWrite(c.ops); got != c.want {
			t.Errorf("strongestWrite(%v) = %v, want %v", c.ops, got, c.want)
		}
	}
}

// While a session's write is being sent, the writes it queues meanwhile
// go as one: here the session opened and ended while its InitializeEnded
// was held up, and the store then gets the Forget alone.
func TestWritesQueuedWhileOneIsSentGoAsOne(t *testing.T) {
	store := newFakeStore()
	tab, _ := newTestTable(t, func(c *Config) { c.Store = store })
	ctx := context.Background()

	initialize, ok := tab.Begin("s", nil)
	if !ok {
		t.Fatal("Begin refused a new id")
	}
	release := make(chan struct{})
	store.mu.Lock()
	store.block = release
	store.mu.Unlock()
	s, _ := tracked(tab, "s")
	initialize.Done(200)
	eventually(t, func() bool { return store.count("InitializeEnded") == 1 })

	for _, traits := range []Traits{CarriesInitialized, EndsSession} {
		turn, err := tab.Acquire(ctx, "s", traits)
		if err != nil {
			t.Fatal(err)
		}
		turn.Done(200)
	}
	close(release)
	eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return !s.writing
	})
	want := []string{"Created s", "InitializeEnded s", "Forget s"}
	if got := store.writeLog(); !slices.Equal(got, want) {
		t.Fatalf("store got %q, want %q", got, want)
	}
	if _, found := store.record("s"); found {
		t.Fatal("the record outlived the session")
	}
}

// queueingStore is a fakeStore that also takes writes without blocking
// (WriteQueue): it logs them, or, with refuse set, declines them.
type queueingStore struct {
	*fakeStore
	refuse bool   // decline every write
	fail   string // take every write, then report those of this op failed
	qmu    sync.Mutex
	queued []string // "op id"
}

func (q *queueingStore) take(op, id string, failed func()) bool {
	if q.refuse {
		return false
	}
	q.qmu.Lock()
	defer q.qmu.Unlock()
	q.queued = append(q.queued, op+" "+id)
	if op == q.fail {
		go failed()
	}
	return true
}

func (q *queueingStore) QueueInitializeEnded(id string, failed func()) bool {
	return q.take("InitializeEnded", id, failed)
}
func (q *queueingStore) QueueOpened(id string, failed func()) bool {
	return q.take("Opened", id, failed)
}
func (q *queueingStore) QueueForget(id string, failed func()) bool {
	return q.take("Forget", id, failed)
}

func (q *queueingStore) queuedLog() []string {
	q.qmu.Lock()
	defer q.qmu.Unlock()
	return slices.Clone(q.queued)
}

// runSession opens and ends session id on tab: initialize, initialized,
// DELETE.
func runSession(t *testing.T, tab *Table, id string) {
	t.Helper()
	initialize, ok := tab.Begin(id, nil)
	if !ok {
		t.Fatal("Begin refused a new id")
	}
	initialize.Done(200)
	for _, traits := range []Traits{CarriesInitialized, EndsSession} {
		turn, err := tab.Acquire(context.Background(), id, traits)
		if err != nil {
			t.Fatal(err)
		}
		turn.Done(200)
	}
}

// A store that queues writes itself gets each one as it happens, with no
// goroutine between: by the time the exchange's Done returns.
func TestWritesGoToAQueueingStoreAsTheyHappen(t *testing.T) {
	store := &queueingStore{fakeStore: newFakeStore()}
	tab, _ := newTestTable(t, func(c *Config) { c.Store, c.Writes = store, store })
	runSession(t, tab, "s")
	if got, want := store.queuedLog(), []string{"InitializeEnded s", "Opened s", "Forget s"}; !slices.Equal(got, want) {
		t.Fatalf("queued %q, want %q", got, want)
	}
	if got := store.writeLog(); !slices.Equal(got, []string{"Created s"}) {
		t.Fatalf("the store's own methods got %q, want Created alone", got)
	}
}

// A store that declines gets the writes through its methods, as any.
func TestWritesAStoreDeclinesToQueueGoThroughItsMethods(t *testing.T) {
	store := &queueingStore{fakeStore: newFakeStore(), refuse: true}
	tab, _ := newTestTable(t, func(c *Config) { c.Store, c.Writes = store, store })
	runSession(t, tab, "s")
	eventually(t, func() bool {
		log := store.writeLog()
		return len(log) > 0 && log[len(log)-1] == "Forget s"
	})
	if _, found := store.record("s"); found {
		t.Fatal("the record outlived the session")
	}
}

// A queued write that fails (Redis failing over while the batch went) is
// handed back: the table sends it again itself after a pause, so the
// record still opens and the other instances stop holding the session.
func TestQueuedWriteThatFailsIsSentAgainByTheTable(t *testing.T) {
	// Only Opened fails: a failed InitializeEnded would send the Opened
	// after it from the session's goroutine, never through the queue.
	store := &queueingStore{fakeStore: newFakeStore(), fail: "Opened"}
	tab, clock := newTestTable(t, func(c *Config) { c.Store, c.Writes = store, store })
	initialize, _ := tab.Begin("s", nil)
	initialize.Done(200)
	turn, err := tab.Acquire(context.Background(), "s", CarriesInitialized)
	if err != nil {
		t.Fatal(err)
	}
	turn.Done(202)
	eventually(t, func() bool { return slices.Contains(store.queuedLog(), "Opened s") })
	if n := store.count("Opened"); n != 0 {
		t.Fatalf("Opened sent %d times before the pause", n)
	}
	eventually(t, func() bool {
		clock.Advance(firstWriteRetryPause)
		rec, _ := store.record("s")
		return rec.Open
	})
}

// queueingTurns is a queueing store with cluster turns.
type queueingTurns struct {
	*memTurns
	q *queueingStore
}

func (t *queueingTurns) QueueInitializeEnded(id string, failed func()) bool {
	return t.q.QueueInitializeEnded(id, failed)
}
func (t *queueingTurns) QueueOpened(id string, failed func()) bool {
	return t.q.QueueOpened(id, failed)
}
func (t *queueingTurns) QueueForget(id string, failed func()) bool {
	return t.q.QueueForget(id, failed)
}

// With cluster turns too, a store that queues writes gets each one as it
// happens (it announces an Opened itself, once written).
func TestWritesWithClusterTurnsGoToAQueueingStoreToo(t *testing.T) {
	clock := newFakeClock()
	turns := newMemTurns(clock, false)
	store := &queueingTurns{memTurns: turns, q: &queueingStore{fakeStore: turns.fakeStore}}
	tab, _ := newTestTable(t, func(c *Config) { c.Store, c.Turns, c.Writes, c.Watcher = store, store, store, store })
	runSession(t, tab, "s")
	if got, want := store.q.queuedLog(), []string{"InitializeEnded s", "Opened s", "Forget s"}; !slices.Equal(got, want) {
		t.Fatalf("queued %q, want %q", got, want)
	}
}
