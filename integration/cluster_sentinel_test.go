package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Behind round robin, the instances reaching Redis through a Sentinel
// (`state redis { sentinel … master_name … }`, and so order cluster): the
// master is killed mid-run and the Sentinel promotes its replica. No
// request waits past its bound, nothing is left in flight or waiting, the
// requests caught while no master answered fail with clear errors only, and
// the next 100 connects, on the promoted master, fail none.
//
// The instances log in as a user with the README's least-privilege rule,
// on the master and on the replica it fails over to.
func TestClusterRoundRobinSentinelFailoverMidRun(t *testing.T) {
	prerequisites(t)
	requireModule(t, redisStateModule)
	set := startSentinelSet(t)
	for _, r := range []*redisServer{set.Master, set.Replica} {
		addLeastPrivilegedUser(t, r.Addr)
	}
	state := strings.Replace(set.state(), "\n}", "\n\tusername "+leastPrivilegedUser+"\n\tpassword "+leastPrivilegedPassword+"\n}", 1)
	c := startCluster(t, clusterOptions{State: state, Balancer: caddyRoundRobin, Front: deadInstanceFront})
	before := set.masterPort()

	wait, done := pipelineInBackground(t, c, "round robin, sentinel failover mid-run", clusterN(t, roundRobinFaultsN))
	sleepUnlessDone(t, 2*time.Second, done, "killing the master")
	set.Master.kill(t)
	killed := time.Now()
	for set.masterPort() == before {
		if time.Since(killed) > 30*time.Second {
			t.Fatal("the sentinel promoted no replica within 30s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("master killed; the sentinel named the replica master %v later", time.Since(killed).Round(time.Millisecond))
	res := wait()
	wantBoundedThroughFault(t, c, res, crossedRepliesLogged)
	wantNothingStuck(t, c)
	t.Logf("failed state calls by op: %v", nonZero(c.stateErrors(t)))

	after := runPipeline(t, c, "round robin, after the failover", clusterN(t, 100))
	wantNoFailure(t, after)
}

// A three-master Redis Cluster given as one address with `cluster` (a
// managed service's configuration endpoint), behind round robin: no
// failure, no failed state call, and the sessions' turns spread over the
// masters. The instances log in as a user with the README's
// least-privilege rule and what it says a cluster adds.
func TestClusterRoundRobinOnARedisClusterBehindOneAddress(t *testing.T) {
	prerequisites(t)
	requireModule(t, redisStateModule)
	nodes := startRedisCluster(t)
	for _, r := range nodes {
		addLeastPrivilegedUser(t, r.Addr, "+cluster|slots", "+cluster|shards")
	}
	state := "state redis {\n\taddress " + nodes[0].Addr + "\n\tcluster\n\tusername " + leastPrivilegedUser +
		"\n\tpassword " + leastPrivilegedPassword + "\n}"
	c := startCluster(t, clusterOptions{State: state, Balancer: caddyRoundRobin})
	res := runPipeline(t, c, "round robin, a Redis Cluster behind one address", clusterN(t, 200))
	wantNoFailure(t, res)
	if errs := nonZero(c.stateErrors(t)); len(errs) != 0 {
		t.Fatalf("failed state calls: %v", errs)
	}
	for _, r := range nodes {
		if n := r.keys(t); n == 0 {
			t.Errorf("master %s holds no key: the client did not spread over the cluster", r.Addr)
		}
	}
}

// The user the README's least-privilege ACL rule creates, with a password.
const (
	leastPrivilegedUser     = "mcp_serializer"
	leastPrivilegedPassword = "least-privilege-secret"
)

// addLeastPrivilegedUser creates, on the server at addr, the user of the
// README's ACL rule (the line that starts "ACL SETUSER mcp_serializer"),
// with more rules if given.
func addLeastPrivilegedUser(t *testing.T, addr string, more ...string) {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
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
		t.Fatalf("README.md has no line starting %q", start)
	}
	args := append([]string{"ACL", "SETUSER", leastPrivilegedUser, "on", ">" + leastPrivilegedPassword}, append(rule, more...)...)
	if reply, err := redisCommand(addr, args...); err != nil || reply != "OK" {
		t.Fatalf("%s: ACL SETUSER: %q, %v", addr, reply, err)
	}
}
