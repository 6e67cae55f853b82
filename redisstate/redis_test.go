package redisstate

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/enginetest"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/redistest"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/testnet"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/wait"
	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
	"github.com/mcpserializer/caddy-mcp-serializer/stateengine"
)

func TestRedisStateConformance(t *testing.T) {
	addr := redistest.Start(t)
	n := 0
	enginetest.Conformance(t, func(t *testing.T, ttl time.Duration) enginetest.Under {
		n++ // a prefix per engine keeps the subtests apart
		eng := enginetest.Load(t, nil, "redis", map[string]any{
			"address": []string{addr}, "key_prefix": "conformance" + strconv.Itoa(n) + ":",
		}).(*Engine)
		return under(eng, ttl, eng.client)
	})
}

// under is eng as Conformance runs it. Redis keeps its own clock: time
// passes for real, and a record's expiry is read there, through expiries
// (a client allowed PEXPIRETIME).
func under(eng *Engine, ttl time.Duration, expiries redis.Cmdable) enginetest.Under {
	return enginetest.Under{
		Store:   enginetest.NewAdapter(eng, ttl, zap.NewNop()),
		Advance: time.Sleep,
		Expiry: func(t *testing.T, id string) time.Time {
			t.Helper()
			at, err := expiries.PExpireTime(context.Background(), eng.KeyPrefix+serializer.StoreKey(id)).Result()
			if err != nil || at < 0 {
				t.Fatalf("PEXPIRETIME of the record of %s: %v, %v", id, at, err)
			}
			return time.UnixMilli(at.Milliseconds())
		},
	}
}

// Several addresses make a cluster client: here a one-node Redis Cluster,
// with a second seed that is down.
func TestRedisClusterStateConformance(t *testing.T) {
	port := testnet.FreePort(t)
	addr, _ := redistest.Run(t, port, "--port", strconv.Itoa(port), "--cluster-enabled", "yes",
		"--cluster-config-file", filepath.Join(t.TempDir(), "nodes.conf"))
	node := redis.NewClient(&redis.Options{Addr: addr})
	defer node.Close()
	ctx := context.Background()
	if err := node.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 16383).Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := node.ClusterInfo(ctx).Result()
		if err == nil && strings.Contains(info, "cluster_state:ok") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("one-node cluster not ok after 10s: %v %s", err, info)
		}
		time.Sleep(20 * time.Millisecond)
	}
	down := "127.0.0.1:" + strconv.Itoa(testnet.FreePort(t))
	n := 0
	enginetest.Conformance(t, func(t *testing.T, ttl time.Duration) enginetest.Under {
		n++
		eng := enginetest.Load(t, nil, "redis", map[string]any{
			"address": []string{addr, down}, "key_prefix": "cluster" + strconv.Itoa(n) + ":",
		}).(*Engine)
		if _, ok := eng.client.(*redis.ClusterClient); !ok {
			t.Fatalf("two addresses made a %T, want a cluster client", eng.client)
		}
		return under(eng, ttl, eng.client)
	})
}

// A managed cluster hands out one address (its configuration endpoint):
// with cluster, that one address makes a cluster client, which follows
// the other masters' MOVED, here on a three-master Redis Cluster; the
// session records and their owners work as on one server.
func TestRedisClusterBehindOneAddress(t *testing.T) {
	addrs := redistest.StartCluster(t, 3)
	n := 0
	enginetest.Conformance(t, func(t *testing.T, ttl time.Duration) enginetest.Under {
		n++
		eng := enginetest.Load(t, nil, "redis", map[string]any{
			"address": []string{addrs[0]}, "cluster": true, "key_prefix": "one" + strconv.Itoa(n) + ":",
		}).(*Engine)
		if _, ok := eng.client.(*redis.ClusterClient); !ok {
			t.Fatalf("cluster made a %T, want a cluster client", eng.client)
		}
		return under(eng, ttl, eng.client)
	})

	ctx := context.Background()
	eng := enginetest.Load(t, nil, "redis", map[string]any{"address": []string{addrs[0]}, "cluster": true}).(*Engine)
	for i := range 20 { // keys in every master's slots
		key := serializer.StoreKey(strconv.Itoa(i))
		if owner, err := eng.ClaimOwner(ctx, key, "a", time.Minute); err != nil || owner != "a" {
			t.Fatalf("claim %d: %q, %v", i, owner, err)
		}
		if err := eng.Forget(ctx, key); err != nil {
			t.Fatalf("forget %d: %v", i, err)
		}
	}

	// Without cluster, the one address is a plain client: the keys of
	// the other masters' slots meet MOVED.
	plain := enginetest.Load(t, nil, "redis", map[string]any{"address": []string{addrs[0]}}).(*Engine)
	moved := 0
	for i := range 20 {
		if _, _, err := plain.Lookup(ctx, serializer.StoreKey(strconv.Itoa(i))); redis.HasErrorPrefix(err, "MOVED") {
			moved++
		}
	}
	if moved == 0 {
		t.Fatal("a plain client on one master of three never met MOVED")
	}
}

