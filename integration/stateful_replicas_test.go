package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/testnet"
	"github.com/mcpserializer/caddy-mcp-serializer/owner"
)

// MCP servers that keep their sessions in one replica's memory (the
// official TypeScript SDK's server with sessions: v2server.mjs --legacy
// sessions), three replicas, each behind its own Caddy run from
// examples/stateful-replicas/instance.Caddyfile (`upstream_sessions
// instance`, `instance_name replica-N`), one Redis, and a round-robin
// front, Caddy's or nginx's. A replica answers a session it does not know
// 404 "Session not found", and each replica logs every request it got,
// with whether it named a session and its status: the tests judge there
// which replica served what.

const (
	// statefulConnects is the pipelined connects of a run straight to the
	// replicas and through the module.
	statefulConnects = 60
	// statefulSessions is the sessions the hold runs keep open: about ten
	// a replica.
	statefulSessions = 30
	// statefulLapseBound bounds the wait, from a kill, for a request of a
	// killed instance's session to be answered 404: its lease lapses 3 s
	// after its last renewal and the others wait 3 s more (the lock
	// delay), so 6–8 s on a machine at rest.
	statefulLapseBound = 20 * time.Second
	// statefulKeptLease is how long an instance stopped with SIGTERM
	// keeps its lease, for it to start again.
	statefulKeptLease = 15 * time.Second
	// statefulEventBound bounds every other wait for an event.
	statefulEventBound = time.Minute
)

// statefulReplicas is the replicas, their instances (once started), Redis
// and the front.
type statefulReplicas struct {
	Front    string // the front's base URL
	front    *front
	replicas []*replica
	redis    *redisServer
}

// replica is one v2server.mjs process and the Caddy in front of it.
type replica struct {
	Name  string // replica-1…: its instance's instance_name
	Addr  string
	log   string
	proc  *process
	caddy *caddyInstance
	id    string // the instance ID its sessions' ids name
	probe string // the id of a session begun on it by instanceIDOf
}

// startReplicaServers runs n replicas of v2server.mjs with sessions, each
// on its own port with its own log.
func startReplicaServers(t *testing.T, n int) *statefulReplicas {
	t.Helper()
	rs := &statefulReplicas{}
	for i := 1; i <= n; i++ {
		rs.addReplicaServer(t)
	}
	return rs
}

// addReplicaServer runs one more replica, replica-N, on a port of its own.
func (rs *statefulReplicas) addReplicaServer(t *testing.T) *replica {
	t.Helper()
	r := &replica{Name: "replica-" + strconv.Itoa(len(rs.replicas)+1), Addr: "127.0.0.1:" + strconv.Itoa(testnet.FreePort(t))}
	r.log = filepath.Join(t.TempDir(), r.Name+".log")
	dumpOnFailure(t, r.Name, r.log)
	r.start(t)
	rs.replicas = append(rs.replicas, r)
	return r
}

// start runs the replica's v2server.mjs on its port, its log appended to,
// and waits until it listens. It can be called again once the replica has
// exited: the same port, an empty memory.
func (r *replica) start(t *testing.T) {
	t.Helper()
	node, script := v2Script(t, "v2server.mjs")
	_, port, _ := strings.Cut(r.Addr, ":")
	cmd := exec.Command(node, script, "--port", port, "--legacy", "sessions")
	cmd.Dir = filepath.Dir(script)
	r.proc = startProcess(t, r.Name, cmd, r.log, syscall.SIGTERM, 5*time.Second)
	waitTCP(t, r.proc, r.Addr, r.log)
}

// addrs are the replicas' addresses.
func (rs *statefulReplicas) addrs() []string {
	var out []string
	for _, r := range rs.replicas {
		out = append(out, r.Addr)
	}
	return out
}

// startInstances starts Redis and, in front of each replica, a Caddy run
// from the example's instance.Caddyfile (each edit made once), named as
// its replica; then a round-robin front of kind b in front of them, and
// learns the instance ID each one's sessions carry.
func (rs *statefulReplicas) startInstances(t *testing.T, b balancer, edits ...[2]string) {
	t.Helper()
	requireModule(t, redisStateModule)
	rs.redis = startRedis(t)
	for _, r := range rs.replicas {
		rs.startInstance(t, r, edits...)
	}
	opts := clusterOptions{Balancer: b}
	if b == caddyRoundRobin {
		// A stopped or killed instance: a refused connection is tried on
		// another, and a POST whose kept-alive connection a stopping
		// instance closed is sent again.
		opts.Front = deadInstanceFront + stoppingInstanceFront
	}
	rs.front = startFront(t, opts, rs.dials())
	rs.Front = rs.front.URL
}

