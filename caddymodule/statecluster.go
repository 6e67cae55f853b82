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
	TakeTurn(ctx context.Context, key, token string, age, lease, claim time.Duration) (serializer.TurnState, time.Duration, error)
	ClaimTurn(ctx context.Context, key, token string, age, lease, claim time.Duration, nudge bool) (serializer.TurnState, time.Duration, error)
	RenewTurn(ctx context.Context, key, token string, lease time.Duration) (held bool, behind time.Duration, err error)
	ReleaseTurn(ctx context.Context, key, token string, claim time.Duration) error
	// Watch calls changed for every announcement (serializer.Watcher).
	Watch(changed func(key, asker string, waited time.Duration)) (stop func())
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
	shared.announceOpened = true
	return &clusterState{shared, turns}
}

// turnAnswers is what a turn call answers, through bounded.
type turnAnswers struct {
	state  serializer.TurnState
	held   bool
	behind time.Duration
}

func (c *clusterState) TakeTurn(ctx context.Context, id, token string, age, lease, claim time.Duration) (serializer.TurnState, time.Duration, error) {
	res, err := c.turnCall(ctx, opTake, id, func(ctx context.Context, key string) (turnAnswers, error) {
		state, behind, err := c.turns.TakeTurn(ctx, key, token, age, lease, claim)
		return turnAnswers{state: state, behind: behind}, err
	})
	return res.state, res.behind, err
}

func (c *clusterState) ClaimTurn(ctx context.Context, id, token string, age, lease, claim time.Duration, nudge bool) (serializer.TurnState, time.Duration, error) {
	res, err := c.turnCall(ctx, opClaim, id, func(ctx context.Context, key string) (turnAnswers, error) {
		state, behind, err := c.turns.ClaimTurn(ctx, key, token, age, lease, claim, nudge)
		return turnAnswers{state: state, behind: behind}, err
	})
	return res.state, res.behind, err
}

func (c *clusterState) RenewTurn(ctx context.Context, id, token string, lease time.Duration) (bool, time.Duration, error) {
	res, err := c.turnCall(ctx, opRenew, id, func(ctx context.Context, key string) (turnAnswers, error) {
		held, behind, err := c.turns.RenewTurn(ctx, key, token, lease)
		return turnAnswers{held: held, behind: behind}, err
	})
	return res.held, res.behind, err
}

// turnCall runs a turn call through the adapter's bounds; a call that
// fails answers that nobody waits.
func (c *clusterState) turnCall(ctx context.Context, op stateOp, id string, call func(context.Context, string) (turnAnswers, error)) (turnAnswers, error) {
	res, err := bounded(c.sharedState, ctx, op, id, serializer.StoreKey(id), call)
	if err != nil {
		res.behind = serializer.NobodyWaiting
	}
	return res, err
}

func (c *clusterState) ReleaseTurn(ctx context.Context, id, token string, claim time.Duration) error {
	_, err := bounded(c.sharedState, ctx, opRelease, id, serializer.StoreKey(id), func(ctx context.Context, key string) (struct{}, error) {
		return struct{}{}, c.turns.ReleaseTurn(ctx, key, token, claim)
	})
	return err
}

// Watch passes the engine's announcements on.
func (c *clusterState) Watch(changed func(key, asker string, waited time.Duration)) (stop func()) {
	return c.turns.Watch(changed)
}

// Announcing reports whether the engine's announcements work.
func (c *clusterState) Announcing() bool { return c.turns.Announcing() }

var (
	_ serializer.TurnStore = (*clusterState)(nil)
	_ serializer.Watcher   = (*clusterState)(nil)
)
