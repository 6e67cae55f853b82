package redisstate

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/enginetest"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/redistest"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/wait"
	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// A session's owner is written with its record and read back with it;
// a record written without one names none.
func TestRedisRecordsTheOwnerWithTheSessionsRecord(t *testing.T) {
	addr := redistest.Start(t)
	eng := enginetest.Load(t, nil, "redis", map[string]any{"address": []string{addr}}).(*Engine)
	store := enginetest.NewAdapter(eng, time.Hour, zap.NewNop())
	ctx := context.Background()
	if err := store.CreatedOwned(ctx, "owned", time.Now().Add(time.Minute), "aaaa 10.0.0.1:8080"); err != nil {
		t.Fatal(err)
	}
	if err := store.Created(ctx, "plain", time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if owner, found, err := store.Owner(ctx, "owned"); err != nil || !found || owner != "aaaa 10.0.0.1:8080" {
		t.Fatalf("Owner(owned) = %q, %v, %v", owner, found, err)
	}
	if owner, found, err := store.Owner(ctx, "plain"); err != nil || !found || owner != "" {
		t.Fatalf("Owner(plain) = %q, %v, %v; want found with none", owner, found, err)
	}
	if _, found, err := store.Owner(ctx, "missing"); err != nil || found {
		t.Fatalf("Owner(missing) = %v, %v; want not found", found, err)
	}
}

// Instances that find the owner gone at once take the session over in
// one atomic step each: one wins, and every one of them learns who.
func TestRedisTakeOverHasOneWinnerAmongInstancesRacing(t *testing.T) {
	addr := redistest.Start(t)
	eng := enginetest.Load(t, nil, "redis", map[string]any{"address": []string{addr}}).(*Engine)
	store := enginetest.NewAdapter(eng, time.Hour, zap.NewNop())
	ctx := context.Background()
	const dead = "dead 10.0.0.1:8080"
	for round := range 20 {
		if err := store.CreatedOwned(ctx, "s", time.Now().Add(time.Minute), dead); err != nil {
			t.Fatal(err)
		}
		instances := []string{"b 10.0.0.2:8080", "c 10.0.0.3:8080", "d 10.0.0.4:8080"}
		got := make([]string, len(instances))
		var wg sync.WaitGroup
		for i, me := range instances {
			wg.Go(func() {
				owner, found, err := store.TakeOver(ctx, "s", dead, me)
				if err != nil || !found {
					t.Errorf("TakeOver = %v, %v", found, err)
				}
				got[i] = owner
			})
		}
		wg.Wait()
		for _, owner := range got {
			if owner != got[0] {
				t.Fatalf("round %d: instances learned different owners %q", round, got)
			}
		}
		if recorded, _, _ := store.Owner(ctx, "s"); recorded != got[0] || recorded == dead {
			t.Fatalf("round %d: recorded %q, instances learned %q", round, recorded, got[0])
		}
	}
	if _, found, err := store.TakeOver(ctx, "missing", dead, "b 10.0.0.2:8080"); err != nil || found {
		t.Fatalf("TakeOver of a missing record = %v, %v; want not found, nothing created", found, err)
	}
	if _, found, _ := store.Owner(ctx, "missing"); found {
		t.Fatal("TakeOver created a record")
	}
}

// A key's queue has no record until the first instance claims it: that
// instance owns it, a later claim learns it, and only the owner's claim
// extends the record's life.
func TestRedisClaimOwnerHasOneWinnerAndOnlyTheOwnerExtendsTheRecord(t *testing.T) {
	addr := redistest.Start(t)
	eng := enginetest.Load(t, nil, "redis", map[string]any{"address": []string{addr}}).(*Engine)
	ctx := context.Background()
	key := "k1"
	if owner, err := eng.ClaimOwner(ctx, key, "a 10.0.0.1:8080", time.Minute); err != nil || owner != "a 10.0.0.1:8080" {
		t.Fatalf("first claim = %q, %v", owner, err)
	}
	if owner, err := eng.ClaimOwner(ctx, key, "b 10.0.0.2:8080", time.Hour); err != nil || owner != "a 10.0.0.1:8080" {
		t.Fatalf("second claim = %q, %v; want the first claimer", owner, err)
	}
	ttl := eng.client.PTTL(ctx, eng.KeyPrefix+key).Val()
	if ttl <= 0 || ttl > time.Minute {
		t.Fatalf("record lives %v after another instance's claim, want at most the owner's minute", ttl)
	}
	if _, err := eng.ClaimOwner(ctx, key, "a 10.0.0.1:8080", time.Hour); err != nil {
		t.Fatal(err)
	}
	if ttl := eng.client.PTTL(ctx, eng.KeyPrefix+key).Val(); ttl <= time.Minute {
		t.Fatalf("record lives %v after its owner's claim for an hour", ttl)
	}
	if rec, found, err := eng.Lookup(ctx, key); err != nil || !found || rec.Owner != "a 10.0.0.1:8080" {
		t.Fatalf("Lookup = %+v, %v, %v", rec, found, err)
	}
}

// An owner's exchange marks the record while it runs: the mark is read
// back for as long as it was given, cleared by the instance that made it,
// kept fresh by the old owner after a takeover (its exchange still runs),
// refused to anyone else, and never creates a record.
func TestRedisRunningMarkOutlastsATakeOverAndIsClearedByItsMaker(t *testing.T) {
	addr := redistest.Start(t)
	eng := enginetest.Load(t, nil, "redis", map[string]any{"address": []string{addr}}).(*Engine)
	store := enginetest.NewAdapter(eng, time.Hour, zap.NewNop())
	ctx := context.Background()
	const old, next, other = "old 10.0.0.1:8080", "next 10.0.0.2:8080", "other 10.0.0.3:8080"
	if err := store.CreatedOwned(ctx, "s", time.Now().Add(time.Minute), old); err != nil {
		t.Fatal(err)
	}
	runningFor := func(want string) time.Duration {
		t.Helper()
		d, err := store.RunningFor(ctx, "s")
		if err != nil {
			t.Fatal(err)
		}
		if (d > 0) != (want == "marked") {
			t.Fatalf("RunningFor = %v, want %s", d, want)
		}
		return d
	}
	runningFor("none")
	if err := store.MarkRunning(ctx, "s", old, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if d := runningFor("marked"); d > 5*time.Second || d < 4*time.Second {
		t.Fatalf("RunningFor = %v just after a 5 s mark", d)
	}
	if _, _, err := store.TakeOver(ctx, "s", old, next); err != nil {
		t.Fatal(err)
	}
	if err := store.MarkRunning(ctx, "s", old, 5*time.Second); err != nil { // refreshed by its maker
		t.Fatal(err)
	}
	runningFor("marked")
	if err := store.MarkRunning(ctx, "s", other, 0); err != nil { // not its mark
		t.Fatal(err)
	}
	runningFor("marked")
	if err := store.MarkRunning(ctx, "s", old, 0); err != nil {
		t.Fatal(err)
	}
	runningFor("none")
	if err := store.MarkRunning(ctx, "s", other, 5*time.Second); err != nil { // neither owner nor maker
		t.Fatal(err)
	}
	runningFor("none")
	// A mark nobody refreshes lapses on Redis' clock: read back at once
	// (a stalled machine has 2 s to get there), at most as long as it was
	// given, then gone once that is over.
	const life = 2 * time.Second
	if err := store.MarkRunning(ctx, "s", next, life); err != nil {
		t.Fatal(err)
	}
	left := runningFor("marked")
	if left > life {
		t.Fatalf("RunningFor = %v just after a %v mark", left, life)
	}
	time.Sleep(left)
	wait.Until(t, "the mark to lapse", func() bool {
		d, err := store.RunningFor(ctx, "s")
		if err != nil {
			t.Fatal(err)
		}
		return d == 0
	})

	if err := store.MarkRunning(ctx, "missing", old, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if n, err := eng.client.Exists(ctx, eng.KeyPrefix+serializer.StoreKey("missing")).Result(); err != nil || n != 0 {
		t.Fatalf("a mark on a missing record created it (exists %d, %v)", n, err)
	}
}

// An instance's lease stands while it renews it, on Redis' clock, and is
// listed with its address; a renewal names the address it stood at (that
// another instance renewed it shows there). Unrenewed, it lapses and is
// listed as lapsed, and its next renewal answers a higher epoch and no
// address; a dropped lease is listed as dropped.
func TestRedisLeasesStandWhileRenewedAndLapseOtherwise(t *testing.T) {
	addr := redistest.Start(t)
	eng := enginetest.Load(t, nil, "redis", map[string]any{"address": []string{addr}}).(*Engine)
	store := enginetest.NewAdapter(eng, time.Hour, zap.NewNop())
	ctx := context.Background()
	for i, holder := range []string{"", "10.0.0.1:8080"} {
		if r, err := store.Renew(ctx, "aaaa", "10.0.0.1:8080", time.Hour); err != nil || r.Epoch != 1 || r.Existed != (i == 1) || r.Holder != holder {
			t.Fatalf("Renew %d = %+v, %v; want epoch 1, there before (at %q) only the second time", i, r, err, holder)
		}
	}
	if r, err := store.Renew(ctx, "aaaa", "10.0.0.9:8080", time.Hour); err != nil || r.Holder != "10.0.0.1:8080" {
		t.Fatalf("Renew from another address = %+v, %v; want it to name 10.0.0.1:8080", r, err)
	}
	if _, err := store.Renew(ctx, "aaaa", "10.0.0.1:8080", time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Renew(ctx, "bbbb", "10.0.0.2:8080", 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	members, err := store.Members(ctx)
	if err != nil || members["aaaa"].Addr != "10.0.0.1:8080" || members["aaaa"].Lapsed != 0 {
		t.Fatalf("Members = %v, %v", members, err)
	}
	wait.Until(t, "the unrenewed lease lapsed", func() bool {
		m, err := store.Members(ctx)
		return err == nil && m["bbbb"].Lapsed > 0 && m["aaaa"].Lapsed == 0
	})
	if r, err := store.Renew(ctx, "bbbb", "10.0.0.2:8080", time.Hour); err != nil || r.Epoch != 2 || r.Holder != "" {
		t.Fatalf("Renew after the lapse = %+v, %v; want epoch 2, no address", r, err)
	}
	if err := store.Drop(ctx, "aaaa", time.Minute); err != nil {
		t.Fatal(err)
	}
	m, err := store.Members(ctx)
	if err != nil || !m["aaaa"].Dropped || m["bbbb"].Lapsed != 0 {
		t.Fatalf("Members after a drop = %v, %v; want aaaa dropped, bbbb standing", m, err)
	}
	if r, err := store.Renew(ctx, "aaaa", "10.0.0.1:8080", time.Hour); err != nil || !r.Existed || r.Epoch != 2 || r.Holder != "" {
		t.Fatalf("Renew after a drop = %+v, %v; want epoch 2, no address", r, err)
	}
}

// A key claimed for a short while (30 s until the upstream answers one of
// its requests) lives as long as its owner's exchange is marked running:
// a first exchange longer than the claim keeps its owner.
func TestRedisRunningMarkKeepsAShortClaimAlive(t *testing.T) {
	addr := redistest.Start(t)
	eng := enginetest.Load(t, nil, "redis", map[string]any{"address": []string{addr}}).(*Engine)
	ctx := context.Background()
	const key, me = "key k", "a 10.0.0.1:8080"
	if _, err := eng.ClaimOwner(ctx, key, me, time.Second); err != nil {
		t.Fatal(err)
	}
	if err := eng.MarkRunning(ctx, key, me, time.Hour); err != nil {
		t.Fatal(err)
	}
	if ttl := eng.client.PTTL(ctx, eng.KeyPrefix+key).Val(); ttl <= time.Minute {
		t.Fatalf("a 1 s claim marked running for an hour lives %v", ttl)
	}
	if err := eng.MarkRunning(ctx, key, me, time.Second); err != nil {
		t.Fatal(err)
	}
	if ttl := eng.client.PTTL(ctx, eng.KeyPrefix+key).Val(); ttl <= time.Minute {
		t.Fatalf("a shorter mark shortened the record's life to %v", ttl)
	}
}

// A takeover from an owner whose lease stands on Redis' clock is refused,
// whatever the instance asking saw in its last listing: the owner may
// have renewed since (it was paused, and woke). Once the lease is gone,
// the takeover goes through.
func TestRedisTakeOverFromAnOwnerWhoseLeaseStandsIsRefused(t *testing.T) {
	addr := redistest.Start(t)
	eng := enginetest.Load(t, nil, "redis", map[string]any{"address": []string{addr}}).(*Engine)
	ctx := context.Background()
	const a, b = "aaaaaaaaaaaaaaaa 10.0.0.1:8080", "bbbbbbbbbbbbbbbb 10.0.0.2:8080"
	if _, err := eng.ClaimOwner(ctx, "s", a, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.RenewLease(ctx, "aaaaaaaaaaaaaaaa", "10.0.0.1:8080", time.Hour); err != nil {
		t.Fatal(err)
	}
	if owner, found, err := eng.TakeOver(ctx, "s", a, b); err != nil || !found || owner != a {
		t.Fatalf("TakeOver from an owner whose lease stands = %q, %v, %v; want refused, %q", owner, found, err, a)
	}
	if owner, _, err := eng.TakeOver(ctx, "s", a, a); err != nil || owner != a {
		t.Fatalf("the owner's own read-and-keep = %q, %v", owner, err)
	}
	if err := eng.DropLease(ctx, "aaaaaaaaaaaaaaaa", time.Minute); err != nil {
		t.Fatal(err)
	}
	if owner, _, err := eng.TakeOver(ctx, "s", a, b); err != nil || owner != b {
		t.Fatalf("TakeOver once the owner's lease is gone = %q, %v; want %q", owner, err, b)
	}
}
