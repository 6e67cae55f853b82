package serializer

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// memTurns is a TurnStore (and, with announce set, an announcing
// Watcher) on TurnLines, on the tests' fake clock.
type memTurns struct {
	*fakeStore
	clock *fakeClock

	mu       sync.Mutex
	lines    map[string]*TurnLine
	calls    map[string]int  // by op and session: "take s"
	fail     error           // every call fails, unapplied
	lose     map[string]bool // by op: applied, but the answer is lost
	refuse   map[string]bool // by op: fails, unapplied
	announce bool
	watchers map[int]func(string, string, time.Duration)
	nextW    int
}

func newMemTurns(clock *fakeClock, announce bool) *memTurns {
	return &memTurns{fakeStore: newFakeStore(), clock: clock, lines: map[string]*TurnLine{}, calls: map[string]int{},
		lose: map[string]bool{}, refuse: map[string]bool{}, announce: announce, watchers: map[int]func(string, string, time.Duration){}}
}

// enter counts a call of op and returns id's line and the error the
// call's answer meets once applied, or the error that keeps it from
// being applied. Caller holds m.mu.
func (m *memTurns) enter(op, id string) (l *TurnLine, answer, err error) {
	m.calls[op+" "+id]++
	if m.fail != nil {
		return nil, nil, m.fail
	}
	if m.refuse[op] {
		return nil, nil, errStoreDown
	}
	if m.lose[op] {
		answer = context.DeadlineExceeded
	}
	l = m.lines[id]
	if l == nil {
		l = &TurnLine{}
		m.lines[id] = l
	}
	return l, answer, nil
}

func (m *memTurns) TakeTurn(_ context.Context, id, token string, age, lease, claim time.Duration) (TurnState, time.Duration, error) {
	m.mu.Lock()
	l, answer, err := m.enter("take", id)
	if err != nil {
		m.mu.Unlock()
		return 0, NobodyWaiting, err
	}
	now := m.clock.Now()
	st, first := l.Take(token, now.Add(-age), now, lease, claim)
	m.mu.Unlock()
	if st == TurnWaiting {
		m.changed(id, token, age)
	}
	return st, behind(now, first), answer
}

func (m *memTurns) ClaimTurn(_ context.Context, id, token string, age, lease, claim time.Duration, nudge bool) (TurnState, time.Duration, error) {
	m.mu.Lock()
	l, answer, err := m.enter("claim", id)
	if err != nil {
		m.mu.Unlock()
		return 0, NobodyWaiting, err
	}
	now := m.clock.Now()
	st, first := l.Claim(token, now, lease, claim)
	m.mu.Unlock()
	if st == TurnWaiting && nudge {
		m.changed(id, token, age)
	}
	return st, behind(now, first), answer
}

func (m *memTurns) RenewTurn(_ context.Context, id, token string, lease time.Duration) (bool, time.Duration, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, answer, err := m.enter("renew", id)
	if err != nil {
		return false, NobodyWaiting, err
	}
	now := m.clock.Now()
	held, first := l.Renew(token, now, lease)
	return held, behind(now, first), answer
}

// behind is a TurnStore's answer for a TurnLine's first arrival.
func behind(now, first time.Time) time.Duration {
	if first.IsZero() {
		return NobodyWaiting
	}
	return now.Sub(first)
}

func (m *memTurns) ReleaseTurn(_ context.Context, id, token string, claim time.Duration) error {
	m.mu.Lock()
	l, answer, err := m.enter("release", id)
	if err != nil {
		m.mu.Unlock()
		return err
	}
	handedOn := l.Release(token, m.clock.Now(), claim)
	m.mu.Unlock()
	if handedOn {
		m.changed(id, "", 0)
	}
	return answer
}

func (m *memTurns) Opened(ctx context.Context, id string) error {
	err := m.fakeStore.Opened(ctx, id)
	if err == nil {
		m.changed(id, "", 0)
	}
	return err
}

func (m *memTurns) changed(id, asker string, waited time.Duration) {
	m.mu.Lock()
	var ws []func(string, string, time.Duration)
	if m.announce {
		for _, w := range m.watchers {
			ws = append(ws, w)
		}
	}
	m.mu.Unlock()
	for _, w := range ws {
		w(StoreKey(id), asker, waited)
	}
}

func (m *memTurns) Watch(changed func(string, string, time.Duration)) func() {
	m.mu.Lock()
	defer m.mu.Unlock()
	i := m.nextW
	m.nextW++
	m.watchers[i] = changed
	return func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		delete(m.watchers, i)
	}
}

func (m *memTurns) Announcing() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.announce
}

func (m *memTurns) setFail(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.fail = err
}

// set turns a fault of op on or off: lose (applied, answer lost) or
// refuse (not applied).
func (m *memTurns) set(fault map[string]bool, op string, on bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	fault[op] = on
}

// count returns the calls of op made for session id.
func (m *memTurns) countOf(op, id string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls[op+" "+id]
}

