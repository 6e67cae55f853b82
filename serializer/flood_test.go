package serializer

import (
	"fmt"
	"runtime"
	"sync"
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
	for _, id := range tab.lru.Keys() {
		busy[id], _ = tab.lru.Peek(id)
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
		if cur, ok := tab.lru.Peek(id); !ok || cur != s {
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

// Sessions still initializing do not make the table grow for ever: once
// their gate has opened (here by init_timeout) they are ordinary idle
// sessions and the next arrivals evict them.
func TestInitializingSessionsAreEvictableOnceTheirGateOpens(t *testing.T) {
	tab, clock := newTestTable(t, func(c *Config) { c.MaxSessions = 10 })
	for i := range 30 {
		turn, _ := tab.Begin(fmt.Sprint("init-", i), nil)
		turn.Done(200)
	}
	if tab.Len() != 30 {
		t.Fatalf("Len = %d, want all 30 initializing sessions kept", tab.Len())
	}
	clock.Advance(10 * time.Second) // init_timeout: forward opens every gate
	for i := range 30 {
		turn, _ := tab.Acquire(bg, fmt.Sprint("later-", i), 0)
		turn.Done(200)
	}
	if tab.Len() > 10 {
		t.Fatalf("Len = %d, want the table back within max_sessions (10)", tab.Len())
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
	if !tab.lru.Contains("s") {
		t.Fatal("a session waiting for notifications/initialized expired")
	}
}
