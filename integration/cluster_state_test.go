package integration

import (
	"os"
	"strconv"
	"testing"
)

// clusterN is the number of pipelined connects for a cluster run: n, or
// more with MCP_SERIALIZER_CLUSTER_N.
func clusterN(t *testing.T, n int) int {
	t.Helper()
	if v := os.Getenv("MCP_SERIALIZER_CLUSTER_N"); v != "" {
		parsed, err := strconv.Atoi(v)
		if err != nil || parsed < 1 {
			t.Fatalf("MCP_SERIALIZER_CLUSTER_N=%q: want a positive integer", v)
		}
		if parsed > n {
			n = parsed
		}
	}
	return n
}

// runPipeline runs the SDK client's pipelined connects through the front
// and logs what it counted.
func runPipeline(t *testing.T, c *cluster, label string, n int) pipelineResult {
	t.Helper()
	// --get open: the instances answer the SDK's GET with 405
	// (get_stream reject), so no GET stream pins a PHP worker.
	res := runPipelineResult(t, c, n)
	logRun(t, c, label, res)
	return res
}

// logRun logs a run's failure rate and counts.
func logRun(t *testing.T, c *cluster, label string, res pipelineResult) {
	t.Helper()
	rate := 0.0
	if res.N > 0 {
		rate = 100 * float64(res.FailedSessions) / float64(res.N)
	}
	t.Logf("%s: %d pipelined connects through the front to %d instances: %.1f%% with failures; %s",
		label, res.N, len(c.Instances), rate, res.summary())
	logSamples(t, res.Samples)
	if res.Error != "" {
		t.Fatalf("client error: %s", res.Error)
	}
}

// wantNoFailure fails the test unless every connect succeeded cleanly.
func wantNoFailure(t *testing.T, res pipelineResult) {
	t.Helper()
	if res.Connects != res.N {
		t.Errorf("connects: got %d of %d", res.Connects, res.N)
	}
	if res.Rejections != 0 {
		t.Errorf("rejections (-32600): got %d, want 0", res.Rejections)
	}
	if res.HTTPErrorCount != 0 {
		t.Errorf("HTTP errors: got %v, want none", res.HTTPErrors)
	}
	if res.IDMismatches != 0 || res.UnexpectedReplies != 0 {
		t.Errorf("replies not matching their requests: %d id mismatches, %d unexpected replies", res.IDMismatches, res.UnexpectedReplies)
	}
	if res.Broken != 0 {
		t.Errorf("broken sessions: got %d, want 0", res.Broken)
	}
	if res.Timeouts != 0 {
		t.Errorf("replies that never came: %d, want 0", res.Timeouts)
	}
	if res.Failures != 0 || !res.OK {
		t.Errorf("failures: got %d, want 0", res.Failures)
	}
}

// Without shared state, initialize lands on any instance and its follow-ups
// on the one the session id hashes to, where the session is unknown and so
// not gated: pipelined connects fail again as without the module. This is
// the figure the shared state is measured against.
func TestClusterWithoutStateLetsPipelinedConnectsFail(t *testing.T) {
	prerequisites(t)
	c := startCluster(t, clusterOptions{})
	res := runPipeline(t, c, "no state", clusterN(t, 300))
	t.Logf("PHP error logs: %s", c.logSummary())
	if res.Connects == 0 {
		t.Fatalf("no connect succeeded: the cluster does not work at all")
	}
	if res.Rejections == 0 && res.Broken == 0 {
		t.Fatalf("expected rejected or broken sessions with the gate on the wrong instance, got none: %s", res.summary())
	}
}

// The same with the Go stand-in as the upstream.
func TestClusterWithoutStateLetsPipelinedConnectsFailStub(t *testing.T) {
	prerequisites(t)
	c := startCluster(t, clusterOptions{Stub: true})
	res := runPipeline(t, c, "no state, stub", clusterN(t, 300))
	if res.Connects == 0 {
		t.Fatalf("no connect succeeded: the cluster does not work at all")
	}
	if res.Rejections == 0 && res.Broken == 0 {
		t.Fatalf("expected rejected or broken sessions with the gate on the wrong instance, got none: %s", res.summary())
	}
}

const (
	redisStateModule   = "http.handlers.mcp_serializer.state.redis"
	storageStateModule = "http.handlers.mcp_serializer.state.storage"
)

// redisState is the minimal `state redis` block for a test's redis-server.
func redisState(r *redisServer) string {
	return "state redis {\n\taddress " + r.Addr + "\n}"
}

// With the session state in Redis, the instance that gets the follow-ups
// finds the record the creating instance wrote and gates the session: no
// pipelined connect fails.
func TestClusterStateRedisHoldsTheGate(t *testing.T) {
	prerequisites(t)
	requireModule(t, redisStateModule)
	redis := startRedis(t)
	c := startCluster(t, clusterOptions{State: redisState(redis)})
	res := runPipeline(t, c, "state redis", clusterN(t, 1000))
	t.Logf("PHP error logs: %s", c.logSummary())
	t.Logf("state errors: %v; redis keys left after every session's DELETE: %d", c.stateErrors(t), redis.keys(t))
	wantNoFailure(t, res)
}

// With the session state in Caddy's storage (file_system in one directory
// shared by the instances), the same.
func TestClusterStateStorageHoldsTheGate(t *testing.T) {
	prerequisites(t)
	requireModule(t, storageStateModule)
	c := startCluster(t, clusterOptions{State: "state storage", Global: "storage file_system " + t.TempDir()})
	res := runPipeline(t, c, "state storage", clusterN(t, 300))
	t.Logf("PHP error logs: %s", c.logSummary())
	t.Logf("state errors: %v", c.stateErrors(t))
	wantNoFailure(t, res)
}

// The two engines with the Go stand-in as the upstream.
func TestClusterStateHoldsTheGateStub(t *testing.T) {
	prerequisites(t)
	t.Run("redis", func(t *testing.T) {
		requireModule(t, redisStateModule)
		redis := startRedis(t)
		c := startCluster(t, clusterOptions{Stub: true, State: redisState(redis)})
		wantNoFailure(t, runPipeline(t, c, "state redis, stub", clusterN(t, 300)))
	})
	t.Run("storage", func(t *testing.T) {
		requireModule(t, storageStateModule)
		c := startCluster(t, clusterOptions{Stub: true, State: "state storage", Global: "storage file_system " + t.TempDir()})
		wantNoFailure(t, runPipeline(t, c, "state storage, stub", clusterN(t, 300)))
	})
}
