package owner

import (
	"context"
	"testing"
	"time"
)

// A Redis that restarts from its last RDB snapshot (the default for
// redis:7 with a /data volume) lists every lease as it was then: lapsed
// long ago. A live owner renews within renewEvery; the lock delay is
// there to give it that second. Its sessions must not be taken over
// before it.
func TestALeaseRestoredFromAnOldSnapshotIsNotTakenOverBeforeTheLockDelay(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	l := newMemLeases(c)
	a, b := leasedDir(ownerA, l), leasedDir(ownerB, l)
	for _, d := range []*Directory{a, b} {
		d.Members().Renew(ctx)
	}
	for _, d := range []*Directory{a, b} {
		d.Members().Refresh(ctx)
	}
	s := newMemStore()
	s.owners["s1"] = ownerB.String()
	b.Created("s1", ownerB.Addr)

	// Redis restarts and loads a snapshot taken a minute ago: both
	// leases are there with their expiry of then, epochs unchanged.
	l.mu.Lock()
	for id, ls := range l.leases {
		ls.until = c.now().Add(-time.Minute)
		l.leases[id] = ls
	}
	l.mu.Unlock()

	a.Members().Refresh(ctx) // A's background listing meets the restored hash first
	o, forward, _ := a.Route(ctx, s, "s1", "", ownerA.Addr)
	if !forward || o.ID != ownerB.ID {
		t.Fatalf("right after the engine restarted from a snapshot, A routed B's session to %v (forward %v), "+
			"before B had its renewal second: B's lease lapsed only in the snapshot; record now %q",
			o, forward, s.owners["s1"])
	}
}

// After the engine restarted empty, session s1 lives at B, which created
// it and knows it. Its client rewrites the instance its id names to A
// ("mcps1.<A>.<x>" and "mcps1.<B>.<x>" are one upstream session x), or
// sends Mcp-Serializer-Owner naming A straight to A: every other instance
// forwards the first to A, and A serves it, while B serves the second.
func TestAnInstanceThatNeverOwnedASessionWithoutARecordDoesNotServeItBesideItsOwner(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	l := newMemLeases(c)
	a, b := leasedDir(ownerA, l), leasedDir(ownerB, l)
	for _, d := range []*Directory{a, b} {
		d.Members().Renew(ctx)
		d.Members().Refresh(ctx)
	}
	s := newMemStore() // restarted empty: no record of s1
	b.Created("s1", ownerB.Addr)

	_, bForwards, bWaits := b.Route(ctx, s, "s1", ownerB.ID, ownerB.Addr)
	bServes := !bForwards && !bWaits
	aServes := a.Serves(ctx, s, "s1", ownerA.ID)
	if aServes && bServes {
		t.Fatal("A, which never owned s1, serves it as forwarded to it while B, its owner, serves it too")
	}
}
