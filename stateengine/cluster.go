package stateengine

import (
	"context"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// Cluster is the table's Store and TurnStore with `order cluster`: the
// Adapter's calls, the turns through the same bounds and error counts,
// and announcements, so that a request waiting on another instance hears
// of the change at once.
type Cluster struct {
	*Adapter
	turns TurnKeeper
}

// NewCluster adds to a the cluster turns of its engine (turns, its
// Abilities.Turns); a's Opened writes then announce the opened gate.
func NewCluster(a *Adapter, turns TurnKeeper) *Cluster {
	a.announceOpened = true
	return &Cluster{a, turns}
}

// Configure makes c cfg's Store as the Adapter does, its TurnStore and its
// Watcher.
func (c *Cluster) Configure(cfg *serializer.Config) {
	c.Adapter.Configure(cfg)
	cfg.Turns, cfg.Watcher = c, c
}

// turnAnswers is what a turn call answers, through bounded.
type turnAnswers struct {
	state  serializer.TurnState
	held   bool
	behind time.Duration
}

func (c *Cluster) TakeTurn(ctx context.Context, id, token string, age, lease, claim time.Duration) (serializer.TurnState, time.Duration, error) {
	res, err := c.turnCall(ctx, OpTake, id, func(ctx context.Context, key string) (turnAnswers, error) {
		state, behind, err := c.turns.TakeTurn(ctx, key, token, age, lease, claim)
		return turnAnswers{state: state, behind: behind}, err
	})
	return res.state, res.behind, err
}

func (c *Cluster) ClaimTurn(ctx context.Context, id, token string, age, lease, claim time.Duration, nudge bool) (serializer.TurnState, time.Duration, error) {
	res, err := c.turnCall(ctx, OpClaim, id, func(ctx context.Context, key string) (turnAnswers, error) {
		state, behind, err := c.turns.ClaimTurn(ctx, key, token, age, lease, claim, nudge)
		return turnAnswers{state: state, behind: behind}, err
	})
	return res.state, res.behind, err
}

func (c *Cluster) RenewTurn(ctx context.Context, id, token string, lease time.Duration) (bool, time.Duration, error) {
	res, err := c.turnCall(ctx, OpRenew, id, func(ctx context.Context, key string) (turnAnswers, error) {
		held, behind, err := c.turns.RenewTurn(ctx, key, token, lease)
		return turnAnswers{held: held, behind: behind}, err
	})
	return res.held, res.behind, err
}

// turnCall runs a turn call through the adapter's bounds; a call that
// fails answers that nobody waits.
func (c *Cluster) turnCall(ctx context.Context, op Op, id string, call func(context.Context, string) (turnAnswers, error)) (turnAnswers, error) {
	res, err := bounded(c.Adapter, ctx, op, id, serializer.StoreKey(id), call)
	if err != nil {
		res.behind = serializer.NobodyWaiting
	}
	return res, err
}

func (c *Cluster) ReleaseTurn(ctx context.Context, id, token string, claim time.Duration) error {
	_, err := bounded(c.Adapter, ctx, OpRelease, id, serializer.StoreKey(id), func(ctx context.Context, key string) (struct{}, error) {
		return struct{}{}, c.turns.ReleaseTurn(ctx, key, token, claim)
	})
	return err
}

// Watch passes the engine's announcements on.
func (c *Cluster) Watch(changed func(key, asker string, waited time.Duration)) (stop func()) {
	return c.turns.Watch(changed)
}

// Announcing reports whether the engine's announcements work.
func (c *Cluster) Announcing() bool { return c.turns.Announcing() }

var (
	_ serializer.TurnStore = (*Cluster)(nil)
	_ serializer.Watcher   = (*Cluster)(nil)
)
