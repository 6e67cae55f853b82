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
