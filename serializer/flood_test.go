package serializer

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// floodIDs is the number of made-up session ids the flood sends: 500k,
// about 5 s under -race on two cores (10 s with other packages testing
// beside it); -short sends 50k.
func floodIDs() int {
	if testing.Short() {
		return 50_000
	}
	return 500_000
}

// A flood of distinct, made-up session ids (each one request, as a
// scanner guessing ids would send) keeps the table within max_sessions
// plus the sessions in use, keeps the heap bounded, and never evicts a
// real session that is busy: one with an exchange in flight, a queue, a
// stream, or a gate still waiting for notifications/initialized.
func TestFloodOfMadeUpSessionIDsStaysBoundedAndSparesBusySessions(t *testing.T) {
	const maxSessions = 10_000
	tab, _ := newTestTable(t, func(c *Config) { c.MaxSessions = maxSessions })

	// Real sessions, busy in every way a session can be.
	inFlight := make([]Turn, 100)
	for i := range inFlight {
		inFlight[i], _ = tab.Acquire(bg, fmt.Sprint("real-busy-", i), 0)
	}
	queued, _ := tab.Acquire(bg, "real-queued", 0)
	queuedNext := acquireAsync(t, tab, bg, "real-queued", 0)
	stream, _ := tab.Acquire(bg, "real-stream", 0)
	stream.Streaming()
	// Initialized, answered, waiting for the client's initialized: no
	// request holds it, but evicting it would let its follow-ups race.
	initialize, _ := tab.Begin("real-gated", nil)
	initialize.Done(200)
	initializeHeld, _ := tab.Begin("real-gated-held", nil)
	initializeHeld.Done(200)
	held := acquireAsync(t, tab, bg, "real-gated-held", 0)
	busy := map[string]*Session{}
	for _, id := range trackedIDs(tab) {
		busy[id], _ = tracked(tab, id)
	}

	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)

	n := floodIDs()
	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	maxLen := 0
	const workers = 4
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				turn, err := tab.Acquire(bg, fmt.Sprintf("made-up-%08x", i), 0)
				if err != nil {
					t.Errorf("made-up id: %v", err)
					return
				}
				turn.Done(404 * (i % 2)) // half answered 404, half never answered
				if i%1000 == 0 {
					mu.Lock()
					maxLen = max(maxLen, tab.Len())
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	runtime.GC()
	runtime.ReadMemStats(&after)
	growth := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d made-up ids in %v (%.1f µs each); tracked at most %d; heap %+d KiB",
		n, elapsed.Round(time.Millisecond), float64(elapsed.Microseconds())/float64(n), maxLen, growth>>10)

	if limit := maxSessions + len(busy); maxLen > limit || tab.Len() > limit {
		t.Errorf("tracked %d sessions (at most %d during the flood), want at most max_sessions + busy = %d",
			tab.Len(), maxLen, limit)
	}
	// A tracked session costs a few hundred bytes; 500k would be >100 MiB.
	if growth > 16<<20 {
		t.Errorf("heap grew by %d MiB over the flood, want it bounded by max_sessions (< 16 MiB)", growth>>20)
	}
	for id, s := range busy {
		if cur, ok := tracked(tab, id); !ok || cur != s {
			t.Errorf("busy session %q was evicted", id)
		}
	}

	// Every real session still works as it did.
	for _, turn := range inFlight {
		turn.Done(200)
	}
	queued.Done(200)
	mustGet(t, queuedNext).turn.Done(200)
	stream.Done(200)
	mustWait(t, held) // still gated
	mustGet(t, acquireAsync(t, tab, bg, "real-gated-held", CarriesInitialized)).turn.Done(202)
	mustGet(t, held).turn.Done(200)
	gatedNext := acquireAsync(t, tab, bg, "real-gated", 0)
	mustWait(t, gatedNext) // the gate survived the flood
	mustGet(t, acquireAsync(t, tab, bg, "real-gated", CarriesInitialized)).turn.Done(202)
	mustGet(t, gatedNext).turn.Done(200)
}

// A flood of initializes that never send notifications/initialized: each
// leaves a gated session no request holds. Once no idle open session is
// left to evict, the oldest gated one goes, its init timeout stopped, so
// the table (and its timers) stay within max_sessions however long the
// flood lasts.
func TestInitializeFloodEvictsTheOldestGatedSessionsWithinMaxSessions(t *testing.T) {
	const maxSessions, flood = 1000, 20_000
	var evicted, gated atomic.Int32
	tab, clock := newTestTable(t, func(c *Config) {
		c.MaxSessions = maxSessions
		c.Events = &countingEvents{evictions: &evicted, gated: &gated}
	})
	for i := range flood {
		turn, ok := tab.Begin(fmt.Sprint("gated-", i), nil)
		if !ok {
			t.Fatalf("Begin refused gated-%d", i)
		}
		turn.Done(200)
		if n := tab.Len(); n > maxSessions {
			t.Fatalf("after %d initializes the table holds %d sessions, want at most %d", i+1, n, maxSessions)
		}
	}
	if evicted.Load() != flood-maxSessions || gated.Load() != flood-maxSessions {
		t.Fatalf("evictions = %d (%d gated), want %d, all gated", evicted.Load(), gated.Load(), flood-maxSessions)
	}
	for i := range flood {
		_, ok := tracked(tab, fmt.Sprint("gated-", i))
		if want := i >= flood-maxSessions; ok != want {
			t.Fatalf("gated-%d tracked = %v, want only the newest %d kept", i, ok, maxSessions)
		}
	}
	if n := clock.pending(); n != maxSessions {
		t.Fatalf("%d init timeouts pending, want one per tracked session (%d)", n, maxSessions)
	}
}

