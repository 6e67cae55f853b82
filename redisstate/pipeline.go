package redisstate

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
	"github.com/mcpserializer/caddy-mcp-serializer/stateengine"
)

// Writes sends a batch of writes in one pipeline, one round trip. The
// scripts go by their SHA; from the first write the server answers
// NOSCRIPT (it restarted, or its scripts were flushed) on, the writes go
// once more, in a second pipeline, with the scripts' bodies, which loads
// them. Running writes again in their order from any point leaves the
// records as running them once does: Created sets every field, the
// updates only move fields towards open and never recreate a record, and
// DEL deletes again.
func (r *Engine) Writes(ctx context.Context, ws []*stateengine.Write, ttl time.Duration) {
	now := time.Now()
	cmds := r.pipeline(ctx, ws, func(p redis.Pipeliner, w *stateengine.Write) redis.Cmder {
		return r.queueWrite(ctx, p, w, ttl, now, (*redis.Script).EvalSha)
	})
	lost := -1
	for i, w := range ws {
		w.Err = cmds[i].Err()
		if lost < 0 && redis.HasErrorPrefix(w.Err, "NOSCRIPT") {
			lost = i
		}
	}
	if lost < 0 {
		return
	}
	again := ws[lost:]
	cmds = r.pipeline(ctx, again, func(p redis.Pipeliner, w *stateengine.Write) redis.Cmder {
		return r.queueWrite(ctx, p, w, ttl, now, (*redis.Script).Eval)
	})
	for i, w := range again {
		w.Err = cmds[i].Err()
	}
}

// pipeline queues one command per write and sends them; each command
// holds its answer or error.
func (r *Engine) pipeline(ctx context.Context, ws []*stateengine.Write, queue func(redis.Pipeliner, *stateengine.Write) redis.Cmder) []redis.Cmder {
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
func (r *Engine) queueWrite(ctx context.Context, p redis.Pipeliner, w *stateengine.Write, ttl time.Duration, now time.Time,
	eval func(*redis.Script, context.Context, redis.Scripter, []string, ...any) *redis.Cmd) redis.Cmder {
	keys := []string{r.KeyPrefix + w.Key}
	switch w.Op {
	case stateengine.OpCreated:
		life := serializer.RecordTTL(ttl, false, w.Deadline, now)
		return eval(createScript, ctx, p, keys, w.Deadline.UnixMilli(), life.Milliseconds(), w.Owner)
	case stateengine.OpInitializeEnded:
		return eval(updateScript, ctx, p, keys, "ended", ttl.Milliseconds())
	case stateengine.OpOpened:
		return eval(updateScript, ctx, p, keys, "opened", ttl.Milliseconds())
	case stateengine.OpTouch:
		return eval(updateScript, ctx, p, keys, "touch", ttl.Milliseconds())
	case stateengine.OpForget:
		return p.Del(ctx, keys[0])
	}
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(fmt.Errorf("%s is not a write", w.Op))
	return cmd
}

// write sends one write on its own.
func (r *Engine) write(ctx context.Context, w *stateengine.Write, ttl time.Duration) error {
	r.Writes(ctx, []*stateengine.Write{w}, ttl)
	return w.Err
}
