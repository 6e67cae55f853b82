package serializer

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"weak"
)

var bg = context.Background()

func TestRequestsOfOneSessionRunOneAtATimeInArrivalOrder(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	first, err := tab.Acquire(bg, "s", 0)
	if err != nil {
		t.Fatal(err)
	}
	second := acquireAsync(t, tab, bg, "s", 0)
	third := acquireAsync(t, tab, bg, "s", 0)
	mustWait(t, second)

	first.Done(200)
	r := mustGet(t, second)
	mustWait(t, third)
	r.turn.Done(200)
	mustGet(t, third).turn.Done(200)
}

func TestSessionsDoNotWaitForEachOther(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	a, _ := tab.Acquire(bg, "a", 0)
	defer a.Done(200)
	b := acquireAsync(t, tab, bg, "b", 0)
	if r := mustGet(t, b); r.err != nil {
		t.Fatal(r.err)
	}
}

func TestInitializeExchangeHoldsSlotUntilItsBodyEnds(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	initialize, ok := tab.Begin("s", nil)
	if !ok {
		t.Fatal("Begin refused a new session")
	}
	initialized := acquireAsync(t, tab, bg, "s", CarriesInitialized)
	mustWait(t, initialized)
	initialize.Done(200)
	mustGet(t, initialized).turn.Done(202)
}

func TestHeldRequestWaitsForInitializedAck(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	initialize, _ := tab.Begin("s", nil)
	initialize.Done(200)

	setLevel := acquireAsync(t, tab, bg, "s", 0)
	mustWait(t, setLevel) // slot is free, but the gate holds it
	initialized := mustGet(t, acquireAsync(t, tab, bg, "s", CarriesInitialized))
	mustWait(t, setLevel) // not before the upstream answered
	initialized.turn.Done(202)
	mustGet(t, setLevel).turn.Done(200)
}

func TestPingIsHeldLikeAnyRequest(t *testing.T) {
	// The gate looks at traits only: a ping has none, so it is held.
	traits, _, _ := Classify([]byte(`{"jsonrpc":"2.0","id":9,"method":"ping"}`))
	tab, _ := newTestTable(t, nil)
	initialize, _ := tab.Begin("s", nil)
	initialize.Done(200)
	mustWait(t, acquireAsync(t, tab, bg, "s", traits))
}

func TestInitializedGoesAheadOfHeldMessagesWhichKeepTheirOrder(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	initialize, _ := tab.Begin("s", nil)
	setLevel := acquireAsync(t, tab, bg, "s", 0)
	toolsList := acquireAsync(t, tab, bg, "s", 0)
	initialized := acquireAsync(t, tab, bg, "s", CarriesInitialized)
	initialize.Done(200)

	mustGet(t, initialized).turn.Done(202)
	r := mustGet(t, setLevel)
	mustWait(t, toolsList)
	r.turn.Done(200)
	mustGet(t, toolsList).turn.Done(200)
}

// Only a 2xx acknowledges: an error, or a redirect (an app that wants
// HTTPS answering a plain-HTTP request), leaves the gate closed.
func TestGateStaysClosedWhenInitializedIsNotAcknowledged(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	initialize, _ := tab.Begin("s", nil)
	initialize.Done(200)
	held := acquireAsync(t, tab, bg, "s", 0)
	mustGet(t, acquireAsync(t, tab, bg, "s", CarriesInitialized)).turn.Done(500)
	mustWait(t, held)
	mustGet(t, acquireAsync(t, tab, bg, "s", CarriesInitialized)).turn.Done(301)
	mustWait(t, held)
	mustGet(t, acquireAsync(t, tab, bg, "s", CarriesInitialized)).turn.Done(202)
	mustGet(t, held).turn.Done(200)
}

func TestInitTimeoutForwardOpensGate(t *testing.T) {
	var timedOut atomic.Int32
	tab, clock := newTestTable(t, func(c *Config) {
		c.OnInitTimeout = Forward
		c.Events = &countingEvents{gateTimeouts: &timedOut}
	})
	initialize, _ := tab.Begin("s", nil)
	initialize.Done(200)
	held := acquireAsync(t, tab, bg, "s", 0)
	clock.Advance(9 * time.Second)
	mustWait(t, held)
	clock.Advance(time.Second)
	if r := mustGet(t, held); r.err != nil {
		t.Fatalf("held request after forward timeout: %v", r.err)
	}
	if timedOut.Load() != 1 {
		t.Fatalf("gate timeouts reported = %d, want 1", timedOut.Load())
	}
}

