package serializer

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Cluster turns: one session's requests upstream one at a time across
// instances, for fronts that spread a session's requests over them (round
// robin). Config.Turns turns them on; without it (behind a front that
// keeps a session on one instance) a session's order is kept here alone,
// at no cost per request.
//
// The rules, whatever the engine:
//   - A request first gets its turn here, as always (queue, gate, streams),
//     then takes a ticket on the engine; so an instance has at most one
//     ticket per session, and its requests keep their arrival order.
//     Tickets are served in the order taken, one at a time.
//   - A ticket being served has a lease (TurnLease): its holder renews it
//     every TurnLease/3 while its exchange lasts and hands the turn on when
//     the exchange ends. A holder that stops renewing (its instance died)
//     is passed over when the lease runs out.
//   - A ticket whose turn has come must be claimed within TurnClaim, or it
//     is passed over (its instance died while the request waited); a live
//     waiter passed over takes a new ticket.
//   - Fencing: every change names the ticket it acts for and does nothing
//     unless that ticket is the one being served, so a late holder never
//     hands on another's turn nor renews its own after losing it.
//   - Not ordered across instances: the initialize exchange (nobody else
//     knows the session yet) and messages that carry only replies or
//     cancellations (the exchange they answer may be the one holding the
//     turn, streaming on another instance).
//   - The engine failing (an error, or no answer within StoreTimeout) lets
//     the request go with its turn here only: today's order on one
//     instance, never a stuck request. Every wait ends by QueueTimeout.

// TurnLease and TurnClaim bound how long a dead instance holds up a
// session's requests on the others: a turn it held, and a turn that came
// to a request it held waiting.
const (
	TurnLease = 5 * time.Second
	TurnClaim = 1 * time.Second
)

// TurnLineTTL is how long an engine keeps a session's TicketLine after its
// last change: every live ticket changes it more often than that (a
// holder renews every TurnLease/3, a waiter reads it every
// remoteMaxBackoff), and a line left alone is free, as is no line.
const TurnLineTTL = 3 * TurnLease

// TicketState is what the engine says of a ticket.
type TicketState uint8

const (
	TicketWaiting    TicketState = iota // tickets before it are still served
	TicketServed                        // its turn: the lease runs from now
	TicketPassedOver                    // it was not claimed in time; take a new one
)

// TurnStore keeps the cluster turns of sessions, by session id. Like a
// Store, it must key them by a hash of the id, honour its context and
// return within its own bound; Watch announcements (if it is a Watcher)
// include hand-ons.
type TurnStore interface {
	// TakeTicket queues a request of session id and says whether its turn
	// has come already (it is then served, with a lease of lease).
	TakeTicket(ctx context.Context, id string, lease, claim time.Duration) (ticket int64, state TicketState, err error)
	// ClaimTicket says where ticket stands; if its turn has come it is
	// served from now, with a lease of lease.
	ClaimTicket(ctx context.Context, id string, ticket int64, lease, claim time.Duration) (TicketState, error)
	// RenewTicket extends the lease of ticket if it is being served, and
	// reports whether it was.
	RenewTicket(ctx context.Context, id string, ticket int64, lease time.Duration) (bool, error)
	// ReleaseTicket ends ticket: hands the turn on if it is being served,
	// or withdraws it if it is still waiting, so that it is skipped.
	ReleaseTicket(ctx context.Context, id string, ticket int64, claim time.Duration) error
}

// errPassedOver is internal: a waiter's ticket was passed over.
var errPassedOver = errors.New("ticket passed over")

// clusterTurn is a request's ticket while it is served.
type clusterTurn struct {
	store  TurnStore
	id     string
	ticket int64
	cfg    *Config

	mu      sync.Mutex
	ended   bool
	stopRen func() bool
}

// ordersAcrossInstances reports whether a request with these traits takes
// a ticket.
func ordersAcrossInstances(traits Traits) bool { return !traits.Has(RepliesOnly) }

// takeClusterTurn waits for the request's cluster turn, if the table has
// turns, after its turn here; waited is how long it waited here. It
// returns the ticket being served, or nil if the request goes without one.
func (s *Session) takeClusterTurn(ctx context.Context, traits Traits, waited time.Duration) (*clusterTurn, error) {
	cfg := s.table.config()
	if cfg.Turns == nil || !ordersAcrossInstances(traits) {
		return nil, nil
	}
	deadline := s.table.clock.Now().Add(cfg.QueueTimeout - waited)
	for {
		ct, err := s.waitTicket(ctx, cfg, deadline)
		if !errors.Is(err, errPassedOver) {
			return ct, err
		}
	}
}

// waitTicket takes a ticket and waits until it is served.
func (s *Session) waitTicket(ctx context.Context, cfg *Config, deadline time.Time) (*clusterTurn, error) {
	t := s.table
	store := cfg.Turns
	call := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), cfg.StoreTimeout)
	}
	// Listening before the ticket is taken: a hand-on announced between
	// the read and the wait is not missed.
	defer t.awaitRemote(s)()
	changed := s.nextRemoteChange()
	cctx, cancel := call()
	ticket, state, err := store.TakeTicket(cctx, s.id, TurnLease, TurnClaim)
	cancel()
	if err != nil {
		return nil, nil // engine down: this instance's order only
	}
	withdraw := func() {
		cctx, cancel := call()
		_ = store.ReleaseTicket(cctx, s.id, ticket, TurnClaim)
		cancel()
	}
	backoff := remoteFirstBackoff
	for {
		switch state {
		case TicketServed:
			return s.served(cfg, ticket), nil
		case TicketPassedOver:
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
		cctx, cancel := call()
		state, err = store.ClaimTicket(cctx, s.id, ticket, TurnLease, TurnClaim)
		cancel()
		if err != nil {
			go withdraw() // best effort; its claim window ends it anyway
			return nil, nil
		}
	}
}

// served starts renewing the lease of a ticket being served.
func (s *Session) served(cfg *Config, ticket int64) *clusterTurn {
	ct := &clusterTurn{store: cfg.Turns, id: s.id, ticket: ticket, cfg: cfg}
	ct.mu.Lock()
	ct.stopRen = s.table.clock.AfterFunc(TurnLease/3, func() { ct.renew(s.table.clock) })
	ct.mu.Unlock()
	return ct
}

// renew extends the lease while the exchange lasts.
func (ct *clusterTurn) renew(clock Clock) {
	ctx, cancel := context.WithTimeout(context.Background(), ct.cfg.StoreTimeout)
	held, err := ct.store.RenewTicket(ctx, ct.id, ct.ticket, TurnLease)
	cancel()
	ct.mu.Lock()
	defer ct.mu.Unlock()
	if ct.ended || (err == nil && !held) {
		return // ended, or passed over: nothing left to renew
	}
	ct.stopRen = clock.AfterFunc(TurnLease/3, func() { ct.renew(clock) })
}

// end hands the turn on; the exchange has ended.
func (ct *clusterTurn) end() {
	if ct == nil {
		return
	}
	ct.mu.Lock()
	ct.ended = true
	if ct.stopRen != nil {
		ct.stopRen()
	}
	ct.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), ct.cfg.StoreTimeout)
	_ = ct.store.ReleaseTicket(ctx, ct.id, ct.ticket, TurnClaim)
	cancel()
}