// line returns a copy of id's line.
func (m *memTurns) line(id string) TurnLine {
	m.mu.Lock()
	defer m.mu.Unlock()
	if l := m.lines[id]; l != nil {
		c := *l
		c.Waiting = slices.Clone(l.Waiting)
		return c
	}
	return TurnLine{}
}

// newCluster returns n tables with cluster turns on one memTurns.
func newCluster(t *testing.T, n int, announce bool) ([]*Table, *memTurns, *fakeClock) {
	t.Helper()
	clock := newFakeClock()
	turns := newMemTurns(clock, announce)
	tabs := make([]*Table, n)
	for i := range tabs {
		cfg := Defaults()
		cfg.Clock = clock
		cfg.Store, cfg.Turns, cfg.Watcher = turns, turns, turns
		tabs[i] = NewTable(cfg)
		t.Cleanup(tabs[i].Close)
	}
	return tabs, turns, clock
}

// openSession makes id a known, open session on every table.
func openSession(t *testing.T, turns *memTurns, id string) {
	t.Helper()
	turns.put(id, Record{Open: true})
}

func TestClusterTurnRunsASessionsRequestsOneAtATimeAcrossInstances(t *testing.T) {
	tabs, turns, _ := newCluster(t, 2, true)
	openSession(t, turns, "s")
	first := mustGet(t, acquireAsync(t, tabs[0], bg, "s", 0))
	if first.err != nil {
		t.Fatal(first.err)
	}
	second := acquireInBackground(tabs[1], "s")
	mustWait(t, second) // the first is still upstream on the other instance
	first.turn.Done(200)
	r := mustGet(t, second) // announced: no clock needed
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.turn.Done(200)
}

func TestClusterTurnWithoutAnnouncementsEndsWithinABackoff(t *testing.T) {
	tabs, turns, clock := newCluster(t, 2, false)
	openSession(t, turns, "s")
	first := mustGet(t, acquireAsync(t, tabs[0], bg, "s", 0))
	second := acquireInBackground(tabs[1], "s")
	mustWait(t, second)
	first.turn.Done(200)
	mustWait(t, second) // nothing announced it
	r := resultWithinBackoffs(t, clock, second, "the waiting request did not read the turn again within its backoff")
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.turn.Done(200)
}

func TestHolderKeepsTheTurnWhileRequestsKeepArrivingThere(t *testing.T) {
	tabs, turns, clock := newCluster(t, 2, true)
	openSession(t, turns, "s")
	for range 20 { // a sticky front: every request on one instance
		r := mustGet(t, acquireAsync(t, tabs[0], bg, "s", 0))
		if r.err != nil {
			t.Fatal(r.err)
		}
		clock.Advance(100 * time.Millisecond)
		r.turn.Done(200)
	}
	if n := turns.countOf("take", "s"); n != 1 {
		t.Fatalf("%d asks for 20 requests on one instance, want 1", n)
	}
	if n := turns.countOf("release", "s") + turns.countOf("claim", "s"); n != 0 {
		t.Fatalf("%d releases and claims for requests on the holder, want none", n)
	}
}

func TestIdleHolderHandsTheTurnOnAtOnceWhenAskedElsewhere(t *testing.T) {
	tabs, turns, _ := newCluster(t, 2, true)
	openSession(t, turns, "s")
	mustGet(t, acquireAsync(t, tabs[0], bg, "s", 0)).turn.Done(200) // tabs[0] keeps the turn
	endClusterTurn(t, acquireInBackground(tabs[1], "s"))            // no clock: announced both ways
}

func TestRequestsThatReachedTheHolderBeforeAnAskElsewhereGoFirst(t *testing.T) {
	tabs, turns, clock := newCluster(t, 2, true)
	openSession(t, turns, "s")
	var mu sync.Mutex
	var order []string
	run := func(tab *Table, name string, first chan result) <-chan struct{} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			r := <-first
			if r.err != nil {
				t.Error(r.err)
				return
			}
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
			r.turn.Done(200)
		}()
		return done
	}
	r1 := mustGet(t, acquireAsync(t, tabs[0], bg, "s", 0)) // upstream on A
	r2 := acquireAsync(t, tabs[0], bg, "s", 0)             // queued on A
	clock.Advance(5 * time.Millisecond)
	r3 := acquireInBackground(tabs[1], "s") // then asked on B
	eventually(t, func() bool { return len(turns.line("s").Waiting) == 1 })
	clock.Advance(5 * time.Millisecond)
	r4 := acquireAsync(t, tabs[0], bg, "s", 0) // on A, after B's ask was heard there
	done := []<-chan struct{}{
		run(tabs[0], "r2", relay(r2)), run(tabs[1], "r3", relay(r3)), run(tabs[0], "r4", relay(r4)),
	}
	mu.Lock()
	order = append(order, "r1")
	mu.Unlock()
	r1.turn.Done(200)
	for _, d := range done {
		select {
		case <-d:
		case <-time.After(5 * time.Second):
			t.Fatal("a request was not served")
		}
	}
	if want := []string{"r1", "r2", "r3", "r4"}; !slices.Equal(order, want) {
		t.Fatalf("served %v, want %v (arrival order across instances)", order, want)
	}
}

