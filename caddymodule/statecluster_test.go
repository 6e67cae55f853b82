package caddymodule

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// The Redis script keeps a session's ticket line exactly as
// serializer.TicketLine does: the same answers to a long random run of
// takes, claims, renewals and releases, with leases and claim windows
// running out along the way.
func TestRedisTicketLineFollowsTheSerializersRules(t *testing.T) {
	eng := loadEngine(t, nil, "redis", map[string]any{"address": []string{startRedis(t)}}).(*RedisState)
	ctx := context.Background()
	const lease, claim = 500 * time.Millisecond, 100 * time.Millisecond
	for seed := range uint64(5) {
		rng := rand.New(rand.NewPCG(seed, 42))
		key := fmt.Sprintf("line-%d", seed)
		var line serializer.TicketLine
		now := time.UnixMilli(1_700_000_000_000)
		var tickets []int64
		pick := func() int64 {
			if len(tickets) == 0 || rng.IntN(10) == 0 {
				return rng.Int64N(20) // unknown or stale tickets too
			}
			return tickets[rng.IntN(len(tickets))]
		}
		for step := range 400 {
			now = now.Add(time.Duration(rng.IntN(150)) * time.Millisecond)
			var want, got string
			switch op := rng.IntN(4); op {
			case 0:
				n, st := line.Take(now, lease, claim)
				tickets = append(tickets, n)
				rn, rst, err := eng.takeAt(ctx, key, lease, claim, now)
				if err != nil {
					t.Fatal(err)
				}
				want, got = fmt.Sprint("take ", n, st), fmt.Sprint("take ", rn, rst)
			case 1:
				ticket := pick()
				st := line.Claim(ticket, now, lease, claim)
				rst, err := eng.claimAt(ctx, key, ticket, lease, claim, now)
				if err != nil {
					t.Fatal(err)
				}
				want, got = fmt.Sprint("claim ", ticket, st), fmt.Sprint("claim ", ticket, rst)
			case 2:
				ticket := pick()
				ok := line.Renew(ticket, now, lease)
				rok, err := eng.renewAt(ctx, key, ticket, lease, now)
				if err != nil {
					t.Fatal(err)
				}
				want, got = fmt.Sprint("renew ", ticket, ok), fmt.Sprint("renew ", ticket, rok)
			case 3:
				ticket := pick()
				on := line.Release(ticket, now, claim)
				ron, err := eng.releaseAt(ctx, key, ticket, claim, now)
				if err != nil {
					t.Fatal(err)
				}
				want, got = fmt.Sprint("release ", ticket, on), fmt.Sprint("release ", ticket, ron)
			}
			if want != got {
				t.Fatalf("seed %d step %d: redis %q, serializer %q (line %+v)", seed, step, got, want, line)
			}
		}
	}
}

func TestRedisAnnouncesHandOnsAndOpenedGates(t *testing.T) {
	eng := loadEngine(t, nil, "redis", map[string]any{"address": []string{startRedis(t)}}).(*RedisState)
	heard := make(chan string, 4)
	stop := eng.Watch(func(key string) { heard <- key })
	defer stop()
	ctx := context.Background()
	expect := func(want string) {
		t.Helper()
		select {
		case key := <-heard:
			if key != want {
				t.Fatalf("announced %q, want %q", key, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("nothing announced for %q", want)
		}
	}
	// The subscription may still be starting: announce until it is heard.
	deadline := time.Now().Add(5 * time.Second)
	for len(heard) == 0 && time.Now().Before(deadline) {
		if err := eng.Announce(ctx, "ready"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for len(heard) > 0 {
		<-heard
	}
	first, _, _ := eng.TakeTicket(ctx, "k", time.Second, time.Second)
	second, st, _ := eng.TakeTicket(ctx, "k", time.Second, time.Second)
	if st != serializer.TicketWaiting {
		t.Fatalf("second ticket %d: %v, want waiting", second, st)
	}
	if err := eng.ReleaseTicket(ctx, "k", first, time.Second); err != nil {
		t.Fatal(err)
	}
	expect("k")
	if err := eng.ReleaseTicket(ctx, "k", second, time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case key := <-heard:
		t.Fatalf("announced %q for a hand-on nobody waits for", key)
	case <-time.After(50 * time.Millisecond):
	}
}

// What order cluster costs a request on an idle session: its ticket taken
// and handed on (two Redis round trips on loopback), against order local
// (no engine call), on one table.
func BenchmarkSessionRequestOnRedis(b *testing.B) {
	eng := loadEngine(b, nil, "redis", map[string]any{"address": []string{startRedis(b)}}).(*RedisState)
	for _, order := range []string{orderLocal, orderCluster} {
		b.Run("order="+order, func(b *testing.B) {
			shared := newSharedState(eng, time.Hour, zap.NewNop())
			cfg := serializer.Defaults()
			cfg.Store, cfg.StoreTimeout = shared, time.Second
			if order == orderCluster {
				cluster := newClusterState(shared, eng)
				cfg.Store, cfg.Turns = cluster, cluster
			}
			tab := serializer.NewTable(cfg)
			defer tab.Close()
			ctx := context.Background()
			turn, _ := tab.Acquire(ctx, "bench-"+order, 0) // the first sight's lookup
			turn.Done(200)
			b.ResetTimer()
			for range b.N {
				turn, err := tab.Acquire(ctx, "bench-"+order, 0)
				if err != nil {
					b.Fatal(err)
				}
				turn.Done(200)
			}
		})
	}
}
