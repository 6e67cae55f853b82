package stateengine

import (
	"context"
	"encoding/json"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/testclock"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/warnlimit"
	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// hungEngine never answers and ignores its context, like a hung network
// file system.
type hungEngine struct{ release chan struct{} }

func (hungEngine) Abilities() Abilities       { return Abilities{} }
func (hungEngine) CallTimeout() time.Duration { return 50 * time.Millisecond }

func (e hungEngine) Created(context.Context, string, time.Time, time.Duration) error {
	<-e.release
	return nil
}

func (e hungEngine) InitializeEnded(context.Context, string, time.Duration) error {
	<-e.release
	return nil
}

func (e hungEngine) Opened(context.Context, string, time.Duration) error { <-e.release; return nil }
func (e hungEngine) Touch(context.Context, string, time.Duration) error  { <-e.release; return nil }
func (e hungEngine) Forget(context.Context, string) error                { <-e.release; return nil }

func (e hungEngine) Lookup(context.Context, string) (serializer.Record, bool, error) {
	<-e.release
	return serializer.Record{Open: true}, true, nil
}

func TestAdapterReturnsAtTheTimeoutWhenTheEngineIgnoresItsContext(t *testing.T) {
	eng := hungEngine{release: make(chan struct{})}
	defer close(eng.release)
	store := NewAdapter(eng, time.Hour, zap.NewNop(), testErrors)
	done := make(chan error, 1)
	go func() {
		_, found, err := store.Lookup(context.Background(), "s")
		if found {
			err = errors.New("found")
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lookup = %v, want a deadline error", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Lookup still waiting on a hung engine after 5s (timeout 50ms)")
	}
}

// The table's own deadline passing is the engine's failure; a caller
// that cancels is not.
func TestAdapterCountsTheCallersDeadlineButNotItsCancellation(t *testing.T) {
	eng := hungEngine{release: make(chan struct{})}
	defer close(eng.release)
	store := NewAdapter(eng, time.Hour, zap.NewNop(), testErrors)
	counter := testErrors.WithLabelValues("lookup")

	before := testutil.ToFloat64(counter)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, _, err := store.Lookup(ctx, "s"); err == nil {
		t.Fatal("Lookup on a hung engine succeeded")
	}
	if got := testutil.ToFloat64(counter); got != before+1 {
		t.Fatalf("after the caller's deadline: %v errors, want %v", got, before+1)
	}

	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	if _, _, err := store.Lookup(ctx, "s"); err == nil {
		t.Fatal("Lookup with a cancelled context succeeded")
	}
	if got := testutil.ToFloat64(counter); got != before+1 {
		t.Fatalf("a cancelled caller was counted: %v errors, want %v", got, before+1)
	}
}

func TestAdapterWarnsOncePerOperationPerIntervalWithoutTheSessionID(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	eng := hungEngine{release: make(chan struct{})}
	defer close(eng.release)
	store := NewAdapter(eng, time.Hour, zap.New(core), testErrors)
	clock := testclock.New()
	store.now = clock.Now
	ctx := context.Background()
	const id = "secret-session-id"

	for range 5 {
		store.Touch(ctx, id)
	}
	store.Forget(ctx, id) // another operation has its own allowance
	byOp := func(op string) []observer.LoggedEntry {
		var out []observer.LoggedEntry
		for _, e := range logs.All() {
			if e.ContextMap()["op"] == op {
				out = append(out, e)
			}
		}
		return out
	}
	if n := len(byOp("touch")); n != 1 {
		t.Fatalf("%d WARN lines for 5 failed touches within the interval, want 1", n)
	}
	if n := len(byOp("forget")); n != 1 {
		t.Fatalf("%d WARN lines for a failed forget, want 1", n)
	}
	clock.Advance(warnlimit.Interval)
	store.Touch(ctx, id)
	touches := byOp("touch")
	if len(touches) != 2 {
		t.Fatalf("%d WARN lines after the interval, want 2", len(touches))
	}
	if got := touches[1].ContextMap()["suppressed"]; got != int64(4) {
		t.Fatalf("suppressed = %v, want 4", got)
	}
	for _, e := range logs.All() {
		line, _ := json.Marshal(e.ContextMap())
		if strings.Contains(e.Message+string(line), id) {
			t.Fatalf("a WARN line shows the session id: %s %s", e.Message, line)
		}
		if e.ContextMap()["session"] != serializer.SessionHash(id) {
			t.Fatalf("session = %v, want its hash %s", e.ContextMap()["session"], serializer.SessionHash(id))
		}
	}
}

// fakeEngine keeps records in memory and counts the calls that reach it.
// While hang is open, every call waits for it to close, ignoring its
// context; while createdHangs is open, Created alone does. Its call
// timeout is long enough for a loaded machine unless a test shortens it.
type fakeEngine struct {
	timeout            time.Duration
	hang, createdHangs chan struct{}
	entered            atomic.Int64 // calls that reached the engine
	lookups            atomic.Int64
	createdStarted     chan struct{} // if set, Created signals it on entry

	mu      sync.Mutex
	records map[string]serializer.Record
}

func (*fakeEngine) Abilities() Abilities         { return Abilities{} }
func (e *fakeEngine) CallTimeout() time.Duration { return e.timeout }

func (e *fakeEngine) enter() {
	e.entered.Add(1)
	if e.hang != nil {
		<-e.hang
	}
}

func (e *fakeEngine) Created(_ context.Context, key string, deadline time.Time, _ time.Duration) error {
	e.enter()
	if e.createdStarted != nil {
		e.createdStarted <- struct{}{}
	}
	if e.createdHangs != nil {
		<-e.createdHangs
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.records[key] = serializer.Record{InitDeadline: deadline, InitializeInFlight: true}
	return nil
}

func (e *fakeEngine) InitializeEnded(context.Context, string, time.Duration) error {
	e.enter()
	return nil
}

func (e *fakeEngine) Opened(context.Context, string, time.Duration) error { e.enter(); return nil }
func (e *fakeEngine) Touch(context.Context, string, time.Duration) error  { e.enter(); return nil }

func (e *fakeEngine) Forget(_ context.Context, key string) error {
	e.enter()
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.records, key)
	return nil
}

func (e *fakeEngine) Lookup(_ context.Context, key string) (serializer.Record, bool, error) {
	e.enter()
	e.lookups.Add(1)
	e.mu.Lock()
	defer e.mu.Unlock()
	rec, ok := e.records[key]
	return rec, ok, nil
}

func newFakeEngine() *fakeEngine {
	return &fakeEngine{timeout: 10 * time.Second, records: map[string]serializer.Record{}}
}

// An engine that hangs ignoring its context keeps a goroutine per call
// until it returns: the adapter stops calling it once
// maxStateCallsInFlight are out, fails the rest at once and counts them,
// and calls it again only when one has returned.
func TestAdapterBoundsTheCallsInFlightOnAnEngineThatIgnoresItsContext(t *testing.T) {
	eng := newFakeEngine()
	eng.timeout = 20 * time.Millisecond
	eng.hang = make(chan struct{})
	released := false
	release := func() {
		if !released {
			released = true
			close(eng.hang)
		}
	}
	defer release()
	core, logs := observer.New(zap.WarnLevel)
	store := NewAdapter(eng, time.Hour, zap.New(core), testErrors)
	ctx := context.Background()
	lookups := testErrors.WithLabelValues("lookup")
	touches := testErrors.WithLabelValues("touch")
	lookupsBefore, touchesBefore := testutil.ToFloat64(lookups), testutil.ToFloat64(touches)
	goroutinesBefore := runtime.NumGoroutine()

	// Fill every slot: each call gives up at its timeout, its engine
	// call hangs on.
	var wg sync.WaitGroup
	for i := range maxStateCallsInFlight {
		wg.Go(func() {
			if _, _, err := store.Lookup(ctx, "filling-"+strconv.Itoa(i)); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Lookup on a hung engine = %v, want a deadline error", err)
			}
		})
	}
	wg.Wait()

	const more = 1000
	for i := range more {
		var err error
		if i%2 == 0 {
			_, _, err = store.Lookup(ctx, "more-"+strconv.Itoa(i))
		} else {
			err = store.Touch(ctx, "more-"+strconv.Itoa(i))
		}
		if !errors.Is(err, errStateBusy) {
			t.Fatalf("call %d with every slot taken = %v, want errStateBusy", i, err)
		}
	}
	if n := eng.entered.Load(); n != maxStateCallsInFlight {
		t.Fatalf("the engine was called %d times, want %d: the calls beyond the bound reached it", n, maxStateCallsInFlight)
	}
	grown := runtime.NumGoroutine() - goroutinesBefore
	t.Logf("%d calls on a hung engine: %d goroutines more", maxStateCallsInFlight+more, grown)
	if grown > maxStateCallsInFlight+50 {
		t.Fatalf("%d goroutines more after %d calls on a hung engine, want about %d", grown, maxStateCallsInFlight+more, maxStateCallsInFlight)
	}
	if got := testutil.ToFloat64(lookups) - lookupsBefore; got != maxStateCallsInFlight+more/2 {
		t.Errorf("state_errors_total{op=lookup} grew by %v, want %v", got, maxStateCallsInFlight+more/2)
	}
	if got := testutil.ToFloat64(touches) - touchesBefore; got != more/2 {
		t.Errorf("state_errors_total{op=touch} grew by %v, want %v", got, more/2)
	}
	var touchWarns int
	for _, e := range logs.All() {
		if e.ContextMap()["op"] == "touch" {
			touchWarns++
			if e.ContextMap()["error"] != errStateBusy.Error() {
				t.Errorf("WARN for a refused touch: error = %v, want %q", e.ContextMap()["error"], errStateBusy)
			}
		}
	}
	if touchWarns != 1 {
		t.Errorf("%d WARN lines for %d refused touches, want 1", touchWarns, more/2)
	}

	// The slots come free as the engine returns, not at the timeout.
	release()
	deadline := time.Now().Add(10 * time.Second)
	for len(store.slots) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d slots still taken 10s after the engine returned", len(store.slots))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := store.Touch(ctx, "after"); err != nil {
		t.Fatalf("Touch once the engine answers again = %v", err)
	}
}