// A request that reached the holder's instance while that instance's slot
// was busy asks only later, but says how long it has waited: it still goes
// before a request that reached another instance after it.
func TestAnAskCountsFromItsRequestsArrivalNotFromWhenItWasSent(t *testing.T) {
	tabs, turns, clock := newCluster(t, 2, true)
	openSession(t, turns, "s")
	a1 := mustGet(t, acquireAsync(t, tabs[0], bg, "s", 0)) // upstream on A
	b1 := acquireInBackground(tabs[1], "s")                // asks on B at once
	eventually(t, func() bool { return len(turns.line("s").Waiting) == 1 })
	clock.Advance(5 * time.Millisecond)
	a2 := acquireAsync(t, tabs[0], bg, "s", 0) // A's slot is busy: it asks later
	clock.Advance(5 * time.Millisecond)
	b2 := acquireAsync(t, tabs[1], bg, "s", 0) // after a2, on B
	clock.Advance(10 * time.Millisecond)
	a1.turn.Done(200)
	first := mustGet(t, b1)
	eventually(t, func() bool { return len(turns.line("s").Waiting) == 1 }) // a2 asked
	first.turn.Done(200)
	second := mustGet(t, a2)
	mustWait(t, b2)
	second.turn.Done(200)
	mustGet(t, b2).turn.Done(200)
}

// relay passes ch's result on through a channel a test can hand around.
func relay(ch <-chan result) chan result {
	out := make(chan result, 1)
	go func() { out <- <-ch }()
	return out
}

func TestClusterTurnsGoInTheOrderAsked(t *testing.T) {
	tabs, turns, _ := newCluster(t, 3, true)
	openSession(t, turns, "s")
	first := mustGet(t, acquireAsync(t, tabs[0], bg, "s", 0))
	var order []int
	var mu sync.Mutex
	done := make(chan struct{}, 2)
	for _, i := range []int{1, 2} {
		go func() {
			turn, err := tabs[i].Acquire(bg, "s", 0)
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			turn.Done(200)
			done <- struct{}{}
		}()
		eventually(t, func() bool { return len(turns.line("s").Waiting) == i })
	}
	first.turn.Done(200)
	<-done
	<-done
	if order[0] != 1 || order[1] != 2 {
		t.Fatalf("served in the order %v, want [1 2] (the order they asked)", order)
	}
}

func TestDeadInstancesTurnIsPassedOverWhenItsLeaseRunsOut(t *testing.T) {
	tabs, turns, clock := newCluster(t, 1, true)
	openSession(t, turns, "s")
	// An instance took the turn, then died: nobody renews its lease.
	if st, _, _ := turns.TakeTurn(bg, "s", "dead", 0, TurnLease, TurnClaim); st != TurnServed {
		t.Fatalf("dead instance's ask: %v, want served", st)
	}
	waiting := acquireInBackground(tabs[0], "s")
	eventually(t, func() bool { return turns.countOf("take", "s") == 2 })
	clock.Advance(TurnLease - time.Millisecond)
	mustWait(t, waiting)
	clock.Advance(2 * remoteMaxBackoff)
	r := mustGet(t, waiting)
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.turn.Done(200)
}

func TestLiveHolderRenewsItsLeaseForALongExchange(t *testing.T) {
	tabs, turns, clock := newCluster(t, 2, true)
	openSession(t, turns, "s")
	long := mustGet(t, acquireAsync(t, tabs[0], bg, "s", 0))
	stopped := make(chan struct{})
	long.turn.StopOnLapse(func() { close(stopped) })
	waiting := acquireInBackground(tabs[1], "s")
	eventually(t, func() bool { return turns.countOf("take", "s") == 2 })
	for range 24 { // four leases
		clock.Advance(TurnLease / 6)
		time.Sleep(time.Millisecond) // let a renewal land
	}
	mustWait(t, waiting)
	select {
	case <-stopped:
		t.Fatal("the exchange was stopped while its lease was renewed")
	default:
	}
	long.turn.Done(200)
	mustGet(t, waiting).turn.Done(200)
}

