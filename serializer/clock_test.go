package serializer

import (
	"context"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"
)

// fakeClock is a Clock that moves only when a test calls Advance.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	at      time.Time
	f       func()
	stopped bool
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		was := !t.stopped
		t.stopped = true
		return was
	}
}

// pending returns the number of timers neither run nor stopped.
func (c *fakeClock) pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, t := range c.timers {
		if !t.stopped {
			n++
		}
	}
	return n
}

// Advance moves time forward and runs the timers that became due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []func()
	kept := c.timers[:0]
	for _, t := range c.timers {
		switch {
		case t.stopped:
		case !t.at.After(c.now):
			t.stopped = true
			due = append(due, t.f)
		default:
			kept = append(kept, t)
		}
	}
	clear(c.timers[len(kept):]) // a dropped timer's func must not stay reachable
	c.timers = kept
	c.mu.Unlock()
	for _, f := range due {
		f()
	}
}

// newTestTable returns a table on a fake clock with small limits.
func newTestTable(t *testing.T, edit func(*Config)) (*Table, *fakeClock) {
	t.Helper()
	clock := newFakeClock()
	cfg := Defaults()
	cfg.Clock = clock
	if edit != nil {
		edit(&cfg)
	}
	tab := NewTable(cfg)
	t.Cleanup(tab.Close)
	return tab, clock
}

// result is the outcome of an Acquire run in the background.
type result struct {
	turn Turn
	err  error
}

// acquireAsync starts an Acquire and waits until it is queued (or done),
// so that tests control arrival order.
func acquireAsync(t *testing.T, tab *Table, ctx context.Context, id string, traits Traits) <-chan result {
	t.Helper()
	before := waitingCount(tab, id)
	ch := make(chan result, 1)
	go func() {
		turn, err := tab.Acquire(ctx, id, traits)
		ch <- result{turn, err}
	}()
	eventually(t, func() bool { return waitingCount(tab, id) > before || len(ch) > 0 })
	return ch
}

// tracked returns the table's session for id, if any.
func tracked(tab *Table, id string) (*Session, bool) {
	tab.mu.Lock()
	defer tab.mu.Unlock()
	s, ok := tab.sessions[id]
	return s, ok
}

// trackedIDs returns the ids the table tracks, in no order.
func trackedIDs(tab *Table) []string {
	tab.mu.Lock()
	defer tab.mu.Unlock()
	return slices.Collect(maps.Keys(tab.sessions))
}

func waitingCount(tab *Table, id string) int {
	s, ok := tracked(tab, id)
	if !ok {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.waiting)
}

// eventually polls cond for up to five seconds.
func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(time.Millisecond)
	}
}

// mustGet returns the result, failing if none arrives within five seconds.
func mustGet(t *testing.T, ch <-chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("no result within 5s")
		return result{}
	}
}

// mustWait asserts that ch has no result yet.
func mustWait(t *testing.T, ch <-chan result) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("expected to wait, got turn (err=%v)", r.err)
	case <-time.After(20 * time.Millisecond):
	}
}
