package caddymodule

import (
	"context"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// Order settings: a session's requests in order on each instance (behind
// a front that keeps a session on one), or across instances (any front).
const (
	orderLocal   = "local"
	orderCluster = "cluster"
)

// TurnEngine is a StateEngine that can keep cluster turns
// (serializer.TurnStore, by key) and announce changes to every instance
// (serializer.Watcher). The redis engine is one; storage is not: Caddy's
// storage has no atomic update to keep a ticket line with.
type TurnEngine interface {
	StateEngine
	TakeTicket(ctx context.Context, key string, lease, claim time.Duration) (int64, serializer.TicketState, error)
	ClaimTicket(ctx context.Context, key string, ticket int64, lease, claim time.Duration) (serializer.TicketState, error)
	RenewTicket(ctx context.Context, key string, ticket int64, lease time.Duration) (bool, error)
	ReleaseTicket(ctx context.Context, key string, ticket int64, claim time.Duration) error
	// Announce tells every instance's Watch that key's record changed.
	Announce(ctx context.Context, key string) error
	Watch(changed func(key string)) (stop func())
}

// clusterState is the table's Store and TurnStore with `order cluster`:
// sharedState's calls, the turns through the same bounds and error
// counts, and announcements, so that a request waiting on another
// instance hears of the change at once.
type clusterState struct {
	*sharedState
	turns TurnEngine
}

func newClusterState(shared *sharedState, turns TurnEngine) *clusterState {
	return &clusterState{shared, turns}
}

// Opened marks the record open, then announces it: requests held at the
// gate on other instances go at once.
func (c *clusterState) Opened(ctx context.Context, id string) error {
	if err := c.sharedState.Opened(ctx, id); err != nil {
		return err
	}
	_, err := bounded(c.sharedState, ctx, opAnnounce, id, serializer.StoreKey(id), func(ctx context.Context, key string) (struct{}, error) {
		return struct{}{}, c.turns.Announce(ctx, key)
	})
	return err
}

type takeResult struct {
	ticket int64
	state  serializer.TicketState
}

func (c *clusterState) TakeTicket(ctx context.Context, id string, lease, claim time.Duration) (int64, serializer.TicketState, error) {
	res, err := bounded(c.sharedState, ctx, opTake, id, serializer.StoreKey(id), func(ctx context.Context, key string) (takeResult, error) {
		ticket, state, err := c.turns.TakeTicket(ctx, key, lease, claim)
		return takeResult{ticket, state}, err
	})
	return res.ticket, res.state, err
}

func (c *clusterState) ClaimTicket(ctx context.Context, id string, ticket int64, lease, claim time.Duration) (serializer.TicketState, error) {
	return bounded(c.sharedState, ctx, opClaim, id, serializer.StoreKey(id), func(ctx context.Context, key string) (serializer.TicketState, error) {
		return c.turns.ClaimTicket(ctx, key, ticket, lease, claim)
	})
}

func (c *clusterState) RenewTicket(ctx context.Context, id string, ticket int64, lease time.Duration) (bool, error) {
	return bounded(c.sharedState, ctx, opRenew, id, serializer.StoreKey(id), func(ctx context.Context, key string) (bool, error) {
		return c.turns.RenewTicket(ctx, key, ticket, lease)
	})
}

func (c *clusterState) ReleaseTicket(ctx context.Context, id string, ticket int64, claim time.Duration) error {
	_, err := bounded(c.sharedState, ctx, opRelease, id, serializer.StoreKey(id), func(ctx context.Context, key string) (struct{}, error) {
		return struct{}{}, c.turns.ReleaseTicket(ctx, key, ticket, claim)
	})
	return err
}

// Watch passes the engine's announcements on.
func (c *clusterState) Watch(changed func(key string)) (stop func()) {
	return c.turns.Watch(changed)
}

var (
	_ serializer.TurnStore = (*clusterState)(nil)
	_ serializer.Watcher   = (*clusterState)(nil)
)
