package redisstate

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/enginetest"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/redistest"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/wait"
	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
	"github.com/mcpserializer/caddy-mcp-serializer/stateengine"
)

// The scripts go by their SHA; a server that lost them (restarted, or
// SCRIPT FLUSH) gets them again, within the same call.
func TestRedisWritesLoadTheScriptsTheServerLost(t *testing.T) {
	addr := redistest.Start(t)
	eng := enginetest.Load(t, nil, "redis", map[string]any{"address": []string{addr}}).(*Engine)
	store := enginetest.NewAdapter(eng, time.Hour, zap.NewNop())
	ctx := context.Background()
	if err := store.Created(ctx, "s1", time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := eng.client.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	ws := []*stateengine.Write{
		{Op: stateengine.OpCreated, Key: serializer.StoreKey("s2"), Deadline: time.Now().Add(time.Minute)},
		{Op: stateengine.OpOpened, Key: serializer.StoreKey("s1")},
		{Op: stateengine.OpInitializeEnded, Key: serializer.StoreKey("s2")},
		{Op: stateengine.OpTouch, Key: serializer.StoreKey("s1")},
	}
	eng.Writes(ctx, ws, time.Hour)
	for _, w := range ws {
		if w.Err != nil {
			t.Fatalf("%s: %v", w.Op, w.Err)
		}
	}
	for id, want := range map[string]serializer.Record{
		"s1": {Open: true},
		"s2": {InitializeInFlight: false},
	} {
		rec, found, err := store.Lookup(ctx, id)
		if err != nil || !found || rec.Open != want.Open || rec.InitializeInFlight != want.InitializeInFlight {
			t.Fatalf("Lookup(%s) = %+v, %v, %v; want %+v", id, rec, found, err, want)
		}
	}
}

// One batch holds the writes of several sessions, each session's in its
// order, as a busy instance sends them.
func TestRedisWritesOfOneBatchApplyInTheirOrder(t *testing.T) {
	addr := redistest.Start(t)
	eng := enginetest.Load(t, nil, "redis", map[string]any{"address": []string{addr}}).(*Engine)
	ctx := context.Background()
	deadline := time.Now().Add(time.Minute)
	k := serializer.StoreKey
	ws := []*stateengine.Write{
		{Op: stateengine.OpCreated, Key: k("opened"), Deadline: deadline},
		{Op: stateengine.OpCreated, Key: k("ended"), Deadline: deadline},
		{Op: stateengine.OpOpened, Key: k("opened")},
		{Op: stateengine.OpForget, Key: k("ended")},
		{Op: stateengine.OpInitializeEnded, Key: k("opened")}, // does not undo Opened
		{Op: stateengine.OpOpened, Key: k("ended")},           // does not bring it back
		{Op: stateengine.OpOpened, Key: k("never created")},
	}
	eng.Writes(ctx, ws, time.Hour)
	for _, w := range ws {
		if w.Err != nil {
			t.Fatalf("%s %s: %v", w.Op, w.Key, w.Err)
		}
	}
	for key, want := range map[string]bool{k("opened"): true, k("ended"): false, k("never created"): false} {
		rec, found, err := eng.Lookup(ctx, key)
		if err != nil || found != want || (found && (!rec.Open || rec.InitializeInFlight)) {
			t.Fatalf("Lookup = %+v, %v, %v; want found %v and open", rec, found, err, want)
		}
	}
	if n, err := eng.client.Exists(ctx, eng.KeyPrefix+k("ended"), eng.KeyPrefix+k("never created")).Result(); err != nil || n != 0 {
		t.Fatalf("EXISTS = %d, %v", n, err)
	}
}

// Through a table on a real redis-server, a session's later writes go by
// the queue (no goroutine of the table's waits on them) and reach the
// record: open once initialized is acknowledged, gone after DELETE.
func TestRedisRecordFollowsASessionThroughQueuedWrites(t *testing.T) {
	addr := redistest.Start(t)
	eng := enginetest.Load(t, nil, "redis", map[string]any{"address": []string{addr}}).(*Engine)
	store := enginetest.NewAdapter(eng, time.Hour, zap.NewNop())
	cfg := serializer.Defaults()
	store.Configure(&cfg)
	table := serializer.NewTable(cfg)
	defer table.Close()
	ctx := context.Background()
	lookup := func() (serializer.Record, bool) {
		rec, found, err := eng.Lookup(ctx, serializer.StoreKey("s"))
		if err != nil {
			t.Fatal(err)
		}
		return rec, found
	}

	initialize, _ := table.Begin("s", nil)
	if rec, found := lookup(); !found || rec.Open || !rec.InitializeInFlight {
		t.Fatalf("after Begin: %+v, %v; want initializing, in flight", rec, found)
	}
	initialize.Done(200)
	turn, err := table.Acquire(ctx, "s", serializer.CarriesInitialized)
	if err != nil {
		t.Fatal(err)
	}
	turn.Done(202)
	wait.Until(t, "the record open", func() bool { rec, found := lookup(); return found && rec.Open })
	turn, err = table.Acquire(ctx, "s", serializer.EndsSession)
	if err != nil {
		t.Fatal(err)
	}
	turn.Done(200)
	wait.Until(t, "the record gone", func() bool { _, found := lookup(); return !found })
}
