package serializer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

func TestTurnReportsItsWaitAndWhetherTheGateHeldIt(t *testing.T) {
	tab, clock := newTestTable(t, nil)
	initialize, _ := tab.Begin("s", nil)
	initialize.Done(200)
	held := acquireAsync(t, tab, bg, "s", 0)
	initialized := mustGet(t, acquireAsync(t, tab, bg, "s", CarriesInitialized))
	if initialized.turn.Held() || initialized.turn.Waited() != 0 {
		t.Fatalf("initialized went straight through, yet held=%v waited=%s", initialized.turn.Held(), initialized.turn.Waited())
	}
	clock.Advance(3 * time.Second)
	initialized.turn.Done(202)
	r := mustGet(t, held)
	if !r.turn.Held() || r.turn.Waited() != 3*time.Second {
		t.Fatalf("held request: held=%v waited=%s, want true, 3s", r.turn.Held(), r.turn.Waited())
	}
	r.turn.Done(200)

	// Queued behind an exchange, not held.
	first, _ := tab.Acquire(bg, "s", 0)
	queued := acquireAsync(t, tab, bg, "s", 0)
	clock.Advance(time.Second)
	first.Done(200)
	r = mustGet(t, queued)
	if r.turn.Held() || r.turn.Waited() != time.Second {
		t.Fatalf("queued request: held=%v waited=%s, want false, 1s", r.turn.Held(), r.turn.Waited())
	}
	r.turn.Done(200)
}

func TestFailedWaitStillReportsItsWait(t *testing.T) {
	tab, clock := newTestTable(t, func(c *Config) { c.QueueTimeout = 2 * time.Second })
	initialize, _ := tab.Begin("s", nil)
	initialize.Done(200)
	held := acquireAsync(t, tab, bg, "s", 0)
	clock.Advance(2 * time.Second)
	r := mustGet(t, held)
	if !errors.Is(r.err, ErrQueueTimeout) || !r.turn.Held() || r.turn.Waited() != 2*time.Second {
		t.Fatalf("timed out at the gate: err=%v held=%v waited=%s", r.err, r.turn.Held(), r.turn.Waited())
	}
}

func TestInspectCountsSessionsByStateLeastRecentlyUsedFirst(t *testing.T) {
	tab, clock := newTestTable(t, nil)
	idle, _ := tab.Acquire(bg, "idle", 0)
	idle.Done(200)
	clock.Advance(time.Minute)

	gated, _ := tab.Begin("gated", nil) // initializing, its initialize in flight
	held := acquireAsync(t, tab, bg, "gated", 0)
	clock.Advance(time.Second)

	busy, _ := tab.Acquire(bg, "busy", 0)
	busy.Streaming()
	queued := acquireAsync(t, tab, bg, "busy", 0)
	clock.Advance(time.Second)

	var seen []SessionStatus
	sum := tab.Inspect(func(s SessionStatus) { seen = append(seen, s) })
	want := TableStatus{Sessions: 3, Initializing: 1, Open: 2, InFlight: 2, Streaming: 1, Waiting: 2, WaitingTotal: 2}
	if sum != want {
		t.Fatalf("counts = %+v, want %+v", sum, want)
	}
	if len(seen) != 3 || seen[0].ID != "idle" || seen[1].ID != "gated" || seen[2].ID != "busy" {
		t.Fatalf("sessions in order %v, want idle, gated, busy", seen)
	}
	if s := seen[0]; s.Gate != GateOpen || s.InFlight || s.Waiting != 0 || s.Age != time.Minute+2*time.Second || s.Idle != s.Age {
		t.Errorf("idle session: %+v", s)
	}
	if s := seen[1]; s.Gate != GateInitializing || !s.InFlight || s.Streaming || s.Waiting != 1 || s.Age != 2*time.Second {
		t.Errorf("gated session: %+v", s)
	}
	if s := seen[2]; s.Gate != GateOpen || !s.InFlight || !s.Streaming || s.Waiting != 1 || s.Age != time.Second {
		t.Errorf("busy session: %+v", s)
	}

	gated.Done(200)
	mustGet(t, acquireAsync(t, tab, bg, "gated", CarriesInitialized)).turn.Done(202)
	mustGet(t, held).turn.Done(200)
	busy.Done(200)
	mustGet(t, queued).turn.Done(200)
}

func TestInspectShowsARejectingGate(t *testing.T) {
	tab, clock := newTestTable(t, func(c *Config) { c.OnInitTimeout = Reject })
	initialize, _ := tab.Begin("s", nil)
	initialize.Done(200)
	clock.Advance(10 * time.Second)
	if sum := tab.Inspect(nil); sum.Rejecting != 1 || sum.Initializing != 0 {
		t.Fatalf("counts after a reject timeout: %+v", sum)
	}
}

