package integration

import (
	"os"
	"strconv"
	"testing"
	"time"
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
	var res pipelineResult
	// --get open: the instances answer the SDK's GET with 405
	// (get_stream reject), so no GET stream pins a PHP worker.
	runClient(t, 15*time.Minute, &res, "pipeline", "--url", c.Front+"/mcp", "--n", strconv.Itoa(n), "--concurrency", "8", "--get", "open")
	rate := 0.0
	if res.N > 0 {
		rate = 100 * float64(res.FailedSessions) / float64(res.N)
	}
	t.Logf("%s: %d pipelined connects through the front to %d instances: %.1f%% with failures; %s",
		label, n, len(c.Instances), rate, res.summary())
	logSamples(t, res.Samples)
	if res.Error != "" {
		t.Fatalf("client error: %s", res.Error)
	}
	return res
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