func TestInitTimeoutRejectAnswersHeldAndLaterRequestsUntilInitialized(t *testing.T) {
	tab, clock := newTestTable(t, func(c *Config) { c.OnInitTimeout = Reject })
	initialize, _ := tab.Begin("s", nil)
	initialize.Done(200)
	held := acquireAsync(t, tab, bg, "s", 0)
	gotGate := make(chan error, 1)
	go func() { gotGate <- tab.WaitGate(bg, "s") }()
	clock.Advance(10 * time.Second)

	if r := mustGet(t, held); !errors.Is(r.err, ErrNotInitialized) {
		t.Fatalf("held request: err = %v, want ErrNotInitialized", r.err)
	}
	if err := <-gotGate; !errors.Is(err, ErrNotInitialized) {
		t.Fatalf("GET at the gate: err = %v, want ErrNotInitialized", err)
	}
	if _, err := tab.Acquire(bg, "s", 0); !errors.Is(err, ErrNotInitialized) {
		t.Fatalf("later request: err = %v, want ErrNotInitialized", err)
	}
	mustGet(t, acquireAsync(t, tab, bg, "s", CarriesInitialized)).turn.Done(202)
	later, err := tab.Acquire(bg, "s", 0)
	if err != nil {
		t.Fatalf("request after a late initialized: %v", err)
	}
	later.Done(200)
}

func TestInitTimeoutSynthesizeSendsInitializedAheadOfHeld(t *testing.T) {
	tab, clock := newTestTable(t, func(c *Config) { c.OnInitTimeout = Synthesize })
	var sent []Traits
	synthDone := make(chan struct{})
	initialize, _ := tab.Begin("s", func(ctx context.Context) bool {
		defer close(synthDone)
		turn, err := tab.Acquire(ctx, "s", CarriesInitialized)
		if err != nil {
			return false
		}
		sent = append(sent, turn.traits)
		turn.Done(202)
		return true
	})
	initialize.Done(200)
	held := acquireAsync(t, tab, bg, "s", 0)
	clock.Advance(10 * time.Second)
	<-synthDone
	if len(sent) != 1 {
		t.Fatalf("synthesized initialized sent %d times, want 1", len(sent))
	}
	mustGet(t, held).turn.Done(200)
}

func TestInitTimeoutSynthesizeFailureStillReleasesHeld(t *testing.T) {
	tab, clock := newTestTable(t, func(c *Config) { c.OnInitTimeout = Synthesize })
	initialize, _ := tab.Begin("s", func(ctx context.Context) bool {
		turn, err := tab.Acquire(ctx, "s", CarriesInitialized)
		if err == nil {
			turn.Done(502)
		}
		return false
	})
	initialize.Done(200)
	held := acquireAsync(t, tab, bg, "s", 0)
	clock.Advance(10 * time.Second)
	if r := mustGet(t, held); r.err != nil {
		t.Fatalf("held request after failed synthesize: %v", r.err)
	}
}

func TestRepliesOvertakeAStreamingExchange(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	call, _ := tab.Acquire(bg, "s", 0)
	call.Streaming()
	for _, traits := range []Traits{RepliesOnly, RepliesOnly | CarriesInitialized} {
		r := mustGet(t, acquireAsync(t, tab, bg, "s", traits))
		if r.err != nil || !r.turn.Overtook() {
			t.Fatalf("reply behind a stream: overtook=%v err=%v", r.turn.Overtook(), r.err)
		}
		r.turn.Done(202)
	}
	ordinary := acquireAsync(t, tab, bg, "s", 0)
	mustWait(t, ordinary)
	call.Done(200)
	mustGet(t, ordinary).turn.Done(200)
}

// mustBeWaiting asserts that a request acquireAsync has started is still
// in its line: acquireAsync returns once it is, or once it has its turn.
func mustBeWaiting(t *testing.T, ch <-chan result, what string) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s got its turn (err=%v), want it to wait", what, r.err)
	default:
	}
}

// A reply that overtook a stream holds the session's slot until it ends:
// the stream ending first does not let the next request go beside it.
// The stream does not wait for it: it ends while the reply still runs.
func TestAnOvertakingReplyHoldsTheSlotUntilItEnds(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	call, _ := tab.Acquire(bg, "s", 0)
	call.Streaming()
	cancel := mustGet(t, acquireAsync(t, tab, bg, "s", RepliesOnly))
	if !cancel.turn.Overtook() {
		t.Fatal("the cancellation did not overtake the stream")
	}
	call.Done(200)
	next := acquireAsync(t, tab, bg, "s", 0)
	mustBeWaiting(t, next, "the next request, while the cancellation that overtook runs,")
	cancel.turn.Done(202)
	r := mustGet(t, next)
	if r.err != nil || r.turn.Overtook() {
		t.Fatalf("next request: err=%v overtook=%v", r.err, r.turn.Overtook())
	}
	r.turn.Done(200)
}

// An overtaking reply whose own answer is an event stream leaves the slot
// as the stream it overtook made it: once both have ended, the next
// request goes at once. Taken for the holder's, the reply's stream would
// leave the slot streaming with nobody to end it.
func TestAnOvertakersEventStreamDoesNotMakeTheSlotStreaming(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	call, _ := tab.Acquire(bg, "s", 0)
	call.Streaming()
	reply := mustGet(t, acquireAsync(t, tab, bg, "s", RepliesOnly))
	call.Done(200)
	reply.turn.Streaming()
	reply.turn.Done(200)
	next := acquireAsync(t, tab, bg, "s", 0)
	select {
	case r := <-next:
		r.turn.Done(200)
	default:
		t.Fatal("the next request waits: the overtaking reply's event stream left the slot streaming")
	}
}

