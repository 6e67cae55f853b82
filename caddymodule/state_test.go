package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/certmagic"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/testcerts"
	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// engineUnderTest is one engine behind the adapter the table calls.
type engineUnderTest struct {
	store *sharedState
	// advance moves the engine's clock on by d: a fake clock where the
	// engine takes its time from us, a real wait where the server keeps
	// its own.
	advance func(d time.Duration)
}

// testStoreConformance pins what every engine must do, through the
// serializer.Store interface. newEngine makes a fresh engine whose records
// live ttl after their last write.
func testStoreConformance(t *testing.T, newEngine func(t *testing.T, ttl time.Duration) engineUnderTest) {
	ctx := context.Background()
	mustLookup := func(t *testing.T, s serializer.Store, id string) (serializer.Record, bool) {
		t.Helper()
		rec, found, err := s.Lookup(ctx, id)
		if err != nil {
			t.Fatalf("Lookup: %v", err)
		}
		return rec, found
	}
	must := func(t *testing.T, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}

	t.Run("CreatedIsInitializingWithItsExchangeInFlight", func(t *testing.T) {
		e := newEngine(t, time.Hour)
		deadline := time.Now().Add(10 * time.Second)
		must(t, e.store.Created(ctx, "session-a", deadline))
		rec, found := mustLookup(t, e.store, "session-a")
		if !found || rec.Open || !rec.InitializeInFlight || rec.InitDeadline.UnixMilli() != deadline.UnixMilli() {
			t.Fatalf("Lookup = %+v, %v; want initializing, in flight, deadline %v", rec, found, deadline)
		}
		if _, found := mustLookup(t, e.store, "session-b"); found {
			t.Fatal("a session never created was found")
		}
	})

	t.Run("InitializeEndedClearsInFlight", func(t *testing.T) {
		e := newEngine(t, time.Hour)
		deadline := time.Now().Add(10 * time.Second)
		must(t, e.store.Created(ctx, "s", deadline))
		must(t, e.store.InitializeEnded(ctx, "s"))
		rec, found := mustLookup(t, e.store, "s")
		if !found || rec.Open || rec.InitializeInFlight || rec.InitDeadline.UnixMilli() != deadline.UnixMilli() {
			t.Fatalf("Lookup = %+v, %v; want initializing, not in flight", rec, found)
		}
	})

	t.Run("OpenedIsNotUndoneByALateInitializeEnded", func(t *testing.T) {
		e := newEngine(t, time.Hour)
		must(t, e.store.Created(ctx, "s", time.Now().Add(10*time.Second)))
		must(t, e.store.Opened(ctx, "s"))
		if rec, found := mustLookup(t, e.store, "s"); !found || !rec.Open || rec.InitializeInFlight {
			t.Fatalf("Lookup after Opened = %+v, %v; want open, nothing in flight", rec, found)
		}
		must(t, e.store.InitializeEnded(ctx, "s"))
		must(t, e.store.Touch(ctx, "s"))
		rec, found := mustLookup(t, e.store, "s")
		if !found || !rec.Open || rec.InitializeInFlight {
			t.Fatalf("Lookup = %+v, %v; want open", rec, found)
		}
	})

	t.Run("UpdatesDoNotRecreateAMissingRecord", func(t *testing.T) {
		e := newEngine(t, time.Hour)
		must(t, e.store.InitializeEnded(ctx, "s"))
		must(t, e.store.Opened(ctx, "s"))
		must(t, e.store.Touch(ctx, "s"))
		if rec, found := mustLookup(t, e.store, "s"); found {
			t.Fatalf("updates of a missing record made %+v", rec)
		}
	})

	t.Run("ForgetRemovesTheRecord", func(t *testing.T) {
		e := newEngine(t, time.Hour)
		must(t, e.store.Created(ctx, "s", time.Now().Add(10*time.Second)))
		must(t, e.store.Opened(ctx, "s"))
		must(t, e.store.Forget(ctx, "s"))
		if _, found := mustLookup(t, e.store, "s"); found {
			t.Fatal("found after Forget")
		}
		must(t, e.store.Forget(ctx, "s")) // forgetting twice is fine
		must(t, e.store.Opened(ctx, "s"))
		if _, found := mustLookup(t, e.store, "s"); found {
			t.Fatal("an update after Forget brought the record back")
		}
	})

	t.Run("RecordExpiresAfterSessionTTL", func(t *testing.T) {
		const ttl = 300 * time.Millisecond
		e := newEngine(t, ttl)
		must(t, e.store.Created(ctx, "s", time.Now()))
		must(t, e.store.Opened(ctx, "s"))
		if _, found := mustLookup(t, e.store, "s"); !found {
			t.Fatal("not found before its ttl")
		}
		e.advance(ttl + 200*time.Millisecond)
		if rec, found := mustLookup(t, e.store, "s"); found {
			t.Fatalf("found %+v after its ttl", rec)
		}
	})

	t.Run("InitializingRecordLivesUntilItsDeadline", func(t *testing.T) {
		const ttl = 300 * time.Millisecond
		e := newEngine(t, ttl)
		must(t, e.store.Created(ctx, "s", time.Now().Add(time.Hour)))
		must(t, e.store.InitializeEnded(ctx, "s"))
		e.advance(ttl + 300*time.Millisecond)
		if _, found := mustLookup(t, e.store, "s"); !found {
			t.Fatal("an initializing record expired before its init deadline")
		}
	})

	// serializer.RecordTTL: the init deadline holds an initializing
	// record only; an open one lives session_ttl from its last write.
	t.Run("OpenRecordExpiresAfterSessionTTLBeforeItsInitDeadline", func(t *testing.T) {
		const ttl = 300 * time.Millisecond
		e := newEngine(t, ttl)
		must(t, e.store.Created(ctx, "s", time.Now().Add(time.Hour)))
		must(t, e.store.Opened(ctx, "s"))
		e.advance(ttl + 200*time.Millisecond)
		if rec, found := mustLookup(t, e.store, "s"); found {
			t.Fatalf("found %+v after its ttl: the init deadline kept an open record", rec)
		}
	})

	t.Run("TouchExtendsTheRecord", func(t *testing.T) {
		const ttl = time.Second
		e := newEngine(t, ttl)
		must(t, e.store.Created(ctx, "s", time.Now()))
		must(t, e.store.Opened(ctx, "s"))
		e.advance(600 * time.Millisecond)
		must(t, e.store.Touch(ctx, "s"))
		if _, found := mustLookup(t, e.store, "s"); !found {
			t.Fatal("not found before its ttl (the machine stalled for most of a second?)")
		}
		e.advance(600 * time.Millisecond) // past the expiry Touch replaced
		if _, found := mustLookup(t, e.store, "s"); !found {
			t.Fatal("Touch did not extend the record")
		}
	})
}

