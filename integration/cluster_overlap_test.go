package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// A session's calls at once, judged at the backend: behind a round-robin
// front, sessions keep two tool calls of 1–3 s in flight (client.mjs
// inflight) while an operator's fault hits the cluster, and the PHP-FPM
// pools count in their shared store how many requests of each session ran
// at once (MCP_PHP_COUNT_OVERLAP). Whatever the instances believed, a
// session whose peak is 2 had two calls running at once.

const (
	// overlapSessions is how many sessions the fault runs keep open.
	overlapSessions = 6
	// overlapStep is MCP_PHP_PROGRESS_MS: a call of 2 to 6 steps lasts 1–3 s.
	overlapStep = 500 * time.Millisecond
	// overlapEvery is how many calls end between one step of a fault and
	// the next: about two seconds of the run.
	overlapEvery = 6
	// overlapCallTimeout is how long the client waits for a call: a call
	// may wait behind its session's other call and a stopping instance.
	// A call whose reply the backend lost (PHP's record race, when two
	// calls of a session ran at once) fails only then.
	overlapCallTimeout = 20 * time.Second
	// overlapWait bounds each wait for calls to end.
	overlapWait = 2 * time.Minute
)

// stoppingInstanceFront lets the front send a POST again when the
// connection it picked broke before the request was sent: an instance
// stopping gracefully closes its idle keep-alive connections, and one the
// front had just picked fails the write (an AWS ALB's deregistration delay
// avoids the same race by sending nothing new to a draining target). The
// body is buffered so that it can be sent again.
const stoppingInstanceFront = `
request_buffers 64KiB
lb_retry_match {
	method POST
}`

// startOverlapCluster starts three instances with `state redis` on r
// behind a round-robin Caddy front that leaves a stopped instance out,
// their PHP-FPM pools counting each session's requests at once, and a
// grace period long enough for a stopping instance to finish its calls.
func startOverlapCluster(t *testing.T, r *redisServer) *cluster {
	t.Helper()
	return startOverlapClusterBehind(t, r, caddyRoundRobin)
}

// startOverlapClusterBehind is startOverlapCluster behind front: a Caddy
// front with the lines above, nginx's as examples/cluster/nginx.conf
// has it (without its hash line).
func startOverlapClusterBehind(t *testing.T, r *redisServer, front balancer) *cluster {
	t.Helper()
	return startOwnerCluster(t, overlapOptions(r, front))
}

// overlapOptions are the overlap runs' cluster behind front.
func overlapOptions(r *redisServer, front balancer) clusterOptions {
	opts := clusterOptions{
		State:        redisState(r),
		Balancer:     front,
		ProgressMS:   int(overlapStep / time.Millisecond),
		PHPWorkers:   6,
		CountOverlap: true,
		GracePeriod:  30 * time.Second,
	}
	if front == caddyRoundRobin {
		opts.Front = deadInstanceFront + stoppingInstanceFront
	}
	return opts
}

// inflightResult is the inflight mode's final line.
type inflightResult struct {
	OK              bool               `json:"ok"`
	Error           string             `json:"error"`
	N               int                `json:"n"`
	Opened          int                `json:"opened"`
	Calls           int                `json:"calls"`
	FailedCalls     int                `json:"failedCalls"`
	Failures        map[string]int     `json:"failures"`
	FailedCallTimes []failedCall       `json:"failedCallTimes"`
	FailedConnects  int                `json:"failedConnects"`
	FailedDeletes   int                `json:"failedDeletes"`
	IDMismatches    int                `json:"idMismatches"`
	HTTPErrors      map[string]int     `json:"httpErrors"`
	Marks           map[string]float64 `json:"marks"`
	Samples         []string           `json:"samples"`
	ElapsedMs       int                `json:"elapsedMs"`
	CallP50Ms       float64            `json:"callP50Ms"`
	CallMaxMs       int                `json:"callMaxMs"`
	Stopped         bool               `json:"stopped"`
}

// failedCall is when a failed call began and ended, in ms since the client
// started, as its marks are.
type failedCall struct {
	BeganAt float64 `json:"beganAt"`
	EndedAt float64 `json:"endedAt"`
	Reason  string  `json:"reason"`
	// ByNginx: the answer was nginx's own 502 page, not an instance's.
	ByNginx bool `json:"byNginx"`
}

// inflightRun is the client's inflight mode through the front, running in
// the background and telling the test as each session opens and each call
// ends.
type inflightRun struct {
	label    string
	stdin    *os.File
	finished chan struct{}
	res      inflightResult

	mu      sync.Mutex
	ended   int
	opened  int
	marked  map[string]bool // the marks the client has recorded
	changed chan struct{}   // closed at each event, then replaced
}