func TestHolderThatCannotRenewStopsItsExchangeBeforeTheLeaseLapses(t *testing.T) {
	tabs, turns, clock := newCluster(t, 2, true)
	openSession(t, turns, "s")
	long := mustGet(t, acquireAsync(t, tabs[0], bg, "s", 0))
	stopped := make(chan time.Time, 1)
	long.turn.StopOnLapse(func() { stopped <- clock.Now() })
	start := clock.Now()
	turns.set(turns.refuse, "renew", true) // cut off from the engine for renewals
	for range 100 {
		clock.Advance(TurnLease / 50)
		time.Sleep(time.Millisecond)
		if len(stopped) > 0 {
			break
		}
	}
	select {
	case at := <-stopped:
		if lapse := start.Add(TurnLease); !at.Before(lapse) {
			t.Fatalf("stopped %s after the turn began, not before its lease may lapse (%s)", at.Sub(start), TurnLease)
		}
	default:
		t.Fatal("the exchange ran on past its lease")
	}
	if renewals := turns.countOf("renew", "s"); renewals < 2 {
		t.Fatalf("%d renewals tried before stopping, want at least 2", renewals)
	}
	long.turn.Done(0)
	// The next request elsewhere is served, and never beside the stopped one.
	endClusterTurn(t, acquireInBackground(tabs[1], "s"))
}

func TestHolderWhoseLineWasRolledBackStopsItsExchange(t *testing.T) {
	tabs, turns, clock := newCluster(t, 2, true)
	openSession(t, turns, "s")
	mustGet(t, acquireAsync(t, tabs[0], bg, "s", 0)).turn.Done(200)
	before := turns.line("s") // what a replica had
	b := mustGet(t, acquireInBackground(tabs[1], "s"))
	stopped := make(chan struct{})
	b.turn.StopOnLapse(func() { close(stopped) })
	turns.mu.Lock()
	*turns.lines["s"] = before // a failover to that replica
	turns.mu.Unlock()
	for range 10 {
		clock.Advance(TurnLease / 6)
		time.Sleep(time.Millisecond)
	}
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("the holder ran on after the engine forgot its turn")
	}
	b.turn.Done(0)
}

func TestLostAnswerToAnAskLeavesNoTurnServedToNobody(t *testing.T) {
	tabs, turns, _ := newCluster(t, 2, true)
	openSession(t, turns, "s")
	turns.set(turns.lose, "take", true) // applied on the engine, answer lost
	r := mustGet(t, acquireAsync(t, tabs[0], bg, "s", 0))
	if r.err != nil || r.turn.grant != nil {
		t.Fatalf("err=%v grant=%v, want a turn here only", r.err, r.turn.grant)
	}
	r.turn.Done(200)
	turns.set(turns.lose, "take", false)
	// No clock moves: the lost ask was withdrawn, not left to lapse.
	endClusterTurn(t, acquireInBackground(tabs[1], "s"))
}

func TestAskedTwiceWithOneTokenIsQueuedOnce(t *testing.T) {
	var l TurnLine
	now := time.Unix(0, 0)
	l.Take("a", now, now, TurnLease, TurnClaim)
	for range 2 {
		if st, _ := l.Take("b", now, now, TurnLease, TurnClaim); st != TurnWaiting {
			t.Fatalf("b: %v, want waiting", st)
		}
	}
	if st, first := l.Take("a", now, now, TurnLease, TurnClaim); st != TurnServed || !first.Equal(now) {
		t.Fatalf("a again: %v, first waiting since %v; want served, b waiting since %v", st, first, now)
	}
	if len(l.Waiting) != 1 {
		t.Fatalf("line %v, want b once", l.Waiting)
	}
}

func TestAsksWaitInTheOrderTheirRequestsArrived(t *testing.T) {
	var l TurnLine
	now := time.Unix(100, 0)
	l.Take("holder", now, now, TurnLease, TurnClaim)
	l.Take("late", now.Add(-time.Millisecond), now, TurnLease, TurnClaim)
	l.Take("early", now.Add(-time.Second), now, TurnLease, TurnClaim) // asked last, arrived first
	l.Take("tie", now.Add(-time.Millisecond), now, TurnLease, TurnClaim)
	var order []string
	for _, a := range l.Waiting {
		order = append(order, a.Token)
	}
	if want := []string{"early", "late", "tie"}; !slices.Equal(order, want) {
		t.Fatalf("line %v, want %v", order, want)
	}
}

func TestHolderPassedOverCannotHandOnTheNextTurn(t *testing.T) {
	var l TurnLine
	now := time.Unix(0, 0)
	l.Take("late", now, now, TurnLease, TurnClaim)
	l.Take("next", now, now, TurnLease, TurnClaim)
	l.Take("after", now, now, TurnLease, TurnClaim)
	now = now.Add(TurnLease + time.Millisecond)
	if st, _ := l.Claim("next", now, TurnLease, TurnClaim); st != TurnServed {
		t.Fatalf("next after the lease ran out: %v, want served", st)
	}
	if held, _ := l.Renew("late", now, TurnLease); held {
		t.Fatal("the late holder renewed a lease it had lost")
	}
	l.Release("late", now, TurnClaim)
	if st, _ := l.Claim("after", now, TurnLease, TurnClaim); st != TurnWaiting {
		t.Fatalf("after the late holder's release: %v, want still waiting behind next", st)
	}
}