func TestRedisStateConformance(t *testing.T) {
	addr := startRedis(t)
	n := 0
	testStoreConformance(t, func(t *testing.T, ttl time.Duration) engineUnderTest {
		n++ // a prefix per engine keeps the subtests apart
		eng := loadEngine(t, nil, "redis", map[string]any{
			"address": []string{addr}, "key_prefix": "conformance" + strconv.Itoa(n) + ":",
		}).(*RedisState)
		return engineUnderTest{store: newSharedState(eng, ttl, zap.NewNop()), advance: time.Sleep}
	})
}

// Several addresses make a cluster client: here a one-node Redis Cluster,
// with a second seed that is down.
func TestRedisClusterStateConformance(t *testing.T) {
	port := loopbackPort(t)
	addr, _ := runRedis(t, port, "--port", strconv.Itoa(port), "--cluster-enabled", "yes",
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
	down := "127.0.0.1:" + strconv.Itoa(loopbackPort(t))
	n := 0
	testStoreConformance(t, func(t *testing.T, ttl time.Duration) engineUnderTest {
		n++
		eng := loadEngine(t, nil, "redis", map[string]any{
			"address": []string{addr, down}, "key_prefix": "cluster" + strconv.Itoa(n) + ":",
		}).(*RedisState)
		if _, ok := eng.client.(*redis.ClusterClient); !ok {
			t.Fatalf("two addresses made a %T, want a cluster client", eng.client)
		}
		return engineUnderTest{store: newSharedState(eng, ttl, zap.NewNop()), advance: time.Sleep}
	})
}

// A managed cluster hands out one address (its configuration endpoint):
// with cluster, that one address makes a cluster client, which follows
// the other masters' MOVED, here on a three-master Redis Cluster; the
// session records and the cluster turns work as on one server.
func TestRedisClusterBehindOneAddress(t *testing.T) {
	addrs := startRedisCluster(t, 3)
	n := 0
	testStoreConformance(t, func(t *testing.T, ttl time.Duration) engineUnderTest {
		n++
		eng := loadEngine(t, nil, "redis", map[string]any{
			"address": []string{addrs[0]}, "cluster": true, "key_prefix": "one" + strconv.Itoa(n) + ":",
		}).(*RedisState)
		if _, ok := eng.client.(*redis.ClusterClient); !ok {
			t.Fatalf("cluster made a %T, want a cluster client", eng.client)
		}
		return engineUnderTest{store: newSharedState(eng, ttl, zap.NewNop()), advance: time.Sleep}
	})

	ctx := context.Background()
	eng := loadEngine(t, nil, "redis", map[string]any{"address": []string{addrs[0]}, "cluster": true}).(*RedisState)
	for i := range 20 { // keys in every master's slots
		key := serializer.StoreKey(strconv.Itoa(i))
		if st, _, err := eng.TakeTurn(ctx, key, "a", 0, time.Second, time.Second); err != nil || st != serializer.TurnServed {
			t.Fatalf("take %d: %v, %v", i, st, err)
		}
		if err := eng.ReleaseTurn(ctx, key, "a", time.Second); err != nil {
			t.Fatalf("release %d: %v", i, err)
		}
	}

	// Without cluster, the one address is a plain client: the keys of
	// the other masters' slots meet MOVED.
	plain := loadEngine(t, nil, "redis", map[string]any{"address": []string{addrs[0]}}).(*RedisState)
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
	masterPort, replicaPort := loopbackPort(t), loopbackPort(t)
	master, stopMaster := runRedis(t, masterPort, "--port", strconv.Itoa(masterPort))
	replica, _ := runRedis(t, replicaPort, "--port", strconv.Itoa(replicaPort), "--replicaof", "127.0.0.1", strconv.Itoa(masterPort))
	sentinel := runSentinel(t, "mymaster", master)
	ctx := context.Background()
	eng := loadEngine(t, nil, "redis", map[string]any{
		"sentinel": []string{sentinel}, "master_name": "mymaster", "timeout": "1s",
	}).(*RedisState)
	if _, ok := eng.client.(*redis.Client); !ok {
		t.Fatalf("sentinel made a %T, want a failover client", eng.client)
	}
	store := newSharedState(eng, time.Hour, zap.NewNop())
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
	promoted := redis.NewClient(&redis.Options{Addr: replica})
	defer promoted.Close()
	if role, err := promoted.Do(ctx, "ROLE").Slice(); err != nil || role[0] != "master" {
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

// runSentinel starts a Sentinel on loopback watching master under name,
// quick to fail over (a second to call it down), and returns its address.
func runSentinel(t *testing.T, name, master string) string {
	t.Helper()
	host, port, _ := net.SplitHostPort(master)
	sentinelPort := loopbackPort(t)
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\n"+
		"sentinel monitor %s %s %s 1\nsentinel down-after-milliseconds %s 1000\n"+
		"sentinel failover-timeout %s 5000\n", sentinelPort, dir, name, host, port, name, name)), 0o600); err != nil {
		t.Fatal(err)
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server is not installed: apt-get install -y redis-server")
	}
	cmd := exec.Command(bin, conf, "--sentinel")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	addr := "127.0.0.1:" + strconv.Itoa(sentinelPort)
	client := redis.NewSentinelClient(&redis.Options{Addr: addr})
	defer client.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if got, err := client.GetMasterAddrByName(context.Background(), name).Result(); err == nil && len(got) == 2 {
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("sentinel on %s does not know %s after 10s", addr, name)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startRedisCluster runs n masters on loopback and joins them into a Redis
// Cluster with redis-cli --cluster create; it returns their addresses.
func startRedisCluster(t testing.TB, n int) []string {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatal("redis-cli is not installed: apt-get install -y redis-tools")
	}
	var addrs []string
	for range n {
		port := loopbackPort(t)
		addr, _ := runRedis(t, port, "--port", strconv.Itoa(port), "--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(t.TempDir(), "nodes.conf"))
		addrs = append(addrs, addr)
	}
	out, err := exec.Command(cli, append(append([]string{"--cluster", "create"}, addrs...), "--cluster-replicas", "0", "--cluster-yes")...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	ctx := context.Background()
	for _, addr := range addrs {
		node := redis.NewClient(&redis.Options{Addr: addr})
		deadline := time.Now().Add(20 * time.Second)
		for {
			info, err := node.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster not ok on %s after 20s: %v %s", addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		node.Close()
	}
	return addrs
}

func TestStorageStateConformance(t *testing.T) {
	testStoreConformance(t, func(t *testing.T, ttl time.Duration) engineUnderTest {
		clock := newTestClock()
		eng := loadEngine(t, fileStorage(t.TempDir()), "storage", nil).(*StorageState)
		eng.now = clock.Now
		return engineUnderTest{store: newSharedState(eng, ttl, zap.NewNop()), advance: clock.Advance}
	})
}

func TestRedisKeysAreHashesOfTheSessionID(t *testing.T) {
	addr := startRedis(t)
	eng := loadEngine(t, nil, "redis", map[string]any{"address": []string{addr}}).(*RedisState)
	store := newSharedState(eng, time.Hour, zap.NewNop())
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
	addr := startRedis(t, "--requirepass", password)
	t.Setenv("MCP_SERIALIZER_TEST_REDIS_PASSWORD", password)
	eng := loadEngine(t, nil, "redis", map[string]any{
		"address": []string{addr}, "password": "{env.MCP_SERIALIZER_TEST_REDIS_PASSWORD}",
	}).(*RedisState)
	store := newSharedState(eng, time.Hour, zap.NewNop())
	ctx := context.Background()
	if err := store.Created(ctx, "s", time.Now().Add(time.Minute)); err != nil {
		t.Fatalf("Created with the password from the environment: %v", err)
	}
	if _, found, err := store.Lookup(ctx, "s"); err != nil || !found {
		t.Fatalf("Lookup = %v, %v; want found", found, err)
	}

	wrong := loadEngine(t, nil, "redis", map[string]any{"address": []string{addr}, "password": "wrong"}).(*RedisState)
	before := testutil.ToFloat64(metrics.stateErrors.WithLabelValues("lookup"))
	if _, _, err := newSharedState(wrong, time.Hour, zap.NewNop()).Lookup(ctx, "s"); err == nil {
		t.Fatal("Lookup with a wrong password succeeded")
	}
	if got := testutil.ToFloat64(metrics.stateErrors.WithLabelValues("lookup")); got != before+1 {
		t.Fatalf("state_errors_total{op=lookup} went from %v to %v, want one more", before, got)
	}
}

// An engine that is down (nothing listens) or blackholed (accepts and
// never answers) costs each call its timeout at most, and every failure
// is counted.
func TestRedisClientIsSharedAcrossReloads(t *testing.T) {
	addr := startRedis(t)
	parent := fileStorage(t.TempDir())
	load := func() (*RedisState, context.CancelFunc) {
		ctx, cancel := caddy.NewContext(*parent)
		mod, err := ctx.LoadModuleByID("http.handlers.mcp_serializer.state.redis",
			json.RawMessage(`{"address": ["`+addr+`"]}`))
		if err != nil {
			t.Fatal(err)
		}
		return mod.(*RedisState), cancel
	}
	old, unloadOld := load()
	current, unloadCurrent := load() // the reloaded config, provisioned before the old one goes
	defer unloadCurrent()
	if old.client != current.client {
		t.Fatal("a config with the same connection settings got a client of its own")
	}
	unloadOld()
	store := newSharedState(current, time.Hour, zap.NewNop())
	if err := store.Created(context.Background(), "s", time.Now().Add(time.Minute)); err != nil {
		t.Fatalf("the client closed with the old config: %v", err)
	}
}

func TestRedisOverTLS(t *testing.T) {
	addr, caFile, _, _ := startTLSRedis(t, "no")
	ctx := context.Background()
	eng := loadEngine(t, nil, "redis", map[string]any{
		"address": []string{addr}, "tls_ca_file": caFile, "tls_server_name": "redis.test",
	}).(*RedisState)
	wantRoundTrip(t, newSharedState(eng, time.Hour, zap.NewNop()))

	// Without the CA, the server's certificate is refused.
	untrusted := loadEngine(t, nil, "redis", map[string]any{
		"address": []string{addr}, "tls": true, "tls_server_name": "redis.test",
	}).(*RedisState)
	if _, _, err := newSharedState(untrusted, time.Hour, zap.NewNop()).Lookup(ctx, "s"); err == nil {
		t.Fatal("a certificate from an unknown CA was accepted")
	}
}

// startTLSRedis runs a redis-server that speaks TLS only, with a
// certificate for redis.test, asking clients for theirs as authClients
// says (yes, optional, no).
func startTLSRedis(t *testing.T, authClients string) (addr, caFile, certFile, keyFile string) {
	t.Helper()
	caFile, certFile, keyFile = writeTestCerts(t, t.TempDir())
	port := loopbackPort(t)
	addr, _ = runRedis(t, port, "--port", "0", "--tls-port", strconv.Itoa(port),
		"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-ca-cert-file", caFile,
		"--tls-auth-clients", authClients)
	return addr, caFile, certFile, keyFile
}

// wantRoundTrip writes a record through store and reads it back.
func wantRoundTrip(t *testing.T, store *sharedState) {
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
	addr, caFile, certFile, keyFile := startTLSRedis(t, "yes")
	ctx := context.Background()
	eng := loadEngine(t, nil, "redis", map[string]any{
		"address": []string{addr}, "tls_ca_file": caFile, "tls_server_name": "redis.test",
		"tls_cert_file": certFile, "tls_key_file": keyFile,
	}).(*RedisState)
	wantRoundTrip(t, newSharedState(eng, time.Hour, zap.NewNop()))

	without := loadEngine(t, nil, "redis", map[string]any{
		"address": []string{addr}, "tls_ca_file": caFile, "tls_server_name": "redis.test",
	}).(*RedisState)
	core, logs := observer.New(zap.WarnLevel)
	refused := newSharedState(without, time.Hour, zap.New(core))
	counter := metrics.stateErrors.WithLabelValues("lookup")
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

// writeTestCerts writes a CA and a certificate for redis.test, signed by
// it, as PEM files: the server's, and a client's for mutual TLS.
func writeTestCerts(t *testing.T, dir string) (caFile, certFile, keyFile string) {
	t.Helper()
	caFile, certFile, keyFile, err := testcerts.Write(dir)
	if err != nil {
		t.Fatal(err)
	}
	return caFile, certFile, keyFile
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
		"down":       "127.0.0.1:" + strconv.Itoa(loopbackPort(t)),
		"blackholed": blackhole.Addr().String(),
	} {
		t.Run(name, func(t *testing.T) {
			eng := loadEngine(t, nil, "redis", map[string]any{"address": []string{addr}, "timeout": "100ms"}).(*RedisState)
			store := newSharedState(eng, time.Hour, zap.NewNop())
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
				before := testutil.ToFloat64(metrics.stateErrors.WithLabelValues(c.op))
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
				if got := testutil.ToFloat64(metrics.stateErrors.WithLabelValues(c.op)); got != before+1 {
					t.Errorf("state_errors_total{op=%s} went from %v to %v, want one more", c.op, before, got)
				}
			}
		})
	}
}

// Redis stopped: calls fail, counted; Redis back on the same address: the
// same engine works again, without a reload.
func TestRedisEngineRecoversWhenRedisComesBack(t *testing.T) {
	port := loopbackPort(t)
	args := []string{"--port", strconv.Itoa(port)}
	addr, stop := runRedis(t, port, args...)
	eng := loadEngine(t, nil, "redis", map[string]any{"address": []string{addr}, "timeout": "100ms"}).(*RedisState)
	store := newSharedState(eng, time.Hour, zap.NewNop())
	ctx := context.Background()
	if err := store.Created(ctx, "before", time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	stop()
	before := testutil.ToFloat64(metrics.stateErrors.WithLabelValues("lookup"))
	if _, _, err := store.Lookup(ctx, "before"); err == nil {
		t.Fatal("Lookup succeeded with Redis stopped")
	}
	if got := testutil.ToFloat64(metrics.stateErrors.WithLabelValues("lookup")); got != before+1 {
		t.Fatalf("state_errors_total{op=lookup} went from %v to %v, want one more", before, got)
	}
	runRedis(t, port, args...)
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

// hungEngine never answers and ignores its context, like a hung network
// file system.
type hungEngine struct{ release chan struct{} }

func (hungEngine) CallTimeout() time.Duration { return 50 * time.Millisecond }
func (e hungEngine) Created(context.Context, string, time.Time, time.Duration) error {
	<-e.release
	return nil
}
func (e hungEngine) InitializeEnded(context.Context, string, time.Duration) error {
	<-e.release
	return nil
}
func (e hungEngine) Opened(context.Context, string, time.Duration) error { <-e.release; return nil }
func (e hungEngine) Touch(context.Context, string, time.Duration) error  { <-e.release; return nil }
func (e hungEngine) Forget(context.Context, string) error                { <-e.release; return nil }
func (e hungEngine) Lookup(context.Context, string) (serializer.Record, bool, error) {
	<-e.release
	return serializer.Record{Open: true}, true, nil
}

func TestAdapterReturnsAtTheTimeoutWhenTheEngineIgnoresItsContext(t *testing.T) {
	eng := hungEngine{release: make(chan struct{})}
	defer close(eng.release)
	store := newSharedState(eng, time.Hour, zap.NewNop())
	done := make(chan error, 1)
	go func() {
		_, found, err := store.Lookup(context.Background(), "s")
		if found {
			err = errors.New("found")
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lookup = %v, want a deadline error", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Lookup still waiting on a hung engine after 5s (timeout 50ms)")
	}
}

// The table's own deadline passing is the engine's failure; a caller
// that cancels is not.
func TestAdapterCountsTheCallersDeadlineButNotItsCancellation(t *testing.T) {
	eng := hungEngine{release: make(chan struct{})}
	defer close(eng.release)
	store := newSharedState(eng, time.Hour, zap.NewNop())
	counter := metrics.stateErrors.WithLabelValues("lookup")

	before := testutil.ToFloat64(counter)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, _, err := store.Lookup(ctx, "s"); err == nil {
		t.Fatal("Lookup on a hung engine succeeded")
	}
	if got := testutil.ToFloat64(counter); got != before+1 {
		t.Fatalf("after the caller's deadline: %v errors, want %v", got, before+1)
	}

	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	if _, _, err := store.Lookup(ctx, "s"); err == nil {
		t.Fatal("Lookup with a cancelled context succeeded")
	}
	if got := testutil.ToFloat64(counter); got != before+1 {
		t.Fatalf("a cancelled caller was counted: %v errors, want %v", got, before+1)
	}
}

func TestAdapterWarnsOncePerOperationPerIntervalWithoutTheSessionID(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	eng := hungEngine{release: make(chan struct{})}
	defer close(eng.release)
	store := newSharedState(eng, time.Hour, zap.New(core))
	clock := newTestClock()
	store.now = clock.Now
	ctx := context.Background()
	const id = "secret-session-id"

	for range 5 {
		store.Touch(ctx, id)
	}
	store.Forget(ctx, id) // another operation has its own allowance
	byOp := func(op string) []observer.LoggedEntry {
		var out []observer.LoggedEntry
		for _, e := range logs.All() {
			if e.ContextMap()["op"] == op {
				out = append(out, e)
			}
		}
		return out
	}
	if n := len(byOp("touch")); n != 1 {
		t.Fatalf("%d WARN lines for 5 failed touches within the interval, want 1", n)
	}
	if n := len(byOp("forget")); n != 1 {
		t.Fatalf("%d WARN lines for a failed forget, want 1", n)
	}
	clock.Advance(stateWarnInterval)
	store.Touch(ctx, id)
	touches := byOp("touch")
	if len(touches) != 2 {
		t.Fatalf("%d WARN lines after the interval, want 2", len(touches))
	}
	if got := touches[1].ContextMap()["suppressed"]; got != int64(4) {
		t.Fatalf("suppressed = %v, want 4", got)
	}
	for _, e := range logs.All() {
		line, _ := json.Marshal(e.ContextMap())
		if strings.Contains(e.Message+string(line), id) {
			t.Fatalf("a WARN line shows the session id: %s %s", e.Message, line)
		}
		if e.ContextMap()["session"] != sessionHash(id) {
			t.Fatalf("session = %v, want its hash %s", e.ContextMap()["session"], sessionHash(id))
		}
	}
}

// fakeEngine keeps records in memory and counts the calls that reach it.
// While hang is open, every call waits for it to close, ignoring its
// context; while createdHangs is open, Created alone does.
type fakeEngine struct {
	hang, createdHangs chan struct{}
	entered            atomic.Int64 // calls that reached the engine
	lookups            atomic.Int64
	createdStarted     chan struct{} // if set, Created signals it on entry

	mu      sync.Mutex
	records map[string]serializer.Record
}

func newFakeEngine() *fakeEngine { return &fakeEngine{records: map[string]serializer.Record{}} }

func (*fakeEngine) CallTimeout() time.Duration { return 20 * time.Millisecond }

func (e *fakeEngine) enter() {
	e.entered.Add(1)
	if e.hang != nil {
		<-e.hang
	}
}

func (e *fakeEngine) Created(_ context.Context, key string, deadline time.Time, _ time.Duration) error {
	e.enter()
	if e.createdStarted != nil {
		e.createdStarted <- struct{}{}
	}
	if e.createdHangs != nil {
		<-e.createdHangs
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.records[key] = serializer.Record{InitDeadline: deadline, InitializeInFlight: true}
	return nil
}
func (e *fakeEngine) InitializeEnded(context.Context, string, time.Duration) error {
	e.enter()
	return nil
}
func (e *fakeEngine) Opened(context.Context, string, time.Duration) error { e.enter(); return nil }
func (e *fakeEngine) Touch(context.Context, string, time.Duration) error  { e.enter(); return nil }
func (e *fakeEngine) Forget(_ context.Context, key string) error {
	e.enter()
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.records, key)
	return nil
}
func (e *fakeEngine) Lookup(_ context.Context, key string) (serializer.Record, bool, error) {
	e.enter()
	e.lookups.Add(1)
	e.mu.Lock()
	defer e.mu.Unlock()
	rec, ok := e.records[key]
	return rec, ok, nil
}

// An engine that hangs ignoring its context keeps a goroutine per call
// until it returns: the adapter stops calling it once
// maxStateCallsInFlight are out, fails the rest at once and counts them,
// and calls it again only when one has returned.
func TestAdapterBoundsTheCallsInFlightOnAnEngineThatIgnoresItsContext(t *testing.T) {
	eng := newFakeEngine()
	eng.hang = make(chan struct{})
	released := false
	release := func() {
		if !released {
			released = true
			close(eng.hang)
		}
	}
	defer release()
	core, logs := observer.New(zap.WarnLevel)
	store := newSharedState(eng, time.Hour, zap.New(core))
	ctx := context.Background()
	lookups := metrics.stateErrors.WithLabelValues("lookup")
	touches := metrics.stateErrors.WithLabelValues("touch")
	lookupsBefore, touchesBefore := testutil.ToFloat64(lookups), testutil.ToFloat64(touches)
	goroutinesBefore := runtime.NumGoroutine()

	// Fill every slot: each call gives up at its timeout, its engine
	// call hangs on.
	var wg sync.WaitGroup
	for i := range maxStateCallsInFlight {
		wg.Go(func() {
			if _, _, err := store.Lookup(ctx, "filling-"+strconv.Itoa(i)); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Lookup on a hung engine = %v, want a deadline error", err)
			}
		})
	}
	wg.Wait()

	const more = 1000
	for i := range more {
		var err error
		if i%2 == 0 {
			_, _, err = store.Lookup(ctx, "more-"+strconv.Itoa(i))
		} else {
			err = store.Touch(ctx, "more-"+strconv.Itoa(i))
		}
		if !errors.Is(err, errStateBusy) {
			t.Fatalf("call %d with every slot taken = %v, want errStateBusy", i, err)
		}
	}
	if n := eng.entered.Load(); n != maxStateCallsInFlight {
		t.Fatalf("the engine was called %d times, want %d: the calls beyond the bound reached it", n, maxStateCallsInFlight)
	}
	grown := runtime.NumGoroutine() - goroutinesBefore
	t.Logf("%d calls on a hung engine: %d goroutines more", maxStateCallsInFlight+more, grown)
	if grown > maxStateCallsInFlight+50 {
		t.Fatalf("%d goroutines more after %d calls on a hung engine, want about %d", grown, maxStateCallsInFlight+more, maxStateCallsInFlight)
	}
	if got := testutil.ToFloat64(lookups) - lookupsBefore; got != maxStateCallsInFlight+more/2 {
		t.Errorf("state_errors_total{op=lookup} grew by %v, want %v", got, maxStateCallsInFlight+more/2)
	}
	if got := testutil.ToFloat64(touches) - touchesBefore; got != more/2 {
		t.Errorf("state_errors_total{op=touch} grew by %v, want %v", got, more/2)
	}
	var touchWarns int
	for _, e := range logs.All() {
		if e.ContextMap()["op"] == "touch" {
			touchWarns++
			if e.ContextMap()["error"] != errStateBusy.Error() {
				t.Errorf("WARN for a refused touch: error = %v, want %q", e.ContextMap()["error"], errStateBusy)
			}
		}
	}
	if touchWarns != 1 {
		t.Errorf("%d WARN lines for %d refused touches, want 1", touchWarns, more/2)
	}

	// The slots come free as the engine returns, not at the timeout.
	release()
	deadline := time.Now().Add(10 * time.Second)
	for len(store.slots) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d slots still taken 10s after the engine returned", len(store.slots))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := store.Touch(ctx, "after"); err != nil {
		t.Fatalf("Touch once the engine answers again = %v", err)
	}
}

func TestAdapterRemembersNotFoundBriefly(t *testing.T) {
	eng := newFakeEngine()
	store := newSharedState(eng, time.Hour, zap.NewNop())
	clock := newTestClock()
	store.now = clock.Now
	ctx := context.Background()
	lookup := func(id string) bool {
		t.Helper()
		_, found, err := store.Lookup(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return found
	}
	for range 10 {
		if lookup("unknown") {
			t.Fatal("found a session never created")
		}
	}
	if n := eng.lookups.Load(); n != 1 {
		t.Fatalf("10 lookups of one unknown id reached the engine %d times, want 1", n)
	}
	clock.Advance(notFoundTTL)
	lookup("unknown")
	if n := eng.lookups.Load(); n != 2 {
		t.Fatalf("a lookup %s later reached the engine %d times in all, want 2", notFoundTTL, n)
	}

	// Created drops the entry: the record is found at once.
	if err := store.Created(ctx, "unknown", time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if !lookup("unknown") || !lookup("unknown") {
		t.Fatal("a session created here reads as not found")
	}
	if n := eng.lookups.Load(); n != 4 {
		t.Fatalf("lookups reached the engine %d times in all, want 4: a found record is read each time", n)
	}

	// Forget: the record is gone, and known to be.
	if err := store.Forget(ctx, "unknown"); err != nil {
		t.Fatal(err)
	}
	if lookup("unknown") {
		t.Fatal("found after Forget")
	}
	if n := eng.lookups.Load(); n != 4 {
		t.Fatalf("a lookup right after Forget reached the engine (%d in all, want 4)", n)
	}
}

// A lookup that answers "not found" while a Created for its id is still
// on its way must not hide the record once it is written.
func TestAdapterDoesNotRememberNotFoundOverlappingACreated(t *testing.T) {
	eng := newFakeEngine()
	eng.createdHangs = make(chan struct{})
	eng.createdStarted = make(chan struct{}, 1)
	store := newSharedState(eng, time.Hour, zap.NewNop())
	ctx := context.Background()
	created := make(chan error, 1)
	go func() { created <- store.Created(context.Background(), "s", time.Now().Add(time.Minute)) }()
	<-eng.createdStarted
	if _, found, err := store.Lookup(ctx, "s"); err != nil || found {
		t.Fatalf("Lookup while Created is on its way = %v, %v; want not found", found, err)
	}
	close(eng.createdHangs)
	<-created // the adapter may have given up at its timeout: wait for the engine
	deadline := time.Now().Add(10 * time.Second)
	for {
		eng.mu.Lock()
		_, written := eng.records[serializer.StoreKey("s")]
		eng.mu.Unlock()
		if written && len(store.slots) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the engine's Created did not return within 10s")
		}
		time.Sleep(time.Millisecond)
	}
	if _, found, err := store.Lookup(ctx, "s"); err != nil || !found {
		t.Fatalf("Lookup after Created = %v, %v; want found", found, err)
	}
}

func TestNotFoundCacheStaysWithinItsEntriesUnderAFloodOfUniqueIDs(t *testing.T) {
	eng := newFakeEngine()
	store := newSharedState(eng, time.Hour, zap.NewNop())
	ctx := context.Background()
	const ids = 3 * notFoundEntries
	for i := range ids {
		if _, _, err := store.Lookup(ctx, "flood-"+strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(store.notFound.keys); n > notFoundEntries {
		t.Fatalf("%d entries after %d unique ids, want at most %d", n, ids, notFoundEntries)
	}
	before := eng.lookups.Load()
	store.Lookup(ctx, "flood-"+strconv.Itoa(ids-1)) // the newest: remembered
	if eng.lookups.Load() != before {
		t.Fatal("the newest id was not remembered")
	}
	store.Lookup(ctx, "flood-0") // the oldest: made room
	if eng.lookups.Load() != before+1 {
		t.Fatal("the oldest id was still remembered past the bound")
	}
}

func TestStorageInstancesOnOneDirectorySeeEachOthersRecords(t *testing.T) {
	dir := t.TempDir()
	a := newSharedState(loadEngine(t, fileStorage(dir), "storage", nil).(StateEngine), time.Hour, zap.NewNop())
	b := newSharedState(loadEngine(t, fileStorage(dir), "storage", nil).(StateEngine), time.Hour, zap.NewNop())
	ctx := context.Background()
	if err := a.Created(ctx, "s", time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if rec, found, err := b.Lookup(ctx, "s"); err != nil || !found || !rec.InitializeInFlight {
		t.Fatalf("b.Lookup = %+v, %v, %v; want a's initializing record", rec, found, err)
	}
	if err := b.Opened(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if err := a.InitializeEnded(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if rec, found, err := a.Lookup(ctx, "s"); err != nil || !found || !rec.Open {
		t.Fatalf("a.Lookup = %+v, %v, %v; want b's open", rec, found, err)
	}
	if err := b.Forget(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if _, found, err := a.Lookup(ctx, "s"); err != nil || found {
		t.Fatalf("a.Lookup after b forgot = %v, %v; want not found", found, err)
	}
}

func TestStorageSweeperRemovesExpiredRecordsOneInstanceAtATime(t *testing.T) {
	dir := t.TempDir()
	clock := newTestClock()
	a := loadEngine(t, fileStorage(dir), "storage", map[string]any{"timeout": "200ms"}).(*StorageState)
	b := loadEngine(t, fileStorage(dir), "storage", map[string]any{"timeout": "200ms"}).(*StorageState)
	a.now, b.now = clock.Now, clock.Now
	ctx := context.Background()
	const ttl, interval = time.Minute, time.Hour
	for _, key := range []string{"expired", "live"} {
		if err := a.Created(ctx, key, clock.Now(), ttl); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(ttl / 2)
	if err := a.Touch(ctx, "live", ttl); err != nil {
		t.Fatal(err)
	}
	clock.Advance(ttl/2 + time.Second)
	exists := func(key string) bool { return a.storage.Exists(ctx, recordDir(key)) }

	// While another instance holds the lock, a sweeper skips its round.
	if err := b.storage.Lock(ctx, storageSweepLock); err != nil {
		t.Fatal(err)
	}
	if removed, err := a.sweep(ctx, interval); err != nil || removed != 0 {
		t.Fatalf("sweep under another's lock = %d, %v; want a skipped round", removed, err)
	}
	if !exists("expired") {
		t.Fatal("a record was removed while another instance held the lock")
	}
	if err := b.storage.Unlock(ctx, storageSweepLock); err != nil {
		t.Fatal(err)
	}

	if removed, err := a.sweep(ctx, interval); err != nil || removed != 1 {
		t.Fatalf("sweep = %d, %v; want the one expired record removed", removed, err)
	}
	if exists("expired") || !exists("live") {
		t.Fatalf("after the sweep: expired there %v, live there %v", exists("expired"), exists("live"))
	}

	// Another instance right after skips: the round was just done.
	if err := a.Created(ctx, "expired2", clock.Now(), time.Second); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Second)
	if removed, err := b.sweep(ctx, interval); err != nil || removed != 0 {
		t.Fatalf("a second sweep right after = %d, %v; want a skipped round", removed, err)
	}
	clock.Advance(interval)
	if removed, err := b.sweep(ctx, interval); err != nil || removed != 2 {
		t.Fatalf("the next round = %d, %v; want expired2 and the now expired live record removed", removed, err)
	}
}

// hookedStorage is Caddy's file storage with hooks on List and Load.
type hookedStorage struct {
	certmagic.Storage
	onList func()
	onLoad func(key string) // after the load, before its answer returns
}

func (h *hookedStorage) List(ctx context.Context, prefix string, recursive bool) ([]string, error) {
	if h.onList != nil {
		h.onList()
	}
	return h.Storage.List(ctx, prefix, recursive)
}

func (h *hookedStorage) Load(ctx context.Context, key string) ([]byte, error) {
	data, err := h.Storage.Load(ctx, key)
	if h.onLoad != nil {
		h.onLoad(key)
	}
	return data, err
}

// newStorageState starts a storage engine on storage, without Caddy, on
// clock (nil: the system's), stopped when the test ends.
func newStorageState(t *testing.T, storage certmagic.Storage, logger *zap.Logger, clock *testClock) *StorageState {
	t.Helper()
	s := &StorageState{Timeout: caddy.Duration(5 * time.Second), SweepInterval: caddy.Duration(time.Hour)}
	if clock != nil {
		s.now = clock.Now
	}
	s.start(storage, logger)
	t.Cleanup(func() { s.Cleanup() })
	return s
}

// A storage that hangs, ignoring its context, must not hold a reload up:
// Cleanup gives up on the sweeper after the call timeout, and says so.
func TestStorageCleanupDoesNotWaitForASweeperHungOnTheStorage(t *testing.T) {
	listing, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	storage := &hookedStorage{
		Storage: &certmagic.FileStorage{Path: t.TempDir()},
		onList: func() {
			once.Do(func() { close(listing) })
			<-release
		},
	}
	core, logs := observer.New(zap.WarnLevel)
	s := &StorageState{Timeout: caddy.Duration(50 * time.Millisecond), SweepInterval: caddy.Duration(time.Millisecond)}
	s.start(storage, zap.New(core))
	defer func() {
		close(release)
		<-s.sweeperDone
	}()
	select {
	case <-listing:
	case <-time.After(10 * time.Second):
		t.Fatal("the sweeper did not list the records within 10s")
	}
	cleaned := make(chan error, 1)
	go func() { cleaned <- s.Cleanup() }()
	select {
	case <-cleaned:
	case <-time.After(10 * time.Second):
		t.Fatal("Cleanup still waiting 10s for a sweeper hung on the storage (timeout 50ms)")
	}
	if logs.FilterMessageSnippet("sweeper").Len() != 1 {
		t.Fatalf("no WARN line tells of the sweeper left running: %v", logs.All())
	}
}

// An instance touching a record after the sweeper read it as expired
// keeps it: the sweeper reads it again before deleting.
func TestStorageSweeperKeepsARecordTouchedAfterItWasRead(t *testing.T) {
	clock := newTestClock()
	storage := &hookedStorage{Storage: &certmagic.FileStorage{Path: t.TempDir()}}
	s := newStorageState(t, storage, zap.NewNop(), clock)
	ctx := context.Background()
	const ttl = time.Minute
	if err := s.Created(ctx, "s", clock.Now(), ttl); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * ttl)
	touched := false
	storage.onLoad = func(key string) {
		if !touched && key == path.Join(recordDir("s"), factTouched) {
			touched = true // once: Touch reads too
			if err := s.Touch(ctx, "s", ttl); err != nil {
				t.Error(err)
			}
		}
	}
	if removed, err := s.sweep(ctx, time.Hour); err != nil || removed != 0 {
		t.Fatalf("sweep = %d, %v; want the touched record kept", removed, err)
	}
	if !touched {
		t.Fatal("the sweeper never read the touched fact")
	}
	if _, found, err := s.Lookup(ctx, "s"); err != nil || !found {
		t.Fatalf("Lookup after the sweep = %v, %v; want the touched record", found, err)
	}
}

// A fact file that cannot be parsed keeps its record for
// unreadableFactAge after it last changed, then the record goes, with a
// WARN.
func TestStorageSweeperRemovesRecordsWithUnparsableFactsOnceTheyAreOld(t *testing.T) {
	clock := newTestClock()
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	core, logs := observer.New(zap.WarnLevel)
	s := newStorageState(t, storage, zap.New(core), clock)
	ctx := context.Background()
	const ttl, interval = time.Minute, time.Minute
	write := func(key, fact, content string) {
		t.Helper()
		if err := storage.Store(ctx, path.Join(recordDir(key), fact), []byte(content)); err != nil {
			t.Fatal(err)
		}
	}
	write("unreadable", factCreated, "{not json")
	if err := s.Created(ctx, "half", clock.Now(), ttl); err != nil {
		t.Fatal(err)
	}
	write("half", factTouched, "")
	if err := s.Created(ctx, "live", clock.Now(), 2*unreadableFactAge); err != nil {
		t.Fatal(err)
	}
	exists := func(key string) bool { return storage.Exists(ctx, recordDir(key)) }

	clock.Advance(2 * ttl) // half's readable fact has expired; its file is new
	if removed, err := s.sweep(ctx, interval); err != nil || removed != 0 {
		t.Fatalf("sweep with new unparsable facts = %d, %v; want none removed", removed, err)
	}
	if !exists("unreadable") || !exists("half") {
		t.Fatal("a record with a fact changed just now was removed")
	}
	if logs.Len() != 0 {
		t.Fatalf("WARN with nothing removed: %v", logs.All())
	}

	clock.Advance(unreadableFactAge)
	if removed, err := s.sweep(ctx, interval); err != nil || removed != 2 {
		t.Fatalf("sweep = %d, %v; want the two records with old unparsable facts removed", removed, err)
	}
	if exists("unreadable") || exists("half") || !exists("live") {
		t.Fatalf("after the sweep: unreadable there %v, half there %v, live there %v",
			exists("unreadable"), exists("half"), exists("live"))
	}
	warns := logs.All()
	if len(warns) != 1 || warns[0].ContextMap()["removed"] != int64(2) {
		t.Fatalf("WARN lines = %v; want one telling of 2 records removed", warns)
	}
}

func TestStorageSweeperRunsOnItsIntervalAndStopsOnCleanup(t *testing.T) {
	ctx, cancel := caddy.NewContext(*fileStorage(t.TempDir()))
	defer cancel()
	mod, err := ctx.LoadModuleByID("http.handlers.mcp_serializer.state.storage",
		json.RawMessage(`{"sweep_interval": "20ms"}`))
	if err != nil {
		t.Fatal(err)
	}
	eng := mod.(*StorageState)
	if err := eng.Created(context.Background(), "gone", time.Now().Add(-time.Second), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for eng.storage.Exists(context.Background(), recordDir("gone")) {
		if time.Now().After(deadline) {
			t.Fatal("the sweeper did not remove an expired record within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel() // the config goes: Caddy calls Cleanup
	select {
	case <-eng.sweeperDone:
	default:
		t.Fatal("the sweeper still runs after Cleanup")
	}
}

func TestStateEnginesRejectBadSettingsNamingThem(t *testing.T) {
	for _, tc := range []struct {
		engine string
		cfg    map[string]any
		want   string
	}{
		{"redis", map[string]any{"address": []string{"127.0.0.1"}}, "address"},
		{"redis", map[string]any{"db": -1}, "db"},
		{"redis", map[string]any{"db": 2, "address": []string{"127.0.0.1:1", "127.0.0.1:2"}}, "db"},
		{"redis", map[string]any{"timeout": "-1s"}, "timeout"},
		{"redis", map[string]any{"tls_ca_file": "/nonexistent/ca.pem"}, "tls_ca_file"},
		{"redis", map[string]any{"db": 2, "cluster": true, "address": []string{"127.0.0.1:1"}}, "db"},
		{"redis", map[string]any{"cluster": true}, "cluster needs address"},
		{"redis", map[string]any{"sentinel": []string{"127.0.0.1:26379"}}, "sentinel needs master_name"},
		{"redis", map[string]any{"master_name": "mymaster"}, "master_name needs sentinel"},
		{"redis", map[string]any{"sentinel": []string{"127.0.0.1:26379"}, "master_name": "m", "address": []string{"127.0.0.1:6379"}}, "sentinel and address together"},
		{"redis", map[string]any{"sentinel": []string{"127.0.0.1:26379"}, "master_name": "m", "cluster": true}, "sentinel and cluster together"},
		{"redis", map[string]any{"sentinel": []string{"127.0.0.1"}, "master_name": "m"}, "sentinel"},
		{"redis", map[string]any{"sentinel_password": "x"}, "sentinel_username and sentinel_password need sentinel"},
		{"redis", map[string]any{"tls_cert_file": "/etc/c.pem"}, "tls_cert_file needs tls_key_file"},
		{"redis", map[string]any{"tls_key_file": "/etc/c.key"}, "tls_key_file needs tls_cert_file"},
		{"redis", map[string]any{"tls_cert_file": "/nonexistent/c.pem", "tls_key_file": "/nonexistent/c.key"}, "tls_cert_file, tls_key_file"},
		{"storage", map[string]any{"timeout": "-1s"}, "timeout"},
		{"storage", map[string]any{"sweep_interval": "-1s"}, "sweep_interval"},
	} {
		raw, _ := json.Marshal(tc.cfg)
		ctx, cancel := caddy.NewContext(*fileStorage(t.TempDir()))
		_, err := ctx.LoadModuleByID("http.handlers.mcp_serializer.state."+tc.engine, raw)
		cancel()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %s: err = %v, want one naming %q", tc.engine, raw, err, tc.want)
		}
	}
}

// loadEngine provisions a state engine module the way the handler does,
// cleaned up when the test ends. parent carries the storage; nil for none.
func loadEngine(t testing.TB, parent *caddy.Context, name string, cfg map[string]any) caddy.Module {
	t.Helper()
	if parent == nil {
		parent = fileStorage(t.TempDir())
	}
	if cfg == nil {
		cfg = map[string]any{}
	}
	if _, set := cfg["timeout"]; !set {
		// The machine may be shared and slow: the tests that are not
		// about the timeout must not fail on it.
		cfg["timeout"] = "5s"
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(*parent)
	t.Cleanup(cancel)
	mod, err := ctx.LoadModuleByID("http.handlers.mcp_serializer.state."+name, raw)
	if err != nil {
		t.Fatalf("provisioning state %s %s: %v", name, raw, err)
	}
	return mod.(caddy.Module)
}

// fileStorage is a Caddy context whose storage is file_system at root.
func fileStorage(root string) *caddy.Context {
	storage, _ := json.Marshal(map[string]string{"module": "file_system", "root": root})
	ctx, err := caddy.ProvisionContext(&caddy.Config{StorageRaw: storage})
	if err != nil {
		panic(err)
	}
	return &ctx
}

// startRedis runs a redis-server on a free loopback port for the test and
// returns its address.
func startRedis(t testing.TB, args ...string) string {
	t.Helper()
	port := loopbackPort(t)
	addr, _ := runRedis(t, port, append([]string{"--port", strconv.Itoa(port)}, args...)...)
	return addr
}

// runRedis starts redis-server with args, stopped by pid when the test
// ends or by stop, and waits until it listens on port.
func runRedis(t testing.TB, port int, args ...string) (addr string, stop func()) {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server is not installed: apt-get install -y redis-server")
	}
	addr = "127.0.0.1:" + strconv.Itoa(port)
	cmd := exec.Command(bin, append([]string{"--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", t.TempDir()}, args...)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
		})
	}
	t.Cleanup(stop)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return addr, stop
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server not listening on %s after 10s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func loopbackPort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// testClock is a clock the test moves.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func newTestClock() *testClock { return &testClock{now: time.Now()} }

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// StartRedis lets the black-box tests beside this file start a server.
var StartRedis = startRedis