func TestDropAnswersWaitersAndForgetsTheSession(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	initialize, _ := tab.Begin("s", nil)
	initialize.Done(200)
	held1 := acquireAsync(t, tab, bg, "s", 0)
	held2 := acquireAsync(t, tab, bg, "s", 0)
	stream := make(chan error, 1)
	go func() { stream <- tab.WaitGate(bg, "s") }()
	if !tab.Gated("s") {
		t.Fatal("Gated is false for a session waiting for initialized")
	}

	answered, ok := tab.Drop("s")
	if !ok || answered != 2 {
		t.Fatalf("Drop = %d, %v; want 2, true", answered, ok)
	}
	for _, ch := range []<-chan result{held1, held2} {
		if r := mustGet(t, ch); !errors.Is(r.err, ErrSessionDropped) || !r.turn.Held() {
			t.Fatalf("held request after Drop: err=%v held=%v", r.err, r.turn.Held())
		}
	}
	select {
	case err := <-stream:
		// The GET may have come after the drop: then the id is unknown.
		if err != nil && !errors.Is(err, ErrSessionDropped) {
			t.Fatalf("GET stream at the gate after Drop: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("GET stream at the gate still waits after Drop")
	}
	if tab.Len() != 0 || tab.Gated("s") {
		t.Fatalf("dropped session still tracked: len %d", tab.Len())
	}
	if _, ok := tab.Drop("s"); ok {
		t.Fatal("second Drop found the session")
	}

	// The id's next request starts an unknown session: queue only.
	turn, err := tab.Acquire(bg, "s", 0)
	if err != nil || turn.Held() {
		t.Fatalf("request after Drop: err=%v held=%v", err, turn.Held())
	}
	turn.Done(200)
}

func TestDropLeavesTheExchangeInFlightToFinish(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	inFlight, _ := tab.Acquire(bg, "s", 0)
	queued := acquireAsync(t, tab, bg, "s", 0)
	if n, ok := tab.Drop("s"); !ok || n != 1 {
		t.Fatalf("Drop = %d, %v", n, ok)
	}
	if r := mustGet(t, queued); !errors.Is(r.err, ErrSessionDropped) {
		t.Fatalf("queued request: %v", r.err)
	}
	fresh, err := tab.Acquire(bg, "s", 0)
	if err != nil {
		t.Fatal(err)
	}
	inFlight.Done(404) // the old session's end must not drop the new one
	if tab.Len() != 1 {
		t.Fatalf("the new session was dropped by the old one's 404: len %d", tab.Len())
	}
	fresh.Done(200)
}

func TestDropRacesTimeoutsAndDepartures(t *testing.T) {
	tab, clock := newTestTable(t, func(c *Config) { c.QueueTimeout = time.Second })
	busy, _ := tab.Acquire(bg, "s", 0)
	ctx, cancel := context.WithCancel(bg)
	var waiters []<-chan result
	for i := range 20 {
		c := bg
		if i%2 == 0 {
			c = ctx
		}
		waiters = append(waiters, acquireAsync(t, tab, c, "s", 0))
	}
	go cancel()
	go clock.Advance(time.Second)
	tab.Drop("s")
	for _, ch := range waiters {
		r := mustGet(t, ch)
		if r.err == nil {
			t.Fatal("a waiter got a turn in a dropped session")
		}
	}
	busy.Done(200)
}

func TestDropForgetsTheSharedRecord(t *testing.T) {
	store := newFakeStore()
	tab, _ := newTestTable(t, func(c *Config) { c.Store = store })
	initialize, _ := tab.Begin("s", nil)
	initialize.Done(200)
	if _, ok := tab.Drop("s"); !ok {
		t.Fatal("Drop did not find the session")
	}
	eventually(t, func() bool { _, found := store.record("s"); return !found && store.count("Forget") == 1 })
	// The next request finds no record: queue only, not held.
	turn, err := tab.Acquire(bg, "s", 0)
	if err != nil || turn.Held() {
		t.Fatalf("request after Drop: err=%v held=%v", err, turn.Held())
	}
	turn.Done(200)
}

// Inspect, polled by the admin endpoint, reads sessions while requests
// create them, through Begin and through first-sight lookups with a
// Store: every field it reads is filled in before a session is published.
// Run with -race; the store's latency keeps each new session's lookup,
// and Begin's Created, open while Inspect polls.
func TestInspectWhileSessionsAreCreatedIsRaceFree(t *testing.T) {
	store := newFakeStore()
	store.latency = time.Millisecond
	tabs, _ := newInstances(t, 1, store, nil)
	tab := tabs[0]
	stop := make(chan struct{})
	var polls sync.WaitGroup
	polls.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			tab.Inspect(func(SessionStatus) {})
		}
	})
	var creators sync.WaitGroup
	creators.Go(func() {
		for i := range 100 {
			turn, _ := tab.Begin(fmt.Sprint("begun-", i), nil)
			turn.Done(200)
		}
	})
	creators.Go(func() {
		for i := range 100 {
			if turn, err := tab.Acquire(bg, fmt.Sprint("met-", i), 0); err == nil {
				turn.Done(200)
			}
		}
	})
	creators.Wait()
	close(stop)
	polls.Wait()
	if sum := tab.Inspect(nil); sum.Sessions != 200 {
		t.Fatalf("Inspect counts %d sessions, want 200", sum.Sessions)
	}
}
