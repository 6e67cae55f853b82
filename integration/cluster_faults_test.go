package integration

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// pipelineConcurrency is how many connects a fault run keeps in flight.
const pipelineConcurrency = 8

// faultRun is the SDK client's pipelined connects through the front,
// running in the background. Once as many connects as each count it was
// given have ended, the client holds every connect in flight after its
// initialize until the test resumes it, so a fault injected while it is
// held lands mid-run however fast the machine is, with sessions begun
// and their follow-ups still to come.
type faultRun struct {
	label    string
	resumeW  *os.File
	held     chan int
	finished chan struct{}
	res      pipelineResult
}

// startFaultRun starts n pipelined connects through c's front, held at each
// of holdAt (ascending, each below n).
func startFaultRun(t *testing.T, c *cluster, label string, n int, holdAt ...int) *faultRun {
	t.Helper()
	for i, k := range holdAt {
		if k < 1 || k >= n || (i > 0 && k <= holdAt[i-1]) {
			t.Fatalf("hold at %v of %d connects: want rising counts below %d", holdAt, n, n)
		}
	}
	resumeR, resumeW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	r := &faultRun{label: label, resumeW: resumeW, held: make(chan int, len(holdAt)), finished: make(chan struct{})}
	// Cleanups run last first: closing the pipe releases every barrier, so
	// a test that stops early leaves no client held, and then the client
	// is waited for, so that it ends with its test.
	t.Cleanup(func() { <-r.finished })
	t.Cleanup(func() { resumeW.Close(); resumeR.Close() })
	args := []string{"pipeline", "--url", c.Front + "/mcp", "--n", strconv.Itoa(n), "--concurrency", strconv.Itoa(pipelineConcurrency), "--get", "open"}
	if len(holdAt) > 0 {
		counts := make([]string, len(holdAt))
		for i, k := range holdAt {
			counts[i] = strconv.Itoa(k)
		}
		args = append(args, "--hold-at", strings.Join(counts, ","))
	}
	sio := scriptIO{stdin: resumeR, onLine: func(line string) {
		if k, ok := strings.CutPrefix(line, "held "); ok {
			if n, err := strconv.Atoi(k); err == nil {
				r.held <- n
			}
		}
	}}
	go func() {
		defer close(r.finished) // also when runClientWith fails the test
		runClientWith(t, sio, 15*time.Minute, &r.res, args...)
	}()
	return r
}

// heldAt waits until the client holds at k ended connects, failing the
// test if it ends first.
func (r *faultRun) heldAt(t *testing.T, k int) {
	t.Helper()
	select {
	case got := <-r.held:
		if got != k {
			t.Fatalf("%s: the client held at %d connects, want %d", r.label, got, k)
		}
	case <-r.finished:
		t.Fatalf("%s: the run ended before it held at %d connects", r.label, k)
	}
}

// instanceWithHeldSessions is the running instance with the most sessions
// begun and not yet initialized: while a fault run is held, the sessions
// whose follow-ups are still to come. It fails the test if no instance
// has one, so that a fault on it hits work under way.
func (c *cluster) instanceWithHeldSessions(t *testing.T) *caddyInstance {
	t.Helper()
	var most *caddyInstance
	held := 0
	for _, in := range c.Instances {
		if !in.proc.running() {
			continue
		}
		if n := instanceSessionCounts(t, in)["initializing"]; n > held {
			most, held = in, n
		}
	}
	if most == nil {
		t.Fatal("no instance holds a session begun and not yet initialized")
	}
	t.Logf("%s holds %d sessions whose follow-ups are still to come", most.Name, held)
	return most
}

// wantTakenOver fails the test unless the running instances took over a
// session: the sessions a killed instance held, whose follow-ups came
// after the kill.
func wantTakenOver(t *testing.T, c *cluster) {
	t.Helper()
	n := sumValues(c.metrics(t, "caddy_mcp_serializer_takeovers_total"))
	t.Logf("sessions taken over: %v", n)
	if n == 0 {
		t.Error("no session was taken over: the kill hit no session whose follow-ups were still to come")
	}
}

// resume lets the held client go on.
func (r *faultRun) resume(t *testing.T) {
	t.Helper()
	if _, err := r.resumeW.WriteString("go\n"); err != nil {
		t.Fatalf("%s: resuming the client: %v", r.label, err)
	}
}

// wait returns the run's result once the client has ended.
func (r *faultRun) wait(t *testing.T, c *cluster) pipelineResult {
	t.Helper()
	select {
	case <-r.finished:
	case <-time.After(16 * time.Minute):
		t.Fatalf("%s: the client did not finish within 16 minutes", r.label)
	}
	if t.Failed() {
		t.FailNow()
	}
	logRun(t, c, r.label, r.res)
	return r.res
}