// Through Sentinel the module finds the master by its name, and follows a
// failover: the master killed, the sentinel promotes its replica, and the
// records written before (replicated) and after are there.
func TestRedisThroughSentinelFollowsAFailover(t *testing.T) {
	masterPort, replicaPort := testnet.FreePort(t), testnet.FreePort(t)
	master, stopMaster := redistest.Run(t, masterPort, "--port", strconv.Itoa(masterPort))
	replica, _ := redistest.Run(t, replicaPort, "--port", strconv.Itoa(replicaPort), "--replicaof", "127.0.0.1", strconv.Itoa(masterPort))
	sentinel := redistest.RunSentinel(t, "mymaster", master)
	ctx := context.Background()
	onReplica := redis.NewClient(&redis.Options{Addr: replica})
	defer onReplica.Close()
	// The replica's first sync ends some seconds after it connects (Redis
	// delays a diskless sync for more replicas to join): until then no
	// write reaches it, however long WAIT waits.
	wait.Until(t, "the replica in sync with the master", func() bool {
		info, err := onReplica.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	eng := enginetest.Load(t, nil, "redis", map[string]any{
		"sentinel": []string{sentinel}, "master_name": "mymaster", "timeout": "1s",
	}).(*Engine)
	if _, ok := eng.client.(*redis.Client); !ok {
		t.Fatalf("sentinel made a %T, want a failover client", eng.client)
	}
	store := enginetest.NewAdapter(eng, time.Hour, zap.NewNop())
	if err := store.Created(ctx, "before", time.Now().Add(time.Minute)); err != nil {
		t.Fatalf("Created through sentinel: %v", err)
	}
	direct := redis.NewClient(&redis.Options{Addr: master})
	defer direct.Close()
	if n, err := direct.Do(ctx, "WAIT", 1, 5000).Int(); err != nil || n != 1 {
		t.Fatalf("the replica did not take the write: %d, %v", n, err)
	}

	stopMaster()
	deadline := time.Now().Add(30 * time.Second)
	for store.Created(ctx, "after", time.Now().Add(time.Minute)) != nil {
		if time.Now().After(deadline) {
			t.Fatal("no write succeeded within 30s of the master's death")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if role, err := onReplica.Do(ctx, "ROLE").Slice(); err != nil || role[0] != "master" {
		t.Fatalf("the replica's role after the failover: %v, %v", role, err)
	}
	// Calls may fail for a moment more, on connections dialled to the old
	// master before the switch; each failure is counted, none waits.
	for _, id := range []string{"before", "after"} {
		deadline := time.Now().Add(5 * time.Second)
		for {
			_, found, err := store.Lookup(ctx, id)
			if err == nil && found {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("Lookup %q 5s after the failover = %v, %v", id, found, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func TestRedisKeysAreHashesOfTheSessionID(t *testing.T) {
	addr := redistest.Start(t)
	eng := enginetest.Load(t, nil, "redis", map[string]any{"address": []string{addr}}).(*Engine)
	store := enginetest.NewAdapter(eng, time.Hour, zap.NewNop())
	const id = "secret-session-id"
	if err := store.Created(context.Background(), id, time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	keys, err := eng.client.Keys(context.Background(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	want := "mcp_serializer:" + serializer.StoreKey(id)
	if len(keys) != 1 || keys[0] != want {
		t.Fatalf("keys = %q, want [%q]", keys, want)
	}
}

func TestRedisPasswordFromEnvironmentPlaceholder(t *testing.T) {
	const password = "s3cret-for-test"
	addr := redistest.Start(t, "--requirepass", password)
	t.Setenv("MCP_SERIALIZER_TEST_REDIS_PASSWORD", password)
	eng := enginetest.Load(t, nil, "redis", map[string]any{
		"address": []string{addr}, "password": "{env.MCP_SERIALIZER_TEST_REDIS_PASSWORD}",
	}).(*Engine)
	store := enginetest.NewAdapter(eng, time.Hour, zap.NewNop())
	ctx := context.Background()
	if err := store.Created(ctx, "s", time.Now().Add(time.Minute)); err != nil {
		t.Fatalf("Created with the password from the environment: %v", err)
	}
	if _, found, err := store.Lookup(ctx, "s"); err != nil || !found {
		t.Fatalf("Lookup = %v, %v; want found", found, err)
	}

	wrong := enginetest.Load(t, nil, "redis", map[string]any{"address": []string{addr}, "password": "wrong"}).(*Engine)
	before := testutil.ToFloat64(enginetest.Errors.WithLabelValues("lookup"))
	if _, _, err := enginetest.NewAdapter(wrong, time.Hour, zap.NewNop()).Lookup(ctx, "s"); err == nil {
		t.Fatal("Lookup with a wrong password succeeded")
	}
	if got := testutil.ToFloat64(enginetest.Errors.WithLabelValues("lookup")); got != before+1 {
		t.Fatalf("state_errors_total{op=lookup} went from %v to %v, want one more", before, got)
	}
}

// An engine that is down (nothing listens) or blackholed (accepts and
// never answers) costs each call its timeout at most, and every failure
// is counted.
func TestRedisClientIsSharedAcrossReloads(t *testing.T) {
	addr := redistest.Start(t)
	parent := enginetest.FileStorage(t.TempDir())
	load := func() (*Engine, context.CancelFunc) {
		ctx, cancel := caddy.NewContext(*parent)
		mod, err := ctx.LoadModuleByID("http.handlers.mcp_serializer.state.redis",
			json.RawMessage(`{"address": ["`+addr+`"]}`))
		if err != nil {
			t.Fatal(err)
		}
		return mod.(*Engine), cancel
	}
	old, unloadOld := load()
	current, unloadCurrent := load() // the reloaded config, provisioned before the old one goes
	defer unloadCurrent()
	if old.client != current.client {
		t.Fatal("a config with the same connection settings got a client of its own")
	}
	unloadOld()
	store := enginetest.NewAdapter(current, time.Hour, zap.NewNop())
	if err := store.Created(context.Background(), "s", time.Now().Add(time.Minute)); err != nil {
		t.Fatalf("the client closed with the old config: %v", err)
	}
}

func TestRedisOverTLS(t *testing.T) {
	addr, caFile, _, _ := redistest.StartTLS(t, "no")
	ctx := context.Background()
	eng := enginetest.Load(t, nil, "redis", map[string]any{
		"address": []string{addr}, "tls_ca_file": caFile, "tls_server_name": "redis.test",
	}).(*Engine)
	wantRoundTrip(t, enginetest.NewAdapter(eng, time.Hour, zap.NewNop()))

	// Without the CA, the server's certificate is refused.
	untrusted := enginetest.Load(t, nil, "redis", map[string]any{
		"address": []string{addr}, "tls": true, "tls_server_name": "redis.test",
	}).(*Engine)
	if _, _, err := enginetest.NewAdapter(untrusted, time.Hour, zap.NewNop()).Lookup(ctx, "s"); err == nil {
		t.Fatal("a certificate from an unknown CA was accepted")
	}
}

// wantRoundTrip writes a record through store and reads it back.
func wantRoundTrip(t *testing.T, store *stateengine.Adapter) {
	t.Helper()
	ctx := context.Background()
	if err := store.Created(ctx, "s", time.Now().Add(time.Minute)); err != nil {
		t.Fatalf("Created: %v", err)
	}
	if _, found, err := store.Lookup(ctx, "s"); err != nil || !found {
		t.Fatalf("Lookup = %v, %v", found, err)
	}
}

// A server that requires client certificates (mutual TLS) serves the
// module given tls_cert_file and tls_key_file, and refuses it without: the
// failures are counted and logged at WARN, once per interval.
func TestRedisWithClientCertificates(t *testing.T) {
	addr, caFile, certFile, keyFile := redistest.StartTLS(t, "yes")
	ctx := context.Background()
	eng := enginetest.Load(t, nil, "redis", map[string]any{
		"address": []string{addr}, "tls_ca_file": caFile, "tls_server_name": "redis.test",
		"tls_cert_file": certFile, "tls_key_file": keyFile,
	}).(*Engine)
	wantRoundTrip(t, enginetest.NewAdapter(eng, time.Hour, zap.NewNop()))

	without := enginetest.Load(t, nil, "redis", map[string]any{
		"address": []string{addr}, "tls_ca_file": caFile, "tls_server_name": "redis.test",
	}).(*Engine)
	core, logs := observer.New(zap.WarnLevel)
	refused := enginetest.NewAdapter(without, time.Hour, zap.New(core))
	counter := enginetest.Errors.WithLabelValues("lookup")
	before := testutil.ToFloat64(counter)
	for range 2 {
		if _, _, err := refused.Lookup(ctx, "s"); err == nil {
			t.Fatal("a server requiring a client certificate answered without one")
		}
	}
	if n := testutil.ToFloat64(counter) - before; n != 2 {
		t.Fatalf("%v failed lookups counted, want 2", n)
	}
	if n := logs.Len(); n != 1 {
		t.Fatalf("%d WARNs for two refused lookups, want 1", n)
	}
}

func TestRedisDownOrBlackholedAnswersWithinItsTimeout(t *testing.T) {
	blackhole, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { blackhole.Close() })
	var held sync.WaitGroup
	var conns []net.Conn
	var mu sync.Mutex
	held.Add(1)
	go func() {
		defer held.Done()
		for {
			c, err := blackhole.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // held open, never read
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		blackhole.Close()
		held.Wait()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})

	for name, addr := range map[string]string{
		"down":       "127.0.0.1:" + strconv.Itoa(testnet.FreePort(t)),
		"blackholed": blackhole.Addr().String(),
	} {
		t.Run(name, func(t *testing.T) {
			eng := enginetest.Load(t, nil, "redis", map[string]any{"address": []string{addr}, "timeout": "100ms"}).(*Engine)
			store := enginetest.NewAdapter(eng, time.Hour, zap.NewNop())
			ctx := context.Background()
			calls := []struct {
				op   string
				call func() error
			}{
				{"created", func() error { return store.Created(ctx, "s", time.Now().Add(time.Minute)) }},
				{"initialize_ended", func() error { return store.InitializeEnded(ctx, "s") }},
				{"opened", func() error { return store.Opened(ctx, "s") }},
				{"touch", func() error { return store.Touch(ctx, "s") }},
				{"forget", func() error { return store.Forget(ctx, "s") }},
				{"lookup", func() error { _, _, err := store.Lookup(ctx, "s"); return err }},
			}
			for _, c := range calls {
				before := testutil.ToFloat64(enginetest.Errors.WithLabelValues(c.op))
				start := time.Now()
				err := c.call()
				// A bound, not a measurement: far above the 100ms
				// timeout, far below go-redis' own 2s dial timeout.
				if took := time.Since(start); took > 1500*time.Millisecond {
					t.Errorf("%s waited %s on an engine with a 100ms timeout", c.op, took)
				}
				if err == nil {
					t.Errorf("%s succeeded against a %s engine", c.op, name)
				}
				if got := testutil.ToFloat64(enginetest.Errors.WithLabelValues(c.op)); got != before+1 {
					t.Errorf("state_errors_total{op=%s} went from %v to %v, want one more", c.op, before, got)
				}
			}
		})
	}
}

// Redis stopped: calls fail, counted; Redis back on the same address: the
// same engine works again, without a reload.
func TestRedisEngineRecoversWhenRedisComesBack(t *testing.T) {
	port := testnet.FreePort(t)
	args := []string{"--port", strconv.Itoa(port)}
	addr, stop := redistest.Run(t, port, args...)
	eng := enginetest.Load(t, nil, "redis", map[string]any{"address": []string{addr}, "timeout": "100ms"}).(*Engine)
	store := enginetest.NewAdapter(eng, time.Hour, zap.NewNop())
	ctx := context.Background()
	// The first call dials too: on a busy machine it may take longer than
	// the 100ms timeout, which is for the calls below.
	wait.Until(t, "a first write while Redis runs", func() bool {
		return store.Created(ctx, "before", time.Now().Add(time.Minute)) == nil
	})
	stop()
	before := testutil.ToFloat64(enginetest.Errors.WithLabelValues("lookup"))
	if _, _, err := store.Lookup(ctx, "before"); err == nil {
		t.Fatal("Lookup succeeded with Redis stopped")
	}
	if got := testutil.ToFloat64(enginetest.Errors.WithLabelValues("lookup")); got != before+1 {
		t.Fatalf("state_errors_total{op=lookup} went from %v to %v, want one more", before, got)
	}
	redistest.Run(t, port, args...)
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := store.Created(ctx, "after", time.Now().Add(time.Minute))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still failing 10s after Redis came back: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, found, err := store.Lookup(ctx, "after"); err != nil || !found {
		t.Fatalf("Lookup after the restart = %v, %v", found, err)
	}
}

func TestRedisRefusesBadSettingsNamingThem(t *testing.T) {
	for _, tc := range []struct {
		cfg  map[string]any
		want string
	}{
		{map[string]any{"address": []string{"127.0.0.1"}}, "address"},
		{map[string]any{"db": -1}, "db"},
		{map[string]any{"db": 2, "address": []string{"127.0.0.1:1", "127.0.0.1:2"}}, "db"},
		{map[string]any{"timeout": "-1s"}, "timeout"},
		{map[string]any{"tls_ca_file": "/nonexistent/ca.pem"}, "tls_ca_file"},
		{map[string]any{"db": 2, "cluster": true, "address": []string{"127.0.0.1:1"}}, "db"},
		{map[string]any{"cluster": true}, "cluster needs address"},
		{map[string]any{"sentinel": []string{"127.0.0.1:26379"}}, "sentinel needs master_name"},
		{map[string]any{"master_name": "mymaster"}, "master_name needs sentinel"},
		{map[string]any{"sentinel": []string{"127.0.0.1:26379"}, "master_name": "m", "address": []string{"127.0.0.1:6379"}}, "sentinel and address together"},
		{map[string]any{"sentinel": []string{"127.0.0.1:26379"}, "master_name": "m", "cluster": true}, "sentinel and cluster together"},
		{map[string]any{"sentinel": []string{"127.0.0.1"}, "master_name": "m"}, "sentinel"},
		{map[string]any{"sentinel_password": "x"}, "sentinel_username and sentinel_password need sentinel"},
		{map[string]any{"tls_cert_file": "/etc/c.pem"}, "tls_cert_file needs tls_key_file"},
		{map[string]any{"tls_key_file": "/etc/c.key"}, "tls_key_file needs tls_cert_file"},
		{map[string]any{"tls_cert_file": "/nonexistent/c.pem", "tls_key_file": "/nonexistent/c.key"}, "tls_cert_file, tls_key_file"},
	} {
		enginetest.Refuses(t, "redis", tc.cfg, tc.want)
	}
}

// leastPrivilegeACL is the rule docs/several-instances.md gives for the
// module's Redis user with the default key_prefix.
const leastPrivilegeACL = "resetkeys ~mcp_serializer:* resetchannels -@all +@connection +eval +evalsha +hmget +hget +hgetall +hset +hdel +exists +pexpire +del +time"

// The whole engine runs as a user with leastPrivilegeACL: records, owners
// and running marks, with no call refused and nothing logged.
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
		// The user may not read expiries; the admin connection may.
		return under(load(t, fmt.Sprintf("mcp_serializer:%d:", n)), ttl, admin)
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
	if owner, err := store.Claim(ctx, "key cart", a, 0); err != nil || owner != a {
		t.Fatalf("Claim = %q, %v", owner, err)
	}
	if err := store.MarkRunning(ctx, "s", b, time.Minute); err != nil {
		t.Fatal(err)
	}
	if left, err := store.RunningFor(ctx, "s"); err != nil || left <= 0 {
		t.Fatalf("RunningFor = %v, %v after a mark", left, err)
	}
	if err := store.MarkRunning(ctx, "s", b, 0); err != nil {
		t.Fatal(err)
	}
	if left, err := store.RunningFor(ctx, "s"); err != nil || left != 0 {
		t.Fatalf("RunningFor = %v, %v after the mark was cleared", left, err)
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