// startInflightRun starts the inflight mode through c's front with args
// (its --n, --concurrency, --rounds), each call given up after timeout.
func startInflightRun(t *testing.T, c *cluster, label string, timeout time.Duration, args ...string) *inflightRun {
	t.Helper()
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	r := &inflightRun{label: label, stdin: stdinW, finished: make(chan struct{}), marked: map[string]bool{}, changed: make(chan struct{})}
	// Cleanups run last first: closing stdin stops the client, which is
	// then waited for, so that it ends with its test.
	t.Cleanup(func() { <-r.finished })
	t.Cleanup(func() { stdinW.Close(); stdinR.Close() })
	all := append([]string{"inflight", "--url", c.Front + "/mcp", "--events",
		"--steps", "2", "--steps-max", "6", "--timeout", strconv.Itoa(int(timeout / time.Millisecond))}, args...)
	sio := scriptIO{stdin: stdinR, onLine: r.onLine}
	go func() {
		defer close(r.finished) // also when runClientWith fails the test
		runClientWith(t, sio, 10*time.Minute, &r.res, all...)
	}()
	return r
}

func (r *inflightRun) onLine(line string) {
	word, arg, ok := strings.Cut(line, " ")
	if !ok {
		return
	}
	n, err := strconv.Atoi(arg)
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case word == "ended" && err == nil:
		r.ended = n
	case word == "opened" && err == nil:
		r.opened = n
	case word == "marked":
		r.marked[arg] = true
	default:
		return
	}
	close(r.changed)
	r.changed = make(chan struct{})
}

// callsEnded is how many calls have ended so far.
func (r *inflightRun) callsEnded() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ended
}

// sessionsOpened is how many sessions have connected so far.
func (r *inflightRun) sessionsOpened() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.opened
}

// until waits until cond holds of the calls ended and sessions opened, and
// reports whether it did within bound; it fails the test if the run ends
// first.
func (r *inflightRun) until(t *testing.T, what string, bound time.Duration, cond func(ended, opened int) bool) bool {
	t.Helper()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for {
		r.mu.Lock()
		ended, opened, changed := r.ended, r.opened, r.changed
		r.mu.Unlock()
		if cond(ended, opened) {
			return true
		}
		select {
		case <-changed:
		case <-r.finished:
			t.Fatalf("%s: the run ended (%d calls ended, %d sessions opened) before %s", r.label, ended, opened, what)
		case <-timer.C:
			return false
		}
	}
}

// waitCalls waits until k calls have ended, failing the test after
// overlapWait.
func (r *inflightRun) waitCalls(t *testing.T, k int) {
	t.Helper()
	if !r.until(t, strconv.Itoa(k)+" calls ended", overlapWait, func(ended, _ int) bool { return ended >= k }) {
		t.Fatalf("%s: %d calls ended after %v, want %d", r.label, r.callsEnded(), overlapWait, k)
	}
}

// send writes a line to the client's stdin.
func (r *inflightRun) send(t *testing.T, line string) {
	t.Helper()
	if _, err := r.stdin.WriteString(line + "\n"); err != nil {
		t.Fatalf("%s: writing %q to the client: %v", r.label, line, err)
	}
}

// mark has the client note the time under name, on its clock.
func (r *inflightRun) mark(t *testing.T, name string) { r.send(t, "mark "+name) }

// markNow has the client note the time under name and waits until it has,
// so that what the test does next comes after the mark on the client's
// clock too; it fails the test after 30 s.
func (r *inflightRun) markNow(t *testing.T, name string) {
	t.Helper()
	r.mark(t, name)
	recorded := func(int, int) bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.marked[name]
	}
	if !r.until(t, "the mark "+name, 30*time.Second, recorded) {
		t.Fatalf("%s: the client did not record the mark %s within 30 s", r.label, name)
	}
}

// stop ends the run: no call or session begins after it.
func (r *inflightRun) stop(t *testing.T) { r.send(t, "stop") }

// wait returns the run's result once the client has ended.
func (r *inflightRun) wait(t *testing.T) inflightResult {
	t.Helper()
	select {
	case <-r.finished:
	case <-time.After(5 * time.Minute):
		t.Fatalf("%s: the client did not finish within 5 minutes", r.label)
	}
	if t.Failed() {
		t.FailNow()
	}
	if r.res.Error != "" {
		t.Fatalf("%s: client error: %s", r.label, r.res.Error)
	}
	return r.res
}

