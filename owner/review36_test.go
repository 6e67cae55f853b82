package owner

import (
	"context"
	"errors"
	"testing"
	"time"
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

// lossyLeases applies a renewal and then loses its answer, once.
type lossyLeases struct {
	*memLeases
	lose bool
}

func (l *lossyLeases) Renew(ctx context.Context, id, addr string, life time.Duration) (bool, error) {
	stood, err := l.memLeases.Renew(ctx, id, addr, life)
	if l.lose {
		l.lose = false
		return false, errors.New("no answer within 250ms")
	}
	return stood, err
}

// An owner frozen past its lease whose first renewal on waking is applied
// but unanswered never learns that its lease lapsed: the next renewal
// finds it standing. It then serves a session another instance took over.
func TestAResumedOwnerWhoseRenewalAnswerWasLostStillConfirmsBeforeServing(t *testing.T) {
	ctx := context.Background()
	s, ml := newMemStore(), newMemLeases(&clock{})
	ll := &lossyLeases{memLeases: ml}
	am := NewMembership(ownerA.ID, func() Leases { return ll }, ml.c.now)
	am.SetAddr(ownerA.Addr)
	a := NewDirectory(am, 100, time.Hour, ml.c.now)
	b := leasedDir(ownerB, ml)
	a.Created("s1", ownerA.Addr)
	s.owners["s1"] = ownerA.String()
	a.Members().Renew(ctx)
	b.Members().Renew(ctx)
	// A is frozen; B takes s1 over.
	lapse(ml, ownerA, b)
	if o, forward, _ := b.Route(ctx, s, "s1", "", ownerB.Addr); forward || o != ownerB {
		t.Fatalf("B did not take s1 over: %v, %v", o, forward)
	}
	// A wakes: its first renewal is applied, the answer lost.
	ll.lose = true
	first := a.Confirm(ctx, s, "s1")
	// The engine answers A again.
	ml.c.add(renewEvery)
	a.Members().Renew(ctx)
	ml.c.add(verifyDelay)
	if first && a.Confirm(ctx, s, "s1") {
		t.Fatal("A would send s1 upstream while B, which took it over, serves it")
	}
}

// An owner's entry for its session ages out session_ttl after it was
// learned, however busy the session; an owner whose lease then lapses
// serves the session without reading who owns it now.
func TestAnOwnerWhoseLeaseLapsedConfirmsALongLivedSession(t *testing.T) {
	ctx := context.Background()
	s, l := newMemStore(), newMemLeases(&clock{})
	a, b := leasedDir(ownerA, l), leasedDir(ownerB, l)
	a.Created("s1", ownerA.Addr)
	s.owners["s1"] = ownerA.String()
	// The session is in use for more than session_ttl (an hour here).
	for range 61 {
		l.c.add(time.Minute)
		a.Members().Renew(ctx)
		b.Members().Renew(ctx)
		if _, forward, _ := a.Route(ctx, s, "s1", ownerA.ID, ownerA.Addr); forward {
			t.Fatal("the owner forwarded its own session")
		}
	}
	lapse(l, ownerA, b)
	if o, forward, _ := b.Route(ctx, s, "s1", "", ownerB.Addr); forward || o != ownerB {
		t.Fatalf("B did not take s1 over: %v, %v", o, forward)
	}
	a.Members().Renew(ctx) // A resumes and learns its lease lapsed
	l.c.add(verifyDelay)
	if _, forward, _ := a.Route(ctx, s, "s1", ownerA.ID, ownerA.Addr); !forward && a.Confirm(ctx, s, "s1") {
		t.Fatal("A serves s1 upstream beside B, which took it over")
	}
}