func TestWithdrawnAskIsSkipped(t *testing.T) {
	var l TurnLine
	now := time.Unix(0, 0)
	l.Take("a", now, now, TurnLease, TurnClaim)
	l.Take("gone", now, now, TurnLease, TurnClaim)
	l.Take("c", now, now, TurnLease, TurnClaim)
	l.Release("gone", now, TurnClaim)
	if !l.Release("a", now, TurnClaim) {
		t.Fatal("release of the holder handed on nothing")
	}
	if st, _ := l.Claim("c", now, TurnLease, TurnClaim); st != TurnServed {
		t.Fatalf("ask after a withdrawn one: %v, want served", st)
	}
}

func TestUnclaimedTurnIsPassedOverAndItsAskerAsksAgain(t *testing.T) {
	var l TurnLine
	now := time.Unix(0, 0)
	l.Take("a", now, now, TurnLease, TurnClaim)
	l.Take("slow", now, now, TurnLease, TurnClaim)
	l.Release("a", now, TurnClaim)
	now = now.Add(TurnClaim + time.Millisecond)
	if st, _ := l.Claim("slow", now, TurnLease, TurnClaim); st != TurnPassedOver {
		t.Fatalf("claim after the window: %v, want passed over", st)
	}
	if st, _ := l.Take("slow again", now, now, TurnLease, TurnClaim); st != TurnServed {
		t.Fatalf("new ask: %v, want served (the turn is free)", st)
	}
}

func TestLostLineIsTakenUpAgainByItsHolderOnly(t *testing.T) {
	var l TurnLine // the engine restarted empty
	if st, _ := l.Claim("waiter", time.Unix(0, 0), TurnLease, TurnClaim); st != TurnPassedOver {
		t.Fatalf("unknown asker: %v, want passed over", st)
	}
	if l.Release("old", time.Unix(0, 0), TurnClaim) {
		t.Fatal("release of an unknown token handed on a turn")
	}
	var lost TurnLine
	if held, _ := lost.Renew("holder", time.Unix(0, 0), TurnLease); !held {
		t.Fatal("the holder's renewal did not take up its lost line")
	}
	if st, _ := lost.Take("other", time.Unix(0, 0), time.Unix(0, 0), TurnLease, TurnClaim); st != TurnWaiting {
		t.Fatalf("another ask on the line taken up again: %v, want waiting", st)
	}
	freed := TurnLine{}
	freed.Take("a", time.Unix(0, 0), time.Unix(0, 0), TurnLease, TurnClaim)
	freed.Release("a", time.Unix(1, 0), TurnClaim)
	if held, _ := freed.Renew("a", time.Unix(1, 0), TurnLease); held {
		t.Fatal("a late renewal took up a line its holder had released")
	}
}

func TestEngineDownLetsTheRequestGoInThisInstancesOrder(t *testing.T) {
	tabs, turns, _ := newCluster(t, 1, true)
	openSession(t, turns, "s")
	turns.setFail(errStoreDown)
	r := mustGet(t, acquireAsync(t, tabs[0], bg, "s", 0))
	if r.err != nil || r.turn.grant != nil {
		t.Fatalf("err=%v grant=%v, want a turn here only", r.err, r.turn.grant)
	}
	queued := acquireAsync(t, tabs[0], bg, "s", 0)
	mustWait(t, queued) // this instance's order still holds
	r.turn.Done(200)
	mustGet(t, queued).turn.Done(200)
}