// overlapReport is the PHP pools' count of each session's requests at once
// (integration/php/bin/overlap-report.php).
type overlapReport struct {
	Sessions map[string]int `json:"sessions"` // the most at once, by a hash of the session id
	Peak     int            `json:"peak"`     // the highest of them
	Overlaps int            `json:"overlaps"` // pairs of one session's requests that ran at once
	Requests int            `json:"requests"` // requests counted
	Running  int            `json:"running"`  // requests running when read
	// Runs are the requests of each session whose peak is above 1, in the
	// order they entered.
	Runs map[string][]overlapRun `json:"runs"`
}

// overlapRun is one request's run at the backend: the pool (instance) and
// worker it ran in, its JSON-RPC ids, and when it entered and left, in
// seconds since the epoch (left nil: it still ran when read).
type overlapRun struct {
	Pool     string   `json:"pool"`
	PID      int      `json:"pid"`
	Messages string   `json:"messages"`
	Entered  float64  `json:"entered"`
	Left     *float64 `json:"left"`
}

// logOverlaps logs the runs of each session whose requests ran at once,
// their times of day as the instances' logs give them.
func logOverlaps(t *testing.T, rep overlapReport) {
	t.Helper()
	at := func(s float64) string {
		return time.Unix(0, int64(s*1e9)).UTC().Format("15:04:05.000")
	}
	for session, runs := range rep.Runs {
		var b strings.Builder
		for _, r := range runs {
			left := "still running"
			if r.Left != nil {
				left = at(*r.Left)
			}
			fmt.Fprintf(&b, "\n\t%s to %s  %s pid %d, request %s", at(r.Entered), left, r.Pool, r.PID, r.Messages)
		}
		t.Logf("session %s (its logs' hash: %.12s) at the backend, peak %d:%s", session, session, rep.Sessions[session], b.String())
	}
}

