package serializer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Cluster turns: one session's requests upstream one at a time across
// instances, for fronts that spread a session's requests over them (round
// robin). Config.Turns turns them on.
//
// The rules, whatever the engine:
//   - A request first gets its turn here, as always (queue, gate, streams).
//     Then it needs the session's cluster turn. An instance that holds it
//     keeps it from one exchange to the next (a grant), so that behind a
//     front that keeps a session on one instance its requests cost no
//     engine call. An instance that does not hold it asks the engine,
//     under a token it never uses again, and waits in line.
//   - Asking is announced. The holder hears it, lets the requests that
//     reached it before it heard go first, and then hands the turn on
//     when its exchange ends (at once if none is running); its later
//     requests ask again, behind the asker. Two requests that reach
//     different instances within an announcement's delivery time (about a
//     millisecond) may therefore swap; any further apart go in arrival
//     order.
//   - A holder has a lease (TurnLease) on the engine's clock, renewed every
//     TurnLease/3 while an exchange runs; an idle grant is not renewed and
//     lapses. A holder that cannot renew, or learns it lost the turn,
//     stops its exchange TurnMargin before the lease may lapse as seen
//     from here (from the time the renewal was sent), so that no two
//     exchanges of a session run at once. A holder whose instance died
//     is passed over when its lease runs out.
//   - A turn handed on must be claimed within TurnClaim, or it is passed
//     over (the asker's instance died while it waited); a live asker
//     passed over asks again.
//   - Fencing: every call names its token, and does nothing unless that
//     token holds the turn (or waits for it), so a late holder never hands
//     on another's turn. A call whose answer was lost can be sent again:
//     asking twice with one token queues it once, and a request that
//     does not know whether its ask arrived withdraws it.
//   - Announcements only speed things up. While the engine cannot
//     announce (an ACL denies the channel), a grant is handed on at the
//     end of every exchange and askers read the line with a backoff.
//   - Not ordered across instances: the initialize exchange (nobody else
//     knows the session yet) and messages that carry only replies or
//     cancellations (the exchange they answer may be the one holding the
//     turn, streaming on another instance); these also overtake a request
//     here that waits for its cluster turn.
//   - The engine failing (an error, or no answer within StoreTimeout) lets
//     the request go with its turn here only: today's order on one
//     instance, never a stuck request. Every wait ends by QueueTimeout.

// TurnLease and TurnClaim bound how long a dead instance holds up a
// session's requests on the others: a turn it held, and a turn that came
// to a request it held waiting. A holder stops its exchange TurnMargin
// before its lease may lapse; an engine call may take at most
// MaxTurnStoreTimeout, which leaves a holder time to try its renewal
// twice before then.
const (
	TurnLease           = 5 * time.Second
	TurnClaim           = 1 * time.Second
	TurnMargin          = TurnLease / 5
	MaxTurnStoreTimeout = TurnLease / 5
)

// TurnLineTTL is how long an engine keeps a session's TurnLine after its
// last change: every live holder or asker changes it more often than that,
// and a line left alone is free, as is no line.
const TurnLineTTL = 3 * TurnLease

const (
	turnRenewEvery = TurnLease / 3
	turnRetryEvery = TurnLease / 20 // after a failed renewal
	// turnNudgeEvery spaces an asker's repeated announcements, for a
	// holder that missed the first.
	turnNudgeEvery = 500 * time.Millisecond
	// turnReleaseTries bounds the attempts at handing a turn on or
	// withdrawing an ask whose answers were lost.
	turnReleaseTries = 3
)

// TurnState is what the engine says of a token.
type TurnState uint8

const (
	TurnWaiting    TurnState = iota // others hold the turn or are ahead in line
	TurnServed                      // the token holds the turn: its lease runs from now
	TurnPassedOver                  // the line does not know it (passed over, or lost): ask again
)

// TurnStore keeps the cluster turns of sessions, by session id. Like a
// Store, it must key them by a hash of the id, honour its context and
// return within its own bound. Its answers are TurnLine's, with times as
// durations so that no two clocks need agree: age is how long ago the
// asking request reached its instance; behind, for a token that holds the
// turn, how long before the answer the first request waiting behind it
// arrived (NobodyWaiting if none). With a Watcher, the engine announces
// an ask (TakeTurn answered TurnWaiting, or ClaimTurn with nudge still
// waiting) with the asker's token and age, and a hand-on, to every
// instance.
type TurnStore interface {
	TakeTurn(ctx context.Context, id, token string, age, lease, claim time.Duration) (state TurnState, behind time.Duration, err error)
	ClaimTurn(ctx context.Context, id, token string, age, lease, claim time.Duration, nudge bool) (state TurnState, behind time.Duration, err error)
	RenewTurn(ctx context.Context, id, token string, lease time.Duration) (held bool, behind time.Duration, err error)
	ReleaseTurn(ctx context.Context, id, token string, claim time.Duration) error
}