// Overtakers go one at a time: a second reply waits for the first, then
// overtakes the stream still running; an ordinary request waits for all.
func TestOvertakersGoOneAtATime(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	call, _ := tab.Acquire(bg, "s", 0)
	call.Streaming()
	first := mustGet(t, acquireAsync(t, tab, bg, "s", RepliesOnly))
	second := acquireAsync(t, tab, bg, "s", RepliesOnly)
	mustBeWaiting(t, second, "a second overtaker, beside the first,")
	ordinary := acquireAsync(t, tab, bg, "s", 0)
	first.turn.Done(202)
	r := mustGet(t, second)
	if r.err != nil || !r.turn.Overtook() {
		t.Fatalf("second reply: err=%v overtook=%v, want it to overtake the stream", r.err, r.turn.Overtook())
	}
	third := acquireAsync(t, tab, bg, "s", RepliesOnly)
	mustBeWaiting(t, third, "a third overtaker, beside the second,")
	r.turn.Done(202)
	mustGet(t, third).turn.Done(202)
	mustBeWaiting(t, ordinary, "an ordinary request, behind the stream,")
	call.Done(200)
	mustGet(t, ordinary).turn.Done(200)
}

// A reply that waited for an overtaker while the stream ended goes in
// arrival order as any request: the slot is the overtaker's until it ends.
func TestAReplyWaitingForAnOvertakerGoesInOrderOnceTheStreamEnds(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	call, _ := tab.Acquire(bg, "s", 0)
	call.Streaming()
	first := mustGet(t, acquireAsync(t, tab, bg, "s", RepliesOnly))
	reply := acquireAsync(t, tab, bg, "s", RepliesOnly)
	ordinary := acquireAsync(t, tab, bg, "s", 0)
	call.Done(200)
	mustBeWaiting(t, reply, "a reply, while the overtaker holds the slot,")
	first.turn.Done(202)
	r := mustGet(t, reply)
	if r.err != nil || r.turn.Overtook() {
		t.Fatalf("reply: err=%v overtook=%v, want an ordinary turn", r.err, r.turn.Overtook())
	}
	mustBeWaiting(t, ordinary, "the request behind the reply")
	r.turn.Done(202)
	mustGet(t, ordinary).turn.Done(200)
}

func TestRepliesQueueBehindAJSONExchange(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	call, _ := tab.Acquire(bg, "s", 0)
	reply := acquireAsync(t, tab, bg, "s", RepliesOnly)
	mustWait(t, reply)
	call.Done(200)
	r := mustGet(t, reply)
	if r.turn.Overtook() {
		t.Fatal("reply overtook a JSON exchange")
	}
	r.turn.Done(202)
}

func TestQueuedReplyGoesOnceTheExchangeStartsStreaming(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	call, _ := tab.Acquire(bg, "s", 0)
	ordinary := acquireAsync(t, tab, bg, "s", 0)
	reply := acquireAsync(t, tab, bg, "s", RepliesOnly)
	mustWait(t, reply)
	call.Streaming()
	mustGet(t, reply).turn.Done(202)
	mustWait(t, ordinary)
	call.Done(200)
	mustGet(t, ordinary).turn.Done(200)
}

func TestRepliesAreHeldAtTheGate(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	initialize, _ := tab.Begin("s", nil)
	initialize.Streaming()
	mustWait(t, acquireAsync(t, tab, bg, "s", RepliesOnly))
}

