package caddymodule

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// Writes sends a batch of writes in one pipeline, one round trip. The
// scripts go by their SHA; from the first write the server answers
// NOSCRIPT (it restarted, or its scripts were flushed) on, the writes go
// once more, in a second pipeline, with the scripts' bodies, which loads
// them. Running writes again in their order from any point leaves the
// records as running them once does: Created sets every field, the
// updates only move fields towards open and never recreate a record, and
// DEL deletes again.
func (r *RedisState) Writes(ctx context.Context, ws []*stateWrite, ttl time.Duration) {
	now := time.Now()
	cmds := r.pipeline(ctx, ws, func(p redis.Pipeliner, w *stateWrite) redis.Cmder {
		return r.queueWrite(ctx, p, w, ttl, now, (*redis.Script).EvalSha)
	})
	lost := -1
	for i, w := range ws {
		w.err = cmds[i].Err()
		if lost < 0 && redis.HasErrorPrefix(w.err, "NOSCRIPT") {
			lost = i
		}
	}
	if lost < 0 {
		return
	}
	again := ws[lost:]
	cmds = r.pipeline(ctx, again, func(p redis.Pipeliner, w *stateWrite) redis.Cmder {
		return r.queueWrite(ctx, p, w, ttl, now, (*redis.Script).Eval)
	})
	for i, w := range again {
		w.err = cmds[i].Err()
	}
}

// pipeline queues one command per write and sends them; each command
// holds its answer or error.
func (r *RedisState) pipeline(ctx context.Context, ws []*stateWrite, queue func(redis.Pipeliner, *stateWrite) redis.Cmder) []redis.Cmder {
	p := r.client.Pipeline()
	cmds := make([]redis.Cmder, len(ws))
	for i, w := range ws {
		cmds[i] = queue(p, w)
	}
	_, _ = p.Exec(ctx) // errors are in cmds
	return cmds
}

// queueWrite queues w's command on p: a script run by eval (EvalSha, or
// Eval to load it), or DEL.
func (r *RedisState) queueWrite(ctx context.Context, p redis.Pipeliner, w *stateWrite, ttl time.Duration, now time.Time,
	eval func(*redis.Script, context.Context, redis.Scripter, []string, ...any) *redis.Cmd) redis.Cmder {
	keys := []string{r.KeyPrefix + w.key}
	switch w.op {
	case opCreated:
		life := serializer.RecordTTL(ttl, false, w.deadline, now)
		return eval(createScript, ctx, p, keys, w.deadline.UnixMilli(), life.Milliseconds())
	case opInitializeEnded:
		return eval(updateScript, ctx, p, keys, "ended", ttl.Milliseconds())
	case opOpened:
		channel := ""
		if w.announce {
			channel = r.changedChannel()
		}
		return eval(updateScript, ctx, p, keys, "opened", ttl.Milliseconds(), channel, w.key)
	case opTouch:
		return eval(updateScript, ctx, p, keys, "touch", ttl.Milliseconds())
	case opForget:
		return p.Del(ctx, keys[0])
	}
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(fmt.Errorf("%s is not a write", w.op))
	return cmd
}

// write sends one write on its own.
func (r *RedisState) write(ctx context.Context, w *stateWrite, ttl time.Duration) error {
	r.Writes(ctx, []*stateWrite{w}, ttl)
	return w.err
}

var _ batchEngine = (*RedisState)(nil)
