package integration

import (
	"testing"
	"time"
)

// Behind round robin, the instances reaching Redis through a Sentinel
// (`state redis { sentinel … master_name … }`, and so order cluster): the
// master is killed mid-run and the Sentinel promotes its replica. No
// request waits past its bound, nothing is left in flight or waiting, the
// requests caught while no master answered fail with clear errors only, and
// the next 100 connects, on the promoted master, fail none.
func TestClusterRoundRobinSentinelFailoverMidRun(t *testing.T) {
	prerequisites(t)
	requireModule(t, redisStateModule)
	set := startSentinelSet(t)
	c := startCluster(t, clusterOptions{State: set.state(), Balancer: caddyRoundRobin, Front: deadInstanceFront})
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