func TestAdapterRemembersNotFoundBriefly(t *testing.T) {
	eng := newFakeEngine()
	store := NewAdapter(eng, time.Hour, zap.NewNop(), testErrors)
	clock := testclock.New()
	store.now = clock.Now
	ctx := context.Background()
	lookup := func(id string) bool {
		t.Helper()
		_, found, err := store.Lookup(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return found
	}
	for range 10 {
		if lookup("unknown") {
			t.Fatal("found a session never created")
		}
	}
	if n := eng.lookups.Load(); n != 1 {
		t.Fatalf("10 lookups of one unknown id reached the engine %d times, want 1", n)
	}
	clock.Advance(notFoundTTL)
	lookup("unknown")
	if n := eng.lookups.Load(); n != 2 {
		t.Fatalf("a lookup %s later reached the engine %d times in all, want 2", notFoundTTL, n)
	}

	// Created drops the entry: the record is found at once.
	if err := store.Created(ctx, "unknown", time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if !lookup("unknown") || !lookup("unknown") {
		t.Fatal("a session created here reads as not found")
	}
	if n := eng.lookups.Load(); n != 4 {
		t.Fatalf("lookups reached the engine %d times in all, want 4: a found record is read each time", n)
	}

	// Forget: the record is gone, and known to be.
	if err := store.Forget(ctx, "unknown"); err != nil {
		t.Fatal(err)
	}
	if lookup("unknown") {
		t.Fatal("found after Forget")
	}
	if n := eng.lookups.Load(); n != 4 {
		t.Fatalf("a lookup right after Forget reached the engine (%d in all, want 4)", n)
	}
}

// A lookup that answers "not found" while a Created for its id is still
// on its way must not hide the record once it is written.
func TestAdapterDoesNotRememberNotFoundOverlappingACreated(t *testing.T) {
	eng := newFakeEngine()
	eng.createdHangs = make(chan struct{})
	eng.createdStarted = make(chan struct{}, 1)
	store := NewAdapter(eng, time.Hour, zap.NewNop(), testErrors)
	ctx := context.Background()
	created := make(chan error, 1)
	go func() { created <- store.Created(context.Background(), "s", time.Now().Add(time.Minute)) }()
	<-eng.createdStarted
	if _, found, err := store.Lookup(ctx, "s"); err != nil || found {
		t.Fatalf("Lookup while Created is on its way = %v, %v; want not found", found, err)
	}
	close(eng.createdHangs)
	<-created // the adapter may have given up at its timeout: wait for the engine
	deadline := time.Now().Add(10 * time.Second)
	for {
		eng.mu.Lock()
		_, written := eng.records[serializer.StoreKey("s")]
		eng.mu.Unlock()
		if written && len(store.slots) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the engine's Created did not return within 10s")
		}
		time.Sleep(time.Millisecond)
	}
	if _, found, err := store.Lookup(ctx, "s"); err != nil || !found {
		t.Fatalf("Lookup after Created = %v, %v; want found", found, err)
	}
}

func TestNotFoundCacheStaysWithinItsEntriesUnderAFloodOfUniqueIDs(t *testing.T) {
	eng := newFakeEngine()
	store := NewAdapter(eng, time.Hour, zap.NewNop(), testErrors)
	ctx := context.Background()
	const ids = 3 * notFoundEntries
	for i := range ids {
		if _, _, err := store.Lookup(ctx, "flood-"+strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(store.notFound.keys); n > notFoundEntries {
		t.Fatalf("%d entries after %d unique ids, want at most %d", n, ids, notFoundEntries)
	}
	before := eng.lookups.Load()
	store.Lookup(ctx, "flood-"+strconv.Itoa(ids-1)) // the newest: remembered
	if eng.lookups.Load() != before {
		t.Fatal("the newest id was not remembered")
	}
	store.Lookup(ctx, "flood-0") // the oldest: made room
	if eng.lookups.Load() != before+1 {
		t.Fatal("the oldest id was still remembered past the bound")
	}
}

// testErrors counts the failures of the adapters these tests make.
var testErrors = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "state_errors_total"}, []string{"op"})
