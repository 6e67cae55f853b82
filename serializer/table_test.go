package serializer

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestTableEvictsLeastRecentlyUsedIdleSession(t *testing.T) {
	var evicted atomic.Int32
	tab, _ := newTestTable(t, func(c *Config) {
		c.MaxSessions = 2
		c.Events = &countingEvents{evictions: &evicted}
	})
	for _, id := range []string{"a", "b", "a", "c"} {
		turn, _ := tab.Acquire(bg, id, 0)
		turn.Done(200)
	}
	if ids := trackedIDs(tab); !slices.Equal(sorted(ids), []string{"a", "c"}) {
		t.Fatalf("tracked %v, want a and c", ids)
	}
	if evicted.Load() != 1 {
		t.Fatalf("evictions = %d, want 1", evicted.Load())
	}
}

func TestEvictionNeverDropsASessionWithWaiters(t *testing.T) {
	tab, _ := newTestTable(t, func(c *Config) { c.MaxSessions = 2 })
	busy, _ := tab.Acquire(bg, "busy", 0)
	queued := acquireAsync(t, tab, bg, "busy", 0)
	gated, _ := tab.Begin("gated", nil)
	for i := range 10 {
		turn, _ := tab.Acquire(bg, fmt.Sprint("flood-", i), 0)
		turn.Done(404)
	}
	for _, id := range []string{"busy", "gated"} {
		if _, ok := tracked(tab, id); !ok {
			t.Fatalf("session %q in use was evicted", id)
		}
	}
	busy.Done(200)
	mustGet(t, queued).turn.Done(200)
	gated.Done(200)
}

func TestTableGrowsPastMaxSessionsOnlyWhenAllAreInUse(t *testing.T) {
	tab, _ := newTestTable(t, func(c *Config) { c.MaxSessions = 1 })
	a, _ := tab.Acquire(bg, "a", 0)
	b, _ := tab.Acquire(bg, "b", 0)
	if tab.Len() != 2 {
		t.Fatalf("Len = %d, want 2 while both are in use", tab.Len())
	}
	a.Done(200)
	b.Done(200)
	c, _ := tab.Acquire(bg, "c", 0)
	c.Done(200)
	if tab.Len() > 2 {
		t.Fatalf("Len = %d, want the table to stop growing", tab.Len())
	}
}

func TestIdleSessionExpiresAfterTTL(t *testing.T) {
	tab, clock := newTestTable(t, func(c *Config) { c.SessionTTL = time.Minute })
	turn, _ := tab.Acquire(bg, "old", 0)
	turn.Done(200)
	clock.Advance(30 * time.Second)
	turn, _ = tab.Acquire(bg, "new", 0)
	turn.Done(200)
	clock.Advance(31 * time.Second)
	tab.Sweep()
	if ids := trackedIDs(tab); !slices.Equal(ids, []string{"new"}) {
		t.Fatalf("after sweep: %v, want only new", ids)
	}
}

func TestSessionInUseNeverExpires(t *testing.T) {
	tab, clock := newTestTable(t, func(c *Config) { c.SessionTTL = time.Minute })
	busy, _ := tab.Acquire(bg, "busy", 0)
	clock.Advance(2 * time.Hour)
	tab.Sweep()
	if _, ok := tracked(tab, "busy"); !ok {
		t.Fatal("a session with an exchange in flight expired")
	}
	busy.Done(200)
}

func TestConfigureShrinksTableToNewMaxSessions(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	for i := range 5 {
		turn, _ := tab.Acquire(bg, fmt.Sprint(i), 0)
		turn.Done(200)
	}
	cfg := *tab.config()
	cfg.MaxSessions = 2
	tab.Configure(cfg)
	if tab.Len() != 2 {
		t.Fatalf("Len = %d, want 2", tab.Len())
	}
}

func TestJanitorStopsOnClose(t *testing.T) {
	// Counted by name: other tests' goroutines may still be ending.
	janitors := func() int {
		buf := make([]byte, 1<<22)
		n := runtime.Stack(buf, true)
		return strings.Count(string(buf[:n]), "serializer.(*Table).janitor(")
	}
	before := janitors()
	tab := NewTable(Defaults())
	eventually(t, func() bool { return janitors() == before+1 }) // started
	tab.Close()
	tab.Close() // idempotent
	if n := janitors(); n != before {
		t.Fatalf("%d janitors after Close, want %d", n, before)
	}
}

func TestValidateNamesTheSetting(t *testing.T) {
	for setting, edit := range map[string]func(*Config){
		"init_timeout":  func(c *Config) { c.InitTimeout = 0 },
		"queue_timeout": func(c *Config) { c.QueueTimeout = -1 },
		"max_queue":     func(c *Config) { c.MaxQueue = 0 },
		"max_sessions":  func(c *Config) { c.MaxSessions = 0 },
		"session_ttl":   func(c *Config) { c.SessionTTL = 0 },
		"store_timeout": func(c *Config) { c.StoreTimeout = 0 },
	} {
		cfg := Defaults()
		edit(&cfg)
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), setting) {
			t.Errorf("%s: Validate() = %v, want an error naming it", setting, err)
		}
	}
	if err := Defaults().Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
}

func sorted(s []string) []string {
	slices.Sort(s)
	return s
}

// A smaller max_sessions evicts as a new session would: idle open
// sessions first, then the oldest gated ones, never a busy one.
func TestConfigureShrinksByTheSameEvictionPolicy(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	for _, id := range []string{"gated-old", "gated-new"} {
		turn, _ := tab.Begin(id, nil)
		turn.Done(200)
	}
	busy, _ := tab.Acquire(bg, "busy", 0)
	defer busy.Done(200)
	for _, id := range []string{"open-old", "open-new"} {
		turn, _ := tab.Acquire(bg, id, 0)
		turn.Done(200)
	}
	cfg := *tab.config()
	for _, step := range []struct {
		max  int
		want []string
	}{
		{4, []string{"busy", "gated-new", "gated-old", "open-new"}},
		{3, []string{"busy", "gated-new", "gated-old"}},
		{2, []string{"busy", "gated-new"}},
		{0, []string{"busy"}},
	} {
		cfg.MaxSessions = step.max
		tab.Configure(cfg)
		if got := sorted(trackedIDs(tab)); !slices.Equal(got, step.want) {
			t.Fatalf("max_sessions %d: tracked %v, want %v", step.max, got, step.want)
		}
	}
}