// A gated session goes only when no idle open session is left, and then
// the oldest first; a busy session never goes.
func TestGatedSessionsAreEvictedAfterIdleOpenOnesOldestFirst(t *testing.T) {
	var gatedEvictions atomic.Int32
	tab, _ := newTestTable(t, func(c *Config) {
		c.MaxSessions = 4
		c.Events = &countingEvents{gated: &gatedEvictions}
	})
	for _, id := range []string{"gated-old", "gated-new"} {
		turn, _ := tab.Begin(id, nil)
		turn.Done(200)
	}
	busy, _ := tab.Acquire(bg, "busy", 0)
	open, _ := tab.Acquire(bg, "open", 0)
	open.Done(200)
	var news []Turn
	for i, want := range [][]string{
		{"busy", "gated-new", "gated-old", "new-0"},  // the idle open one went first
		{"busy", "gated-new", "new-0", "new-1"},      // then the oldest gated
		{"busy", "new-0", "new-1", "new-2"},          // then the other
		{"busy", "new-0", "new-1", "new-2", "new-3"}, // all busy: the table grows
	} {
		if i == 3 && !tab.Saturated() {
			t.Fatal("Saturated is false with every session busy at max_sessions")
		}
		turn, _ := tab.Acquire(bg, fmt.Sprint("new-", i), 0)
		news = append(news, turn) // held: busy
		if got := sorted(trackedIDs(tab)); !slices.Equal(got, want) {
			t.Fatalf("after new-%d: tracked %v, want %v", i, got, want)
		}
	}
	if gatedEvictions.Load() != 2 {
		t.Fatalf("gated evictions = %d, want 2", gatedEvictions.Load())
	}
	busy.Done(200)
	if tab.Saturated() {
		t.Fatal("Saturated is true with an idle session to evict")
	}
	for _, turn := range news {
		turn.Done(200)
	}
	turn, _ := tab.Acquire(bg, "after", 0)
	turn.Done(200)
	if n := tab.Len(); n != 4 {
		t.Fatalf("Len = %d once the busy sessions went idle, want max_sessions (4)", n)
	}
}

// An evicted gated session's init timeout never acts: no gate timeout is
// reported, and the synthesize action sends nothing for it.
func TestEvictedGatedSessionsInitTimeoutNeverFires(t *testing.T) {
	var timedOut atomic.Int32
	var synthesized atomic.Int32
	tab, clock := newTestTable(t, func(c *Config) {
		c.MaxSessions = 1
		c.OnInitTimeout = Synthesize
		c.Events = &countingEvents{gateTimeouts: &timedOut}
	})
	turn, _ := tab.Begin("gated", func(context.Context) bool { synthesized.Add(1); return true })
	turn.Done(200)
	other, _ := tab.Acquire(bg, "other", 0)
	other.Done(200)
	if _, ok := tracked(tab, "gated"); ok {
		t.Fatal("the gated session was not evicted for the new one")
	}
	clock.Advance(time.Minute)
	if timedOut.Load() != 0 || synthesized.Load() != 0 {
		t.Fatalf("evicted session: %d gate timeouts, %d synthesized", timedOut.Load(), synthesized.Load())
	}
}

// A gated session whose init_timeout opened its gate while no request
// held it is an ordinary idle session: it expires after session_ttl.
func TestSessionOpenedByInitTimeoutWhileIdleExpires(t *testing.T) {
	tab, clock := newTestTable(t, func(c *Config) {
		c.SessionTTL = time.Minute
		c.InitTimeout = 10 * time.Second
	})
	turn, _ := tab.Begin("s", nil)
	turn.Done(200)
	clock.Advance(10 * time.Second) // forward opens the gate
	tab.Sweep()
	if _, ok := tracked(tab, "s"); !ok {
		t.Fatal("expired as soon as its gate opened")
	}
	clock.Advance(time.Minute + time.Second)
	tab.Sweep()
	if _, ok := tracked(tab, "s"); ok {
		t.Fatal("a session opened by init_timeout never expires")
	}
}

func TestSweepSparesASessionStillInitializing(t *testing.T) {
	tab, clock := newTestTable(t, func(c *Config) {
		c.SessionTTL = time.Second
		c.InitTimeout = time.Hour
	})
	initialize, _ := tab.Begin("s", nil)
	initialize.Done(200)
	clock.Advance(time.Minute)
	tab.Sweep()
	if _, ok := tracked(tab, "s"); !ok {
		t.Fatal("a session waiting for notifications/initialized expired")
	}
}