// runPipelineResult runs the client without logging its summary.
func runPipelineResult(t *testing.T, c *cluster, n int) pipelineResult {
	var res pipelineResult
	runClient(t, 15*time.Minute, &res, "pipeline", "--url", c.Front+"/mcp", "--n", strconv.Itoa(n), "--concurrency", "8", "--get", "open")
	return res
}

// wantOnlyClearErrors fails the test when a connect hung or got a reply
// meant for another request: every failure must be an HTTP error status or
// a JSON-RPC error, answered within the bounds.
func wantOnlyClearErrors(t *testing.T, res pipelineResult) {
	t.Helper()
	if res.Connects+res.FailedConnects != res.N {
		t.Errorf("%d connects succeeded and %d failed, of %d: some never ended", res.Connects, res.FailedConnects, res.N)
	}
	if res.Timeouts != 0 {
		t.Errorf("%d replies never came (stuck for 20 s)", res.Timeouts)
	}
	if res.IDMismatches != 0 || res.UnexpectedReplies != 0 {
		t.Errorf("replies not matching their requests: %d id mismatches, %d unexpected replies", res.IDMismatches, res.UnexpectedReplies)
	}
}

// deadInstanceFront is the Caddy front's lines for a run that kills an
// instance: a refused connection is retried on another instance, and the
// dead one is left out until its health check answers again.
const deadInstanceFront = `
lb_try_duration 5s
lb_try_interval 100ms
fail_duration 10s
health_uri /healthz
health_interval 500ms
health_timeout 1s`

// One instance killed (SIGKILL) in the middle of a run, while it holds
// sessions begun whose follow-ups are still to come: the front moves them
// to the others, which take them over from Redis, nothing hangs, a
// connect hit fails with a clear error only, and the two left serve new
// sessions without failure.
func TestClusterInstanceKilledMidRun(t *testing.T) {
	prerequisites(t)
	requireModule(t, redisStateModule)
	redis := startRedis(t)
	c := startCluster(t, clusterOptions{State: redisState(redis), Front: deadInstanceFront})

	n := clusterN(t, 300)
	run := startFaultRun(t, c, "instance killed mid-run", n, n/3)
	run.heldAt(t, n/3)
	victim := c.instanceWithHeldSessions(t)
	victim.kill(t)
	t.Logf("killed %s after %d connects", victim.Name, n/3)
	run.resume(t)
	res := run.wait(t, c)
	wantOnlyClearErrors(t, res)
	wantTakenOver(t, c)
	// At most the connects in flight at the kill (8) are hit, each through
	// one request or two; allow twice that for the health check's lag.
	if res.FailedSessions > 16 {
		t.Errorf("%d connects failed, want at most 16 (the ones in flight on the killed instance)", res.FailedSessions)
	}

	after := runPipeline(t, c, "after the kill, two instances left", clusterN(t, 100))
	wantNoFailure(t, after)
}

// Redis killed and started again (empty) in the middle of a run: every
// request is still served, none waits past the bounds, initialize never
// fails for it, the outage is counted in caddy_mcp_serializer_state_errors_total,
// and once Redis is back the gate holds again.
func TestClusterRedisRestartedMidRun(t *testing.T) {
	prerequisites(t)
	requireModule(t, redisStateModule)
	redis := startRedis(t)
	c := startCluster(t, clusterOptions{State: redisState(redis)})

	n := clusterN(t, 400)
	run := startFaultRun(t, c, "redis restarted mid-run", n, n/4, n/2)
	run.heldAt(t, n/4)
	redis.kill(t)
	t.Logf("redis killed after %d connects", n/4)
	run.resume(t)
	run.heldAt(t, n/2)
	redis.start(t)
	t.Logf("redis restarted after %d connects", n/2)
	run.resume(t)
	res := run.wait(t, c)
	errs := c.stateErrors(t)
	t.Logf("state errors by operation: %v", errs)
	wantOnlyClearErrors(t, res)
	if res.Connects != res.N {
		t.Errorf("initialize failed %d times: a failed write at creation must not fail it", res.N-res.Connects)
	}
	if res.HTTPErrorCount != 0 {
		t.Errorf("HTTP errors during the outage: %v, want none (fall back to local behaviour)", res.HTTPErrors)
	}
	total := 0.0
	for _, v := range errs {
		total += v
	}
	if total == 0 {
		t.Errorf("caddy_mcp_serializer_state_errors_total stayed 0 through a Redis outage")
	}

	after := runPipeline(t, c, "after Redis came back", clusterN(t, 100))
	wantNoFailure(t, after)
}

