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

// A key claimed by A before B joined (scale-out, or any deploy: new
// instances have new IDs, so the hashing moves every key) stays with A
// while its record stands. When the engine restarts empty, A still
// serves it from what it knows, and B, which never met it, hashes it to
// itself and serves it too: one user's line runs on two instances.
func TestAKeyClaimedBeforeAnInstanceJoinedIsNotServedAtTwoAfterTheEngineForgetsIt(t *testing.T) {
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	s, l := newMemStore(), newMemLeases(c)
	a, b := leasedDir(ownerA, l), leasedDir(ownerB, l)
	a.Members().Renew(bg)
	a.Members().Refresh(bg)
	b.Members().Refresh(bg)

	b.Members().Renew(bg) // B joins after the key was met, so choose one B's joining moves
	var key string
	for i := 0; ; i++ {
		key = "key " + time.Duration(i).String()
		if a.Members().Rendezvous(key).ID == ownerA.ID {
			l.mu.Lock()
			l.leases[ownerB.ID] = lease{ownerB.Addr, c.now().Add(time.Hour), 1}
			l.mu.Unlock()
			b.Members().Refresh(bg)
			if b.Members().Rendezvous(key).ID == ownerB.ID {
				break
			}
		}
	}
	// Before B joined, from A's view (only A listed): A serves and claims it.
	if _, forward, _ := a.RouteKey(bg, s, key, ownerA.Addr); forward {
		t.Fatal("A alone forwarded the key")
	}
	a.KeyAnswered(bg, s, key, ownerA.Addr)
	a.Members().Refresh(bg)

	s.mu.Lock()
	clear(s.owners) // the engine restarts empty
	s.mu.Unlock()

	_, aFwd, aWait := a.RouteKey(bg, s, key, ownerA.Addr)
	_, bFwd, bWait := b.RouteKey(bg, s, key, ownerB.Addr)
	if !aFwd && !aWait && !bFwd && !bWait {
		t.Fatalf("after the engine forgot the key's record, both A (its claimer) and B (its hash) serve %q", key)
	}
}
