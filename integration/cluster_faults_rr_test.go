package integration

import (
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Faults behind a round-robin front, the instances on the default order
// (owner, with state redis): every request of a session may land on any
// instance, which forwards it to the session's owner, so a fault in Redis
// or on an instance is one every session in flight meets.

// faultConnectBound is the longest a connect may last through these faults.
// A follow-up can be held at the gate until init_timeout (its session's
// notifications/initialized died with an instance, or its ack could not be
// recorded while Redis was away); a few engine calls, each bounded by the
// redis timeout (250 ms), and the front's retry of a refused connection
// come on top, within 9 s. The client gives up on a reply after 20 s,
// which this stays under.
const faultConnectBound = clusterInitTimeout + 9*time.Second

// roundRobinFaultsN is the pipelined connects of the run a fault hits: enough
// to outlast the fault (MCP_SERIALIZER_CLUSTER_N raises it).
const roundRobinFaultsN = 300

// roundRobinFronts are the fronts the fault tests run behind: Caddy's
// round robin and nginx's.
var roundRobinFronts = []balancer{caddyRoundRobin, nginxRoundRobin}

// startRoundRobinCluster starts three instances with `state redis` on r
// (and so `order owner`) behind front; a Caddy front leaves a dead
// instance out as the hashing front of TestClusterInstanceKilledMidRun
// does, nginx retries the next instance on a refused connection.
func startRoundRobinCluster(t *testing.T, r *redisServer, front balancer) *cluster {
	t.Helper()
	requireModule(t, redisStateModule)
	requireOrderOwner(t)
	opts := clusterOptions{State: redisState(r), Balancer: front}
	if front == caddyRoundRobin {
		opts.Front = deadInstanceFront
	}
	return startCluster(t, opts)
}

// One instance killed (SIGKILL) in the middle of a run behind round robin,
// while it holds sessions begun whose follow-ups are still to come: the
// others take its sessions over, so every wait ends within its bound,
// the connects hit fail with clear errors only, and the two left serve the
// next 100 connects without failure.
func TestClusterRoundRobinInstanceKilledMidRun(t *testing.T) {
	prerequisites(t)
	for _, front := range roundRobinFronts {
		t.Run(front.String(), func(t *testing.T) {
			c := startRoundRobinCluster(t, startRedis(t), front)
			n := clusterN(t, roundRobinFaultsN)
			run := startFaultRun(t, c, front.String()+", instance killed mid-run", n, n/3)
			run.heldAt(t, n/3)
			victim := c.instanceWithHeldSessions(t)
			victim.kill(t)
			t.Logf("killed %s after %d connects", victim.Name, n/3)
			run.resume(t)
			res := run.wait(t, c)
			wantBoundedThroughFault(t, c, res, crossedRepliesFail)
			wantTakenOver(t, c)
			wantNothingStuck(t, c)

			after := runPipeline(t, c, front.String()+", after the kill, two instances left", clusterN(t, 100))
			wantNoFailure(t, after)
		})
	}
}

// Redis killed and started again (empty) in the middle of a run behind
// round robin: owners already known keep serving, a session whose owner
// cannot be learned goes in its instance's order, and no wait outlasts its
// bound.
func TestClusterRoundRobinRedisRestartedMidRun(t *testing.T) {
	runThroughRedisFault(t, "redis restarted", 2*time.Second, func(t *testing.T, redis *redisServer) {
		redis.kill(t)
		t.Logf("redis killed")
	}, func(t *testing.T, redis *redisServer) {
		redis.start(t)
		t.Logf("redis restarted, empty")
	})
}

// Redis unresponsive (SIGSTOP: connections accepted, nothing answered) for
// at least 6 s, then back with its data (SIGCONT), in the middle of a run
// behind round robin: every engine call ends at the redis timeout, and no
// wait outlasts its bound.
func TestClusterRoundRobinRedisUnresponsiveMidRun(t *testing.T) {
	runThroughRedisFault(t, "redis unresponsive", 6*time.Second, func(t *testing.T, redis *redisServer) {
		redis.signal(t, syscall.SIGSTOP)
		t.Cleanup(func() { redis.signal(t, syscall.SIGCONT) }) // the cleanup's SIGTERM needs it running
		t.Logf("redis paused")
	}, func(t *testing.T, redis *redisServer) {
		redis.signal(t, syscall.SIGCONT)
		t.Logf("redis resumed")
	})
}

// runThroughRedisFault runs pipelined connects behind each round-robin
// front, begins the fault on Redis once a third of them have ended and
// ends it once at least outage has passed and as many connects as run at
// once have ended since, and checks that the run stayed within its bounds,
// left nothing stuck, counted the failed engine calls, and that the next
// 100 connects fail none. The client is held while a fault begins or ends,
// so both land mid-run. (A connect that meets Redis away can be held at
// the gate to init_timeout: ending the fault only after a third of the
// run would stretch it over minutes.)
func runThroughRedisFault(t *testing.T, name string, outage time.Duration, begin, end func(t *testing.T, redis *redisServer)) {
	prerequisites(t)
	for _, front := range roundRobinFronts {
		t.Run(front.String(), func(t *testing.T) {
			redis := startRedis(t)
			c := startRoundRobinCluster(t, redis, front)
			n := clusterN(t, roundRobinFaultsN)
			from, to := n/3, n/3+pipelineConcurrency
			run := startFaultRun(t, c, front.String()+", "+name+" mid-run", n, from, to)
			run.heldAt(t, from)
			begin(t, redis)
			began := time.Now()
			run.resume(t)
			time.Sleep(outage)
			run.heldAt(t, to)
			end(t, redis)
			t.Logf("the fault lasted %v, from %d connects to %d", time.Since(began).Round(time.Millisecond), from, to)
			run.resume(t)
			res := run.wait(t, c)
			wantBoundedThroughFault(t, c, res, crossedRepliesLogged)
			wantNothingStuck(t, c)
			wantStateErrorsCounted(t, c)

			after := runPipeline(t, c, front.String()+", after Redis came back", clusterN(t, 100))
			wantNoFailure(t, after)
		})
	}
}

// signal sends sig to the server (SIGSTOP and SIGCONT pause and resume it).
func (r *redisServer) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if !r.proc.running() {
		return
	}
	if err := syscall.Kill(r.proc.cmd.Process.Pid, sig); err != nil {
		t.Errorf("redis-server: %v: %v", sig, err)
	}
}