// NobodyWaiting is a TurnStore's behind when no request waits.
const NobodyWaiting time.Duration = -1

// errPassedOver is internal: an ask was passed over.
var errPassedOver = errors.New("passed over")

// turnGrant is this instance's hold on a session's cluster turn, kept
// from one exchange to the next. Guarded by the session's mu.
type turnGrant struct {
	store TurnStore
	token string
	// renewed is when the call that last started or extended the lease
	// was sent, and deadline that plus TurnLease: the engine started the
	// lease later, so it lapses no earlier.
	renewed, deadline time.Time
	// wantedAt is when the first request waiting for the turn elsewhere
	// arrived, as this instance reckons it (when it heard, less how long
	// before that the request came): requests that reached this instance
	// since go after that one.
	wantedAt time.Time
	inUse    bool   // an exchange holds it
	stop     func() // stops that exchange (Turn.StopOnLapse)
	lost     bool   // its lease lapsed, or the engine gave the turn to another
	ticking  bool   // a renewal is scheduled
	unwatch  func() // ends the session's registration for announcements
}

// turnTokens makes the tokens an instance asks under: a random prefix of
// its own and a count, so no token is ever used twice, here or elsewhere.
type turnTokens struct {
	prefix string
	n      atomic.Uint64
}

func (k *turnTokens) next() string {
	if k.prefix == "" {
		panic("turnTokens used before newTurnTokens")
	}
	return k.prefix + strconv.FormatUint(k.n.Add(1), 36)
}

func newTurnTokens() turnTokens {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return turnTokens{prefix: hex.EncodeToString(b[:]) + "."}
}

// ordersAcrossInstances reports whether a request with these traits needs
// the cluster turn.
func ordersAcrossInstances(traits Traits) bool { return !traits.Has(RepliesOnly) }

// clusterTurn gives the request holding s's slot the session's cluster
// turn, if the table has turns: the grant this instance holds, if the
// request may use it, or one asked for. arrival is when the request
// reached this instance, waited how long it has waited here. It returns
// nil if the request goes without one (the engine failed).
func (s *Session) clusterTurn(ctx context.Context, traits Traits, arrival time.Time, waited time.Duration) (*turnGrant, error) {
	t := s.table
	cfg := t.config()
	if cfg.Turns == nil || !ordersAcrossInstances(traits) {
		return nil, nil
	}
	s.mu.Lock()
	if g := s.clusterGrant; g != nil {
		if g.store == cfg.Turns && g.usableBy(arrival, t.clock.Now()) { // a reload may have moved the turns
			s.useGrant(g)
			s.mu.Unlock()
			return g, nil
		}
		s.clusterGrant = nil // lapsing, asked for before this request came, or on another engine
		go s.releaseGrant(g)
	}
	s.wantHeard = time.Time{}
	s.turnAskBegan() // replies may overtake a request that waits for its turn
	s.mu.Unlock()

	// Listening from before the ask until the grant is given up, without a
	// gap: an ask announced just after the engine served this one would
	// otherwise be missed, and its asker would wait for its next nudge.
	unwatch := t.awaitRemote(s)
	deadline := t.clock.Now().Add(cfg.QueueTimeout - waited)
	g, err := s.askTurn(ctx, cfg, arrival, deadline)
	for errors.Is(err, errPassedOver) {
		g, err = s.askTurn(ctx, cfg, arrival, deadline)
	}
	s.mu.Lock()
	s.askToken = ""
	s.turnAskEnded()
	if g != nil {
		// An ask heard while it waited may have come after the engine's
		// answer: requests here since then go after it. (One from ahead
		// in line, served already, costs a hand-on too soon, not order.)
		if !s.wantHeard.IsZero() {
			g.askedFor(s.wantHeard)
		}
		g.unwatch, unwatch = unwatch, nil // to hear the next ask
		s.clusterGrant = g
		s.useGrant(g)
	}
	s.mu.Unlock()
	if unwatch != nil {
		unwatch()
	}
	return g, err
}