// startInstance starts r's Caddy from the example's instance.Caddyfile
// (each edit made once), named as r, and learns the instance ID its
// sessions carry.
func (rs *statefulReplicas) startInstance(t *testing.T, r *replica, edits ...[2]string) {
	t.Helper()
	config := renderExample(t, "stateful-replicas", "instance.Caddyfile", edits)
	dir := t.TempDir()
	in := &caddyInstance{Name: r.Name + " caddy", Port: testnet.FreePort(t), Admin: testnet.FreePort(t), dir: dir,
		conf: filepath.Join(dir, "instance.Caddyfile"), log: filepath.Join(dir, "caddy.log")}
	if err := os.WriteFile(in.conf, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	in.URL = "http://127.0.0.1:" + strconv.Itoa(in.Port)
	in.env = []string{
		"INSTANCE_PORT=" + strconv.Itoa(in.Port),
		"INSTANCE_BIND=127.0.0.1",
		"INSTANCE_ADMIN=127.0.0.1:" + strconv.Itoa(in.Admin),
		"ADVERTISE=127.0.0.1:" + strconv.Itoa(in.Port),
		"INSTANCE_NAME=" + r.Name,
		"UPSTREAM=" + r.Addr,
		"REDIS_ADDRESS=" + rs.redis.Addr,
	}
	dumpOnFailure(t, in.Name, in.conf, in.log)
	in.start(t)
	r.caddy = in
	r.id, r.probe = instanceIDOf(t, in)
}

// dials are the addresses of the replicas' instances, as the front dials
// them.
func (rs *statefulReplicas) dials() []string {
	var dials []string
	for _, r := range rs.replicas {
		dials = append(dials, "127.0.0.1:"+strconv.Itoa(r.caddy.Port))
	}
	return dials
}

// addReplica starts one more replica and its Caddy (instance_name
// replica-N, its own advertise; each edit made once in its config), waits
// until it answers, and then gives it to the front: a Caddy front loads
// its config again through its admin API, nginx reloads its file.
func (rs *statefulReplicas) addReplica(t *testing.T, edits ...[2]string) *replica {
	t.Helper()
	r := rs.addReplicaServer(t)
	rs.startInstance(t, r, edits...)
	rs.front.setInstances(t, rs.dials())
	return r
}

// instanceIDOf is the instance ID that the session ids of sessions
// created through in name, learnt from an initialize sent to it directly,
// and the id of the session that opened (left as it is).
func instanceIDOf(t *testing.T, in *caddyInstance) (id, session string) {
	t.Helper()
	resp, body := post(t, &http.Client{Timeout: 30 * time.Second}, in.URL+"/mcp", "", initializeBody)
	session = resp.Header.Get("Mcp-Session-Id")
	id, _, ok := owner.SplitOwner(session)
	if resp.StatusCode != http.StatusOK || !ok {
		t.Fatalf("initialize sent to %s: %s, session id %q, body %s: want a session id naming the instance", in.Name, resp.Status, session, body)
	}
	return id, session
}

// replicaOf is the replica whose instance the session id names, or nil.
func (rs *statefulReplicas) replicaOf(session string) *replica {
	id, _, ok := owner.SplitOwner(session)
	if !ok {
		return nil
	}
	for _, r := range rs.replicas {
		if r.id == id {
			return r
		}
	}
	return nil
}

// replicaCounts is what a replica's log shows: its requests by method,
// whether they named a session, and status.
type replicaCounts map[string]int

// v2serverLine is a request line of v2server.mjs's log.
var v2serverLine = regexp.MustCompile(`^([A-Z]+) mcp-method=.* session=(yes|no) body-sha256=[0-9a-f]+ -> (\d+)$`)

// counts reads the replica's log: "POST session=yes 200" and the like.
func (r *replica) counts(t *testing.T) replicaCounts {
	t.Helper()
	f, err := os.Open(r.log)
	if err != nil {
		t.Fatalf("%s log: %v", r.Name, err)
	}
	defer f.Close()
	out := replicaCounts{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := v2serverLine.FindStringSubmatch(sc.Text()); m != nil {
			out[m[1]+" session="+m[2]+" "+m[3]]++
		}
	}
	return out
}

// sessionRequests is how many requests naming a session (GET excepted)
// the replica answered 2xx, and how many it answered 404 (a session it
// does not know).
func (c replicaCounts) sessionRequests() (answered, notFound int) {
	for key, n := range c {
		fields := strings.Fields(key) // method, session=…, status
		if fields[1] != "session=yes" || fields[0] == http.MethodGet {
			continue
		}
		switch status, _ := strconv.Atoi(fields[2]); {
		case status >= 200 && status < 300:
			answered += n
		case status == http.StatusNotFound:
			notFound += n
		}
	}
	return answered, notFound
}

// gets is how many GETs reached the replica.
func (c replicaCounts) gets() int {
	n := 0
	for key, v := range c {
		if strings.HasPrefix(key, "GET ") {
			n += v
		}
	}
	return n
}

// notFound sums the 404s the replicas answered to requests naming a
// session, and logs each replica's counts.
func (rs *statefulReplicas) notFound(t *testing.T, label string) (notFound, gets int) {
	t.Helper()
	for _, r := range rs.replicas {
		c := r.counts(t)
		_, nf := c.sessionRequests()
		notFound += nf
		gets += c.gets()
		t.Logf("%s, %s's log: %v", label, r.Name, map[string]int(c))
	}
	return notFound, gets
}

// The example's instance.Caddyfile adapts: mcp_serializer with state
// redis, upstream_sessions instance, instance_name from INSTANCE_NAME and
// advertise, before its reverse_proxy to its one replica.
func TestStatefulReplicasExampleInstanceAdapts(t *testing.T) {
	path := filepath.Join(repoRoot(t), "examples", "stateful-replicas", "instance.Caddyfile")
	for env, want := range map[string]string{"": "replica-1", "INSTANCE_NAME=pod-7": "pod-7"} {
		out := caddyAdapt(t, path, strings.Fields(env)...)
		serializer, upstream := strings.Index(out, `"handler":"mcp_serializer"`), strings.Index(out, `"handler":"reverse_proxy"`)
		if serializer < 0 || upstream < serializer {
			t.Errorf("want mcp_serializer before reverse_proxy:\n%s", out)
		}
		for _, field := range []string{`"upstream_sessions":"instance"`, `"instance_name":"` + want + `"`, `"advertise":"127.0.0.1:8081"`, `"127.0.0.1:6379"`, `"dial":"127.0.0.1:9181"`} {
			if !strings.Contains(out, field) {
				t.Errorf("environment %q: want %s in:\n%s", env, field, out)
			}
		}
	}
}

// Straight over three in-memory replicas behind round robin, a session's
// requests land on replicas that never saw its initialize, which answer
// them 404 "Session not found": most pipelined connects fail. Through
// mcp_serializer (`upstream_sessions instance`), every request of a
// session reaches the replica that created it, whatever the front does:
// none fails, no replica answers a session's request 404, and the SDK's
// GET is answered 405 by the instance it lands on and reaches no replica.
func TestStatefulReplicasBehindRoundRobinLoseSessionsStraightAndNoneThroughTheModule(t *testing.T) {
	prerequisites(t)
	for _, front := range roundRobinFronts {
		t.Run(front.String(), func(t *testing.T) {
			rs := startReplicaServers(t, 3)
			n := clusterN(t, statefulConnects)
			straight := startFront(t, clusterOptions{Balancer: front}, rs.addrs())
			var without pipelineResult
			runClient(t, 5*time.Minute, &without, "pipeline", "--url", straight.URL+"/mcp", "--n", strconv.Itoa(n), "--concurrency", strconv.Itoa(pipelineConcurrency))
			notFoundStraight, getsStraight := rs.notFound(t, "straight")
			t.Logf("%s straight to the three replicas, %d pipelined connects: %d sessions failed; the replicas answered %d requests of a session 404; %s",
				front, n, without.FailedSessions, notFoundStraight, without.summary())
			logSamples(t, without.Samples)
			if without.Error != "" || without.Connects == 0 {
				t.Fatalf("straight to the replicas, no connect worked: %s %s", without.Error, without.summary())
			}
			if without.FailedSessions <= n/2 || notFoundStraight == 0 {
				t.Fatalf("straight to the replicas behind round robin, %d of %d sessions failed and %d requests were answered 404; want most sessions lost: the replicas do not keep their sessions apart",
					without.FailedSessions, n, notFoundStraight)
			}

			rs.startInstances(t, front)
			var with pipelineResult
			runClient(t, 5*time.Minute, &with, "pipeline", "--url", rs.Front+"/mcp", "--n", strconv.Itoa(n), "--concurrency", strconv.Itoa(pipelineConcurrency))
			notFoundAfter, getsAfter := rs.notFound(t, "through the module")
			t.Logf("%s through mcp_serializer (upstream_sessions instance), %d pipelined connects: %d sessions failed; the replicas answered %d more requests of a session 404; %s",
				front, n, with.FailedSessions, notFoundAfter-notFoundStraight, with.summary())
			wantNoFailure(t, with)
			if notFoundAfter != notFoundStraight {
				t.Errorf("through the module the replicas answered %d requests of a session 404, want none: a request reached a replica that did not create its session", notFoundAfter-notFoundStraight)
			}
			if getsAfter != getsStraight {
				t.Errorf("%d GETs reached a replica through the module, want none (get_stream reject answers them 405 where they land)", getsAfter-getsStraight)
			}
			for status := range with.GetStatuses {
				if status != "405" {
					t.Errorf("the SDK's GETs were answered %v, want 405 only", with.GetStatuses)
					break
				}
			}
			wantGetAnsweredWhereItLands(t, rs.replicas[0].caddy, rs.replicas[1].probe)
		})
	}
}

// wantGetAnsweredWhereItLands sends in a GET for session, which another
// instance created, and fails the test unless in answers it 405 itself,
// forwarding nothing.
func wantGetAnsweredWhereItLands(t *testing.T, in *caddyInstance, session string) {
	t.Helper()
	forwards := func() float64 { return sumValues(in.metrics(t, "caddy_mcp_serializer_forwards_total")) }
	before := forwards()
	req, err := http.NewRequest(http.MethodGet, in.URL+"/mcp", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", session)
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("GET on %s: %v", in.Name, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || forwards() != before {
		t.Errorf("GET on %s for a session another instance created: %s, %v forwarded; want 405 there, nothing forwarded", in.Name, resp.Status, forwards()-before)
	}
}

// One instance's Caddy stopped with SIGTERM and started again, on the same
// ports and with the same instance_name, while sessions of every replica
// are open and in use: the calls its sessions had running when it stopped
// finish; their next calls, sent while it is down, wait for it and are
// answered once it is back; no session of another replica notices; and
// every request was served by the replica that created its session (its
// log shows each request the client had answered, and no replica
// answered one 404). With `upstream_sessions shared` (the default) the
// stopping instance hands its sessions over, and the instance that takes
// one over sends it to its own replica, which answers 404.
func TestStatefulReplicasCaddyRestartedServesItsReplicasSessionsAgain(t *testing.T) {
	prerequisites(t)
	for _, front := range roundRobinFronts {
		t.Run(front.String(), func(t *testing.T) {
			rs := startStatefulReplicas(t, front)
			run := startHoldRun(t, rs, statefulSessions)
			victim := rs.replicas[1]
			mine := run.pastFirstRound(t, rs, victim)

			// Round 2: a slow call on every session (20 steps of 100 ms);
			// the Caddy stops once each of its sessions' calls runs.
			run.send(t, "round slow 20")
			run.until(t, "every call of "+victim.Name+"'s sessions running", statefulEventBound, func(h *holdState) bool { return h.progressed(2, mine) })
			if err := syscall.Kill(victim.caddy.proc.cmd.Process.Pid, syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			stopped := time.Now()
			running := len(mine) - run.answeredOf(2, mine)
			select {
			case <-victim.caddy.proc.exited:
			case <-time.After(statefulEventBound):
				t.Fatalf("%s did not exit within %v of SIGTERM", victim.caddy.Name, statefulEventBound)
			}
			exited := time.Since(stopped)
			run.waitDone(t, 2)
			run.wantRoundAnswered(t, 2)

			// Round 3, sent while it is down: the other replicas' sessions
			// are answered; its sessions' requests wait for it.
			unreachable := func() float64 {
				n := 0.0
				for _, r := range rs.replicas {
					if r != victim {
						n += r.caddy.metrics(t, "caddy_mcp_serializer_forwards_total")[`{result="unreachable"}`]
					}
				}
				return n
			}
			before := unreachable()
			run.send(t, "round")
			run.until(t, "the other replicas' sessions answered in round 3", statefulEventBound, func(h *holdState) bool {
				return h.answeredOf(3, run.others(mine)) == len(run.others(mine))
			})
			waitFor(t, "a request of "+victim.Name+"'s sessions waiting for its instance", statefulEventBound, func() bool { return unreachable() > before })
			if n := run.endedOf(3, mine); n != 0 {
				t.Fatalf("%d calls of %s's sessions ended while its Caddy was down: %v", n, victim.Name, run.failuresOf(3))
			}
			down := time.Since(stopped)
			victim.caddy.start(t)
			t.Logf("%s: SIGTERM with %d of its %d sessions' calls running; it exited %v later; started again %v after the SIGTERM, with round 3's requests of its sessions waiting at the other instances",
				victim.caddy.Name, running, len(mine), exited.Round(time.Millisecond), down.Round(time.Millisecond))
			if id, _ := instanceIDOf(t, victim.caddy); id != victim.id {
				t.Errorf("%s names its sessions %s after the restart, %s before: instance_name does not keep its ID", victim.caddy.Name, id, victim.id)
			}
			run.waitDone(t, 3)
			run.wantRoundAnswered(t, 3)
			t.Logf("round 3: %s's sessions answered %v after the restart began", victim.Name, run.lastAnswerOf(3, mine).Sub(stopped.Add(down)).Round(time.Millisecond))

			run.round(t, "")
			run.wantRoundAnswered(t, 4)
			res := run.stop(t)
			if !res.OK || res.Renewed != 0 {
				t.Errorf("the sessions through the restart: %d failures, %d new sessions, %d failed deletes; want none: %v", len(res.Failures), res.Renewed, res.FailedDeletes, res.Failures)
			}
			rs.wantServedByTheirReplicas(t, res, nil)
		})
	}
}

// A replica and its Caddy gone together, killed (SIGKILL) or stopped
// (SIGTERM) for good: its sessions are gone. Their next requests wait
// while the instance's lease stands and are answered 404, with a JSON-RPC
// error, once it has lapsed and the lock delay has passed: 6–8 s after a
// kill, and after a stop, which keeps the lease 15 s, about 18 s and never
// before 15 s. The client starts a new session at once, on a live
// replica, and it works. The other replicas' sessions are untouched, and
// no replica ever answered a session's request 404: with
// `upstream_sessions shared` (the default) another instance takes the
// gone one's sessions over and sends them to its own replica, which
// answers 404 itself.
func TestStatefulReplicasGoneReplicasSessionsAnswer404AndTheirClientsStartAgain(t *testing.T) {
	prerequisites(t)
	for _, tc := range []struct {
		name  string
		sig   syscall.Signal
		least time.Duration // before it, the lease stands
		bound time.Duration // the 404s come within it
	}{
		{"killed", syscall.SIGKILL, 0, statefulLapseBound},
		{"stopped", syscall.SIGTERM, statefulKeptLease, statefulKeptLease + statefulLapseBound},
	} {
		for _, front := range roundRobinFronts {
			t.Run(tc.name+"/"+front.String(), func(t *testing.T) {
				testGoneReplica(t, front, tc.name, tc.sig, tc.least, tc.bound)
			})
		}
	}
}

// testGoneReplica is one case of the test above.
func testGoneReplica(t *testing.T, front balancer, what string, sig syscall.Signal, least, bound time.Duration) {
	signal := map[syscall.Signal]string{syscall.SIGKILL: "SIGKILL", syscall.SIGTERM: "SIGTERM"}[sig]
	rs := startStatefulReplicas(t, front)
	run := startHoldRun(t, rs, statefulSessions)
	victim := rs.replicas[2]
	mine := run.pastFirstRound(t, rs, victim)
	// A replica logs a request once its answer's stream has ended,
	// which may come after the client has its reply: gone before, it
	// would not show what it served. So far each session sent
	// notifications/initialized, logging/setLevel, tools/list and
	// round 1's call.
	waitFor(t, victim.Name+" logs every request of its sessions", statefulEventBound, func() bool {
		answered, _ := victim.counts(t).sessionRequests()
		return answered >= 4*len(mine)
	})

	for _, p := range []*process{victim.caddy.proc, victim.proc} {
		if err := syscall.Kill(-p.cmd.Process.Pid, sig); err != nil {
			t.Fatal(err)
		}
	}
	signalled := time.Now()
	for _, p := range []*process{victim.caddy.proc, victim.proc} {
		select {
		case <-p.exited:
		case <-time.After(statefulEventBound):
			t.Fatalf("%s still runs %v after %s", p.name, statefulEventBound, signal)
		}
	}
	run.send(t, "round")
	run.until(t, "every session of "+victim.Name+" answered 404", bound, func(h *holdState) bool { return h.failedOf(2, mine) == len(mine) })
	run.waitDone(t, 2)
	h := run.snapshot()
	var first, last time.Duration
	for i, slot := range mine {
		f := h.failed[roundSlot{2, slot}]
		d := f.at.Sub(signalled)
		if i == 0 || d < first {
			first = d
		}
		last = max(last, d)
	}
	t.Logf("%s and its Caddy %s (%s): its %d sessions' next requests answered 404 from %v to %v after the %s", victim.Name, what, signal, len(mine), first.Round(time.Millisecond), last.Round(time.Millisecond), signal)
	if first < least {
		t.Errorf("a request of %s's sessions was answered 404 %v after the %s, before its kept lease (%v) ran out", victim.Name, first.Round(time.Millisecond), signal, least)
	}
	if others := run.others(mine); h.answeredOf(2, others) != len(others) || h.failedOf(2, others) != 0 {
		t.Errorf("round 2: %d of the other replicas' %d sessions answered, %d failed: %v", h.answeredOf(2, others), len(others), h.failedOf(2, others), run.failuresOf(2))
	}
	for _, slot := range mine {
		if got := h.answered[roundSlot{2, slot}]; got.IsZero() {
			t.Errorf("slot %d: its call was not answered on a new session after the 404: %s", slot, h.failed[roundSlot{2, slot}].reason)
		}
		if r := rs.replicaOf(h.sessions[slot]); r == nil || r == victim {
			t.Errorf("slot %d: its new session %q is not on a live replica", slot, h.sessions[slot])
		}
	}

	res := run.endWithOnlyRound2NotFounds(t, rs, victim, len(mine))
	rs.wantServedByTheirReplicas(t, res, nil)
}

// One replica killed (SIGKILL) and started again on its port while its
// Caddy runs and sessions of every replica are open: the replica forgot
// its sessions, and their next requests, still sent to it by its Caddy,
// are answered 404 by the replica itself, one for each (its log says so),
// with the SDK's JSON-RPC error; each client starts a new session at
// once, and it works wherever it was created. The other replicas'
// sessions are untouched, and every other request was served by the
// replica that created its session. No instance stops, so `upstream_sessions
// shared` passes it too: what it rests on is each session's requests
// reaching the instance its id names, which `order local` does not do.
func TestStatefulReplicasReplicaRestartedLosesOnlyItsOwnSessions(t *testing.T) {
	prerequisites(t)
	for _, front := range roundRobinFronts {
		t.Run(front.String(), func(t *testing.T) {
			rs := startStatefulReplicas(t, front)
			run := startHoldRun(t, rs, statefulSessions)
			victim := rs.replicas[0]
			mine := run.pastFirstRound(t, rs, victim)
			others := run.others(mine)
			// Each session sent notifications/initialized,
			// logging/setLevel, tools/list and round 1's call; the
			// replica logs a request once its answer has ended.
			waitFor(t, victim.Name+" logs every request of its sessions", statefulEventBound, func() bool {
				answered, _ := victim.counts(t).sessionRequests()
				return answered >= 4*len(mine)
			})

			if err := syscall.Kill(-victim.proc.cmd.Process.Pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			select {
			case <-victim.proc.exited:
			case <-time.After(statefulEventBound):
				t.Fatalf("%s still runs %v after SIGKILL", victim.Name, statefulEventBound)
			}
			victim.start(t)
			if !victim.caddy.proc.running() {
				t.Fatalf("%s exited with its replica", victim.caddy.Name)
			}

			run.round(t, "")
			h := run.snapshot()
			if h.answeredOf(2, others) != len(others) || h.failedOf(2, others) != 0 {
				t.Errorf("round 2: %d of the other replicas' %d sessions answered, %d failed: %v", h.answeredOf(2, others), len(others), h.failedOf(2, others), run.failuresOf(2))
			}
			landed := map[string]int{}
			for _, slot := range mine {
				if _, ok := h.failed[roundSlot{2, slot}]; !ok {
					t.Errorf("slot %d: its call on %s's forgotten session did not fail", slot, victim.Name)
				}
				if h.answered[roundSlot{2, slot}].IsZero() {
					t.Errorf("slot %d: its call was not answered on a new session after the 404: %s", slot, h.failed[roundSlot{2, slot}].reason)
				}
				r := rs.replicaOf(h.sessions[slot])
				if r == nil {
					t.Errorf("slot %d: its new session %q names none of the instances", slot, h.sessions[slot])
					continue
				}
				landed[r.Name]++
			}
			t.Logf("%s killed and started again with %d of the %d sessions; their next calls failed, and their new sessions were created on %v", victim.Name, len(mine), statefulSessions, landed)

			res := run.endWithOnlyRound2NotFounds(t, rs, victim, len(mine))
			// The 404s are the replica's own: one for each of its
			// sessions, and none at another replica.
			rs.wantServedByTheirReplicas(t, res, map[*replica]int{victim: len(mine)})
		})
	}
}

// A fourth replica and its Caddy (instance_name replica-4, its own
// advertise) started while sessions of the three are open, and given to
// the front: the old sessions' requests that the front now sends to the
// new instance are forwarded to the instances that created them, and
// every old session keeps working, none answered 404; of the sessions
// opened after it joined, the new instance creates its share, and they
// all work. Every request was served by the replica that created its
// session. A new instance on a Redis of its own does not find the old
// sessions' instances and answers the old sessions' requests that reach it
// 404 at once.
func TestStatefulReplicasAnInstanceAddedTakesNewSessionsAndTouchesNoOldOne(t *testing.T) {
	prerequisites(t)
	for _, front := range roundRobinFronts {
		t.Run(front.String(), func(t *testing.T) {
			rs := startStatefulReplicas(t, front)
			old := startHoldRun(t, rs, statefulSessions)
			old.label = "old sessions"
			old.pastFirstRound(t, rs, nil)

			joining := time.Now()
			added := rs.addReplica(t)
			given := time.Since(joining)
			// The front has the new instance once an initialize sent to
			// it creates a session there (left as it is: it sends no
			// request naming a session).
			client := &http.Client{Timeout: 30 * time.Second}
			probes := 0
			took := waitFor(t, "the front sends an initialize to "+added.Name, statefulEventBound, func() bool {
				probes++
				resp, body := post(t, client, rs.Front+"/mcp", "", initializeBody)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("initialize through the front: %s %s", resp.Status, body)
				}
				return rs.replicaOf(resp.Header.Get("Mcp-Session-Id")) == added
			})
			t.Logf("%s and its Caddy started and given to the front %v after it began; the front sent an initialize to it %v later (initialize %d)",
				added.Name, given.Round(time.Millisecond), took.Round(time.Millisecond), probes)

			forwarded := func() float64 { return sumValues(added.caddy.metrics(t, "caddy_mcp_serializer_forwards_total")) }
			old.round(t, "")
			old.wantRoundAnswered(t, 2)
			// Round 2 is the first request of old sessions that the front
			// could send to the new instance.
			oldThrough := forwarded()
			t.Logf("old sessions' round 2: %s forwarded %v of their %d calls to the instances that created them", added.Name, oldThrough, statefulSessions)
			if oldThrough == 0 {
				t.Errorf("%s forwarded none of the old sessions' round 2: the front sent it none", added.Name)
			}
			fresh := startHoldRun(t, rs, statefulSessions)
			fresh.label = "new sessions"
			fresh.waitReady(t)
			theirs := fresh.slotsOf(t, rs, added)
			old.round(t, "")
			fresh.round(t, "")
			old.wantRoundAnswered(t, 3)
			fresh.wantRoundAnswered(t, 1)
			old.round(t, "")
			fresh.round(t, "")
			old.wantRoundAnswered(t, 4)
			fresh.wantRoundAnswered(t, 2)
			t.Logf("%s created %d of the %d sessions opened after it joined; it forwarded %v requests in all to the instances that created their sessions", added.Name, len(theirs), statefulSessions, forwarded())

			resOld, resNew := old.stop(t), fresh.stop(t)
			for _, res := range []holdResult{resOld, resNew} {
				if !res.OK || res.Renewed != 0 {
					t.Errorf("%d failures, %d new sessions, %d failed deletes; want none: %v", len(res.Failures), res.Renewed, res.FailedDeletes, res.Failures)
				}
			}
			all := resOld
			all.Sessions = append(append(all.Sessions[:0:0], resOld.Sessions...), resNew.Sessions...)
			rs.wantServedByTheirReplicas(t, all, nil)
		})
	}
}

// wantServedByTheirReplicas fails the test unless each replica's log
// shows exactly as many requests naming a session (GET excepted)
// answered 2xx as the client had answered 2xx on the sessions whose id
// names that replica's instance, and no replica answered such a request
// 404 but for lost[r], the requests of sessions replica r forgot.
func (rs *statefulReplicas) wantServedByTheirReplicas(t *testing.T, res holdResult, lost map[*replica]int) {
	t.Helper()
	want := map[*replica]int{}
	for _, s := range res.Sessions {
		r := rs.replicaOf(s.SessionID)
		if r == nil {
			t.Errorf("session %q of slot %d names no instance of the replicas", s.SessionID, s.Slot)
			continue
		}
		want[r] += s.Answered
	}
	for _, r := range rs.replicas {
		if r.proc.running() {
			// Its log line for a streamed answer comes once the stream
			// has ended, which may be after the client had its reply.
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
				if answered, _ := r.counts(t).sessionRequests(); answered >= want[r] {
					break
				}
			}
		}
		c := r.counts(t)
		answered, notFound := c.sessionRequests()
		t.Logf("%s served %d requests of its sessions (the client had %d answered), answered %d 404; its log: %v", r.Name, answered, want[r], notFound, map[string]int(c))
		if answered != want[r] || notFound != lost[r] {
			t.Errorf("%s answered %d requests of a session 2xx and %d 404 (want %d, of sessions it forgot); the client had %d answered on %s's sessions: a request was served by a replica that did not create its session", r.Name, answered, notFound, lost[r], want[r], r.Name)
		}
	}
}

// holdResult is the hold mode's final line.
type holdResult struct {
	OK            bool          `json:"ok"`
	Error         string        `json:"error"`
	N             int           `json:"n"`
	Rounds        int           `json:"rounds"`
	Renewed       int           `json:"renewed"`
	FailedOpens   int           `json:"failedOpens"`
	FailedDeletes int           `json:"failedDeletes"`
	Timeouts      int           `json:"timeouts"`
	Failures      []holdFailure `json:"failures"`
	Sessions      []struct {
		Slot      int            `json:"slot"`
		SessionID string         `json:"sessionId"`
		Requests  int            `json:"requests"`
		Answered  int            `json:"answered"`
		Statuses  map[string]int `json:"statuses"`
		Gets      []string       `json:"gets"`
	} `json:"sessions"`
	ElapsedMs int `json:"elapsedMs"`
}

// holdFailure is a failed call or DELETE (round "delete").
type holdFailure struct {
	Round     json.Number `json:"round"`
	Slot      int         `json:"slot"`
	SessionID string      `json:"sessionId"`
	Status    json.Number `json:"status"`
	Body      string      `json:"body"`
	Reason    string      `json:"reason"`
}

// UnmarshalJSON takes a round or status given as a string ("delete",
// "network") too.
func (f *holdFailure) UnmarshalJSON(data []byte) error {
	var raw struct {
		Round     any    `json:"round"`
		Slot      int    `json:"slot"`
		SessionID string `json:"sessionId"`
		Status    any    `json:"status"`
		Body      string `json:"body"`
		Reason    string `json:"reason"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return err
	}
	*f = holdFailure{Round: json.Number(fmt.Sprint(raw.Round)), Slot: raw.Slot, SessionID: raw.SessionID,
		Status: json.Number(fmt.Sprint(raw.Status)), Body: raw.Body, Reason: raw.Reason}
	return nil
}

// roundSlot names one slot's call in one round.
type roundSlot struct{ round, slot int }

// holdState is what the hold client has said so far, each event timed on
// arrival.
type holdState struct {
	ready    bool
	sessions map[int]string // slot -> its session id now
	progress map[roundSlot]time.Time
	answered map[roundSlot]time.Time
	failed   map[roundSlot]holdEvent // the last failure
	done     map[int]bool
}

// holdEvent is a failure the client reported.
type holdEvent struct {
	at     time.Time
	reason string
}

func (h *holdState) countOf(m map[roundSlot]time.Time, round int, slots []int) int {
	n := 0
	for _, s := range slots {
		if _, ok := m[roundSlot{round, s}]; ok {
			n++
		}
	}
	return n
}

func (h *holdState) answeredOf(round int, slots []int) int {
	return h.countOf(h.answered, round, slots)
}

func (h *holdState) progressed(round int, slots []int) bool {
	return h.countOf(h.progress, round, slots) == len(slots)
}

func (h *holdState) failedOf(round int, slots []int) int {
	n := 0
	for _, s := range slots {
		if _, ok := h.failed[roundSlot{round, s}]; ok {
			n++
		}
	}
	return n
}

// holdRun is the client's hold mode through the front, in the background.
type holdRun struct {
	label    string
	n        int
	stdin    *os.File
	finished chan struct{}
	res      holdResult

	mu      sync.Mutex
	state   holdState
	changed chan struct{} // closed at each event, then replaced
}

// startHoldRun opens n sessions through the front with the hold mode.
func startHoldRun(t *testing.T, rs *statefulReplicas, n int) *holdRun {
	t.Helper()
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	r := &holdRun{label: "hold", n: n, stdin: stdinW, finished: make(chan struct{}), changed: make(chan struct{}),
		state: holdState{sessions: map[int]string{}, progress: map[roundSlot]time.Time{}, answered: map[roundSlot]time.Time{},
			failed: map[roundSlot]holdEvent{}, done: map[int]bool{}}}
	// Cleanups run last first: closing stdin ends the client, which is
	// then waited for.
	t.Cleanup(func() { <-r.finished })
	t.Cleanup(func() { stdinW.Close(); stdinR.Close() })
	sio := scriptIO{stdin: stdinR, onLine: r.onLine}
	go func() {
		defer close(r.finished)
		runClientWith(t, sio, 10*time.Minute, &r.res, "hold", "--url", rs.Front+"/mcp", "--n", strconv.Itoa(n), "--timeout", "45000")
	}()
	return r
}

func (r *holdRun) onLine(line string) {
	fields := strings.SplitN(line, " ", 4)
	num := func(i int) int {
		if i >= len(fields) {
			return -1
		}
		n, err := strconv.Atoi(fields[i])
		if err != nil {
			return -1
		}
		return n
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	h := &r.state
	switch fields[0] {
	case "ready":
		h.ready = true
	case "session":
		if len(fields) >= 3 {
			h.sessions[num(1)] = fields[2]
		}
	case "progress":
		if _, ok := h.progress[roundSlot{num(1), num(2)}]; !ok {
			h.progress[roundSlot{num(1), num(2)}] = now
		}
	case "answered":
		h.answered[roundSlot{num(1), num(2)}] = now
	case "failed":
		reason := ""
		if len(fields) == 4 {
			reason = fields[3]
		}
		h.failed[roundSlot{num(1), num(2)}] = holdEvent{at: now, reason: reason}
	case "done":
		h.done[num(1)] = true
	default:
		return
	}
	close(r.changed)
	r.changed = make(chan struct{})
}

// snapshot is a copy of what the client has said so far.
func (r *holdRun) snapshot() *holdState {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := &holdState{ready: r.state.ready, sessions: map[int]string{}, progress: map[roundSlot]time.Time{},
		answered: map[roundSlot]time.Time{}, failed: map[roundSlot]holdEvent{}, done: map[int]bool{}}
	for k, v := range r.state.sessions {
		h.sessions[k] = v
	}
	for k, v := range r.state.progress {
		h.progress[k] = v
	}
	for k, v := range r.state.answered {
		h.answered[k] = v
	}
	for k, v := range r.state.failed {
		h.failed[k] = v
	}
	for k, v := range r.state.done {
		h.done[k] = v
	}
	return h
}

// until waits until cond holds of what the client has said, failing the
// test after bound or if the client ends first.
func (r *holdRun) until(t *testing.T, what string, bound time.Duration, cond func(h *holdState) bool) {
	t.Helper()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for {
		r.mu.Lock()
		ok, changed := cond(&r.state), r.changed
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-r.finished:
			t.Fatalf("%s: the client ended before %s", r.label, what)
		case <-timer.C:
			t.Fatalf("%s: %s: not within %v", r.label, what, bound)
		}
	}
}

// send writes a line to the client's stdin.
func (r *holdRun) send(t *testing.T, line string) {
	t.Helper()
	if _, err := r.stdin.WriteString(line + "\n"); err != nil {
		t.Fatalf("%s: writing %q to the client: %v", r.label, line, err)
	}
}

// waitReady waits until every session is open, failing the test if one
// did not open.
func (r *holdRun) waitReady(t *testing.T) {
	t.Helper()
	r.until(t, "the sessions open", statefulEventBound, func(h *holdState) bool { return h.ready })
	if h := r.snapshot(); len(h.sessions) != r.n || len(h.failed) != 0 {
		t.Fatalf("%d of %d sessions opened: %v", len(h.sessions), r.n, h.failed)
	}
}

// round sends a round of calls ("" for echo) and waits until it is done.
func (r *holdRun) round(t *testing.T, tool string) {
	t.Helper()
	r.mu.Lock()
	next := len(r.state.done) + 1
	r.mu.Unlock()
	r.send(t, strings.TrimSpace("round "+tool))
	r.waitDone(t, next)
}

// waitDone waits until round has ended on every slot.
func (r *holdRun) waitDone(t *testing.T, round int) {
	t.Helper()
	r.until(t, "round "+strconv.Itoa(round)+" done", statefulEventBound, func(h *holdState) bool { return h.done[round] })
}

// wantRoundAnswered fails the test unless every slot's call in round was
// answered and none failed.
func (r *holdRun) wantRoundAnswered(t *testing.T, round int) {
	t.Helper()
	h := r.snapshot()
	all := r.others(nil)
	if a, f := h.answeredOf(round, all), h.failedOf(round, all); a != r.n || f != 0 {
		t.Fatalf("round %d: %d of %d calls answered, %d failed: %v", round, a, r.n, f, r.failuresOf(round))
	}
}

// answeredOf is how many of slots' calls in round have been answered.
func (r *holdRun) answeredOf(round int, slots []int) int {
	return r.snapshot().answeredOf(round, slots)
}

// endedOf is how many of slots' calls in round have been answered or
// have failed.
func (r *holdRun) endedOf(round int, slots []int) int {
	h := r.snapshot()
	return h.answeredOf(round, slots) + h.failedOf(round, slots)
}

// lastAnswerOf is when the last of slots' calls in round was answered.
func (r *holdRun) lastAnswerOf(round int, slots []int) time.Time {
	h := r.snapshot()
	var last time.Time
	for _, s := range slots {
		if at := h.answered[roundSlot{round, s}]; at.After(last) {
			last = at
		}
	}
	return last
}

// failuresOf is the failures the client reported in round, by slot.
func (r *holdRun) failuresOf(round int) map[int]string {
	h := r.snapshot()
	out := map[int]string{}
	for k, f := range h.failed {
		if k.round == round {
			out[k.slot] = f.reason
		}
	}
	return out
}

// others is every slot not in slots, in order.
func (r *holdRun) others(slots []int) []int {
	var out []int
	for s := 0; s < r.n; s++ {
		if !containsInt(slots, s) {
			out = append(out, s)
		}
	}
	return out
}

func containsInt(list []int, v int) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

// startStatefulReplicas starts three replicas and their instances behind
// a round-robin front of kind front (startInstances).
func startStatefulReplicas(t *testing.T, front balancer) *statefulReplicas {
	t.Helper()
	rs := startReplicaServers(t, 3)
	rs.startInstances(t, front)
	return rs
}

// pastFirstRound waits until the run's sessions are open, has each one
// answer round 1, and returns the slots of those victim's instance
// created (slotsOf; nil victim: none).
func (r *holdRun) pastFirstRound(t *testing.T, rs *statefulReplicas, victim *replica) []int {
	t.Helper()
	r.waitReady(t)
	mine := r.slotsOf(t, rs, victim)
	r.round(t, "")
	r.wantRoundAnswered(t, 1)
	return mine
}

// slotsOf is the slots whose sessions victim's instance created, failing
// the test unless every replica has at least two sessions.
func (r *holdRun) slotsOf(t *testing.T, rs *statefulReplicas, victim *replica) []int {
	t.Helper()
	h := r.snapshot()
	per := map[string]int{}
	var mine []int
	for slot, session := range h.sessions {
		rep := rs.replicaOf(session)
		if rep == nil {
			t.Fatalf("slot %d's session %q names none of the instances", slot, session)
		}
		per[rep.Name]++
		if rep == victim {
			mine = append(mine, slot)
		}
	}
	sort.Ints(mine)
	t.Logf("sessions per replica: %v", per)
	for _, rep := range rs.replicas {
		if per[rep.Name] < 2 {
			t.Fatalf("%s has %d of the %d sessions, want at least 2 each: the front did not spread the initializes", rep.Name, per[rep.Name], r.n)
		}
	}
	return mine
}

// stop ends the run (every session deleted) and returns its result.
func (r *holdRun) stop(t *testing.T) holdResult {
	t.Helper()
	r.send(t, "stop")
	select {
	case <-r.finished:
	case <-time.After(statefulEventBound):
		t.Fatalf("%s: the client did not finish within %v of stop", r.label, statefulEventBound)
	}
	if r.res.Error != "" || len(r.res.Sessions) == 0 {
		t.Fatalf("%s: no result from the client (error %q)", r.label, r.res.Error)
	}
	return r.res
}

// endWithOnlyRound2NotFounds runs a third round, stops the run, and fails
// the test unless its only failures were round 2's 404s (JSON-RPC errors)
// of victim's sessions, each replaced by one new session.
func (r *holdRun) endWithOnlyRound2NotFounds(t *testing.T, rs *statefulReplicas, victim *replica, victims int) holdResult {
	t.Helper()
	r.round(t, "")
	r.wantRoundAnswered(t, 3)
	res := r.stop(t)
	if res.Renewed != victims {
		t.Errorf("%d new sessions, want one for each of %s's %d", res.Renewed, victim.Name, victims)
	}
	for _, f := range res.Failures {
		var body struct {
			JSONRPC string `json:"jsonrpc"`
			Error   *struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if f.Round != json.Number("2") || rs.replicaOf(f.SessionID) != victim || f.Status != json.Number("404") {
			t.Errorf("failure in round %s, slot %d (session of %v): %s; want only round 2's 404s of %s's sessions", f.Round, f.Slot, rs.replicaOf(f.SessionID), f.Reason, victim.Name)
		} else if json.Unmarshal([]byte(f.Body), &body) != nil || body.JSONRPC != "2.0" || body.Error == nil {
			t.Errorf("slot %d: the 404's body %q is not a JSON-RPC error", f.Slot, f.Body)
		}
	}
	if len(res.Failures) > 0 {
		t.Logf("the 404 of slot %d: %s", res.Failures[0].Slot, res.Failures[0].Body)
	}
	return res
}

// Two instances given one instance_name (a Caddyfile copied with the name
// written into it) beside a third with its own: the two find at their
// lease renewals that the other renews their lease, and each logs an
// ERROR naming the other's address and counts in
// caddy_mcp_serializer_instance_id_shared; the third does neither.
func TestStatefulReplicasTwoInstancesGivenOneNameAreToldSo(t *testing.T) {
	prerequisites(t)
	requireModule(t, redisStateModule)
	rs := startReplicaServers(t, 3)
	rs.redis = startRedis(t)
	rs.startInstance(t, rs.replicas[0])
	rs.startInstance(t, rs.replicas[1], [2]string{"{$INSTANCE_NAME:replica-1}", rs.replicas[0].Name})
	rs.startInstance(t, rs.replicas[2])
	if rs.replicas[0].id != rs.replicas[1].id {
		t.Fatalf("the two instances named %s carry IDs %s and %s, want one", rs.replicas[0].Name, rs.replicas[0].id, rs.replicas[1].id)
	}
	shared := func(in *caddyInstance) float64 {
		return in.metrics(t, "caddy_mcp_serializer_instance_id_shared")[""]
	}
	first, second, third := rs.replicas[0].caddy, rs.replicas[1].caddy, rs.replicas[2].caddy
	took := waitFor(t, "both instances named "+rs.replicas[0].Name+" count their shared ID", statefulEventBound, func() bool {
		return shared(first) == 1 && shared(second) == 1
	})
	t.Logf("both instances counted their shared ID within %v of the third's start", took.Round(time.Millisecond))
	for _, pair := range [][2]*caddyInstance{{first, second}, {second, first}} {
		logged := pair[0].logText(t)
		want := `"other":"127.0.0.1:` + strconv.Itoa(pair[1].Port) + `"`
		if !strings.Contains(logged, `"level":"error"`) || !strings.Contains(logged, "another instance renews this instance's lease") || !strings.Contains(logged, want) {
			t.Errorf("%s's log has no ERROR naming the other instance (%s)", pair[0].Name, want)
		}
	}
	if n := shared(third); n != 0 {
		t.Errorf("%s, named %s alone, counts %v shared IDs, want 0", third.Name, rs.replicas[2].Name, n)
	}
	if strings.Contains(third.logText(t), "another instance renews this instance's lease") {
		t.Errorf("%s, named %s alone, logged that another instance renews its lease", third.Name, rs.replicas[2].Name)
	}
}
