package owner

import (
	"context"
	"testing"
)

var ownerC = Owner{ID: "cccc", Addr: "10.0.0.3:8080"}

// A stopping owner drops its lease and hands its sessions over; a request
// whose id names it must then be taken over at once, as one whose id
// names nobody is (TestAHandedOverSessionIsTakenOverAtOnce).
func TestAHandedOverSessionWhoseIDNamesItsOwnerIsTakenOverAtOnce(t *testing.T) {
	ctx := context.Background()
	s, l := newMemStore(), newMemLeases(&clock{})
	a, b := leasedDir(ownerA, l), leasedDir(ownerB, l)
	a.Created("s1", ownerA.Addr)
	s.owners["s1"] = ownerA.String()
	a.Members().Renew(ctx)
	b.Members().Renew(ctx)
	b.Members().Refresh(ctx)
	// SIGTERM: handOver drops the lease, then releases.
	a.Members().Stop(ctx, l)
	if n := a.Release(ctx, s); n != 1 {
		t.Fatalf("Release handed %d sessions over, want 1", n)
	}
	b.Members().Refresh(ctx)
	if o, forward, wait := b.Route(ctx, s, "s1", ownerA.ID, ownerB.Addr); forward || wait || o != ownerB {
		t.Fatalf("Route = %v, forward %v, wait %v; want taken over at once, not forwarded to the instance that handed it over", o, forward, wait)
	}
}

// A session taken over from an owner that then comes back (SIGCONT, a
// partition healed) still carries the old owner's name in the client's
// id. Once that owner answers that it does not serve the session, the
// next attempt must go elsewhere, not to it again until queue_timeout.
func TestAnIDNamingAnInstanceThatWasTakenOverReachesTheNewOwner(t *testing.T) {
	ctx := context.Background()
	s, l := newMemStore(), newMemLeases(&clock{})
	a, b, c := leasedDir(ownerA, l), leasedDir(ownerB, l), leasedDir(ownerC, l)
	a.Created("s1", ownerA.Addr)
	s.owners["s1"] = ownerA.String()
	for _, d := range []*Directory{a, b, c} {
		d.Members().Renew(ctx)
	}
	lapse(l, ownerA, b, c)
	if o, forward, _ := b.Route(ctx, s, "s1", ownerA.ID, ownerB.Addr); forward || o != ownerB {
		t.Fatalf("B did not take the lapsed owner's session over: %v, %v", o, forward)
	}
	// A resumes and renews; C has not met the session.
	a.Members().Renew(ctx)
	l.c.add(verifyDelay)
	c.Members().Refresh(ctx)
	for attempt := range 3 {
		o, forward, _ := c.Route(ctx, s, "s1", ownerA.ID, ownerC.Addr)
		if !forward {
			t.Fatalf("attempt %d: served at C", attempt)
		}
		if o.ID == ownerB.ID {
			return
		}
		// A answers 421: it learned B took the session over.
		if a.Serves("s1", o.ID) {
			a.Confirm(ctx, s, "s1") // 503 owner_moved; A learns B's
		}
		c.Unreachable("s1", o)
	}
	t.Fatal("every attempt went to A, which no longer serves the session; the request waits for queue_timeout and is answered 503")
}