// askTurn asks the engine for the cluster turn for a request that arrived
// at arrival, and waits until it is served. The caller listens for
// announcements throughout (awaitRemote), so that a hand-on announced
// between the answer and the wait is not missed.
func (s *Session) askTurn(ctx context.Context, cfg *Config, arrival, deadline time.Time) (*turnGrant, error) {
	t := s.table
	store := cfg.Turns
	call := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), cfg.StoreTimeout)
	}
	token := t.tokens.next()
	s.mu.Lock()
	s.askToken = token
	changed := s.remoteChange()
	s.mu.Unlock()
	withdraw := func() { go releaseTurn(store, s.id, token, cfg.StoreTimeout) }

	sent := t.clock.Now()
	cctx, cancel := call()
	state, behind, err := store.TakeTurn(cctx, s.id, token, sent.Sub(arrival), TurnLease, TurnClaim)
	cancel()
	if err != nil {
		withdraw() // the ask may have arrived though its answer did not
		return nil, nil
	}
	backoff, nudged := remoteFirstBackoff, sent
	for {
		switch state {
		case TurnServed:
			g := &turnGrant{store: store, token: token, renewed: sent, deadline: sent.Add(TurnLease)}
			if behind >= 0 {
				g.askedFor(t.clock.Now().Add(-behind))
			}
			return g, nil
		case TurnPassedOver:
			return nil, errPassedOver
		}
		left := deadline.Sub(t.clock.Now())
		if left <= 0 || !t.pause(changed, ctx.Done(), min(backoff, left)) {
			withdraw()
			return nil, ErrQueueTimeout
		}
		if err := ctx.Err(); err != nil {
			withdraw()
			return nil, err
		}
		backoff = min(2*backoff, remoteMaxBackoff)
		changed = s.nextRemoteChange()
		sent = t.clock.Now()
		nudge := sent.Sub(nudged) >= turnNudgeEvery
		if nudge {
			nudged = sent
		}
		cctx, cancel := call()
		state, behind, err = store.ClaimTurn(cctx, s.id, token, sent.Sub(arrival), TurnLease, TurnClaim, nudge)
		cancel()
		if err != nil {
			withdraw()
			return nil, nil
		}
	}
}

// askedFor records that a request waiting for the turn elsewhere arrived
// at at.
func (g *turnGrant) askedFor(at time.Time) {
	if g.wantedAt.IsZero() || at.Before(g.wantedAt) {
		g.wantedAt = at
	}
}

// usableBy reports whether a request that arrived at arrival may run
// under g: its lease leaves time to renew it before the exchange would
// have to stop, and nobody asked for the turn before the request came.
func (g *turnGrant) usableBy(arrival, now time.Time) bool {
	return !g.lost && now.Before(g.deadline.Add(-2*TurnMargin)) &&
		(g.wantedAt.IsZero() || !arrival.After(g.wantedAt))
}

// useGrant starts an exchange under g, and its renewals. Caller holds s.mu.
func (s *Session) useGrant(g *turnGrant) {
	g.inUse, g.stop = true, nil
	if !g.ticking {
		g.ticking = true
		now := s.table.clock.Now()
		s.table.clock.AfterFunc(g.untilTick(g.renewed.Add(turnRenewEvery), now), func() { s.grantTick(g) })
	}
}

// untilTick is how long from now until due, or until g's last moment to
// stop an exchange if that comes first.
func (g *turnGrant) untilTick(due, now time.Time) time.Duration {
	if last := g.deadline.Add(-TurnMargin); last.Before(due) {
		due = last
	}
	return max(due.Sub(now), 0)
}

// grantTick renews g's lease while an exchange runs under it, and stops
// that exchange when the lease may lapse before a renewal succeeds.
func (s *Session) grantTick(g *turnGrant) {
	t := s.table
	s.mu.Lock()
	if s.clusterGrant != g || !g.inUse {
		g.ticking = false // idle or given up: not renewed
		s.mu.Unlock()
		return
	}
	if !t.clock.Now().Before(g.deadline.Add(-TurnMargin)) {
		s.lapse(g)
		return
	}
	s.mu.Unlock()

	sent := t.clock.Now()
	ctx, cancel := context.WithTimeout(context.Background(), t.config().StoreTimeout)
	held, behind, err := g.store.RenewTurn(ctx, s.id, g.token, TurnLease)
	cancel()

	s.mu.Lock()
	if s.clusterGrant != g || !g.inUse {
		g.ticking = false
		s.mu.Unlock()
		return
	}
	now := t.clock.Now()
	due := now.Add(turnRetryEvery)
	switch {
	case err != nil:
	case !held:
		s.lapse(g) // the engine gave the turn to another
		return
	default:
		g.renewed, g.deadline = sent, sent.Add(TurnLease)
		due = sent.Add(turnRenewEvery)
		if behind >= 0 {
			g.askedFor(now.Add(-behind))
		}
	}
	t.clock.AfterFunc(g.untilTick(due, now), func() { s.grantTick(g) })
	s.mu.Unlock()
}

// lapse gives g up while its exchange runs, and stops that exchange.
// Caller holds s.mu; it is released.
func (s *Session) lapse(g *turnGrant) {
	g.lost, g.ticking = true, false
	if s.clusterGrant == g {
		s.clusterGrant = nil
	}
	stop := g.stop
	s.mu.Unlock()
	s.table.config().Events.TurnLost(s.id)
	if stop != nil {
		stop()
	}
	go s.releaseGrant(g)
}

