package stateengine

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/wait"
	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// batchingEngine is a fakeEngine that takes writes in batches. It logs
// each batch, and holds the first one until the test closes holdFirst
// (or the batch's context ends).
type batchingEngine struct {
	*fakeEngine
	timeout   time.Duration
	holdFirst chan struct{}
	arrived   chan struct{} // one per batch

	mu      sync.Mutex
	batches [][]string // "op key" of each write
}

func (e *batchingEngine) Abilities() Abilities       { return Abilities{Batch: e.Writes} }
func (e *batchingEngine) CallTimeout() time.Duration { return e.timeout }

func (e *batchingEngine) Writes(ctx context.Context, ws []*Write, _ time.Duration) {
	var names []string
	for _, w := range ws {
		names = append(names, w.Op.String()+" "+w.Key)
	}
	e.mu.Lock()
	e.batches = append(e.batches, names)
	first := len(e.batches) == 1
	e.mu.Unlock()
	e.arrived <- struct{}{}
	var err error
	if first {
		select {
		case <-e.holdFirst:
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	for _, w := range ws {
		w.Err = err
	}
}

func (e *batchingEngine) sent() [][]string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.batches)
}

func (e *batchingEngine) awaitBatch(t *testing.T) {
	t.Helper()
	select {
	case <-e.arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("no batch reached the engine within 10s")
	}
}

func newBatchingEngine(timeout time.Duration) *batchingEngine {
	return &batchingEngine{fakeEngine: newFakeEngine(), timeout: timeout,
		holdFirst: make(chan struct{}), arrived: make(chan struct{}, 1024)}
}

// queued is the number of writes waiting for a batch.
func queued(s *Adapter) int {
	s.writes.mu.Lock()
	defer s.writes.mu.Unlock()
	return len(s.writes.queued)
}

// idleSenders counts the adapter's senders waiting for writes.
func idleSenders(s *Adapter) int {
	s.writes.mu.Lock()
	defer s.writes.mu.Unlock()
	return s.writes.idle
}