func TestClusterTurnWaitEndsAtQueueTimeoutAndWithdrawsTheAsk(t *testing.T) {
	tabs, turns, clock := newCluster(t, 2, true)
	openSession(t, turns, "s")
	long := mustGet(t, acquireAsync(t, tabs[0], bg, "s", 0))
	gaveUp := acquireInBackground(tabs[1], "s")
	eventually(t, func() bool { return turns.countOf("take", "s") == 2 })
	for range 40 {
		clock.Advance(Defaults().QueueTimeout / 20) // renewals keep the long turn
		if len(gaveUp) > 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if r := mustGet(t, gaveUp); !errors.Is(r.err, ErrQueueTimeout) {
		t.Fatalf("err = %v, want ErrQueueTimeout", r.err)
	}
	eventually(t, func() bool { return len(turns.line("s").Waiting) == 0 })
	long.turn.Done(200)
}

func TestRepliesAreNotOrderedAcrossInstances(t *testing.T) {
	tabs, turns, _ := newCluster(t, 2, true)
	openSession(t, turns, "s")
	stream := mustGet(t, acquireAsync(t, tabs[0], bg, "s", 0))
	reply := mustGet(t, acquireAsync(t, tabs[1], bg, "s", RepliesOnly))
	if reply.err != nil || reply.turn.grant != nil {
		t.Fatalf("reply: err=%v grant=%v, want a turn without the cluster turn", reply.err, reply.turn.grant)
	}
	reply.turn.Done(202)
	stream.turn.Done(200)
}

func TestRepliesOvertakeARequestWaitingForItsClusterTurn(t *testing.T) {
	tabs, turns, _ := newCluster(t, 2, true)
	openSession(t, turns, "s")
	// A plain JSON exchange holds the cluster turn on A; on B a request
	// waits for it in B's slot, and then the reply A's exchange needs
	// reaches B.
	sampling := mustGet(t, acquireAsync(t, tabs[0], bg, "s", 0))
	waiting := acquireInBackground(tabs[1], "s")
	eventually(t, func() bool { return len(turns.line("s").Waiting) == 1 })
	reply := mustGet(t, acquireAsync(t, tabs[1], bg, "s", RepliesOnly))
	if reply.err != nil || !reply.turn.Overtook() {
		t.Fatalf("reply: err=%v overtook=%v, want it to go at once", reply.err, reply.turn.Overtook())
	}
	reply.turn.Done(202)
	sampling.turn.Done(200)
	mustGet(t, waiting).turn.Done(200)
}

// Every reply waiting when a request starts asking for its cluster turn
// overtakes it, not only the first: the exchange holding the turn on
// another instance may wait for any of them.
func TestEveryWaitingReplyOvertakesARequestThatStartsAskingForItsTurn(t *testing.T) {
	tabs, turns, clock := newCluster(t, 2, true)
	openSession(t, turns, "s")
	a, b := tabs[0], tabs[1]
	// B holds the turn with a plain exchange, and A asks for it. Behind
	// B's exchange wait a request that came after A's ask, and then two
	// replies, which cannot overtake a plain exchange.
	first := mustGet(t, acquireAsync(t, b, bg, "s", 0))
	sampling := acquireInBackground(a, "s")
	eventually(t, func() bool { return heardAsk(b, "s") })
	clock.Advance(time.Millisecond)
	next := acquireAsync(t, b, bg, "s", 0)
	replies := []<-chan result{acquireAsync(t, b, bg, "s", RepliesOnly), acquireAsync(t, b, bg, "s", RepliesOnly)}
	// B's exchange ends and hands the turn to A; B's next request takes
	// B's slot and asks after A.
	first.turn.Done(200)
	held := resultWithinBackoffs(t, clock, sampling, "A's request did not get the turn B handed on")
	if held.err != nil {
		t.Fatal(held.err)
	}
	// Both go at once, neither waiting for the other to end.
	var ended []Turn
	for i, ch := range replies {
		r := mustGet(t, ch)
		if r.err != nil || !r.turn.Overtook() {
			t.Fatalf("reply %d: err=%v overtook=%v, want it to go while the request before it asks", i+1, r.err, r.turn.Overtook())
		}
		ended = append(ended, r.turn)
	}
	for _, turn := range ended {
		turn.Done(202)
	}
	held.turn.Done(200)
	mustGet(t, next).turn.Done(200)
}

func TestWithoutAnnouncementsTheTurnIsHandedOnAfterEveryExchange(t *testing.T) {
	tabs, turns, _ := newCluster(t, 1, false)
	openSession(t, turns, "s")
	for range 3 {
		mustGet(t, acquireAsync(t, tabs[0], bg, "s", 0)).turn.Done(200)
	}
	if takes, releases := turns.countOf("take", "s"), turns.countOf("release", "s"); takes != 3 || releases != 3 {
		t.Fatalf("%d asks and %d releases for 3 requests, want 3 and 3: a holder that cannot hear an ask keeps no turn", takes, releases)
	}
}

func TestClusterTurnsNeedAStoreTimeoutThatLeavesRoomToRenew(t *testing.T) {
	cfg := Defaults()
	turns := newMemTurns(newFakeClock(), true)
	cfg.Store, cfg.Turns = turns, turns
	cfg.StoreTimeout = MaxTurnStoreTimeout + time.Millisecond
	if err := cfg.Validate(); err == nil {
		t.Fatalf("store timeout %s with cluster turns accepted", cfg.StoreTimeout)
	}
	cfg.StoreTimeout = MaxTurnStoreTimeout
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestGateOpenedElsewhereReleasesHeldRequestsWhenAnnounced(t *testing.T) {
	tabs, turns, _ := newCluster(t, 3, true)
	creator, held, acker := tabs[0], tabs[1], tabs[2]
	initialize, _ := creator.Begin("s", nil)
	initialize.Done(200)
	eventually(t, func() bool { rec, _ := turns.record("s"); return !rec.InitializeInFlight })

	setLevel := acquireAsync(t, held, bg, "s", 0)                      // round robin: one here,
	toolsList := acquireAsync(t, creator, bg, "s", 0)                  // one on the creator,
	initialized := acquireAsync(t, acker, bg, "s", CarriesInitialized) // the ack on a third
	mustWait(t, setLevel)
	mustWait(t, toolsList)
	mustGet(t, initialized).turn.Done(202)
	// No clock moves: the announcement of Opened wakes both gates, and
	// the two then go one at a time, in whichever order they asked.
	for range 2 {
		var r result
		select {
		case r = <-setLevel:
		case r = <-toolsList:
		case <-time.After(5 * time.Second):
			t.Fatal("held requests still held after the gate opened elsewhere")
		}
		if r.err != nil {
			t.Fatal(r.err)
		}
		r.turn.Done(200)
	}
}

func TestGateOpenedElsewhereReleasesHeldRequestsWithinABackoff(t *testing.T) {
	tabs, turns, clock := newCluster(t, 2, false) // nothing announced
	store := turns.fakeStore
	creator, acker := tabs[0], tabs[1]
	initialize, _ := creator.Begin("s", nil)
	initialize.Done(200)
	eventually(t, func() bool { rec, _ := store.record("s"); return !rec.InitializeInFlight })
	toolsList := acquireAsync(t, creator, bg, "s", 0)
	mustGet(t, acquireAsync(t, acker, bg, "s", CarriesInitialized)).turn.Done(202)
	eventually(t, func() bool { rec, _ := store.record("s"); return rec.Open })
	mustWait(t, toolsList)
	r := resultWithinBackoffs(t, clock, toolsList, "the held request stayed held after the record opened (init_timeout would have released it)")
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.turn.Done(200)
	if n := store.count("Lookup"); n > 10 {
		t.Fatalf("%d lookups for one held request", n)
	}
}

func TestHeldRequestCostsNoReadWithoutClusterTurns(t *testing.T) {
	store := newFakeStore() // a hashing front: order on each instance
	tabs, clock := newInstances(t, 2, store, nil)
	initialize, _ := tabs[0].Begin("s", nil)
	initialize.Done(200)
	eventually(t, func() bool { rec, _ := store.record("s"); return !rec.InitializeInFlight })
	setLevel := acquireAsync(t, tabs[1], bg, "s", 0)
	eventually(t, func() bool { return adoptionDone(tabs[1], "s") })
	lookups := store.count("Lookup") // the first sight's
	initialized := mustGet(t, acquireAsync(t, tabs[1], bg, "s", CarriesInitialized))
	for range 5 {
		clock.Advance(remoteMaxBackoff)
	}
	mustWait(t, setLevel)
	initialized.turn.Done(202)
	mustGet(t, setLevel).turn.Done(200)
	if n := store.count("Lookup"); n != lookups {
		t.Fatalf("%d lookups while the request was held, want none", n-lookups)
	}
}

func TestReconfiguringWhileAnAnnouncementIsDeliveredDoesNotDeadlock(t *testing.T) {
	tabs, turns, _ := newCluster(t, 1, true)
	tab := tabs[0]
	blocking := &blockingWatcher{memTurns: turns, delivering: make(chan struct{})}
	cfg := *tab.config()
	cfg.Store, cfg.Turns, cfg.Watcher = blocking, blocking, blocking
	tab.Configure(cfg)
	go blocking.deliver(StoreKey("s"))
	<-blocking.delivering
	done := make(chan struct{})
	go func() {
		other := newMemTurns(newFakeClock(), true) // a reload's new store
		cfg.Store, cfg.Turns, cfg.Watcher = other, other, other
		tab.Configure(cfg)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Configure did not return while an announcement was being delivered")
	}
}

// blockingWatcher delivers one announcement that waits for the table's
// watch lock, as a subscription goroutine would.
type blockingWatcher struct {
	*memTurns
	delivering chan struct{}
	mu         sync.Mutex
	changed    func(string, string, time.Duration)
	stopped    chan struct{}
}

func (b *blockingWatcher) Watch(changed func(string, string, time.Duration)) func() {
	b.mu.Lock()
	b.changed = changed
	b.stopped = make(chan struct{})
	b.mu.Unlock()
	return func() { <-b.stopped } // waits for the delivery in progress
}

func (b *blockingWatcher) deliver(key string) {
	b.mu.Lock()
	changed, stopped := b.changed, b.stopped
	b.mu.Unlock()
	close(b.delivering)
	time.Sleep(10 * time.Millisecond) // let Configure start stopping the watch
	changed(key, "", 0)
	close(stopped)
}

func TestHeldRequestGoesWhenTheRecordIsLost(t *testing.T) {
	tabs, turns, clock := newCluster(t, 1, false)
	turns.put("s", Record{InitDeadline: clock.Now().Add(time.Hour)}) // created elsewhere
	held := acquireAsync(t, tabs[0], bg, "s", 0)
	eventually(t, func() bool { return adoptionDone(tabs[0], "s") })
	mustWait(t, held)
	turns.mu.Lock()
	turns.fakeStore.mu.Lock()
	delete(turns.fakeStore.records, "s") // Redis restarted without its data
	turns.fakeStore.mu.Unlock()
	turns.mu.Unlock()
	r := resultWithinBackoffs(t, clock, held, "the request stayed held after the record was lost (until init_timeout)")
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.turn.Done(200)
}

// waitEvents records the waits the table reports.
type waitEvents struct {
	noEvents
	mu    sync.Mutex
	waits []time.Duration
}

func (e *waitEvents) Waited(d time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.waits = append(e.waits, d)
}

func TestReportedWaitIncludesTheClusterTurn(t *testing.T) {
	clock := newFakeClock()
	turns := newMemTurns(clock, true)
	events := &waitEvents{}
	var tabs []*Table
	for range 2 {
		cfg := Defaults()
		cfg.Clock, cfg.Store, cfg.Turns, cfg.Watcher, cfg.Events = clock, turns, turns, turns, events
		tab := NewTable(cfg)
		t.Cleanup(tab.Close)
		tabs = append(tabs, tab)
	}
	openSession(t, turns, "s")
	first := mustGet(t, acquireAsync(t, tabs[0], bg, "s", 0))
	second := acquireInBackground(tabs[1], "s")
	eventually(t, func() bool { return turns.countOf("take", "s") == 2 })
	for range 6 { // renewals keep the first turn
		clock.Advance(500 * time.Millisecond)
		time.Sleep(time.Millisecond)
	}
	first.turn.Done(200)
	mustGet(t, second).turn.Done(200)
	events.mu.Lock()
	defer events.mu.Unlock()
	if len(events.waits) != 2 || events.waits[1] < 3*time.Second {
		t.Fatalf("reported waits %v, want two, the second at least the 3s it waited for the other instance", events.waits)
	}
}

// acquireInBackground starts an Acquire of id on tab and returns where its
// result will come: a request that may wait for another instance, which
// this table's queue does not show.
func acquireInBackground(tab *Table, id string) <-chan result {
	ch := make(chan result, 1)
	go func() {
		turn, err := tab.Acquire(bg, id, 0)
		ch <- result{turn, err}
	}()
	return ch
}

// heardAsk reports whether tab, holding id's cluster turn, has heard
// another instance ask for it: the requests that reach tab from then on
// go after the asker's.
func heardAsk(tab *Table, id string) bool {
	s, ok := tracked(tab, id)
	if !ok {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.clusterGrant != nil && !s.clusterGrant.wantedAt.IsZero()
}

// resultWithinBackoffs moves the clock on by remoteMaxBackoff until ch has
// a result, failing with why after ten backoffs.
func resultWithinBackoffs(t *testing.T, clock *fakeClock, ch <-chan result, why string) result {
	t.Helper()
	for range 10 {
		clock.Advance(remoteMaxBackoff)
		select {
		case r := <-ch:
			return r
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatal(why)
	return result{}
}

func TestKeyedRequestsTakeClusterTurnsAcrossInstances(t *testing.T) {
	tabs, turns, _ := newCluster(t, 2, true)
	first, err := tabs[0].AcquireKeyed(bg, "key cart", 0)
	if err != nil {
		t.Fatal(err)
	}
	second := make(chan result, 1)
	go func() {
		turn, err := tabs[1].AcquireKeyed(bg, "key cart", 0)
		second <- result{turn, err}
	}()
	eventually(t, func() bool { return turns.countOf("take", "key cart") == 2 })
	mustWait(t, second)
	first.Done(200)
	r := mustGet(t, second)
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.turn.Done(200)
	if n := turns.count("Lookup"); n != 0 {
		t.Fatalf("%d lookups for a key, want none", n)
	}
}

func TestTurnHeldOnAnEngineAReloadReplacedIsNotUsed(t *testing.T) {
	tabs, turns, clock := newCluster(t, 1, true)
	tab := tabs[0]
	openSession(t, turns, "s")
	mustGet(t, acquireAsync(t, tab, bg, "s", 0)).turn.Done(200) // holds the turn on turns
	other := newMemTurns(clock, true)
	openSession(t, other, "s")
	cfg := *tab.config()
	cfg.Store, cfg.Turns, cfg.Watcher = other, other, other
	tab.Configure(cfg)
	r := mustGet(t, acquireAsync(t, tab, bg, "s", 0))
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.turn.Done(200)
	if n := other.countOf("take", "s"); n != 1 {
		t.Fatalf("%d asks on the new engine, want 1: the turn held on the old one counts for nothing there", n)
	}
}

func TestClosingTableHandsOnTheTurnsItHolds(t *testing.T) {
	tabs, turns, _ := newCluster(t, 1, true)
	openSession(t, turns, "s")
	mustGet(t, acquireAsync(t, tabs[0], bg, "s", 0)).turn.Done(200)
	if h := turns.line("s").Holder; h == "" {
		t.Fatal("the table does not hold the session's turn")
	}
	tabs[0].Close() // the instance stops
	if h := turns.line("s").Holder; h != "" {
		t.Fatalf("after Close the turn is still held by %q", h)
	}
}

// endClusterTurn waits for ch's turn, which must hold the cluster turn,
// and ends it.
func endClusterTurn(t *testing.T, ch <-chan result) {
	t.Helper()
	r := mustGet(t, ch)
	if r.err != nil || r.turn.grant == nil {
		t.Fatalf("err=%v grant=%v, want the cluster turn", r.err, r.turn.grant)
	}
	r.turn.Done(200)
}
