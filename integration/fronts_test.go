package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// frontsN is the pipelined connects per front in TestClusterBehindEachFront
// (MCP_SERIALIZER_CLUSTER_N raises it).
const frontsN = 300

// frontRun is what one run of pipelined connects through one front showed.
type frontRun struct {
	Front balancer
	Res   pipelineResult
	// Stalled counts the connects that lasted nearly init_timeout or more.
	Stalled int
	// LongWaits counts the requests the instances held over 2.5 s for
	// their turn (queue and gate), from caddy_mcp_serializer_queue_wait_seconds.
	LongWaits float64
	// GateTimeouts is caddy_mcp_serializer_gate_timeouts_total over the
	// instances, read right after the run.
	GateTimeouts float64
	Cluster      *cluster
}

// Three instances (mcp_serializer + php_fastcgi, one shared PHP session
// store, `state redis`) behind each front, Caddy, nginx and HAProxy, hashing
// Mcp-Session-Id or round robin: the SDK client's pipelined connects see no
// failure and none waits out init_timeout, and a tool's progress events
// stream through the front ahead of its result. Every front runs the
// instances with the default `order` (owner, with state redis), and one
// round-robin front also with `order cluster` written out (a config of an
// earlier release, which runs as owner). Each front's
// elapsed time is logged beside the run behind the hashing Caddy front,
// which runs first.
func TestClusterBehindEachFront(t *testing.T) {
	prerequisites(t)
	requireModule(t, redisStateModule)
	requireOrderOwner(t)
	n := clusterN(t, frontsN)
	hashing := runBehindFront(t, clusterOptions{Balancer: caddyHeaderHash}, n, nil)
	for _, opts := range []clusterOptions{
		{Balancer: caddyRoundRobin},
		{Balancer: nginxHash},
		{Balancer: nginxRoundRobin},
		{Balancer: haproxyHash},
		{Balancer: haproxyRoundRobin},
		{Balancer: haproxyRoundRobin, Order: "cluster"},
	} {
		name := opts.Balancer.String()
		if opts.Order != "" {
			name += "_order_" + opts.Order
		}
		t.Run(name, func(t *testing.T) {
			runBehindFront(t, opts, n, &hashing)
		})
	}
}

// runBehindFront starts Redis and a cluster behind opts' front, runs n
// pipelined connects and the SDK's flow through it, checks both and logs
// the figures, with the ratio to base when given.
func runBehindFront(t *testing.T, opts clusterOptions, n int, base *frontRun) frontRun {
	t.Helper()
	if opts.State == "" {
		opts.State = redisState(startRedis(t))
	}
	c := startCluster(t, opts)
	label := opts.Balancer.String()
	if opts.Order != "" {
		label += ", order " + opts.Order
	}
	run := frontRun{Front: opts.Balancer, Res: runPipeline(t, c, label, n), Cluster: c}
	if len(run.Res.ConnectMs) != run.Res.ConnectTimed {
		t.Fatalf("the client timed %d connects but reported %d durations", run.Res.ConnectTimed, len(run.Res.ConnectMs))
	}
	run.Stalled = stalledConnects(run.Res)
	run.LongWaits = c.waitsOver(t, "2.5")
	run.GateTimeouts = sumValues(c.metrics(t, "caddy_mcp_serializer_gate_timeouts_total"))
	ratio := ""
	if base != nil && base.Res.ElapsedMs > 0 {
		ratio = fmt.Sprintf(" (%.2fx the %v front's %.1f s)", float64(run.Res.ElapsedMs)/float64(base.Res.ElapsedMs), base.Front, float64(base.Res.ElapsedMs)/1000)
	}
	t.Logf("%s: %d connects in %.1f s%s; connect p50 %.1f ms, p99 %.1f ms; %d sessions with failures; %d connects of %v or more; %v requests held over 2.5 s; %v gate timeouts so far; failed state calls %v",
		label, run.Res.N, float64(run.Res.ElapsedMs)/1000, ratio, run.Res.ConnectP50Ms, run.Res.ConnectP99Ms,
		run.Res.FailedSessions, run.Stalled, stallMark, run.LongWaits, run.GateTimeouts, nonZero(c.stateErrors(t)))
	wantNoFailure(t, run.Res)
	// Not gate_timeouts_total: a follow-up held until init_timeout is let go
	// without counting one when the record then says the gate opened
	// elsewhere, and a session created on one instance and ended on
	// another counts one there init_timeout after its initialize.
	if run.Stalled != 0 {
		t.Errorf("%d connects lasted %v or more behind the %v front: follow-ups held until init_timeout (%v), want none", run.Stalled, stallMark, opts.Balancer, clusterInitTimeout)
	}
	wantStreamedProgress(t, c.Front+"/mcp")
	return run
}

