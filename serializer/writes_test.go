package serializer

import (
	"context"
	"slices"
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