func TestGetStreamWaitsForGateButNotForQueue(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	initialize, _ := tab.Begin("s", nil)
	initialize.Done(200)
	got := make(chan error, 1)
	go func() { got <- tab.WaitGate(bg, "s") }()
	select {
	case err := <-got:
		t.Fatalf("GET passed a closed gate: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	initialized, _ := tab.Acquire(bg, "s", CarriesInitialized)
	initialized.Done(202)
	if err := <-got; err != nil {
		t.Fatal(err)
	}

	busy, _ := tab.Acquire(bg, "s", 0) // holds the slot
	defer busy.Done(200)
	if err := tab.WaitGate(bg, "s"); err != nil {
		t.Fatalf("GET behind an exchange: %v", err)
	}
}

func TestGetStreamAtGateTimesOut(t *testing.T) {
	tab, clock := newTestTable(t, func(c *Config) { c.QueueTimeout = time.Second })
	initialize, _ := tab.Begin("s", nil)
	initialize.Done(200)
	got := make(chan error, 1)
	go func() { got <- tab.WaitGate(bg, "s") }()
	eventually(t, func() bool { clock.Advance(time.Second); return len(got) > 0 })
	if err := <-got; !errors.Is(err, ErrQueueTimeout) {
		t.Fatalf("err = %v, want ErrQueueTimeout", err)
	}
}

func TestDeleteWaitsItsTurnAndEndsTheSession(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	call, _ := tab.Acquire(bg, "s", 0)
	del := acquireAsync(t, tab, bg, "s", EndsSession)
	mustWait(t, del)
	call.Done(200)
	mustGet(t, del).turn.Done(200)
	if tab.Len() != 0 {
		t.Fatalf("tracked sessions after DELETE = %d, want 0", tab.Len())
	}
}

func TestFailedDeleteKeepsTheSession(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	del, _ := tab.Acquire(bg, "s", EndsSession)
	del.Done(500)
	if tab.Len() != 1 {
		t.Fatalf("tracked sessions = %d, want 1", tab.Len())
	}
}

func TestNotFoundFromUpstreamDropsSession(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	initialize, _ := tab.Begin("s", nil)
	held := acquireAsync(t, tab, bg, "s", 0)
	initialize.Done(404)
	// Nobody will open the gate of a dropped session: its held messages go.
	mustGet(t, held).turn.Done(404)
	if tab.Len() != 0 {
		t.Fatalf("tracked sessions after 404 = %d, want 0", tab.Len())
	}
}

// A 404 to a reply that overtook a stream ends the session upstream, but
// its state stays while the stream runs: the id's next request waits for
// the stream, as it would have, rather than start beside it.
func TestA404ToAnOvertakingReplyKeepsTheSessionWhileItsStreamRuns(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	call, _ := tab.Acquire(bg, "s", 0)
	call.Streaming()
	reply := mustGet(t, acquireAsync(t, tab, bg, "s", RepliesOnly))
	if !reply.turn.Overtook() {
		t.Fatal("the reply did not overtake the stream")
	}
	reply.turn.Done(404)
	next := acquireAsync(t, tab, bg, "s", 0)
	mustBeWaiting(t, next, "the id's next request, beside the stream,")
	call.Done(200)
	mustGet(t, next).turn.Done(404)
	if tab.Len() != 0 {
		t.Fatalf("tracked sessions once nothing of the ended one runs = %d, want 0", tab.Len())
	}
}

// A 404 hands the slot to the request queued behind it, and the id's
// state stays while that one runs: a request arriving meanwhile waits.
func TestA404KeepsTheSessionWhileTheRequestQueuedBehindItRuns(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	first, _ := tab.Acquire(bg, "s", 0)
	queued := acquireAsync(t, tab, bg, "s", 0)
	first.Done(404)
	second := mustGet(t, queued)
	late := acquireAsync(t, tab, bg, "s", 0)
	mustBeWaiting(t, late, "a request beside the one the 404 let go")
	second.turn.Done(404)
	mustGet(t, late).turn.Done(404)
	if tab.Len() != 0 {
		t.Fatalf("tracked sessions = %d, want 0", tab.Len())
	}
}

func TestUnknownSessionIsQueuedButNotGated(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	first, err := tab.Acquire(bg, "never-seen", 0)
	if err != nil {
		t.Fatalf("unknown session held: %v", err)
	}
	second := acquireAsync(t, tab, bg, "never-seen", 0)
	mustWait(t, second)
	first.Done(200)
	mustGet(t, second).turn.Done(200)
	if err := tab.WaitGate(bg, "other-unknown"); err != nil {
		t.Fatalf("GET of an unknown session: %v", err)
	}
}

func TestFullQueueRejectsNewRequests(t *testing.T) {
	tab, _ := newTestTable(t, func(c *Config) { c.MaxQueue = 2 })
	busy, _ := tab.Acquire(bg, "s", 0)
	a := acquireAsync(t, tab, bg, "s", 0)
	b := acquireAsync(t, tab, bg, "s", 0)
	if _, err := tab.Acquire(bg, "s", 0); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("err = %v, want ErrQueueFull", err)
	}
	busy.Done(200)
	mustGet(t, a).turn.Done(200)
	mustGet(t, b).turn.Done(200)
}

func TestWaitPastQueueTimeoutFails(t *testing.T) {
	tab, clock := newTestTable(t, func(c *Config) { c.QueueTimeout = 30 * time.Second })
	busy, _ := tab.Acquire(bg, "s", 0)
	waiting := acquireAsync(t, tab, bg, "s", 0)
	clock.Advance(30 * time.Second)
	if r := mustGet(t, waiting); !errors.Is(r.err, ErrQueueTimeout) {
		t.Fatalf("err = %v, want ErrQueueTimeout", r.err)
	}
	busy.Done(200)
	next, err := tab.Acquire(bg, "s", 0)
	if err != nil {
		t.Fatalf("slot not free after a timed-out waiter: %v", err)
	}
	next.Done(200)
}

func TestDepartedClientLeavesQueueAndIsNeverGranted(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	busy, _ := tab.Acquire(bg, "s", 0)
	ctx, cancel := context.WithCancel(bg)
	gone := acquireAsync(t, tab, ctx, "s", 0)
	after := acquireAsync(t, tab, bg, "s", 0)
	cancel()
	if r := mustGet(t, gone); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("departed client: err = %v, want context.Canceled", r.err)
	}
	busy.Done(200)
	mustGet(t, after).turn.Done(200)
}

func TestTurnGrantedAsClientLeavesPassesTheSlotOn(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	busy, _ := tab.Acquire(bg, "s", 0)
	ctx := &leavingContext{Context: bg}
	waiting := acquireAsync(t, tab, ctx, "s", 0)
	after := acquireAsync(t, tab, bg, "s", 0)
	ctx.left.Store(true) // gone, but Done not yet seen by the waiter
	busy.Done(200)
	if r := mustGet(t, waiting); r.err == nil {
		t.Fatal("a departed client got a turn")
	}
	mustGet(t, after).turn.Done(200)
}