// grantEnded: the exchange under g has ended. It reports whether g must
// be handed on now: it was lost, the session ended, the engine cannot
// announce asks (so a holder would not hear one), or another instance
// asked before the next request here came. Caller holds s.mu, before
// the slot passes on.
func (s *Session) grantEnded(g *turnGrant) (handOn bool) {
	g.inUse, g.stop = false, nil
	if s.clusterGrant != g {
		return false // given up already
	}
	if g.lost || s.gone || !s.table.remote.announcing() ||
		(!g.wantedAt.IsZero() && !s.nextArrivedBefore(g.wantedAt)) {
		s.clusterGrant = nil
		return true
	}
	return false
}

// nextArrivedBefore reports whether the request that gets the slot next
// arrived no later than at. Caller holds s.mu.
func (s *Session) nextArrivedBefore(at time.Time) bool {
	for _, w := range s.waiting {
		if s.admits(w.traits) {
			return !w.arrived.After(at)
		}
	}
	return false
}

// turnAsked: another instance asks for s's cluster turn (asker is its
// token) for a request that arrived there waited ago. A grant held here is
// handed on at once if idle, else after the requests that came before
// that one; a request asking here remembers when, for the grant it is
// about to get. Caller holds s.mu; it returns a grant to hand on outside
// the lock.
func (s *Session) turnAsked(asker string, waited time.Duration) (handOn *turnGrant) {
	at := s.table.clock.Now().Add(-waited)
	if g := s.clusterGrant; g != nil && g.token != asker {
		g.askedFor(at)
		if !g.inUse {
			s.clusterGrant = nil
			return g
		}
		return nil
	}
	if s.slot == slotAskingTurn && s.askToken != asker && (s.wantHeard.IsZero() || at.Before(s.wantHeard)) {
		s.wantHeard = at
	}
	return nil
}

// sessionEndedWithGrant: the session ended upstream (DELETE, or a 404):
// no request of it will ask for its turn again, so a grant it holds with
// no exchange running is dropped without a call; its line lapses on the
// engine. Caller holds s.mu.
func (s *Session) sessionEndedWithGrant() {
	if g := s.clusterGrant; g != nil && !g.inUse {
		s.clusterGrant = nil
		if g.unwatch != nil {
			g.unwatch()
		}
	}
}

// idleGrantGone: the session was forgotten or dropped; a grant it holds
// with no exchange running is handed on. Caller holds s.mu.
func (s *Session) idleGrantGone() {
	if g := s.clusterGrant; g != nil && !g.inUse {
		s.clusterGrant = nil
		go s.releaseGrant(g)
	}
}

// releaseGrant hands g's turn on, or frees it.
func (s *Session) releaseGrant(g *turnGrant) {
	if g.unwatch != nil {
		g.unwatch()
	}
	releaseTurn(g.store, s.id, g.token, s.table.config().StoreTimeout)
}

// releaseTurn hands token's turn on or withdraws its ask, trying again
// if the engine's answer is lost: releasing twice is harmless.
func releaseTurn(store TurnStore, id, token string, timeout time.Duration) {
	for range turnReleaseTries {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		err := store.ReleaseTurn(ctx, id, token, TurnClaim)
		cancel()
		if err == nil {
			return
		}
	}
}

// handOnIdleTurns gives up the cluster turns the table holds with no
// exchange running, for the instance is stopping: the sessions' next
// requests elsewhere then need not wait for the leases to run out. It
// takes at most twice StoreTimeout, however many there are.
func (t *Table) handOnIdleTurns() {
	type held struct {
		s *Session
		g *turnGrant
	}
	var turns []held
	t.mu.Lock()
	for _, s := range t.sessions {
		s.mu.Lock()
		if g := s.clusterGrant; g != nil && !g.inUse {
			s.clusterGrant = nil
			turns = append(turns, held{s, g})
		}
		s.mu.Unlock()
	}
	t.mu.Unlock()
	if len(turns) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*t.config().StoreTimeout)
	defer cancel()
	work := make(chan held)
	var wg sync.WaitGroup
	for range min(len(turns), handOnWorkers) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for h := range work {
				_ = h.g.store.ReleaseTurn(ctx, h.s.id, h.g.token, TurnClaim)
			}
		}()
	}
	for _, h := range turns {
		if h.g.unwatch != nil {
			h.g.unwatch()
		}
		select {
		case work <- h:
		case <-ctx.Done():
		}
	}
	close(work)
	wg.Wait()
}

// handOnWorkers bounds the calls handOnIdleTurns has in flight.
const handOnWorkers = 32