// stallMark is how long a connect lasts when one of its follow-ups was held
// until init_timeout, the gate's deadline; a connect takes well under a
// second otherwise.
const stallMark = clusterInitTimeout * 9 / 10

// stalledConnects counts the connects that lasted stallMark or more.
func stalledConnects(res pipelineResult) int {
	n := 0
	for _, ms := range res.ConnectMs {
		if time.Duration(ms*float64(time.Millisecond)) >= stallMark {
			n++
		}
	}
	return n
}

// waitsOver counts the requests the running instances held longer than le
// seconds (a bucket bound of caddy_mcp_serializer_queue_wait_seconds).
func (c *cluster) waitsOver(t testing.TB, le string) float64 {
	t.Helper()
	count := sumValues(c.metrics(t, "caddy_mcp_serializer_queue_wait_seconds_count"))
	within, ok := c.metrics(t, "caddy_mcp_serializer_queue_wait_seconds_bucket")[`{le="`+le+`"}`]
	if !ok {
		t.Fatalf("caddy_mcp_serializer_queue_wait_seconds has no bucket le=%q", le)
	}
	return count - within
}

// wantStreamedProgress runs the SDK's flow at url (a front, nginx, or Caddy
// itself): slow_count's progress events must reach the client as PHP writes
// them, well ahead of the result, not held back until the reply ends, and
// the GET stream is answered 405 (get_stream reject).
func wantStreamedProgress(t *testing.T, url string) {
	t.Helper()
	var flow flowResult
	runClient(t, 2*time.Minute, &flow, "flow", "--url", url, "--expect-get")
	if !flow.OK {
		t.Fatalf("flow at %s failed: %s (transport errors %v)", url, flow.Error, flow.TransportErrors)
	}
	checkFlowBasics(t, flow)
	if len(flow.Progress) == 0 || flow.ResultAt-flow.Progress[0].At < 300 {
		t.Errorf("progress at %s not streamed ahead of the result: %s, result at %.1f ms", url, jsonString(flow.Progress), flow.ResultAt)
	}
	if len(flow.GetStatuses) != 1 || string(flow.GetStatuses[0]) != "405" {
		t.Errorf("GET stream statuses: got %s, want [405] (get_stream reject)", jsonString(flow.GetStatuses))
	}
}

// requireOrderOwner fails the test when the Caddy binary does not know
// mcp_serializer's `order owner` (the default with state redis).
func requireOrderOwner(t *testing.T) {
	t.Helper()
	conf := filepath.Join(t.TempDir(), "Caddyfile")
	caddyfile := "http://127.0.0.1:9 {\n\tmcp_serializer {\n\t\torder owner\n\t\tadvertise 127.0.0.1:9\n\t\tstate redis {\n\t\t\taddress 127.0.0.1:9\n\t\t}\n\t}\n\trespond ok\n}\n"
	if err := os.WriteFile(conf, []byte(caddyfile), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(caddyBinary(t), "adapt", "--config", conf, "--adapter", "caddyfile").CombinedOutput()
	if err != nil {
		t.Fatalf("the Caddy binary %s refuses mcp_serializer's `order owner` (rebuild it with `make caddy`): %v\n%s", caddyBinary(t), err, out)
	}
}

// nonZero is m without its zero samples.
func nonZero(m map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range m {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}

// sumValues adds up a metric's samples over its label sets.
func sumValues(m map[string]float64) float64 {
	total := 0.0
	for _, v := range m {
		total += v
	}
	return total
}
