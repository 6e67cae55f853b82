package serializer

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// memTurns is a TurnStore (and, with announce set, a Watcher) on
// TicketLines, on the tests' fake clock.
type memTurns struct {
	*fakeStore
	clock *fakeClock

	mu       sync.Mutex
	lines    map[string]*TicketLine
	taken    map[string]int64 // tickets taken per session
	fail     error
	announce bool
	watchers map[int]func(string)
	nextW    int
}

func newMemTurns(clock *fakeClock, announce bool) *memTurns {
	return &memTurns{fakeStore: newFakeStore(), clock: clock, lines: map[string]*TicketLine{}, taken: map[string]int64{}, announce: announce, watchers: map[int]func(string){}}
}

func (m *memTurns) line(id string) (*TicketLine, error) {
	if m.fail != nil {
		return nil, m.fail
	}
	l := m.lines[id]
	if l == nil {
		l = &TicketLine{}
		m.lines[id] = l
	}
	return l, nil
}

func (m *memTurns) TakeTicket(_ context.Context, id string, lease, claim time.Duration) (int64, TicketState, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, err := m.line(id)
	if err != nil {
		return 0, 0, err
	}
	n, st := l.Take(m.clock.Now(), lease, claim)
	m.taken[id]++
	return n, st, nil
}

func (m *memTurns) ClaimTicket(_ context.Context, id string, ticket int64, lease, claim time.Duration) (TicketState, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, err := m.line(id)
	if err != nil {
		return 0, err
	}
	return l.Claim(ticket, m.clock.Now(), lease, claim), nil
}

func (m *memTurns) RenewTicket(_ context.Context, id string, ticket int64, lease time.Duration) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, err := m.line(id)
	if err != nil {
		return false, err
	}
	return l.Renew(ticket, m.clock.Now(), lease), nil
}

func (m *memTurns) ReleaseTicket(_ context.Context, id string, ticket int64, claim time.Duration) error {
	m.mu.Lock()
	l, err := m.line(id)
	if err != nil {
		m.mu.Unlock()
		return err
	}
	handedOn := l.Release(ticket, m.clock.Now(), claim)
	m.mu.Unlock()
	if handedOn {
		m.changed(id)
	}
	return nil
}

func (m *memTurns) Opened(ctx context.Context, id string) error {
	err := m.fakeStore.Opened(ctx, id)
	if err == nil {
		m.changed(id)
	}
	return err
}

func (m *memTurns) changed(id string) {
	m.mu.Lock()
	var ws []func(string)
	if m.announce {
		for _, w := range m.watchers {
			ws = append(ws, w)
		}
	}
	m.mu.Unlock()
	for _, w := range ws {
		w(StoreKey(id))
	}
}

