package serializer

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

// The larger of two writes does what both do, so the writes a session
// makes while one is on its way can go as one.
func TestTheLargerOfTwoWritesDoesWhatBothDo(t *testing.T) {
	for _, c := range []struct{ a, b, want storeOp }{
		{writeNone, opInitializeEnded, opInitializeEnded},
		{opInitializeEnded, opOpened, opOpened},
		{opOpened, opInitializeEnded, opOpened},
		{opInitializeEnded, opForget, opForget},
		{opOpened, opForget, opForget},
		{opForget, opOpened, opForget},
	} {
		if got := max(c.a, c.b); got != c.want {
			t.Errorf("max(%v, %v) = %v, want %v", c.a, c.b, got, c.want)
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
	eventually(t, func() bool { return writesAnswered(s) })
	want := []string{"Created s", "InitializeEnded s", "Forget s"}
	if got := store.writeLog(); !slices.Equal(got, want) {
		t.Fatalf("store got %q, want %q", got, want)
	}
	if _, found := store.record("s"); found {
		t.Fatal("the record outlived the session")
	}
}

// queueingStore is a fakeStore that also takes writes without blocking
// (WriteQueue): it logs them and answers each from a goroutine, or, with
// refuse set, declines them.
type queueingStore struct {
	*fakeStore
	refuse   bool // decline every write
	qmu      sync.Mutex
	failOnce string        // answer the first write of this op with errStoreDown
	hold     chan struct{} // nil, or the answers wait until it is closed
	queued   []string      // "op id"
}

func (q *queueingStore) take(op, id string, done func(error)) bool {
	if q.refuse {
		return false
	}
	q.qmu.Lock()
	defer q.qmu.Unlock()
	q.queued = append(q.queued, op+" "+id)
	var err error
	if op == q.failOnce {
		q.failOnce, err = "", errStoreDown
	}
	hold := q.hold
	go func() {
		if hold != nil {
			<-hold
		}
		done(err)
	}()
	return true
}

func (q *queueingStore) QueueInitializeEnded(id string, done func(error)) bool {
	return q.take("InitializeEnded", id, done)
}
func (q *queueingStore) QueueOpened(id string, done func(error)) bool {
	return q.take("Opened", id, done)
}
func (q *queueingStore) QueueForget(id string, done func(error)) bool {
	return q.take("Forget", id, done)
}

func (q *queueingStore) queuedLog() []string {
	q.qmu.Lock()
	defer q.qmu.Unlock()
	return slices.Clone(q.queued)
}

// writesAnswered reports whether s has no write on its way.
func writesAnswered(s *Session) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.writing
}

// runSession opens and ends session id on tab: initialize, initialized,
// DELETE, each after the Store answered the write before it.
func runSession(t *testing.T, tab *Table, id string) {
	t.Helper()
	initialize, ok := tab.Begin(id, nil)
	if !ok {
		t.Fatal("Begin refused a new id")
	}
	s, _ := tracked(tab, id)
	initialize.Done(200)
	for _, traits := range []Traits{CarriesInitialized, EndsSession} {
		eventually(t, func() bool { return writesAnswered(s) })
		turn, err := tab.Acquire(context.Background(), id, traits)
		if err != nil {
			t.Fatal(err)
		}
		turn.Done(200)
	}
	eventually(t, func() bool { return writesAnswered(s) })
}

// A store that queues writes itself gets them all through its queue, in
// the order the session made them.
func TestWritesGoToAQueueingStoreRatherThanItsMethods(t *testing.T) {
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

// A session's next write goes through the queue only once the one before
// it was answered, so that the Store gets them in order; the writes made
// meanwhile go as one.
func TestAQueuedWriteWaitsForTheAnswerToTheOneBefore(t *testing.T) {
	hold := make(chan struct{})
	store := &queueingStore{fakeStore: newFakeStore(), hold: hold}
	tab, _ := newTestTable(t, func(c *Config) { c.Store, c.Writes = store, store })
	initialize, _ := tab.Begin("s", nil)
	s, _ := tracked(tab, "s")
	initialize.Done(200)
	for _, traits := range []Traits{CarriesInitialized, EndsSession} {
		turn, err := tab.Acquire(context.Background(), "s", traits)
		if err != nil {
			t.Fatal(err)
		}
		turn.Done(200)
	}
	if got, want := store.queuedLog(), []string{"InitializeEnded s"}; !slices.Equal(got, want) {
		t.Fatalf("queued %q before the first write was answered, want %q", got, want)
	}
	close(hold)
	eventually(t, func() bool { return writesAnswered(s) })
	if got, want := store.queuedLog(), []string{"InitializeEnded s", "Forget s"}; !slices.Equal(got, want) {
		t.Fatalf("queued %q, want %q", got, want)
	}
}

// A store that declines gets the writes through its methods, as any.
func TestWritesAStoreDeclinesToQueueGoThroughItsMethods(t *testing.T) {
	store := &queueingStore{fakeStore: newFakeStore(), refuse: true}
	tab, _ := newTestTable(t, func(c *Config) { c.Store, c.Writes = store, store })
	runSession(t, tab, "s")
	if _, found := store.record("s"); found {
		t.Fatal("the record outlived the session")
	}
	if got, want := store.writeLog(), []string{"Created s", "InitializeEnded s", "Opened s", "Forget s"}; !slices.Equal(got, want) {
		t.Fatalf("store got %q, want %q", got, want)
	}
}

// A queued write that fails (Redis failing over while the batch went) is
// queued again after a pause, so the record still opens and the other
// instances stop holding the session.
func TestQueuedWriteThatFailsIsQueuedAgainAfterAPause(t *testing.T) {
	store := &queueingStore{fakeStore: newFakeStore(), failOnce: "Opened"}
	tab, clock := newTestTable(t, func(c *Config) { c.Store, c.Writes = store, store })
	initialize, _ := tab.Begin("s", nil)
	s, _ := tracked(tab, "s")
	initialize.Done(200)
	eventually(t, func() bool { return writesAnswered(s) })
	turn, err := tab.Acquire(context.Background(), "s", CarriesInitialized)
	if err != nil {
		t.Fatal(err)
	}
	turn.Done(202)
	want := []string{"InitializeEnded s", "Opened s"}
	eventually(t, func() bool { return slices.Equal(store.queuedLog(), want) })
	time.Sleep(10 * time.Millisecond)
	if got := store.queuedLog(); !slices.Equal(got, want) {
		t.Fatalf("queued %q before the pause, want %q", got, want)
	}
	want = append(want, "Opened s")
	eventually(t, func() bool {
		clock.Advance(firstWriteRetryPause)
		return slices.Equal(store.queuedLog(), want)
	})
	eventually(t, func() bool { return writesAnswered(s) })
}