func TestDepartedClientIsNotGrantedAFreeSlot(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	ctx, cancel := context.WithCancel(bg)
	cancel()
	if _, err := tab.Acquire(ctx, "s", 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	next, err := tab.Acquire(bg, "s", 0)
	if err != nil {
		t.Fatal(err)
	}
	next.Done(200)
}

// leavingContext reports an error before its Done channel fires, the
// order in which a grant and a departure can meet.
type leavingContext struct {
	context.Context
	left atomic.Bool
}

func (c *leavingContext) Err() error {
	if c.left.Load() {
		return context.Canceled
	}
	return nil
}

func TestPanicAfterAcquireReleasedByDeferredDone(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	func() {
		defer func() { _ = recover() }()
		turn, _ := tab.Acquire(bg, "s", 0)
		defer turn.Done(0)
		panic("next handler failed")
	}()
	next, err := tab.Acquire(bg, "s", 0)
	if err != nil {
		t.Fatal(err)
	}
	next.Done(200)
}

// countingEvents counts what tests look at.
type countingEvents struct {
	noEvents
	gateTimeouts *atomic.Int32
	evictions    *atomic.Int32
	gated        *atomic.Int32 // evictions of gated sessions, also counted in evictions
	waits        *atomic.Int32
}

func (e *countingEvents) Waited(time.Duration) {
	if e.waits != nil {
		e.waits.Add(1)
	}
}

func (e *countingEvents) GateTimedOut(string, TimeoutAction) {
	if e.gateTimeouts != nil {
		e.gateTimeouts.Add(1)
	}
}

func (e *countingEvents) Evicted(gated bool) {
	if e.evictions != nil {
		e.evictions.Add(1)
	}
	if e.gated != nil && gated {
		e.gated.Add(1)
	}
}

func TestKeyedRequestsRunOneAtATimeWithoutAGateOrALookup(t *testing.T) {
	store := newFakeStore()
	tabs, _ := newInstances(t, 1, store, nil)
	tab := tabs[0]
	first, err := tab.AcquireKeyed(bg, "cart-1", 0)
	if err != nil {
		t.Fatal(err)
	}
	second := make(chan result, 1)
	go func() {
		turn, err := tab.AcquireKeyed(bg, "cart-1", 0)
		second <- result{turn, err}
	}()
	other, err := tab.AcquireKeyed(bg, "cart-2", 0) // another key goes at once
	if err != nil {
		t.Fatal(err)
	}
	other.Done(200)
	mustWait(t, second)
	first.Done(200)
	mustGet(t, second).turn.Done(200)
	if n := store.total(); n != 0 {
		t.Fatalf("%d store calls for keyed requests, want none", n)
	}
}

// A 404 ends a session, but a key has no session upstream to end: its
// queue goes on, so that a request arriving after the 404 still waits
// behind the ones queued before it.
func TestA404LeavesAKeysQueueWhole(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	acquire := func() <-chan result {
		ch := make(chan result, 1)
		go func() {
			turn, err := tab.AcquireKeyed(bg, "key cart", 0)
			ch <- result{turn, err}
		}()
		return ch
	}
	first := mustGet(t, acquire())
	second := acquire()
	eventually(t, func() bool { return waitingCount(tab, "key cart") == 1 })
	first.turn.Done(404)
	r := mustGet(t, second)
	third := acquire()
	mustWait(t, third) // behind the second, not in a queue of its own
	r.turn.Done(200)
	mustGet(t, third).turn.Done(200)
}

// inLineAsync starts an AcquireInLine and waits until it waits in its
// session or its line (or is done).
func inLineAsync(t *testing.T, tab *Table, id, line string, traits Traits) <-chan result {
	t.Helper()
	before := waitingCount(tab, id) + waitingCount(tab, line)
	ch := make(chan result, 1)
	go func() {
		turn, err := tab.AcquireInLine(bg, id, Line{Key: line}, traits, nil)
		ch <- result{turn, err}
	}()
	eventually(t, func() bool { return waitingCount(tab, id)+waitingCount(tab, line) > before || len(ch) > 0 })
	return ch
}

func TestSessionsSharingALineGoOneAtATime(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	a := mustGet(t, inLineAsync(t, tab, "a", "key user", 0))
	b := inLineAsync(t, tab, "b", "key user", 0)
	other := mustGet(t, inLineAsync(t, tab, "c", "key other", 0)) // another line goes at once
	mustWait(t, b)
	a.turn.Done(200)
	mustGet(t, b).turn.Done(200)
	other.turn.Done(200)
	// A session-less request of the same key waits in the same line.
	c := mustGet(t, inLineAsync(t, tab, "c", "key user", 0))
	keyed := make(chan result, 1)
	go func() {
		turn, err := tab.AcquireKeyed(bg, "key user", 0)
		keyed <- result{turn, err}
	}()
	mustWait(t, keyed)
	c.turn.Done(200)
	mustGet(t, keyed).turn.Done(200)
}

// A request held at its session's gate has not joined the line: the
// line's other sessions go on, and the notifications/initialized that
// opens the gate goes in the line as any request does.
func TestARequestHeldAtItsGateLeavesItsLineFree(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	initialize, ok := tab.Begin("a", nil)
	if !ok {
		t.Fatal("Begin refused a new session")
	}
	initialize.Done(200)
	held := inLineAsync(t, tab, "a", "key user", 0)
	b := mustGet(t, inLineAsync(t, tab, "b", "key user", 0))
	mustWait(t, held)
	initialized := inLineAsync(t, tab, "a", "key user", CarriesInitialized)
	mustWait(t, initialized) // behind b in the line
	b.turn.Done(200)
	mustGet(t, initialized).turn.Done(202)
	mustGet(t, held).turn.Done(200)
}

// A reply that the session's own stream waits for goes beside it, out of
// the line that stream holds; another session's reply waits in the line.
func TestAReplyToItsSessionsStreamSkipsTheLine(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	call := mustGet(t, inLineAsync(t, tab, "a", "key user", 0))
	call.turn.Streaming()
	reply := mustGet(t, inLineAsync(t, tab, "a", "key user", RepliesOnly))
	if !reply.turn.Overtook() {
		t.Fatal("the reply to the stream did not overtake it")
	}
	otherReply := inLineAsync(t, tab, "b", "key user", RepliesOnly)
	mustWait(t, otherReply)
	reply.turn.Done(202)
	call.turn.Done(200)
	mustGet(t, otherReply).turn.Done(202)
}

// A stream that ends while the reply that overtook it is still upstream
// leaves its line to that reply: another session of the line waits for
// the reply too, since both save the same record.
func TestAnOvertakingReplyHoldsItsStreamsLineUntilItEnds(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	call := mustGet(t, inLineAsync(t, tab, "a", "key user", 0))
	call.turn.Streaming()
	cancel := mustGet(t, inLineAsync(t, tab, "a", "key user", RepliesOnly))
	call.turn.Done(200)
	other := inLineAsync(t, tab, "b", "key user", 0)
	mustWait(t, other)
	cancel.turn.Done(202)
	mustGet(t, other).turn.Done(200)
	// Ended in the other order, the line goes on as before.
	call = mustGet(t, inLineAsync(t, tab, "a", "key user", 0))
	call.turn.Streaming()
	cancel = mustGet(t, inLineAsync(t, tab, "a", "key user", RepliesOnly))
	cancel.turn.Done(202)
	other = inLineAsync(t, tab, "b", "key user", 0)
	mustWait(t, other)
	call.turn.Done(200)
	mustGet(t, other).turn.Done(200)
}

// queue_timeout bounds a request's wait in its session and in its line
// together, and a request that times out in the line gives its session's
// slot back.
func TestQueueTimeoutBoundsTheWaitInSessionAndLineTogether(t *testing.T) {
	tab, clock := newTestTable(t, nil) // queue_timeout 30 s
	a1 := mustGet(t, inLineAsync(t, tab, "a", "key user", 0))
	a2 := inLineAsync(t, tab, "a", "key user", 0) // waits in session a
	b1 := inLineAsync(t, tab, "b", "key user", 0) // waits in the line
	clock.Advance(20 * time.Second)
	a1.turn.Done(200)
	b := mustGet(t, b1)
	eventually(t, func() bool { return waitingCount(tab, "key user") == 1 }) // a2, now in the line
	clock.Advance(9 * time.Second)
	mustWait(t, a2)
	clock.Advance(time.Second)
	if r := mustGet(t, a2); !errors.Is(r.err, ErrQueueTimeout) {
		t.Fatalf("a2 after 30 s in session and line: %v, want ErrQueueTimeout", r.err)
	}
	a3 := inLineAsync(t, tab, "a", "key user", 0)
	if waitingCount(tab, "a") != 0 {
		t.Fatal("a3 waits in its session: the timed-out request kept the slot")
	}
	mustWait(t, a3) // in the line, behind b
	b.turn.Done(200)
	mustGet(t, a3).turn.Done(200)
}

// heldRequest stands for what a waiting request keeps: its body and
// headers, reached from its line through the SynthSource it gave.
type heldRequest struct{ body []byte }

func (*heldRequest) Synthesizer(string) func(context.Context) bool { return nil }

// acquireHoldingAsync is acquireAsync for a request that gives a
// heldRequest, which it returns only as a weak pointer: the test itself
// keeps nothing of it alive.
func acquireHoldingAsync(t *testing.T, tab *Table, id string) (<-chan result, weak.Pointer[heldRequest]) {
	t.Helper()
	src := &heldRequest{body: make([]byte, 512<<10)}
	before := waitingCount(tab, id)
	ch := make(chan result, 1)
	go func() {
		turn, err := tab.AcquireFrom(bg, id, 0, src)
		ch <- result{turn, err}
	}()
	eventually(t, func() bool { return waitingCount(tab, id) > before || len(ch) > 0 })
	return ch, weak.Make(src)
}

// freed reports whether p's value has been collected, after a few
// garbage collections.
func freed[T any](p weak.Pointer[T]) bool {
	for range 5 {
		runtime.GC()
		if p.Value() == nil {
			return true
		}
	}
	return false
}

// A request that waited in line is not kept once it has ended, whether
// its turn came or queue_timeout answered it: the line keeps its backing
// array, and an element left in it would hold the request's body and
// headers until the session expires.
func TestAnEndedRequestIsNotKeptByItsSessionsLine(t *testing.T) {
	tab, clock := newTestTable(t, nil) // queue_timeout 30 s
	first, _ := tab.Acquire(bg, "s", 0)
	queued, granted := acquireHoldingAsync(t, tab, "s")
	first.Done(200)
	mustGet(t, queued).turn.Done(200)
	clock.Advance(0) // the fake clock lets go of its stopped timers
	if !freed(granted) {
		t.Error("a request whose turn came is still referenced after it ended")
	}

	busy, _ := tab.Acquire(bg, "s", 0)
	late, timedOut := acquireHoldingAsync(t, tab, "s")
	clock.Advance(30 * time.Second)
	if r := mustGet(t, late); !errors.Is(r.err, ErrQueueTimeout) {
		t.Fatalf("late request: %v, want ErrQueueTimeout", r.err)
	}
	busy.Done(200)
	if !freed(timedOut) {
		t.Error("a request that timed out in line is still referenced after it was answered")
	}
	if _, ok := tracked(tab, "s"); !ok {
		t.Fatal("the session was forgotten: the test no longer shows what its line keeps")
	}
}

// hookClock is a fakeClock whose next timer's stop blocks until the test
// lets it go: it opens the window between a waiter's grant and its check
// of its context in Session.enter.
type hookClock struct {
	*fakeClock
	mu       sync.Mutex
	armed    bool
	stopping chan struct{}
	proceed  chan struct{}
}

func (c *hookClock) AfterFunc(d time.Duration, f func()) func() bool {
	stop := c.fakeClock.AfterFunc(d, f)
	c.mu.Lock()
	hook := c.armed
	c.armed = false
	c.mu.Unlock()
	if !hook {
		return stop
	}
	return func() bool {
		close(c.stopping)
		<-c.proceed
		return stop()
	}
}

// An overtaker whose client leaves as its turn comes, just as the stream
// it overtook ends and leaves it the key's line, frees that line: the
// key's other sessions go on.
func TestAnOvertakerLeavingAtItsGrantFreesTheLineItWasLeft(t *testing.T) {
	clock := &hookClock{fakeClock: newFakeClock(), stopping: make(chan struct{}), proceed: make(chan struct{})}
	tab, _ := newTestTable(t, func(c *Config) { c.Clock = clock })
	call := mustGet(t, inLineAsync(t, tab, "a", "key user", 0))
	call.turn.Streaming()
	o1 := mustGet(t, inLineAsync(t, tab, "a", "key user", RepliesOnly)) // overtakes
	clock.mu.Lock()
	clock.armed = true
	clock.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	o2 := make(chan result, 1)
	go func() {
		turn, err := tab.AcquireInLine(ctx, "a", Line{Key: "key user"}, RepliesOnly, nil)
		o2 <- result{turn, err}
	}()
	eventually(t, func() bool { return waitingCount(tab, "a") == 1 }) // behind o1
	o1.turn.Done(202)                                                 // o2 is granted; it reaches stop()
	<-clock.stopping
	call.turn.Done(200) // the stream ends: its line is left to o2
	cancel()            // o2's client leaves as its turn comes
	close(clock.proceed)
	if r := mustGet(t, o2); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("o2: %v, want context.Canceled", r.err)
	}
	r := mustGet(t, inLineAsync(t, tab, "b", "key user", 0))
	if r.err != nil {
		t.Fatalf("session b of the same key: %v", r.err)
	}
	r.turn.Done(200)
}

