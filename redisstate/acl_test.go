package redisstate

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/enginetest"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/redistest"
	"github.com/mcpserializer/caddy-mcp-serializer/stateengine"
)

// leastPrivilegeACL is the rule docs/several-instances.md gives for the
// module's Redis user with the default key_prefix.
const leastPrivilegeACL = "resetkeys ~mcp_serializer:* resetchannels &mcp_serializer:changed -@all +@connection +eval +evalsha +hmget +hget +hset +exists +pexpire +del +time +publish +subscribe"

// withoutChannels takes from a user every channel and pub/sub command:
// the engine needs none of them.
const withoutChannels = "resetchannels -publish -subscribe"

// The whole engine runs as a user with leastPrivilegeACL, less channels:
// records and owners, with no call refused and nothing logged.
func TestRedisEngineRunsAsTheLeastPrivilegedUser(t *testing.T) {
	addr := redistest.Start(t)
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	args := []any{"ACL", "SETUSER", "mcp", "on", ">pw"}
	for _, rule := range strings.Fields(leastPrivilegeACL + " " + withoutChannels) {
		args = append(args, rule)
	}
	if err := admin.Do(ctx, args...).Err(); err != nil {
		t.Fatal(err)
	}
	load := func(t *testing.T, prefix string) *Engine {
		return enginetest.Load(t, nil, "redis", map[string]any{"address": []string{addr}, "username": "mcp", "password": "pw",
			"timeout": "1s", "key_prefix": prefix}).(*Engine)
	}
	n := 0
	errorsBefore := map[string]float64{}
	for op := range stateengine.NumOps {
		errorsBefore[op.String()] = testutil.ToFloat64(enginetest.Errors.WithLabelValues(op.String()))
	}
	enginetest.Conformance(t, func(t *testing.T, ttl time.Duration) enginetest.Under {
		n++ // keys of their own per engine, within the user's
		return enginetest.Under{Store: enginetest.NewAdapter(load(t, fmt.Sprintf("mcp_serializer:%d:", n)), ttl, zap.NewNop()), Advance: time.Sleep}
	})

	core, logs := observer.New(zap.WarnLevel)
	store := enginetest.NewAdapter(load(t, "mcp_serializer:"), time.Hour, zap.New(core))
	const a, b = "a 10.0.0.1:8080", "b 10.0.0.2:8080"
	if err := store.CreatedOwned(ctx, "s", time.Now().Add(time.Minute), a); err != nil {
		t.Fatal(err)
	}
	if owner, found, err := store.TakeOver(ctx, "s", a, b); err != nil || !found || owner != b {
		t.Fatalf("TakeOver = %q, %v, %v", owner, found, err)
	}
	if owner, err := store.Claim(ctx, "key cart", a); err != nil || owner != a {
		t.Fatalf("Claim = %q, %v", owner, err)
	}
	for _, id := range []string{"s", "key cart"} {
		if err := store.Forget(ctx, id); err != nil {
			t.Fatal(err)
		}
	}

	for op, before := range errorsBefore {
		if n := testutil.ToFloat64(enginetest.Errors.WithLabelValues(op)); n != before {
			t.Errorf("%v failed %s calls", n-before, op)
		}
	}
	if logs.Len() != 0 {
		t.Fatalf("WARNs: %v", logs.All())
	}
}

// The docs give operators the rule the least-privilege test runs.
func TestDocsGiveTheTestedACLRule(t *testing.T) {
	page, err := os.ReadFile("../docs/several-instances.md")
	if err != nil {
		t.Fatal(err)
	}
	if want := "ACL SETUSER mcp_serializer on >{password} " + leastPrivilegeACL + "\n"; !strings.Contains(string(page), want) {
		t.Fatalf("docs/several-instances.md lacks the tested ACL rule:\n%s", want)
	}
}