// crossedReplies says what a run a fault hit may show of replies handed to
// another request than their own (id mismatches, unexpected replies).
type crossedReplies bool

const (
	crossedRepliesFail crossedReplies = false
	// While Redis cannot be reached, a session created then has no
	// recorded owner, and one whose owner an instance has not learned yet
	// is served where its requests arrive, in that instance's order:
	// behind round robin two requests of one session then run upstream at
	// once on two instances, and PHP's session race can hand one's reply
	// to the other. Counted and logged, not failed (the documented
	// exception); wantOnlyClearErrors otherwise holds.
	crossedRepliesLogged crossedReplies = true
)

// wantBoundedThroughFault checks a run a fault hit: nothing left
// unanswered, only clear errors (but crossed replies, if so told), and no
// connect longer than faultConnectBound. It logs the figures: elapsed,
// failures by kind, the longest connects, the requests held long, and the
// failed engine calls of each instance by operation.
func wantBoundedThroughFault(t *testing.T, c *cluster, res pipelineResult, crossed crossedReplies) {
	t.Helper()
	checked := res
	if crossed == crossedRepliesLogged {
		if res.IDMismatches != 0 || res.UnexpectedReplies != 0 {
			t.Logf("replies handed to another request during the Redis outage (a session's requests ran on two instances at once): %d id mismatches, %d unexpected replies", res.IDMismatches, res.UnexpectedReplies)
		}
		checked.IDMismatches, checked.UnexpectedReplies = 0, 0
	}
	wantOnlyClearErrors(t, checked)
	longest := 0.0
	if len(res.ConnectMs) > 0 {
		longest = slices.Max(res.ConnectMs)
	}
	over := func(d time.Duration) int {
		n := 0
		for _, ms := range res.ConnectMs {
			if time.Duration(ms*float64(time.Millisecond)) > d {
				n++
			}
		}
		return n
	}
	t.Logf("through the fault: %d connects in %.1f s; %d sessions with failures (failed connects %d, rejections %d, broken %d, HTTP errors %v, id mismatches %d, unexpected replies %d); longest connect %.1f ms (bound %v), p50 %.1f ms, p99 %.1f ms; connects over %v: %d; requests held over 10 s at the queue or gate: %v; gate timeouts: %v",
		res.N, float64(res.ElapsedMs)/1000, res.FailedSessions, res.FailedConnects, res.Rejections, res.Broken, res.HTTPErrors, res.IDMismatches, res.UnexpectedReplies,
		longest, faultConnectBound, res.ConnectP50Ms, res.ConnectP99Ms,
		stallMark, over(stallMark),
		c.waitsOver(t, "10"), nonZero(c.metrics(t, "caddy_mcp_serializer_gate_timeouts_total")))
	for _, in := range c.Instances {
		if !in.proc.running() {
			t.Logf("%s: killed", in.Name)
			continue
		}
		t.Logf("%s: failed state calls by op %v", in.Name, nonZero(in.metrics(t, "caddy_mcp_serializer_state_errors_total")))
	}
	if time.Duration(longest*float64(time.Millisecond)) > faultConnectBound {
		t.Errorf("the longest connect took %.1f ms, past the bound of %v: a wait outlasted init_timeout and its margin", longest, faultConnectBound)
	}
}

// wantStateErrorsCounted fails the test when no instance counted a failed
// engine call through a Redis outage.
func wantStateErrorsCounted(t *testing.T, c *cluster) {
	t.Helper()
	if sumValues(c.stateErrors(t)) == 0 {
		t.Errorf("caddy_mcp_serializer_state_errors_total stayed 0 through a Redis outage")
	}
}

// wantNothingStuck fails the test unless, once the client is done, every
// running instance soon has no request in flight and none waiting: what a
// fault left behind has ended within the bound.
func wantNothingStuck(t *testing.T, c *cluster) {
	t.Helper()
	deadline := time.Now().Add(faultConnectBound)
	for {
		var busy []string
		for _, in := range c.Instances {
			if !in.proc.running() {
				continue
			}
			if n := instanceSessionCounts(t, in); n["in_flight"] != 0 || n["waiting_requests"] != 0 {
				busy = append(busy, fmt.Sprintf("%s: %d sessions in flight, %d requests waiting", in.Name, n["in_flight"], n["waiting_requests"]))
			}
		}
		if len(busy) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("requests still in flight or waiting %v after the client ended: %s", faultConnectBound, strings.Join(busy, "; "))
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}