func (m *memTurns) Watch(changed func(string)) func() {
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

func (m *memTurns) setFail(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.fail = err
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
		cfg.Store = turns
		cfg.Turns = turns
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

func TestClusterTurnsGoInTheOrderTaken(t *testing.T) {
	tabs, turns, _ := newCluster(t, 3, true)
	openSession(t, turns, "s")
	first := mustGet(t, acquireAsync(t, tabs[0], bg, "s", 0))
	var order []int
	var mu sync.Mutex
	done := make(chan struct{}, 2)
	for _, i := range []int{1, 2} {
		before := ticketsTaken(turns, "s")
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
		eventually(t, func() bool { return ticketsTaken(turns, "s") > before })
	}
	first.turn.Done(200)
	<-done
	<-done
	if order[0] != 1 || order[1] != 2 {
		t.Fatalf("served in the order %v, want [1 2] (the order the tickets were taken)", order)
	}
}

func ticketsTaken(m *memTurns, id string) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.taken[id]
}

func TestDeadInstancesTurnIsPassedOverWhenItsLeaseRunsOut(t *testing.T) {
	tabs, turns, clock := newCluster(t, 1, true)
	openSession(t, turns, "s")
	// An instance took the turn, then died: nobody renews its lease.
	if _, st, _ := turns.TakeTicket(bg, "s", TurnLease, TurnClaim); st != TicketServed {
		t.Fatalf("first ticket: %v, want served", st)
	}
	waiting := acquireInBackground(tabs[0], "s")
	eventually(t, func() bool { return ticketsTaken(turns, "s") == 2 })
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
	waiting := acquireInBackground(tabs[1], "s")
	eventually(t, func() bool { return ticketsTaken(turns, "s") == 2 })
	for range 12 { // four leases
		clock.Advance(TurnLease / 6)
	}
	mustWait(t, waiting)
	long.turn.Done(200)
	mustGet(t, waiting).turn.Done(200)
}

func TestHolderPassedOverCannotHandOnTheNextTurn(t *testing.T) {
	var l TicketLine
	now := time.Unix(0, 0)
	late, _ := l.Take(now, TurnLease, TurnClaim)
	next, _ := l.Take(now, TurnLease, TurnClaim)
	after, _ := l.Take(now, TurnLease, TurnClaim)
	now = now.Add(TurnLease + time.Millisecond)
	if st := l.Claim(next, now, TurnLease, TurnClaim); st != TicketServed {
		t.Fatalf("next after the lease ran out: %v, want served", st)
	}
	if l.Renew(late, now, TurnLease) {
		t.Fatal("the late holder renewed a lease it had lost")
	}
	l.Release(late, now, TurnClaim)
	if st := l.Claim(after, now, TurnLease, TurnClaim); st != TicketWaiting {
		t.Fatalf("after the late holder's release: %v, want still waiting behind next", st)
	}
}

func TestWithdrawnTicketIsSkipped(t *testing.T) {
	var l TicketLine
	now := time.Unix(0, 0)
	a, _ := l.Take(now, TurnLease, TurnClaim)
	gone, _ := l.Take(now, TurnLease, TurnClaim)
	c, _ := l.Take(now, TurnLease, TurnClaim)
	l.Release(gone, now, TurnClaim)
	if !l.Release(a, now, TurnClaim) {
		t.Fatal("release of the served ticket handed on nothing")
	}
	if st := l.Claim(c, now, TurnLease, TurnClaim); st != TicketServed {
		t.Fatalf("ticket after a withdrawn one: %v, want served", st)
	}
	if len(l.Withdrawn) != 0 {
		t.Fatalf("withdrawn marks left behind: %v", l.Withdrawn)
	}
}

func TestUnclaimedTurnIsPassedOverAndItsWaiterTakesANewTicket(t *testing.T) {
	var l TicketLine
	now := time.Unix(0, 0)
	a, _ := l.Take(now, TurnLease, TurnClaim)
	slow, _ := l.Take(now, TurnLease, TurnClaim)
	l.Release(a, now, TurnClaim)
	now = now.Add(TurnClaim + time.Millisecond)
	if st := l.Claim(slow, now, TurnLease, TurnClaim); st != TicketPassedOver {
		t.Fatalf("claim after the window: %v, want passed over", st)
	}
	if n, st := l.Take(now, TurnLease, TurnClaim); st != TicketServed {
		t.Fatalf("new ticket %d: %v, want served (the turn is free)", n, st)
	}
}

func TestLostLineMakesWaitersTakeNewTickets(t *testing.T) {
	var l TicketLine // the engine restarted empty
	if st := l.Claim(7, time.Unix(0, 0), TurnLease, TurnClaim); st != TicketPassedOver {
		t.Fatalf("unknown ticket: %v, want passed over", st)
	}
	if l.Release(5, time.Unix(0, 0), TurnClaim) {
		t.Fatal("release of an unknown ticket handed on a turn")
	}
}

func TestEngineDownLetsTheRequestGoInThisInstancesOrder(t *testing.T) {
	tabs, turns, _ := newCluster(t, 1, true)
	openSession(t, turns, "s")
	turns.setFail(errStoreDown)
	r := mustGet(t, acquireAsync(t, tabs[0], bg, "s", 0))
	if r.err != nil || r.turn.cluster != nil {
		t.Fatalf("err=%v cluster=%v, want a turn here only", r.err, r.turn.cluster)
	}
	queued := acquireAsync(t, tabs[0], bg, "s", 0)
	mustWait(t, queued) // this instance's order still holds
	r.turn.Done(200)
	mustGet(t, queued).turn.Done(200)
}

func TestClusterTurnWaitEndsAtQueueTimeoutAndWithdrawsTheTicket(t *testing.T) {
	tabs, turns, clock := newCluster(t, 2, true)
	openSession(t, turns, "s")
	long := mustGet(t, acquireAsync(t, tabs[0], bg, "s", 0))
	gaveUp := acquireInBackground(tabs[1], "s")
	eventually(t, func() bool { return ticketsTaken(turns, "s") == 2 })
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
	next := acquireInBackground(tabs[1], "s")
	eventually(t, func() bool { return ticketsTaken(turns, "s") == 3 })
	long.turn.Done(200)
	r := mustGet(t, next) // not held behind the withdrawn ticket
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.turn.Done(200)
}

func TestRepliesAreNotOrderedAcrossInstances(t *testing.T) {
	tabs, turns, _ := newCluster(t, 2, true)
	openSession(t, turns, "s")
	stream := mustGet(t, acquireAsync(t, tabs[0], bg, "s", 0))
	reply := mustGet(t, acquireAsync(t, tabs[1], bg, "s", RepliesOnly))
	if reply.err != nil || reply.turn.cluster != nil {
		t.Fatalf("reply: err=%v cluster=%v, want a turn without a ticket", reply.err, reply.turn.cluster)
	}
	reply.turn.Done(202)
	stream.turn.Done(200)
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
	// the two then go one at a time, in whichever order they took tickets.
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
	cfg.Store, cfg.Turns = blocking, blocking
	tab.Configure(cfg)
	go blocking.deliver(StoreKey("s"))
	<-blocking.delivering
	done := make(chan struct{})
	go func() {
		other := newMemTurns(newFakeClock(), true) // a reload's new store
		cfg.Store, cfg.Turns = other, other
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
	changed    func(string)
	stopped    chan struct{}
}

func (b *blockingWatcher) Watch(changed func(string)) func() {
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
	changed(key)
	close(stopped)
}

func TestLineStartedAgainNeverGivesOutAnOldTicketsNumber(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	var old TicketLine
	served, _ := old.Take(now, TurnLease, TurnClaim)
	waiting, _ := old.Take(now, TurnLease, TurnClaim)
	var fresh TicketLine // the engine restarted empty a moment later
	later := now.Add(50 * time.Millisecond)
	for range 3 {
		n, _ := fresh.Take(later, TurnLease, TurnClaim)
		if n == served || n == waiting {
			t.Fatalf("the new line gave out %d, a number the old line's tickets hold", n)
		}
	}
	if st := fresh.Claim(waiting, later, TurnLease, TurnClaim); st != TicketPassedOver {
		t.Fatalf("old waiting ticket on the new line: %v, want passed over", st)
	}
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
		cfg.Clock, cfg.Store, cfg.Turns, cfg.Events = clock, turns, turns, events
		tab := NewTable(cfg)
		t.Cleanup(tab.Close)
		tabs = append(tabs, tab)
	}
	openSession(t, turns, "s")
	first := mustGet(t, acquireAsync(t, tabs[0], bg, "s", 0))
	second := acquireInBackground(tabs[1], "s")
	eventually(t, func() bool { return ticketsTaken(turns, "s") == 2 })
	clock.Advance(3 * time.Second) // renewals keep the first turn
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
	eventually(t, func() bool { return ticketsTaken(turns, "key cart") == 2 })
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