// readOverlapReport reads store's counts once no request runs there any
// more (a script its client left may still be running), waiting at most a
// minute.
func readOverlapReport(t *testing.T, store string) overlapReport {
	t.Helper()
	cli := phpCLIName(phpFPMBinary(t))
	script := filepath.Join(repoRoot(t), "integration", "php", "bin", "overlap-report.php")
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := exec.CommandContext(ctx, cli, script, store).Output()
		cancel()
		var rep overlapReport
		if err != nil || json.Unmarshal(out, &rep) != nil {
			t.Fatalf("%s %s: %v %s", cli, script, err, out)
		}
		if rep.Running == 0 {
			return rep
		}
		if time.Now().After(deadline) {
			t.Logf("%d requests still run at the backend a minute after the client ended", rep.Running)
			return rep
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// freezeWindow is the span of a fault, by the client's marks: calls
// running in it may fail.
type freezeWindow struct{ from, to string }

// wantNoCallsAtOnce logs what the run measured at the client and at the
// backend, and fails the test unless every session's peak at the backend
// is 1 and no call failed (outside window, when given) nor any session's
// connect.
func wantNoCallsAtOnce(t *testing.T, c *cluster, res inflightResult, began time.Time, window *freezeWindow) {
	t.Helper()
	if window == nil {
		wantNoCallsAtOnceExcusing(t, c, res, began, "", nil)
		return
	}
	from, okFrom := res.Marks[window.from]
	to, okTo := res.Marks[window.to]
	if !okFrom || !okTo {
		t.Fatalf("the client has no marks %q and %q: %v", window.from, window.to, res.Marks)
	}
	wantNoCallsAtOnceExcusing(t, c, res, began, "in flight during the fault", func(f failedCall) bool {
		return f.BeganAt <= to && f.EndedAt >= from
	})
}

// wantNoCallsAtOnceExcusing is wantNoCallsAtOnce, but a failed call that
// excused accepts (the fault's, as what says) does not fail the test.
func wantNoCallsAtOnceExcusing(t *testing.T, c *cluster, res inflightResult, began time.Time, what string, excused func(failedCall) bool) {
	t.Helper()
	rep := readOverlapReport(t, c.fpms[0].Store)
	atOnce := 0
	for _, peak := range rep.Sessions {
		if peak > 1 {
			atOnce++
		}
	}
	failedIn := 0
	if excused != nil {
		for _, f := range res.FailedCallTimes {
			if excused(f) {
				failedIn++
			}
		}
	}
	t.Logf("at the backend: peak %d, %d overlapping pairs, %d of %d sessions with calls at once, %d requests counted", rep.Peak, rep.Overlaps, atOnce, len(rep.Sessions), rep.Requests)
	during := ""
	if excused != nil {
		during = fmt.Sprintf(" (%d of them %s)", failedIn, what)
	}
	t.Logf("at the client: %d sessions, %d calls, %d failed %v%s, failed connects %d, failed deletes %d, HTTP errors %v, id mismatches %d; a call's p50 %.0f ms, longest %d ms; the run took %.1f s, the test %.1f s",
		res.Opened, res.Calls, res.FailedCalls, res.Failures, during, res.FailedConnects, res.FailedDeletes, res.HTTPErrors, res.IDMismatches,
		res.CallP50Ms, res.CallMaxMs, float64(res.ElapsedMs)/1000, time.Since(began).Seconds())
	logSamples(t, res.Samples)
	logOverlaps(t, rep)
	forwardedBy(t, c)
	if res.Calls == 0 || rep.Requests < res.Calls-res.FailedCalls {
		t.Errorf("%d calls answered, %d requests counted at the backend: the counter missed calls", res.Calls-res.FailedCalls, rep.Requests)
	}
	if res.FailedCalls-failedIn != 0 {
		but := ""
		if excused != nil {
			but = " (but those " + what + ")"
		}
		t.Errorf("%d calls failed %v, want none%s", res.FailedCalls-failedIn, res.Failures, but)
	}
	if res.FailedConnects != 0 {
		t.Errorf("%d sessions failed to connect, want none", res.FailedConnects)
	}
	if rep.Peak > 1 {
		t.Errorf("peak %d at the backend: %d sessions had calls running at once, %d pairs overlapped; want every session's peak 1", rep.Peak, atOnce, rep.Overlaps)
	}
}

// stopGracefully stops the instance as a rolling deploy does (SIGTERM)
// and waits until it has exited, failing the test after two minutes.
func (in *caddyInstance) stopGracefully(t *testing.T) time.Duration {
	t.Helper()
	began := time.Now()
	if err := syscall.Kill(-in.proc.cmd.Process.Pid, syscall.SIGTERM); err != nil {
		t.Fatalf("%s: SIGTERM: %v", in.Name, err)
	}
	select {
	case <-in.proc.exited:
	case <-time.After(2 * time.Minute):
		t.Fatalf("%s did not exit within 2 minutes of SIGTERM", in.Name)
	}
	return time.Since(began)
}

// restartGracefully stops the instance with SIGTERM, waits until it has
// exited, and starts it again on the same ports, waiting until it answers.
func (in *caddyInstance) restartGracefully(t *testing.T, run *inflightRun) {
	t.Helper()
	at := run.callsEnded()
	stopped := time.Now()
	exited := in.stopGracefully(t)
	in.start(t)
	t.Logf("%s: SIGTERM after %d calls ended; exited %v later, answering again %v after the SIGTERM",
		in.Name, at, exited.Round(time.Millisecond), time.Since(stopped).Round(time.Millisecond))
}

// instanceMostMidCall is the running instance with the most sessions that
// have an exchange upstream past their initialization, failing the test if
// none has one.
func (c *cluster) instanceMostMidCall(t *testing.T) *caddyInstance {
	t.Helper()
	var most *caddyInstance
	counts := map[string]int{}
	for _, in := range c.Instances {
		if !in.proc.running() {
			continue
		}
		status, _, body := adminCall(t, http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(in.Admin)+"/mcp_serializer/sessions?state=in_flight&limit=1000")
		var rep sessionsReport
		if err := json.Unmarshal(body, &rep); status != http.StatusOK || err != nil || len(rep.Tables) != 1 {
			t.Fatalf("GET /mcp_serializer/sessions on %s: %d %v %s", in.Name, status, err, body)
		}
		for _, s := range rep.Tables[0].Sessions {
			if s.State == "open" {
				counts[in.Name]++
			}
		}
		if most == nil || counts[in.Name] > counts[most.Name] {
			most = in
		}
	}
	if most == nil || counts[most.Name] == 0 {
		t.Fatalf("no instance has a session mid-call: %v", counts)
	}
	t.Logf("sessions mid-call by instance: %v", counts)
	return most
}

// The counter itself: two calls of one session sent at once straight to
// PHP-FPM, with nothing ordering them, run at once, and the backend counts
// it.
func TestOverlapCounterSeesASessionsCallsAtOnceWithoutTheModule(t *testing.T) {
	prerequisites(t)
	fpm := startPHPFPM(t, phpFPMOptions{Workers: 6, ProgressMS: int(overlapStep / time.Millisecond), CountOverlap: true})
	direct := startCaddy(t, caddySite(fpm.fastcgiDirectives()))
	var res inflightResult
	runClient(t, 2*time.Minute, &res, "inflight", "--url", direct+"/mcp", "--n", "2", "--rounds", "2", "--steps", "2", "--steps-max", "4")
	rep := readOverlapReport(t, fpm.Store)
	t.Logf("straight to PHP-FPM: %d calls (%d failed %v); at the backend: peak %d, %d overlapping pairs, %d requests counted", res.Calls, res.FailedCalls, res.Failures, rep.Peak, rep.Overlaps, rep.Requests)
	if rep.Peak != 2 || rep.Overlaps == 0 || len(rep.Sessions) != 2 {
		t.Errorf("peak %d, %d overlapping pairs over %d sessions; want peak 2 and pairs counted over 2 sessions", rep.Peak, rep.Overlaps, len(rep.Sessions))
	}
}

// Behind round robin with nothing failing, every session's calls run one
// at a time at the backend: the rig's baseline.
func TestClusterRoundRobinWithoutFaultsRunsNoSessionsCallsAtOnce(t *testing.T) {
	prerequisites(t)
	began := time.Now()
	c := startOverlapCluster(t, startRedis(t))
	run := startInflightRun(t, c, "no fault", overlapCallTimeout, "--n", strconv.Itoa(overlapSessions), "--rounds", "100")
	run.waitCalls(t, 4*overlapEvery)
	run.stop(t)
	wantNoCallsAtOnce(t, c, run.wait(t), began, nil)
}

// A rolling deploy: each instance in turn is stopped with SIGTERM, waited
// for until it exited, started again on its port and waited for until it
// answers, and the next follows once overlapEvery more calls have ended.
// A stopping owner finishes what it holds; no session's calls may run at
// once meanwhile, and no call fails, behind each round-robin front, but
// for nginx's own 502 to a POST a stopping instance never read.
func TestClusterRoundRobinRollingDeployRunsNoSessionsCallsAtOnce(t *testing.T) {
	prerequisites(t)
	for _, front := range roundRobinFronts {
		t.Run(front.String(), func(t *testing.T) {
			began := time.Now()
			c := startOverlapClusterBehind(t, startRedis(t), front)
			run := startInflightRun(t, c, front.String()+", rolling deploy", overlapCallTimeout, "--n", strconv.Itoa(overlapSessions), "--rounds", "100")
			next := overlapEvery
			for _, in := range c.Instances {
				run.waitCalls(t, next)
				in.restartGracefully(t, run)
				next = run.callsEnded() + overlapEvery
			}
			run.waitCalls(t, next)
			run.stop(t)
			if front != nginxRoundRobin {
				wantNoCallsAtOnce(t, c, run.wait(t), began, nil)
				return
			}
			// nginx answers 502 itself to a POST it sent on a connection a
			// stopping instance closed before reading it (its queue at the
			// closed listener, or an idle connection closed just then):
			// examples/cluster/nginx.conf keeps non_idempotent out of
			// proxy_next_upstream rather than risk running a call twice.
			// At most one a stopping instance.
			excused := 0
			wantNoCallsAtOnceExcusing(t, c, run.wait(t), began, "answered 502 by nginx itself, at most one per instance stopped", func(f failedCall) bool {
				if f.ByNginx && excused < len(c.Instances) {
					excused++
					return true
				}
				return false
			})
		})
	}
}

// Redis restarted empty (it keeps nothing on disk) mid-run, then, once
// overlapEvery more calls have ended, the instance with the most sessions
// mid-call restarted (SIGTERM, started again): no session's calls may run
// at once.
func TestClusterRoundRobinRedisRestartedEmptyRunsNoSessionsCallsAtOnce(t *testing.T) {
	prerequisites(t)
	began := time.Now()
	redis := startRedis(t)
	c := startOverlapCluster(t, redis)
	run := startInflightRun(t, c, "redis restarted empty", overlapCallTimeout, "--n", strconv.Itoa(overlapSessions), "--rounds", "100")
	run.waitCalls(t, overlapEvery)
	redis.kill(t)
	redis.start(t)
	t.Logf("redis restarted empty after %d calls ended", run.callsEnded())
	run.waitCalls(t, run.callsEnded()+overlapEvery)
	c.instanceMostMidCall(t).restartGracefully(t, run)
	run.waitCalls(t, run.callsEnded()+2*overlapEvery)
	run.stop(t)
	wantNoCallsAtOnce(t, c, run.wait(t), began, nil)
}

// Redis unresponsive (SIGSTOP) while sessions are created: sessions end
// and new ones open four at a time, Redis is paused once overlapEvery
// calls have ended and resumed once four sessions have opened since, and
// those sessions run their calls after it: none may run two at once.
func TestClusterRoundRobinSessionsCreatedDuringARedisOutageRunNoCallsAtOnce(t *testing.T) {
	prerequisites(t)
	began := time.Now()
	redis := startRedis(t)
	c := startOverlapCluster(t, redis)
	const atOnce, during = 4, 4
	run := startInflightRun(t, c, "sessions created during a redis outage", overlapCallTimeout, "--n", strconv.Itoa(3*atOnce), "--concurrency", strconv.Itoa(atOnce), "--rounds", "2")
	run.waitCalls(t, overlapEvery)
	opened := run.sessionsOpened()
	redis.signal(t, syscall.SIGSTOP)
	t.Cleanup(func() { redis.signal(t, syscall.SIGCONT) }) // the cleanup's SIGTERM needs it running
	paused := time.Now()
	if !run.until(t, "sessions opened during the outage", overlapWait, func(_, o int) bool { return o >= opened+during }) {
		t.Fatalf("%d sessions opened during the outage within %v, want %d", run.sessionsOpened()-opened, overlapWait, during)
	}
	redis.signal(t, syscall.SIGCONT)
	t.Logf("redis paused after %d calls ended, resumed %v later once %d sessions had opened meanwhile", overlapEvery, time.Since(paused).Round(time.Millisecond), during)
	wantNoCallsAtOnce(t, c, run.wait(t), began, nil)
}

// The instance with the most sessions mid-call frozen (SIGSTOP: its
// connections accepted, nothing answered) until three times overlapEvery
// calls have ended elsewhere or 20 s have passed, long enough for the
// others to give up on it, then resumed (SIGCONT), behind each
// round-robin front: calls in flight during the freeze may fail, and none
// of a session's may run at once. The front sends some of a session's
// calls to the frozen instance itself; on waking it finds the session
// taken over and sends each of them on to the new owner.
func TestClusterRoundRobinOwnerFrozenRunsNoSessionsCallsAtOnce(t *testing.T) {
	prerequisites(t)
	for _, front := range roundRobinFronts {
		t.Run(front.String(), func(t *testing.T) {
			began := time.Now()
			c := startOverlapClusterBehind(t, startRedis(t), front)
			const freezeCalls, freezeBound = 3 * overlapEvery, 20 * time.Second
			// A call may wait out the whole freeze before its own time.
			run := startInflightRun(t, c, front.String()+", owner frozen", freezeBound+overlapCallTimeout, "--n", strconv.Itoa(overlapSessions), "--rounds", "100")
			run.waitCalls(t, overlapEvery)
			victim := c.instanceMostMidCall(t)
			pid := victim.proc.cmd.Process.Pid
			if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) }) // its cleanup's SIGINT needs it running
			run.mark(t, "freeze")
			frozen, at := time.Now(), run.callsEnded()
			elsewhere := run.until(t, "calls ended during the freeze", freezeBound, func(ended, _ int) bool { return ended >= at+freezeCalls })
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			run.mark(t, "thaw")
			t.Logf("%s frozen at %s after %d calls ended, for %v, while %d calls ended elsewhere (reached %d: %v)",
				victim.Name, frozen.UTC().Format("15:04:05.000"), at, time.Since(frozen).Round(time.Millisecond), run.callsEnded()-at, freezeCalls, elsewhere)
			run.waitCalls(t, run.callsEnded()+2*overlapEvery)
			run.stop(t)
			wantNoCallsAtOnce(t, c, run.wait(t), began, &freezeWindow{from: "freeze", to: "thaw"})
		})
	}
}

