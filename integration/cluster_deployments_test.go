package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/testcerts"
)

// Behind round robin, the instances reaching Redis through three Sentinels
// (`state redis { sentinel … master_name … }`, and so order owner) and
// keyed on the v2 client's cart handle: while pipelined connects and
// handle races (parallel calls on one cart) run, the master is killed and
// the Sentinels promote its replica. No request waits past its bound,
// nothing is left in flight or waiting, the requests caught while no master
// answered fail with clear errors only, and none is held to init_timeout;
// once the new master answers, no two calls on a cart overlap in PHP (no
// lost update), and the next 100 connects fail none.
//
// The instances log in as a user with the documented least-privilege rule,
// on the master and on the replica it fails over to.
func TestClusterRoundRobinSentinelFailoverMidRun(t *testing.T) {
	prerequisites(t)
	requireModule(t, redisStateModule)
	set := startSentinelSet(t)
	for _, r := range []*redisServer{set.Master, set.Replica} {
		addLeastPrivilegedUser(t, r)
	}
	state := strings.Replace(set.state(), "\n}", "\n\tusername "+leastPrivilegedUser+"\n\tpassword "+leastPrivilegedPassword+"\n}", 1)
	c := startCluster(t, clusterOptions{State: state, Key: cartKey, Balancer: caddyRoundRobin, Front: deadInstanceFront})
	before := set.masterPort()

	races := cartRacesInBackground(t, c)
	n := clusterN(t, roundRobinFaultsN)
	run := startFaultRun(t, c, "round robin, sentinel failover mid-run", n, n/3, 2*n/3)
	run.heldAt(t, n/3)
	set.Master.kill(t)
	killed := time.Now()
	run.resume(t)
	for set.masterPort() == before {
		if time.Since(killed) > 30*time.Second {
			t.Fatal("the sentinels promoted no replica within 30s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	promoted := time.Now()
	t.Logf("master killed; the sentinels named the replica master %v later", promoted.Sub(killed).Round(time.Millisecond))
	// The instances' clients reach the new master within a second of the
	// Sentinels naming it (they fail calls on connections to the old one
	// meanwhile). The rest of the run comes after a handle race has started
	// past that second, however fast the first part went.
	answers := promoted.Add(time.Second)
	run.heldAt(t, 2*n/3)
	races.waitStartedAfter(t, answers)
	run.resume(t)
	res := run.wait(t, c)
	ran := races.stop(t)
	wantBoundedThroughFault(t, c, res, crossedRepliesLogged)
	wantNothingStuck(t, c)
	t.Logf("failed state calls by op: %v", nonZero(c.stateErrors(t)))
	// A gate opened while no master answered is written again until the
	// new master takes it, so no session is held to init_timeout.
	if held := nonZero(c.metrics(t, "caddy_mcp_serializer_gate_timeouts_total")); len(held) != 0 {
		t.Errorf("follow-ups held to init_timeout through the failover: %v", held)
	}

	// A race started once the new master answers must lose nothing.
	var after int
	for i, r := range ran {
		at := r.Started.Sub(killed).Round(time.Millisecond)
		if r.Race == nil {
			t.Logf("handle race %d (started %v after the kill): none ran: %s", i+1, at, r.Summary)
		} else {
			t.Logf("handle race %d (started %v after the kill): %d of %d items kept, %d lost, %d calls failed",
				i+1, at, r.Race.Items, cartAdds, r.Race.Lost, r.Race.FailedCalls)
		}
		if r.Started.After(answers) {
			after++
			wantNoLostUpdate(t, "handle race "+strconv.Itoa(i+1)+" on the new master", r)
		}
	}
	if after == 0 {
		t.Errorf("no handle race started on the new master during the run (%d races in all)", len(ran))
	}

	res = runPipeline(t, c, "round robin, after the failover", clusterN(t, 100))
	wantNoFailure(t, res)
	wantNoLostUpdate(t, "handle race after the failover", runCartRace(t, c))
}

// A three-master Redis Cluster given as one address with `cluster` (a
// managed service's configuration endpoint), behind round robin: no
// failure, no failed state call, parallel calls on one cart handle lose no
// update, and the sessions' records spread over the masters. The instances
// log in as a user with the documented least-privilege rule and what it
// says a cluster adds.
func TestClusterRoundRobinOnARedisClusterBehindOneAddress(t *testing.T) {
	prerequisites(t)
	requireModule(t, redisStateModule)
	nodes := startRedisCluster(t)
	for _, r := range nodes {
		addLeastPrivilegedUser(t, r, "+cluster|slots", "+cluster|shards")
	}
	state := "state redis {\n\taddress " + nodes[0].Addr + "\n\tcluster\n\tusername " + leastPrivilegedUser +
		"\n\tpassword " + leastPrivilegedPassword + "\n}"
	c := startCluster(t, clusterOptions{State: state, Key: cartKey, Balancer: caddyRoundRobin})
	res := runPipeline(t, c, "round robin, a Redis Cluster behind one address", clusterN(t, 200))
	wantNoFailure(t, res)
	wantNoLostUpdate(t, "handle race on a Redis Cluster", runCartRace(t, c))
	if errs := nonZero(c.stateErrors(t)); len(errs) != 0 {
		t.Fatalf("failed state calls: %v", errs)
	}
	for _, r := range nodes {
		if n := redisCommands(t, r); n == 0 {
			t.Errorf("master %s was sent no command: the client did not spread the records over the cluster", r.Addr)
		}
	}
}

// The user the documented least-privilege ACL rule creates, with a password.
const (
	leastPrivilegedUser     = "mcp_serializer"
	leastPrivilegedPassword = "least-privilege-secret"
)

// addLeastPrivilegedUser creates, on the server r, the user of the
// documented ACL rule (the line of docs/several-instances.md that starts
// "ACL SETUSER mcp_serializer"), with more rules if given.
func addLeastPrivilegedUser(t *testing.T, r *redisServer, more ...string) {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "several-instances.md"))
	if err != nil {
		t.Fatal(err)
	}
	const start = "ACL SETUSER " + leastPrivilegedUser + " on >{password} "
	var rule []string
	for _, line := range strings.Split(string(readme), "\n") {
		if rest, ok := strings.CutPrefix(line, start); ok {
			rule = strings.Fields(rest)
		}
	}
	if len(rule) == 0 {
		t.Fatalf("docs/several-instances.md has no line starting %q", start)
	}
	args := append([]string{"ACL", "SETUSER", leastPrivilegedUser, "on", ">" + leastPrivilegedPassword}, append(rule, more...)...)
	if reply, err := r.command(args...); err != nil || reply != "OK" {
		t.Fatalf("%s: ACL SETUSER: %q, %v", r.Addr, reply, err)
	}
}

// A Redis that requires client certificates (mutual TLS), behind round
// robin: instances given tls_cert_file and tls_key_file serve every session
// with no failed state call; an instance without them is refused by Redis
// on every call, carries on alone (its own sessions still work), counts
// the refusals and WARNs about them at most once per 10 s per operation.
// The instances log in as the documented least-privileged user.
func TestClusterRoundRobinWithRedisRequiringClientCertificates(t *testing.T) {
	prerequisites(t)
	requireModule(t, redisStateModule)
	r, caFile, certFile, keyFile := startTLSRedis(t)
	addLeastPrivilegedUser(t, r)
	// A generous timeout: on a loaded machine a call may take longer than
	// the default 250 ms, and what counts here is only that Redis accepts
	// the certificate.
	trusting := fmt.Sprintf("state redis {\n\taddress %s\n\ttimeout 5s\n\ttls_ca_file %s\n\ttls_server_name %s\n\tusername %s\n\tpassword %s\n",
		r.Addr, caFile, testcerts.ServerName, leastPrivilegedUser, leastPrivilegedPassword)
	c := startCluster(t, clusterOptions{Balancer: caddyRoundRobin,
		State: trusting + fmt.Sprintf("\ttls_cert_file %s\n\ttls_key_file %s\n}", certFile, keyFile)})
	res := runPipeline(t, c, "round robin, Redis with mutual TLS", clusterN(t, 100))
	wantNoFailure(t, res)
	if errs := nonZero(c.stateErrors(t)); len(errs) != 0 {
		t.Fatalf("failed state calls with the client certificate: %v", errs)
	}

	alone := startCluster(t, clusterOptions{Instances: 1, Balancer: caddyRoundRobin, State: trusting + "}"})
	res = runPipeline(t, alone, "one instance without a client certificate", 20)
	wantNoFailure(t, res)
	refused := sumValues(alone.metrics(t, "caddy_mcp_serializer_state_errors_total"))
	warns := strings.Count(alone.Instances[0].logText(t), "shared session state unavailable")
	t.Logf("without a client certificate: %v refused state calls, %d WARN lines", refused, warns)
	if refused == 0 || warns == 0 || float64(warns) >= refused {
		t.Fatalf("%v refused state calls and %d WARN lines: want refusals counted, and fewer WARNs than refusals", refused, warns)
	}
}