// awaitAll waits for the calls' answers, each bounded.
func awaitAll(t *testing.T, errs <-chan error, n int) []error {
	t.Helper()
	var out []error
	for range n {
		select {
		case err := <-errs:
			out = append(out, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of %d calls answered within 10s", len(out), n)
		}
	}
	return out
}

func TestAdapterSendsTheWritesMadeDuringAnExchangeTogetherInTheNext(t *testing.T) {
	eng := newBatchingEngine(10 * time.Second)
	store := newTestAdapter(eng, time.Hour, zap.NewNop())
	ctx := context.Background()
	errs := make(chan error, 4)

	go func() { errs <- store.Opened(ctx, "a") }()
	eng.awaitBatch(t)
	go func() { errs <- store.InitializeEnded(ctx, "b") }()
	go func() { errs <- store.Opened(ctx, "c") }()
	go func() { errs <- store.Forget(ctx, "d") }()
	wait.Until(t, "three writes queued", func() bool { return queued(store) == 3 })
	close(eng.holdFirst)
	for _, err := range awaitAll(t, errs, 4) {
		if err != nil {
			t.Fatal(err)
		}
	}
	batches := eng.sent()
	key := serializer.StoreKey
	if len(batches) != 2 || !slices.Equal(batches[0], []string{"opened " + key("a")}) {
		t.Fatalf("batches %q, want the first write alone, then the three others together", batches)
	}
	second := slices.Sorted(slices.Values(batches[1]))
	want := slices.Sorted(slices.Values([]string{"initialize_ended " + key("b"), "opened " + key("c"), "forget " + key("d")}))
	if !slices.Equal(second, want) {
		t.Fatalf("second batch %q, want %q", second, want)
	}
}

// A client's initialize answer waits for Created: it does not wait for
// an exchange in flight to end, as the other writes do.
func TestAdapterCreatedStartsAnExchangeBesideOneInFlight(t *testing.T) {
	eng := newBatchingEngine(10 * time.Second)
	store := newTestAdapter(eng, time.Hour, zap.NewNop())
	ctx := context.Background()
	errs := make(chan error, 3)

	go func() { errs <- store.Opened(ctx, "a") }()
	eng.awaitBatch(t)
	go func() { errs <- store.Created(ctx, "new", time.Now().Add(time.Minute)) }()
	if err := awaitAll(t, errs, 1)[0]; err != nil {
		t.Fatalf("Created = %v", err)
	}
	// Created's sender answers before it goes idle; until it does, a
	// write would still go out with it.
	wait.Until(t, "Created's sender idle", func() bool { return idleSenders(store) == 1 })

	go func() { errs <- store.Touch(ctx, "b") }()
	wait.Until(t, "the Touch queued", func() bool { return queued(store) == 1 })
	if n := len(eng.sent()); n != 2 {
		t.Fatalf("%d batches sent while the first was in flight, want 2 (it and Created's)", n)
	}
	close(eng.holdFirst)
	for _, err := range awaitAll(t, errs, 2) {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := eng.sent(); len(got) != 3 || !slices.Equal(got[2], []string{"touch " + serializer.StoreKey("b")}) {
		t.Fatalf("batches %q, want the Touch in a third, once the first ended", got)
	}
}

// A write whose caller stopped waiting before it was sent is never sent:
// its session's next write, which may follow at once, must not end up
// behind it. Its slot comes back, and the failure is counted.
func TestAdapterNeverSendsAWriteItsCallerStoppedWaitingFor(t *testing.T) {
	eng := newBatchingEngine(10 * time.Second)
	store := newTestAdapter(eng, time.Hour, zap.NewNop())
	counter := testErrors.WithLabelValues("forget")
	before := testutil.ToFloat64(counter)
	errs := make(chan error, 1)

	go func() { errs <- store.Opened(context.Background(), "a") }()
	eng.awaitBatch(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := store.Forget(ctx, "late"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Forget = %v, want the caller's deadline", err)
	}
	if got := testutil.ToFloat64(counter); got != before+1 {
		t.Fatalf("%v forget errors counted, want %v", got, before+1)
	}
	close(eng.holdFirst)
	if err := awaitAll(t, errs, 1)[0]; err != nil {
		t.Fatal(err)
	}
	wait.Until(t, "the sender idle", func() bool {
		store.writes.mu.Lock()
		defer store.writes.mu.Unlock()
		return store.writes.idle == store.writes.senders
	})
	if got := eng.sent(); len(got) != 1 {
		t.Fatalf("batches %q: the abandoned write was sent", got)
	}
	if n := len(store.slots); n != 0 {
		t.Fatalf("%d slots still taken", n)
	}
}

// A sender with nothing to send ends after senderLinger: an adapter left
// behind by a reload keeps no goroutine.
func TestAdapterSendersEndOnceNoWritesCome(t *testing.T) {
	eng := newBatchingEngine(10 * time.Second)
	close(eng.holdFirst)
	store := newTestAdapter(eng, time.Hour, zap.NewNop())
	ctx := context.Background()
	errs := make(chan error, 2)
	go func() { errs <- store.Opened(ctx, "a") }()
	go func() { errs <- store.Created(ctx, "b", time.Now().Add(time.Minute)) }()
	for _, err := range awaitAll(t, errs, 2) {
		if err != nil {
			t.Fatal(err)
		}
	}
	wait.Until(t, "no sender left", func() bool {
		store.writes.mu.Lock()
		defer store.writes.mu.Unlock()
		return store.writes.senders == 0 && store.writes.idle == 0
	})
}

// takeEverySlot fills the adapter's call slots: one write hung in the
// engine's first batch, the others queued behind it. Their answers come
// on the channel once the test closes eng.holdFirst.
func takeEverySlot(t *testing.T, eng *batchingEngine, store *Adapter) <-chan error {
	t.Helper()
	ctx := context.Background()
	errs := make(chan error, maxStateCallsInFlight)
	go func() { errs <- store.Opened(ctx, "first") }()
	eng.awaitBatch(t)
	for i := range maxStateCallsInFlight - 1 {
		go func() { errs <- store.Touch(ctx, strconv.Itoa(i)) }()
	}
	wait.Until(t, "every slot taken", func() bool { return queued(store) == maxStateCallsInFlight-1 })
	return errs
}

// Writes queued behind a hung exchange hold their slots: once all are
// taken the next write fails at once, without queueing.
func TestAdapterRefusesAWriteWhenEveryCallSlotIsTaken(t *testing.T) {
	eng := newBatchingEngine(10 * time.Second)
	store := newTestAdapter(eng, time.Hour, zap.NewNop())
	errs := takeEverySlot(t, eng, store)
	if err := store.Touch(context.Background(), "one too many"); !errors.Is(err, errStateBusy) {
		t.Fatalf("Touch = %v, want errStateBusy", err)
	}
	close(eng.holdFirst)
	for _, err := range awaitAll(t, errs, maxStateCallsInFlight) {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// A write the table queues with nobody waiting is handed back, not
// dropped, when every call slot is taken: the table then sends it itself
// and tries again if that fails.
func TestAdapterHandsAQueuedWriteBackWhenEveryCallSlotIsTaken(t *testing.T) {
	eng := newBatchingEngine(10 * time.Second)
	store := newTestAdapter(eng, time.Hour, zap.NewNop())
	errs := takeEverySlot(t, eng, store)
	counter := testErrors.WithLabelValues("opened")
	before := testutil.ToFloat64(counter)
	if store.QueueOpened("s", func(error) { t.Error("a write handed back was answered") }) {
		t.Fatal("QueueOpened took a write with no slot free")
	}
	if n := testutil.ToFloat64(counter); n != before {
		t.Fatalf("a write handed back was counted as failed (%v)", n-before)
	}
	close(eng.holdFirst)
	awaitAll(t, errs, maxStateCallsInFlight)
}

// The serializer.WriteQueue writes return at once and go in the next
// batch; a queued Forget leaves "not found" remembered as Forget does.
func TestAdapterQueuedWritesGoInTheNextBatchWithNobodyWaiting(t *testing.T) {
	eng := newBatchingEngine(10 * time.Second)
	store := newTestAdapter(eng, time.Hour, zap.NewNop())
	ctx := context.Background()
	errs := make(chan error, 1)

	go func() { errs <- store.Opened(ctx, "a") }()
	eng.awaitBatch(t)
	var answered atomic.Int32
	for _, queue := range []func(string, func(error)) bool{store.QueueInitializeEnded, store.QueueOpened, store.QueueForget} {
		done := func(err error) {
			if err != nil {
				t.Errorf("a write that went was answered %v", err)
			}
			answered.Add(1)
		}
		if !queue("b", done) {
			t.Fatal("a batching adapter declined a queued write")
		}
	}
	if n := queued(store); n != 3 {
		t.Fatalf("%d writes queued, want 3", n)
	}
	close(eng.holdFirst)
	if err := awaitAll(t, errs, 1)[0]; err != nil {
		t.Fatal(err)
	}
	eng.awaitBatch(t)
	k := serializer.StoreKey("b")
	if got := eng.sent(); len(got) != 2 || !slices.Equal(got[1], []string{"initialize_ended " + k, "opened " + k, "forget " + k}) {
		t.Fatalf("batches %q, want the three queued writes together in the second", got)
	}
	wait.Until(t, "the slots back", func() bool { return len(store.slots) == 0 })
	wait.Until(t, "each write answered", func() bool { return answered.Load() == 3 })
	lookups := eng.lookups.Load()
	if _, found, err := store.Lookup(ctx, "b"); err != nil || found {
		t.Fatalf("Lookup = %v, %v", found, err)
	}
	if eng.lookups.Load() != lookups {
		t.Fatal("a lookup right after the queued Forget reached the engine")
	}
}

// failingBatchEngine fails every write of its batches.
type failingBatchEngine struct{ *fakeEngine }

func (e failingBatchEngine) Abilities() Abilities     { return Abilities{Batch: e.Writes} }
func (failingBatchEngine) CallTimeout() time.Duration { return 10 * time.Second }

func (failingBatchEngine) Writes(_ context.Context, ws []*Write, _ time.Duration) {
	for _, w := range ws {
		w.Err = errors.New("engine down")
	}
}

// A queued write that fails is counted, and its failure handed to the
// table once.
func TestAdapterCountsAndHandsBackAQueuedWriteThatFails(t *testing.T) {
	store := newTestAdapter(failingBatchEngine{newFakeEngine()}, time.Hour, zap.NewNop())
	counter := testErrors.WithLabelValues("opened")
	before := testutil.ToFloat64(counter)
	var handedBack atomic.Int32
	if !store.QueueOpened("s", func(err error) {
		if err != nil {
			handedBack.Add(1)
		}
	}) {
		t.Fatal("declined")
	}
	wait.Until(t, "the failure counted", func() bool { return testutil.ToFloat64(counter) == before+1 })
	wait.Until(t, "the slot back", func() bool { return len(store.slots) == 0 })
	wait.Until(t, "the write handed back", func() bool { return handedBack.Load() == 1 })
}

// An engine that takes no batches (Caddy storage) gets its writes one at
// a time, in order, from the serializer's goroutine: nothing is queued.
func TestAdapterQueuesNothingForAnEngineWithoutBatches(t *testing.T) {
	store := newTestAdapter(newFakeEngine(), time.Hour, zap.NewNop())
	for name, queue := range map[string]func(string, func(error)) bool{
		"InitializeEnded": store.QueueInitializeEnded, "Opened": store.QueueOpened, "Forget": store.QueueForget,
	} {
		if queue("s", nil) {
			t.Fatalf("Queue%s took a write for an engine without batches", name)
		}
	}
	if n := len(store.slots); n != 0 {
		t.Fatalf("%d slots taken", n)
	}
}

// newTestAdapter is NewAdapter with its failures counted in testErrors.
func newTestAdapter(engine Engine, ttl time.Duration, logger *zap.Logger) *Adapter {
	return NewAdapter(engine, ttl, logger, testErrors)
}