// admitAsync starts an AcquireInLine whose admission is decided by admit.
func admitAsync(tab *Table, id, line string, traits Traits, admit func(context.Context) (string, error)) <-chan result {
	ch := make(chan result, 1)
	go func() {
		turn, err := tab.AcquireInLine(bg, id, Line{Key: line, Admit: admit}, traits, nil)
		ch <- result{turn, err}
	}()
	return ch
}

// A line's admission is asked only once the request holds its session's
// turn, so the session's later requests wait behind it, in arrival order,
// however long it takes.
func TestALinesAdmissionIsAskedOnceTheSessionsTurnIsHeld(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	first := mustGet(t, inLineAsync(t, tab, "a", "", 0))
	asked := make(chan struct{})
	decide := make(chan string)
	admit := func(context.Context) (string, error) { close(asked); return <-decide, nil }
	second := admitAsync(tab, "a", "key user", 0, admit)
	eventually(t, func() bool { return waitingCount(tab, "a") == 1 })
	select {
	case <-asked:
		t.Fatal("admission was asked while the session's earlier request held its turn")
	default:
	}
	first.turn.Done(200)
	<-asked
	third := inLineAsync(t, tab, "a", "key user", 0)
	decide <- "key user"
	mustGet(t, second).turn.Done(200)
	mustGet(t, third).turn.Done(200)
}

