package redisstate

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/enginetest"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/redistest"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/wait"
	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
	"github.com/mcpserializer/caddy-mcp-serializer/stateengine"
)

// The Redis script keeps a session's turn line exactly as
// serializer.TurnLine does: the same answers and the same line after a
// long random run of asks, claims, renewals and releases by a few tokens,
// with leases and claim windows running out along the way, and a line
// lost now and then.
func TestRedisTurnLineFollowsTheSerializersRules(t *testing.T) {
	eng := enginetest.Load(t, nil, "redis", map[string]any{"address": []string{redistest.Start(t)}}).(*Engine)
	ctx := context.Background()
	const lease, claim = 500 * time.Millisecond, 100 * time.Millisecond
	tokens := []string{"a.1", "a.2", "b.1", "b.2", "c.1"}
	for seed := range uint64(5) {
		rng := rand.New(rand.NewPCG(seed, 42))
		key := fmt.Sprintf("line-%d", seed)
		var line serializer.TurnLine
		now := time.UnixMilli(1_700_000_000_000)
		for step := range 400 {
			now = now.Add(time.Duration(rng.IntN(150)) * time.Millisecond)
			token := tokens[rng.IntN(len(tokens))]
			var want, got string
			switch op := rng.IntN(9); op {
			case 0, 1:
				age := time.Duration(rng.IntN(300)) * time.Millisecond
				st, first := line.Take(token, now.Add(-age), now, lease, claim)
				rst, rbehind, err := eng.takeAt(ctx, key, token, age, lease, claim, now)
				if err != nil {
					t.Fatal(err)
				}
				want, got = fmt.Sprint("take ", token, st, behindOf(now, first)), fmt.Sprint("take ", token, rst, rbehind)
			case 2, 3:
				st, first := line.Claim(token, now, lease, claim)
				rst, rbehind, err := eng.claimAt(ctx, key, token, 0, lease, claim, rng.IntN(2) == 0, now)
				if err != nil {
					t.Fatal(err)
				}
				want, got = fmt.Sprint("claim ", token, st, behindOf(now, first)), fmt.Sprint("claim ", token, rst, rbehind)
			case 4, 5:
				held, first := line.Renew(token, now, lease)
				rheld, rbehind, err := eng.renewAt(ctx, key, token, lease, now)
				if err != nil {
					t.Fatal(err)
				}
				want, got = fmt.Sprint("renew ", token, held, behindOf(now, first)), fmt.Sprint("renew ", token, rheld, rbehind)
			case 6, 7:
				on := line.Release(token, now, claim)
				ron, err := eng.releaseAt(ctx, key, token, claim, now)
				if err != nil {
					t.Fatal(err)
				}
				want, got = fmt.Sprint("release ", token, on), fmt.Sprint("release ", token, ron)
			case 8:
				if rng.IntN(4) == 0 { // the engine lost the line
					line = serializer.TurnLine{}
					if err := eng.client.Del(ctx, eng.KeyPrefix+key+":turn").Err(); err != nil {
						t.Fatal(err)
					}
				}
				continue
			}
			if want != got {
				t.Fatalf("seed %d step %d: redis %q, serializer %q (line %+v)", seed, step, got, want, line)
			}
			f, err := eng.client.HMGet(ctx, eng.KeyPrefix+key+":turn", "holder", "waiting").Result()
			if err != nil {
				t.Fatal(err)
			}
			var waiting []string
			for _, a := range line.Waiting {
				waiting = append(waiting, fmt.Sprintf("%s:%d", a.Token, a.Arrived.UnixMilli()))
			}
			if h, w := fmt.Sprint(f[0]), fmt.Sprint(f[1]); h != line.Holder || w != strings.Join(waiting, " ") {
				t.Fatalf("seed %d step %d: redis line holder %q waiting %q, serializer %+v", seed, step, h, w, line)
			}
		}
	}
}

// behindOf is what a TurnStore answers for a TurnLine's first arrival.
func behindOf(now, first time.Time) time.Duration {
	if first.IsZero() {
		return serializer.NobodyWaiting
	}
	return now.Sub(first)
}