// An instance restarted (a new process, not a reload) between a session's
// initialize on another instance and its follow-ups still gates it: a
// logging/setLevel sent before notifications/initialized waits for it
// instead of reaching PHP first and being rejected as not initialized.
func TestClusterRestartedInstanceKeepsSessionGated(t *testing.T) {
	prerequisites(t)
	for _, engine := range []string{"redis", "storage"} {
		t.Run(engine, func(t *testing.T) {
			opts := clusterOptions{Instances: 2, PHPWorkers: 2}
			if engine == "redis" {
				requireModule(t, redisStateModule)
				opts.State = redisState(startRedis(t))
			} else {
				requireModule(t, storageStateModule)
				opts.State = "state storage"
				opts.Global = "storage file_system " + t.TempDir()
			}
			c := startCluster(t, opts)
			a, b := c.Instances[0], c.Instances[1]
			client := &http.Client{Timeout: 30 * time.Second}

			resp, body := post(t, client, a.URL+"/mcp", "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"go-test","version":"1"}}}`)
			session := resp.Header.Get("Mcp-Session-Id")
			if resp.StatusCode != http.StatusOK || session == "" {
				t.Fatalf("initialize on %s: status %d, session id present %v, body %s", a.Name, resp.StatusCode, session != "", body)
			}

			b.kill(t)
			b.start(t)
			t.Logf("%s restarted after the session was created on %s", b.Name, a.Name)

			setLevel := setLevelAsync(client, b.URL+"/mcp", session)
			// Give setLevel the lead it has in a pipelined connect.
			waitHeldOrAnswered(t, c, setLevel)
			initializedAt := time.Now()
			resp, body = post(t, client, b.URL+"/mcp", session, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
			if resp.StatusCode != http.StatusAccepted {
				t.Fatalf("notifications/initialized on %s: status %d, body %s", b.Name, resp.StatusCode, body)
			}
			var got timedReply
			select {
			case got = <-setLevel:
			case <-time.After(40 * time.Second):
				t.Fatalf("logging/setLevel not answered within 40s")
			}
			t.Logf("logging/setLevel answered %d %s, %v after initialized was sent", got.status, strings.TrimSpace(string(got.body)), got.at.Sub(initializedAt).Round(time.Millisecond))
			var msg struct {
				Result json.RawMessage `json:"result"`
				Error  *struct {
					Code    int    `json:"code"`
					Message string `json:"message"`
				} `json:"error"`
			}
			if got.status != http.StatusOK || json.Unmarshal(got.body, &msg) != nil {
				t.Fatalf("logging/setLevel: status %d, body %s", got.status, got.body)
			}
			if msg.Error != nil {
				t.Fatalf("logging/setLevel reached PHP before notifications/initialized: error %d %s (the restarted instance did not gate the session)", msg.Error.Code, msg.Error.Message)
			}
			if got.at.Before(initializedAt) {
				t.Fatalf("logging/setLevel was answered before notifications/initialized was sent")
			}
		})
	}
}

// waitHeldOrAnswered waits until a request waits at one of the cluster's
// running instances, or reply has come (a gate that held nothing), failing
// after 40 s.
func waitHeldOrAnswered(t *testing.T, c *cluster, reply <-chan timedReply) {
	t.Helper()
	deadline := time.Now().Add(40 * time.Second)
	for len(reply) == 0 {
		for _, in := range c.Instances {
			if in.proc.running() && instanceSessionCounts(t, in)["waiting_requests"] > 0 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the request neither waited nor was answered within 40s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// timedReply is an answer and when it came.
type timedReply struct {
	status int
	body   []byte
	at     time.Time
}

// setLevelAsync sends logging/setLevel in session from its own goroutine;
// a failure to send comes as its body.
func setLevelAsync(client *http.Client, url, session string) <-chan timedReply {
	ch := make(chan timedReply, 1)
	go func() {
		status, body, err := postNoFatal(client, url, session, `{"jsonrpc":"2.0","id":2,"method":"logging/setLevel","params":{"level":"debug"}}`)
		if err != nil {
			body = []byte(err.Error())
		}
		ch <- timedReply{status: status, body: body, at: time.Now()}
	}()
	return ch
}

// postNoFatal sends one JSON-RPC POST from any goroutine.
func postNoFatal(client *http.Client, url, session, body string) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", session)
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var b strings.Builder
	_, err = io.Copy(&b, resp.Body)
	return resp.StatusCode, []byte(b.String()), err
}