// A request refused admission goes on in its session's turn without
// waiting in the line, which another session holds.
func TestARequestRefusedAdmissionGoesWithoutTheLine(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	holder := mustGet(t, inLineAsync(t, tab, "a", "key user", 0))
	refused := mustGet(t, admitAsync(tab, "b", "key user", 0, func(context.Context) (string, error) { return "", nil }))
	if refused.err != nil {
		t.Fatal(refused.err)
	}
	// The line is still the holder's alone: a third session waits in it.
	admitted := inLineAsync(t, tab, "c", "key user", 0)
	mustWait(t, admitted)
	refused.turn.Done(200)
	mustWait(t, admitted)
	holder.turn.Done(200)
	mustGet(t, admitted).turn.Done(200)
}

// An admission that fails gives the session's turn back to its next
// request; one that outlasts QueueTimeout is a queue timeout.
func TestAFailedAdmissionGivesTheSessionsTurnBack(t *testing.T) {
	tab, _ := newTestTable(t, func(c *Config) { c.QueueTimeout = 50 * time.Millisecond })
	failed := errors.New("undecided")
	r := mustGet(t, admitAsync(tab, "a", "key user", 0, func(context.Context) (string, error) { return "", failed }))
	if !errors.Is(r.err, failed) {
		t.Fatalf("err = %v, want the admission's", r.err)
	}
	r = mustGet(t, admitAsync(tab, "a", "key user", 0, func(ctx context.Context) (string, error) { <-ctx.Done(); return "", ctx.Err() }))
	if !errors.Is(r.err, ErrQueueTimeout) {
		t.Fatalf("err = %v, want ErrQueueTimeout", r.err)
	}
	mustGet(t, inLineAsync(t, tab, "a", "key user", 0)).turn.Done(200)
}

