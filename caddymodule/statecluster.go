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
// storage has no atomic update to keep a turn line with.
type TurnEngine interface {
	StateEngine
	TakeTurn(ctx context.Context, key, token string, lease, claim time.Duration) (serializer.TurnState, bool, error)
	ClaimTurn(ctx context.Context, key, token string, lease, claim time.Duration, nudge bool) (serializer.TurnState, bool, error)
	RenewTurn(ctx context.Context, key, token string, lease time.Duration) (held, wanted bool, err error)
	ReleaseTurn(ctx context.Context, key, token string, claim time.Duration) error
	// Announce tells every instance's Watch that key's record changed.
	Announce(ctx context.Context, key string) error
	Watch(changed func(key, asker string)) (stop func())
	Announcing() bool
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

// turnAnswers is what a take or a claim answers, through bounded.
type turnAnswers struct {
	state  serializer.TurnState
	wanted bool
}

func (c *clusterState) TakeTurn(ctx context.Context, id, token string, lease, claim time.Duration) (serializer.TurnState, bool, error) {
	res, err := bounded(c.sharedState, ctx, opTake, id, serializer.StoreKey(id), func(ctx context.Context, key string) (turnAnswers, error) {
		state, wanted, err := c.turns.TakeTurn(ctx, key, token, lease, claim)
		return turnAnswers{state, wanted}, err
	})
	return res.state, res.wanted, err
}

func (c *clusterState) ClaimTurn(ctx context.Context, id, token string, lease, claim time.Duration, nudge bool) (serializer.TurnState, bool, error) {
	res, err := bounded(c.sharedState, ctx, opClaim, id, serializer.StoreKey(id), func(ctx context.Context, key string) (turnAnswers, error) {
		state, wanted, err := c.turns.ClaimTurn(ctx, key, token, lease, claim, nudge)
		return turnAnswers{state, wanted}, err
	})
	return res.state, res.wanted, err
}

func (c *clusterState) RenewTurn(ctx context.Context, id, token string, lease time.Duration) (held, wanted bool, err error) {
	res, err := bounded(c.sharedState, ctx, opRenew, id, serializer.StoreKey(id), func(ctx context.Context, key string) ([2]bool, error) {
		held, wanted, err := c.turns.RenewTurn(ctx, key, token, lease)
		return [2]bool{held, wanted}, err
	})
	return res[0], res[1], err
}

func (c *clusterState) ReleaseTurn(ctx context.Context, id, token string, claim time.Duration) error {
	_, err := bounded(c.sharedState, ctx, opRelease, id, serializer.StoreKey(id), func(ctx context.Context, key string) (struct{}, error) {
		return struct{}{}, c.turns.ReleaseTurn(ctx, key, token, claim)
	})
	return err
}

// Watch passes the engine's announcements on.
func (c *clusterState) Watch(changed func(key, asker string)) (stop func()) {
	return c.turns.Watch(changed)
}

// Announcing reports whether the engine's announcements work.
func (c *clusterState) Announcing() bool { return c.turns.Announcing() }

var (
	_ serializer.TurnStore = (*clusterState)(nil)
	_ serializer.Watcher   = (*clusterState)(nil)
)