// waitFor waits until cond holds, checking every 100 ms, and fails the
// test after bound.
func waitFor(t *testing.T, what string, bound time.Duration, cond func() bool) time.Duration {
	t.Helper()
	began := time.Now()
	for !cond() {
		if time.Since(began) > bound {
			t.Fatalf("%s: not within %v", what, bound)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Since(began)
}

// forwarded is how many requests the instance has forwarded to their
// session's owner and passed the owner's answer on, since it started.
func (in *caddyInstance) forwarded(t *testing.T) float64 {
	t.Helper()
	return in.metrics(t, "caddy_mcp_serializer_forwards_total")[`{result="forwarded"}`]
}

// takeovers is how many sessions the running instances have taken over.
func (c *cluster) takeovers(t *testing.T) float64 {
	t.Helper()
	return sumValues(c.metrics(t, "caddy_mcp_serializer_takeovers_total"))
}

// Scale-out: a fourth instance started once overlapEvery calls have ended
// and added to the front (a Caddy front loads its config again through
// its admin API, its old config finishing the calls in flight; nginx
// reloads its file), behind each round-robin front. The run's sessions,
// all owned by the first three, are forwarded through it to their owners;
// no call fails and no session's calls run at once.
func TestClusterRoundRobinScaleOutRunsNoSessionsCallsAtOnce(t *testing.T) {
	prerequisites(t)
	for _, front := range roundRobinFronts {
		t.Run(front.String(), func(t *testing.T) {
			began := time.Now()
			opts := overlapOptions(startRedis(t), front)
			opts.FrontGracePeriod = 30 * time.Second
			c := startOwnerCluster(t, opts)
			run := startInflightRun(t, c, front.String()+", scale-out", overlapCallTimeout, "--n", strconv.Itoa(overlapSessions), "--rounds", "100")
			run.waitCalls(t, overlapEvery)
			at, joining := run.callsEnded(), time.Now()
			in := c.addInstance(t)
			added := time.Since(joining)
			// A request of the run met it: forwarded, or served there.
			reached := func() float64 {
				return sumValues(in.metrics(t, "caddy_mcp_serializer_forwards_total")) + sumValues(in.metrics(t, "caddy_mcp_serializer_queue_wait_seconds_count"))
			}
			through := waitFor(t, in.Name+" gets the run's requests", overlapWait, func() bool { return reached() > 0 })
			t.Logf("%s started after %d calls ended, answering and given to the front %v later; the first of the run's requests met it %v after that",
				in.Name, at, added.Round(time.Millisecond), through.Round(time.Millisecond))
			run.waitCalls(t, run.callsEnded()+2*overlapEvery)
			run.stop(t)
			res := run.wait(t)
			wantNoCallsAtOnce(t, c, res, began, nil)
			if n := in.forwarded(t); n < 2 {
				t.Errorf("%s forwarded %v of the run's requests to their owners, want them routed through it", in.Name, n)
			}
		})
	}
}

// The instance with the most sessions mid-call killed (SIGKILL) once
// overlapEvery calls have ended: the calls in flight on it then may fail,
// none after. Its sessions are taken over once its lease has lapsed (3 s)
// and the lock delay passed (3 s): their calls wait meanwhile, the longest
// call says how long. It is then started again on its ports, under a new
// ID, once overlapEvery more calls have ended, and the run goes on
// through it. No session's calls may run at once at the backend.
func TestClusterRoundRobinInstanceKilledRunsNoSessionsCallsAtOnce(t *testing.T) {
	prerequisites(t)
	began := time.Now()
	c := startOverlapCluster(t, startRedis(t))
	run := startInflightRun(t, c, "instance killed", overlapCallTimeout, "--n", strconv.Itoa(overlapSessions), "--rounds", "100")
	run.waitCalls(t, overlapEvery)
	victim := c.instanceMostMidCall(t)
	run.markNow(t, "kill")
	at := run.callsEnded()
	victim.kill(t)
	killed := time.Now()
	run.mark(t, "killed")
	takenOver := waitFor(t, "the killed instance's sessions taken over", overlapWait, func() bool { return c.takeovers(t) > 0 })
	t.Logf("%s killed after %d calls ended; the first of its sessions taken over %v later", victim.Name, at, takenOver.Round(time.Millisecond))
	run.waitCalls(t, run.callsEnded()+overlapEvery)
	victim.start(t)
	t.Logf("%s started again %v after the kill, after %d calls ended", victim.Name, time.Since(killed).Round(time.Millisecond), run.callsEnded())
	through := waitFor(t, victim.Name+" forwards the run's requests again", overlapWait, func() bool { return victim.forwarded(t) > 0 })
	t.Logf("%s passed on its first forward %v after it started again", victim.Name, through.Round(time.Millisecond))
	run.waitCalls(t, run.callsEnded()+2*overlapEvery)
	run.stop(t)
	res := run.wait(t)
	t.Logf("the longest call lasted %d ms (a call itself lasts at most %v): its session's owner was killed", res.CallMaxMs, 6*overlapStep)
	wantNoCallsAtOnce(t, c, res, began, &freezeWindow{from: "kill", to: "killed"})
	t.Logf("sessions taken over: %v", c.takeovers(t))
}

// A partition between instances: each instance advertises a relay in the
// test process, and the relay of the instance with the most sessions
// mid-call is cut once overlapEvery calls have ended, while the front and
// Redis still reach that instance. Cut as refused (the listener closed),
// a request across the partition is tried again every 250 ms and answered
// 503 at queue_timeout (8 s here): the relay is healed once 2*overlapEvery
// more calls have ended and such a 503 was counted. Cut as black-holed
// (connections accepted, nothing passed either way), a forward's dial
// succeeds and it waits for the owner's answer: the relay is healed once
// 2*overlapEvery more calls have ended and it held a connection or bytes
// of one made before it. Either
// is healed after 20 s past queue_timeout at the latest. The owner's lease stands, so no session is
// taken over and none's calls run at once at the backend; a call may fail
// only with a 503 from across the partition.
func TestClusterRoundRobinPartitionBetweenInstancesRunsNoSessionsCallsAtOnce(t *testing.T) {
	prerequisites(t)
	const queueTimeout = 8 * time.Second
	for _, kind := range []cutKind{cutRefused, cutBlackHoled} {
		t.Run(kind.String(), func(t *testing.T) {
			began := time.Now()
			opts := overlapOptions(startRedis(t), caddyRoundRobin)
			opts.Relays = true
			opts.QueueTimeout = queueTimeout
			c := startOwnerCluster(t, opts)
			const healCalls, healBound = 2 * overlapEvery, queueTimeout + 20*time.Second
			// A call may wait out the whole partition before its own time.
			run := startInflightRun(t, c, "partition, "+kind.String(), healBound+overlapCallTimeout, "--n", strconv.Itoa(overlapSessions), "--rounds", "100")
			run.waitCalls(t, overlapEvery)
			victim := c.instanceMostMidCall(t)
			others := func(name string) float64 {
				n := 0.0
				for _, in := range c.Instances {
					if in != victim {
						n += in.metrics(t, name)[`{result="unreachable"}`] + in.metrics(t, name)[`{reason="owner_unreachable"}`]
					}
				}
				return n
			}
			unreachable := func() float64 { return others("caddy_mcp_serializer_forwards_total") }
			answered503 := func() float64 { return others("caddy_mcp_serializer_rejections_total") }
			unreachableBefore := unreachable()
			run.markNow(t, "cut")
			victim.relay.cutAs(t, kind)
			at, cut := run.callsEnded(), time.Now()
			// Healed once a request has met the partition: a 503 counted
			// across a refused one, a connection held by a black hole.
			healed := run.until(t, "calls ended during the partition", healBound, func(ended, _ int) bool {
				met := answered503() > 0
				if kind == cutBlackHoled {
					met = victim.relay.metNow()
				}
				return ended >= at+healCalls && met
			})
			stats := victim.relay.heal(t)
			lasted := time.Since(cut)
			run.mark(t, "healed")
			held := ""
			if kind == cutBlackHoled {
				held = fmt.Sprintf(", %d accepted in the black hole and held, the longest for %v", stats.Held, stats.LongestHeld.Round(time.Millisecond))
			}
			t.Logf("%s's relay %v after %d calls ended, for %v, while %d calls ended (healed on events: %v); through the relay: %d connections before the cut%s; forwards to it unreachable meanwhile %v, requests answered 503 for it %v (queue_timeout %v)",
				victim.Name, kind, at, lasted.Round(time.Millisecond), run.callsEnded()-at, healed,
				stats.Accepted, held, unreachable()-unreachableBefore, answered503(), queueTimeout)
			if stats.Accepted == 0 {
				t.Fatalf("no instance reached %s through its relay before the partition: it does not advertise the relay", victim.Name)
			}
			if !healed && stats.Held == 0 && unreachable() == unreachableBefore {
				t.Errorf("no request met the partition: none was forwarded to %s while its relay was cut", victim.Name)
			}
			run.waitCalls(t, run.callsEnded()+2*overlapEvery)
			run.stop(t)
			res := run.wait(t)
			t.Logf("calls answered 503 from across the partition: %d (HTTP errors %v); the longest call lasted %d ms (a call itself lasts at most %v)",
				res.Failures["HTTP 503"], res.HTTPErrors, res.CallMaxMs, 6*overlapStep)
			wantNoCallsAtOnceExcusing(t, c, res, began, "answered 503 from across the partition", func(f failedCall) bool { return f.Reason == "HTTP 503" })
			rejected := c.metrics(t, "caddy_mcp_serializer_rejections_total")
			t.Logf("requests answered by the instances themselves, by reason: %v", nonZero(rejected))
			if across := rejected[`{reason="owner_unreachable"}`]; float64(res.Failures["HTTP 503"]) > across {
				t.Errorf("%d calls answered 503, %v of them because the owner could not be reached: the others were not from across the partition", res.Failures["HTTP 503"], across)
			}
			if n := c.takeovers(t); n != 0 {
				t.Errorf("%v sessions taken over across the partition, want none: the owner's lease stood", n)
			}
		})
	}
}