// A reply that overtakes its session's stream is never asked to be
// admitted: it waits neither for a proof nor in the line.
func TestAnOvertakingReplyIsNotAskedForAdmission(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	stream := mustGet(t, inLineAsync(t, tab, "a", "key user", 0))
	stream.turn.Streaming()
	reply := mustGet(t, admitAsync(tab, "a", "key user", RepliesOnly, func(context.Context) (string, error) {
		t.Error("a reply was asked for admission")
		return "", nil
	}))
	if reply.err != nil || !reply.turn.Overtook() {
		t.Fatalf("the reply did not overtake: %v", reply.err)
	}
	reply.turn.Done(202)
	stream.turn.Done(200)
}

// Work done beside the requests (a credential's proof) waits in a key's
// queue as a request does, but its wait is not reported as a request's.
func TestAnAsideTurnWaitsInItsQueueUnreported(t *testing.T) {
	var waits atomic.Int32
	tab, _ := newTestTable(t, func(c *Config) { c.Events = &countingEvents{waits: &waits} })
	first, err := tab.AcquireAside(bg, "key user proof")
	if err != nil {
		t.Fatal(err)
	}
	second := make(chan result, 1)
	go func() {
		turn, err := tab.AcquireAside(bg, "key user proof")
		second <- result{turn, err}
	}()
	mustWait(t, second)
	first.Done(0)
	mustGet(t, second).turn.Done(0)
	if n := waits.Load(); n != 0 {
		t.Fatalf("%d waits reported for work beside the requests, want none", n)
	}
	keyed, err := tab.AcquireKeyed(bg, "key user", 0)
	if err != nil {
		t.Fatal(err)
	}
	keyed.Done(200)
	if n := waits.Load(); n != 1 {
		t.Fatalf("%d waits reported for a request, want 1", n)
	}
}

// A keyed request that already waited for its credential's proof waits in
// its key's queue for what is left of QueueTimeout, not a whole one more.
func TestAKeyedRequestAfterItsProofWaitsWhatIsLeftOfQueueTimeout(t *testing.T) {
	tab, clock := newTestTable(t, func(c *Config) { c.QueueTimeout = 10 * time.Second })
	holder, err := tab.AcquireKeyed(bg, "key user", 0)
	if err != nil {
		t.Fatal(err)
	}
	after := make(chan result, 1)
	go func() {
		turn, err := tab.AcquireKeyedAfter(bg, "key user", 0, 8*time.Second)
		after <- result{turn, err}
	}()
	fresh := make(chan result, 1)
	go func() {
		turn, err := tab.AcquireKeyed(bg, "key user", 0)
		fresh <- result{turn, err}
	}()
	eventually(t, func() bool { return waitingCount(tab, "key user") == 2 })
	clock.Advance(2 * time.Second)
	if r := mustGet(t, after); !errors.Is(r.err, ErrQueueTimeout) {
		t.Fatalf("after 8 s of proof and 2 s in the queue: err = %v, want ErrQueueTimeout", r.err)
	}
	mustWait(t, fresh)
	holder.Done(200)
	mustGet(t, fresh).turn.Done(200)
}

// Admission may name the line the request joins, known only once it is
// decided (a user signing in by e-mail, whose login its proof names):
// the request waits in that line.
func TestAdmissionNamesTheLineTheRequestJoins(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	holder := mustGet(t, inLineAsync(t, tab, "a", "key alice", 0))
	named := admitAsync(tab, "b", "", 0, func(context.Context) (string, error) { return "key alice", nil })
	mustWait(t, named)
	holder.turn.Done(200)
	mustGet(t, named).turn.Done(200)
}