func TestRedisAnnouncesAsksHandOnsAndOpenedGates(t *testing.T) {
	eng := enginetest.Load(t, nil, "redis", map[string]any{"address": []string{redistest.Start(t)}}).(*Engine)
	type heardMsg struct {
		key, asker string
		waited     time.Duration
	}
	heard := make(chan heardMsg, 8)
	stop := eng.Watch(func(key, asker string, waited time.Duration) { heard <- heardMsg{key, asker, waited} })
	defer stop()
	ctx := context.Background()
	expect := func(want heardMsg) {
		t.Helper()
		select {
		case m := <-heard:
			if m != want {
				t.Fatalf("announced %+v, want %+v", m, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("nothing announced, want %+v", want)
		}
	}
	wait.Until(t, "the subscription is confirmed", eng.Announcing)
	if _, _, err := eng.TakeTurn(ctx, "k", "first", 0, time.Second, time.Second); err != nil {
		t.Fatal(err)
	}
	if st, _, _ := eng.TakeTurn(ctx, "k", "second", 40*time.Millisecond, time.Second, time.Second); st != serializer.TurnWaiting {
		t.Fatalf("second ask: %v, want waiting", st)
	}
	expect(heardMsg{"k", "second", 40 * time.Millisecond})
	if err := eng.ReleaseTurn(ctx, "k", "first", time.Second); err != nil {
		t.Fatal(err)
	}
	expect(heardMsg{"k", "", 0})
	shared := enginetest.NewAdapter(eng, time.Hour, zap.NewNop())
	cluster := stateengine.NewCluster(shared, eng)
	if err := cluster.Created(ctx, "s", time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := cluster.Opened(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	expect(heardMsg{serializer.StoreKey("s"), "", 0})
	if err := eng.ReleaseTurn(ctx, "k", "second", time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-heard:
		t.Fatalf("announced %+v for a hand-on nobody waits for", m)
	case <-time.After(50 * time.Millisecond):
	}
}

// What order cluster costs a request on an idle session, against order
// local (no engine call): on the instance that holds the session's turn
// (a sticky front: no engine call either), and alternating between two
// instances (round robin: each request asks and the other hands on).
func BenchmarkSessionRequestOnRedis(b *testing.B) {
	eng := enginetest.Load(b, nil, "redis", map[string]any{"address": []string{redistest.Start(b)}}).(*Engine)
	newTable := func(b *testing.B, order string) *serializer.Table {
		if order == "cluster" {
			return clusterTables(b, eng, 1, zap.NewNop(), time.Second)[0]
		}
		cfg := serializer.Defaults()
		enginetest.NewAdapter(eng, time.Hour, zap.NewNop()).Configure(&cfg)
		cfg.StoreTimeout = time.Second
		tab := serializer.NewTable(cfg)
		b.Cleanup(tab.Close)
		return tab
	}
	for _, bench := range []struct {
		name      string
		order     string
		instances int
	}{
		{"order=local", "local", 1},
		{"order=cluster/sticky", "cluster", 1},
		{"order=cluster/round_robin", "cluster", 2},
	} {
		b.Run(bench.name, func(b *testing.B) {
			var tabs []*serializer.Table
			for range bench.instances {
				tabs = append(tabs, newTable(b, bench.order))
			}
			if bench.order == "cluster" {
				wait.Until(b, "the engine announcing", eng.Announcing)
			}
			ctx := context.Background()
			id := "bench-" + bench.name
			for _, tab := range tabs {
				turn, _ := tab.Acquire(ctx, id, 0) // the first sight's lookup
				turn.Done(200)
			}
			b.ResetTimer()
			for i := range b.N {
				turn, err := tabs[i%len(tabs)].Acquire(ctx, id, 0)
				if err != nil {
					b.Fatal(err)
				}
				turn.Done(200)
			}
		})
	}
}

// What a hand-on costs a three-master Redis Cluster: requests on 64
// sessions alternate between two instances, so every request asks and the
// other instance hands on. ns/op is a request's time (ask, hand-on heard,
// claim); per node: Redis CPU beyond what it spends idle, announcements carried over the cluster bus
// and bytes sent, per request. A PUBLISH goes to every node, and every
// instance's subscription sits on the node owning the channel's slot.
func BenchmarkTurnHandOnOnRedisCluster(b *testing.B) {
	addrs := redistest.StartCluster(b, 3)
	eng := enginetest.Load(b, nil, "redis", map[string]any{"address": []string{addrs[0]}, "cluster": true}).(*Engine)
	tabs := clusterTables(b, eng, 2, zap.NewNop(), time.Second)
	wait.Until(b, "the engine announcing", eng.Announcing)
	ctx := context.Background()
	ids := make([]string, 64)
	for i := range ids {
		ids[i] = fmt.Sprintf("bench-handon-%d", i)
		for _, tab := range tabs {
			turn, _ := tab.Acquire(ctx, ids[i], 0) // the first sight's lookup
			turn.Done(200)
		}
	}
	nodes := make([]*redis.Client, len(addrs))
	for i, addr := range addrs {
		nodes[i] = redis.NewClient(&redis.Options{Addr: addr})
		defer nodes[i].Close()
	}
	// A cluster's nodes spend CPU while idle (the bus's pings, cron): what
	// they spend in a second is taken off per second of the run.
	idle := make([]nodeLoad, len(nodes))
	for i, n := range nodes {
		idle[i] = readNodeLoad(b, n)
	}
	time.Sleep(time.Second)
	before := make([]nodeLoad, len(nodes))
	for i, n := range nodes {
		before[i] = readNodeLoad(b, n)
		idle[i] = before[i].minus(idle[i])
	}
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		turn, err := tabs[i%2].Acquire(ctx, ids[(i/2)%len(ids)], 0)
		if err != nil {
			b.Fatal(err)
		}
		turn.Done(200)
	}
	b.StopTimer()
	elapsed := time.Since(start)
	n := float64(b.N)
	var published int64
	for i, node := range nodes {
		d := readNodeLoad(b, node).minus(before[i])
		published += d.publishes
		busy := d.cpu - time.Duration(float64(idle[i].cpu)*elapsed.Seconds())
		b.ReportMetric(busy.Seconds()*1e6/n, fmt.Sprintf("node%d-cpu-µs/op", i+1))
		b.ReportMetric(float64(d.busPublishes)/n, fmt.Sprintf("node%d-bus-announcements/op", i+1))
		b.ReportMetric(float64(d.sent)/n, fmt.Sprintf("node%d-sent-B/op", i+1))
	}
	b.ReportMetric(float64(published)/n, "announcements/op")
}

// What one announcement costs a three-master Redis Cluster's nodes, as
// PUBLISH (what the module sends) and as SPUBLISH (sharded pub/sub) on a
// channel of the publishing node's slots, heard by a subscriber on that
// node: owner-cpu is the publishing node's, others-cpu the two other
// nodes' together. A PUBLISH is copied over the cluster bus to every node.
func BenchmarkAnnouncementOnRedisCluster(b *testing.B) {
	addrs := redistest.StartCluster(b, 3)
	ctx := context.Background()
	nodes := make([]*redis.Client, len(addrs))
	for i, addr := range addrs {
		nodes[i] = redis.NewClient(&redis.Options{Addr: addr})
		defer nodes[i].Close()
	}
	owner := nodes[0]
	var channel string // a channel in the first node's slots
	for i := 0; channel == ""; i++ {
		c := "mcp_serializer:changed:" + strconv.Itoa(i)
		if err := owner.Do(ctx, "SPUBLISH", c, "probe").Err(); err == nil {
			channel = c
		}
	}
	msg := "want mcp_serializer:" + strings.Repeat("0", 64) + " 0123456789abcdef.42 3"
	for _, bench := range []struct {
		name      string
		subscribe func() *redis.PubSub
		publish   func() error
	}{
		{"publish", func() *redis.PubSub { return owner.Subscribe(ctx, channel) },
			func() error { return owner.Publish(ctx, channel, msg).Err() }},
		{"spublish", func() *redis.PubSub { return owner.SSubscribe(ctx, channel) },
			func() error { return owner.SPublish(ctx, channel, msg).Err() }},
	} {
		b.Run(bench.name, func(b *testing.B) {
			sub := bench.subscribe()
			defer sub.Close()
			if _, err := sub.Receive(ctx); err != nil {
				b.Fatal(err)
			}
			go func() {
				for range sub.Channel() {
				}
			}()
			before := make([]nodeLoad, len(nodes))
			for i, n := range nodes {
				before[i] = readNodeLoad(b, n)
			}
			b.ResetTimer()
			for range b.N {
				if err := bench.publish(); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			var others time.Duration
			for i, n := range nodes[1:] {
				others += readNodeLoad(b, n).minus(before[i+1]).cpu
			}
			n := float64(b.N)
			b.ReportMetric(readNodeLoad(b, owner).minus(before[0]).cpu.Seconds()*1e6/n, "owner-cpu-µs/op")
			b.ReportMetric(others.Seconds()*1e6/n, "others-cpu-µs/op")
		})
	}
}

// nodeLoad is what a Redis node has done so far: its CPU, the
// announcements it published and those it received over the cluster bus,
// and the bytes it sent to clients.
type nodeLoad struct {
	cpu          time.Duration
	publishes    int64
	busPublishes int64
	sent         int64
}

func (a nodeLoad) minus(b nodeLoad) nodeLoad {
	return nodeLoad{a.cpu - b.cpu, a.publishes - b.publishes, a.busPublishes - b.busPublishes, a.sent - b.sent}
}

func readNodeLoad(t testing.TB, c *redis.Client) nodeLoad {
	t.Helper()
	ctx := context.Background()
	info, err := c.Info(ctx, "cpu", "stats", "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	bus, err := c.ClusterInfo(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	var load nodeLoad
	for _, line := range strings.Split(info+"\n"+bus, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		switch k {
		case "used_cpu_sys", "used_cpu_user":
			sec, _ := strconv.ParseFloat(v, 64)
			load.cpu += time.Duration(sec * float64(time.Second))
		case "cluster_stats_messages_publish_received":
			load.busPublishes, _ = strconv.ParseInt(v, 10, 64)
		case "cmdstat_publish": // calls=N,usec=…
			calls, _, _ := strings.Cut(strings.TrimPrefix(v, "calls="), ",")
			load.publishes, _ = strconv.ParseInt(calls, 10, 64)
		case "total_net_output_bytes":
			load.sent, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return load
}

// Redis 7 and Valkey give a new ACL user no channel (acl-pubsub-default
// resetchannels). Such a user's turns still move between instances by
// reading, each at once rather than when a lease runs out, and the
// refusal is logged once, with the ACL line that grants the channel.
func TestClusterTurnsMoveWithoutChannelRights(t *testing.T) {
	addr := redistest.Start(t)
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	if err := admin.Do(ctx, "ACL", "SETUSER", "mcp", "on", ">pw", "resetchannels", "~mcp_serializer:*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	eng := enginetest.Load(t, nil, "redis", map[string]any{"address": []string{addr}, "username": "mcp", "password": "pw", "timeout": "1s"}).(*Engine)
	core, logs := observer.New(zap.WarnLevel)
	eng.logger = zap.New(core)
	tabs := clusterTables(t, eng, 2, zap.NewNop(), 0)
	wait.Until(t, "the refused subscription is logged", func() bool { return logs.Len() > 0 })
	for i := range 20 { // round robin
		actx, cancel := context.WithTimeout(ctx, serializer.TurnLease/2)
		turn, err := tabs[i%2].Acquire(actx, "s", 0)
		cancel()
		if err != nil {
			t.Fatalf("request %d: %v (waited for a lease to run out?)", i, err)
		}
		if !turn.Clustered() {
			t.Fatalf("request %d went without the cluster turn", i)
		}
		turn.Done(200)
	}
	// A request that asks while another instance's exchange runs waits in
	// line (its announcement refused), and is handed the turn at its end.
	for i := range 5 {
		held, err := tabs[0].Acquire(ctx, "s", 0)
		if err != nil || !held.Clustered() {
			t.Fatalf("holder %d: err=%v clustered=%v", i, err, held.Clustered())
		}
		asked := make(chan serializer.Turn, 1)
		go func() {
			actx, cancel := context.WithTimeout(ctx, serializer.TurnLease/2)
			defer cancel()
			turn, err := tabs[1].Acquire(actx, "s", 0)
			if err != nil {
				t.Errorf("asker %d: %v", i, err)
			}
			asked <- turn
		}()
		time.Sleep(20 * time.Millisecond) // it asks, and waits
		held.Done(200)
		turn := <-asked
		if !turn.Clustered() {
			t.Fatalf("asker %d went without the cluster turn", i)
		}
		turn.Done(200)
	}
	if eng.Announcing() {
		t.Fatal("the engine says its announcements work")
	}
	warns := logs.FilterMessageSnippet("refuses this user the announcement channel").All()
	if len(warns) != 1 {
		t.Fatalf("%d WARNs about the channel, want 1: %v", len(warns), logs.All())
	}
	if acl := warns[0].ContextMap()["acl"]; acl != "ACL SETUSER <user> &mcp_serializer:changed" {
		t.Fatalf("WARN gives the ACL line %q", acl)
	}
	if n := logs.Len(); n != 1 {
		t.Fatalf("%d WARNs, want only the channel's: %v", n, logs.All())
	}
}

// leastPrivilegeACL is the rule docs/several-instances.md gives for the module's Redis
// user with the default key_prefix: its keys, its channel, and the
// commands its scripts and calls use, nothing else.
const leastPrivilegeACL = "resetkeys ~mcp_serializer:* resetchannels &mcp_serializer:changed -@all +@connection +eval +evalsha +hmget +hget +hset +exists +pexpire +del +time +publish +subscribe"

// The whole engine runs as a user with exactly leastPrivilegeACL: records,
// turns and announcements, with no call refused.
func TestRedisEngineRunsAsTheLeastPrivilegedUser(t *testing.T) {
	addr := redistest.Start(t)
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	args := []any{"ACL", "SETUSER", "mcp", "on", ">pw"}
	for _, rule := range strings.Fields(leastPrivilegeACL) {
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

	eng := load(t, "mcp_serializer:") // the default, whose channel the rule names
	core, logs := observer.New(zap.WarnLevel)
	eng.logger = zap.New(core)
	tabs := clusterTables(t, eng, 2, zap.New(core), 0)
	wait.Until(t, "the subscription is confirmed", eng.Announcing)
	initialize, _ := tabs[0].Begin("s", nil)
	initialize.Done(200)
	for i, traits := range []serializer.Traits{serializer.CarriesInitialized, 0, 0, 0, serializer.EndsSession} {
		turn, err := tabs[i%2].Acquire(ctx, "s", traits)
		if err != nil || !turn.Clustered() {
			t.Fatalf("request %d: err=%v clustered=%v", i, err, turn.Clustered())
		}
		turn.Done(200)
	}
	held, _ := tabs[0].Acquire(ctx, "k", 0)
	asked := make(chan serializer.Turn, 1)
	go func() {
		turn, _ := tabs[1].Acquire(ctx, "k", 0)
		asked <- turn
	}()
	time.Sleep(20 * time.Millisecond)
	held.Done(200)
	(<-asked).Done(200)

	if !eng.Announcing() {
		t.Fatal("announcements refused to the least privileged user")
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

// clusterTables makes n tables on eng with order cluster, as n instances
// would, their failures logged to logger; storeTimeout, unless 0, bounds
// each engine call instead of the engine's own timeout.
func clusterTables(t testing.TB, eng *Engine, n int, logger *zap.Logger, storeTimeout time.Duration) []*serializer.Table {
	var tabs []*serializer.Table
	for range n {
		cfg := serializer.Defaults()
		stateengine.NewCluster(enginetest.NewAdapter(eng, time.Hour, logger), eng).Configure(&cfg)
		if storeTimeout > 0 {
			cfg.StoreTimeout = storeTimeout
		}
		tab := serializer.NewTable(cfg)
		t.Cleanup(tab.Close)
		tabs = append(tabs, tab)
	}
	return tabs
}
