package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// order owner across three instances with real PHP-FPM pools on one
// session store: the instance that created a session serves all of its
// requests, the others forward them there (caddymodule/owners.go).

func startOwnerCluster(t *testing.T, opts clusterOptions) *cluster {
	t.Helper()
	requireModule(t, redisStateModule)
	opts.Order = "owner"
	return startCluster(t, opts)
}

// forwardedBy logs and returns the requests each instance forwarded to
// an owner, and the sessions each took over.
func forwardedBy(t *testing.T, c *cluster) (forwarded, takeovers float64) {
	t.Helper()
	for _, in := range c.Instances {
		if !in.proc.running() {
			continue
		}
		f := in.metrics(t, "caddy_mcp_serializer_forwards_total")
		o := sumValues(in.metrics(t, "caddy_mcp_serializer_takeovers_total"))
		t.Logf("%s: forwards by result %v, takeovers %v", in.Name, nonZero(f), o)
		forwarded += f[`{result="forwarded"}`]
		takeovers += o
	}
	return forwarded, takeovers
}

// Behind round robin (Caddy's and nginx's), a connect's requests land on
// all three instances; each meets its session's owner, so none fails.
func TestClusterOwnerRoundRobinConnectsNeverFail(t *testing.T) {
	prerequisites(t)
	for _, b := range []balancer{caddyRoundRobin, nginxRoundRobin} {
		t.Run(b.String(), func(t *testing.T) {
			c := startOwnerCluster(t, clusterOptions{State: redisState(startRedis(t)), Balancer: b})
			res := runPipeline(t, c, "order owner, "+b.String(), clusterN(t, 200))
			wantNoFailure(t, res)
			if forwarded, _ := forwardedBy(t, c); forwarded == 0 {
				t.Error("no request was forwarded to its owner: the front did not spread sessions, or the instances did not forward")
			}
		})
	}
}

// Calls of one session sent at once behind round robin reach three
// instances and still run one at a time, at the owner: every call gets
// its own answer.
func TestClusterOwnerParallelCallsOfOneSessionGetTheirOwnAnswers(t *testing.T) {
	prerequisites(t)
	c := startOwnerCluster(t, clusterOptions{State: redisState(startRedis(t)), Balancer: caddyRoundRobin})
	var res callsResult
	runClient(t, 5*time.Minute, &res, "calls", "--url", c.Front+"/mcp", "--n", "20", "--concurrency", "4", "--calls", "3", "--timeout", "5000")
	t.Logf("round robin, order owner: %s", res.summary())
	logSamples(t, res.Samples)
	forwardedBy(t, c)
	if !res.OK || res.WrongCalls != 0 || res.IDMismatches != 0 || res.HTTPErrorCount != 0 {
		t.Errorf("%s; want every call answered with its own reply", res.summary())
	}
}

// Tool calls of 7 s through an 8 s Redis outage (SIGSTOP: connections
// accepted, nothing answered), behind a front hashing Mcp-Session-Id and
// behind round robin: the owners are known before the outage, so no call
// waits for Redis and none is cut.
func TestClusterOwnerLongCallsOutlastARedisOutage(t *testing.T) {
	prerequisites(t)
	for _, b := range []balancer{caddyHeaderHash, caddyRoundRobin} {
		t.Run(b.String(), func(t *testing.T) {
			redis := startRedis(t)
			c := startOwnerCluster(t, clusterOptions{State: redisState(redis), Balancer: b, ProgressMS: 1000, PHPWorkers: 8})
			done := make(chan callsResult, 1)
			go func() {
				var res callsResult
				runClient(t, 2*time.Minute, &res, "calls", "--url", c.Front+"/mcp", "--n", "12", "--concurrency", "12",
					"--calls", "1", "--tool", "slow_count", "--steps", "7", "--timeout", "30000")
				done <- res
			}()
			waitOpenInFlight(t, c, 12, done)
			redis.signal(t, syscall.SIGSTOP)
			t.Cleanup(func() { redis.signal(t, syscall.SIGCONT) })
			t.Log("all 12 calls upstream; redis paused for 8s")
			time.Sleep(8 * time.Second)
			redis.signal(t, syscall.SIGCONT)
			var res callsResult
			select {
			case res = <-done:
			case <-time.After(2 * time.Minute):
				t.Fatal("the calls did not end within 2 minutes")
			}
			t.Logf("%s, order owner, 7 s calls through an 8 s Redis outage: %s", b, res.summary())
			logSamples(t, res.Samples)
			forwardedBy(t, c)
			if res.Error != "" || !res.OK || res.WrongCalls != 0 || res.HTTPErrorCount != 0 {
				t.Errorf("%s; want all 12 calls answered, none cut", res.summary())
			}
			if res.ElapsedMs < 7000 {
				t.Errorf("the calls took %d ms: they did not run through the outage", res.ElapsedMs)
			}
		})
	}
}

// waitOpenInFlight waits until the cluster's instances have n sessions
// with an exchange upstream past their initialization (a tool call, not
// an initialize), failing the test if the client ends first or 2 minutes
// pass.
func waitOpenInFlight[T any](t *testing.T, c *cluster, n int, ended <-chan T) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		calls := 0
		for _, in := range c.Instances {
			status, _, body := adminCall(t, http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(in.Admin)+"/mcp_serializer/sessions?state=in_flight&limit=1000")
			var rep sessionsReport
			if err := json.Unmarshal(body, &rep); status != http.StatusOK || err != nil || len(rep.Tables) != 1 {
				t.Fatalf("GET /mcp_serializer/sessions: %d %v %s", status, err, body)
			}
			for _, s := range rep.Tables[0].Sessions {
				if s.State == "open" {
					calls++
				}
			}
		}
		if calls >= n {
			return
		}
		select {
		case <-ended:
			t.Fatalf("the client ended before %d sessions had a call upstream at once", n)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions with a call upstream after 2 minutes, want %d", calls, n)
		}
	}
}

// The sessions of an instance killed (SIGKILL) are taken over, once its
// lease has lapsed, by the instance that next gets one of their
// requests, with their gate: a session killed mid-initialization still
// holds logging/setLevel until its notifications/initialized, which
// reaches a third instance and is forwarded to the new owner. Requests
// meeting the owner after its lease lapsed never dial it.
func TestClusterOwnerSessionsOfAKilledInstanceAreTakenOverStillGated(t *testing.T) {
	prerequisites(t)
	c := startOwnerCluster(t, clusterOptions{State: redisState(startRedis(t)), PHPWorkers: 2})
	a, b, cc := c.Instances[0], c.Instances[1], c.Instances[2]
	client := &http.Client{Timeout: 30 * time.Second}
	initialize := func(t *testing.T, on *caddyInstance) string {
		t.Helper()
		resp, body := post(t, client, on.URL+"/mcp", "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"go-test","version":"1"}}}`)
		session := resp.Header.Get("Mcp-Session-Id")
		if resp.StatusCode != http.StatusOK || session == "" {
			t.Fatalf("initialize on %s: status %d, body %s", on.Name, resp.StatusCode, body)
		}
		return session
	}
	initialized := func(t *testing.T, on *caddyInstance, session string) time.Time {
		t.Helper()
		sent := time.Now()
		if resp, body := post(t, client, on.URL+"/mcp", session, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); resp.StatusCode != http.StatusAccepted {
			t.Fatalf("notifications/initialized on %s: status %d, body %s", on.Name, resp.StatusCode, body)
		}
		return sent
	}
	gated := initialize(t, b)
	open1, open2 := initialize(t, b), initialize(t, b)
	initialized(t, b, open1)
	initialized(t, b, open2)
	b.kill(t)
	t.Logf("killed %s, the owner of three sessions, one still initializing", b.Name)

	setLevel := setLevelAsync(client, a.URL+"/mcp", gated)
	waitHeldOrAnswered(t, c, setLevel)
	initializedAt := initialized(t, cc, gated)
	var got timedReply
	select {
	case got = <-setLevel:
	case <-time.After(40 * time.Second):
		t.Fatal("logging/setLevel not answered within 40s")
	}
	t.Logf("logging/setLevel on %s answered %d %s, %v after initialized was sent to %s", a.Name, got.status, strings.TrimSpace(string(got.body)),
		got.at.Sub(initializedAt).Round(time.Millisecond), cc.Name)
	if got.status != http.StatusOK || !strings.Contains(string(got.body), `"result"`) {
		t.Fatalf("logging/setLevel after the takeover: status %d, body %s (the session lost its gate, or its owner)", got.status, got.body)
	}
	if got.at.Before(initializedAt) {
		t.Fatal("logging/setLevel was answered before notifications/initialized was sent")
	}

	for _, session := range []string{open1, open2} {
		status, body, err := postNoFatal(client, cc.URL+"/mcp", session, `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`)
		if err != nil || status != http.StatusOK || !strings.Contains(string(body), `"tools"`) {
			t.Fatalf("tools/list on %s for a session of the killed instance: %d %s %v", cc.Name, status, body, err)
		}
	}
	forwardedBy(t, c)
	if n := cc.metrics(t, "caddy_mcp_serializer_forwards_total")[`{result="unreachable"}`]; n != 0 {
		t.Errorf("%s dialed the killed owner %v times after its lease lapsed, want never", cc.Name, n)
	}
	takeovers := sumValues(a.metrics(t, "caddy_mcp_serializer_takeovers_total")) + sumValues(cc.metrics(t, "caddy_mcp_serializer_takeovers_total"))
	if takeovers != 3 {
		t.Errorf("%v sessions taken over, want the killed instance's 3", takeovers)
	}
}

// redisCommands counts the commands r has been sent, as the module
// sends them: scripts (each counted once, not the calls inside it),
// lookups and deletes; a client's connection handshake is left out.
func redisCommands(t *testing.T, r *redisServer) float64 {
	t.Helper()
	info, err := r.command("INFO", "commandstats")
	if err != nil {
		t.Fatalf("redis INFO: %v", err)
	}
	total := 0.0
	for _, line := range strings.Split(info, "\n") {
		name, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
		switch strings.TrimPrefix(name, "cmdstat_") {
		case "evalsha", "eval", "hmget", "del":
		default:
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(stats, "calls="), ",")
		n, err := strconv.ParseFloat(calls, 64)
		if !ok || err != nil {
			t.Fatalf("commandstats line %q", line)
		}
		total += n
	}
	return total
}

// What a connect (initialize, notifications/initialized, logging/setLevel,
// tools/list, DELETE) costs in Redis commands with order owner: the
// session's own record writes (created, initialize ended, opened,
// forgotten) and one lookup on each other instance that meets it, behind
// a hashing front and behind round robin.
func TestClusterOwnerRedisCommandsPerConnectAreTheRecordsOwn(t *testing.T) {
	prerequisites(t)
	const n = 100
	for _, tc := range []struct {
		order string
		front balancer
		most  float64 // commands per connect, with order owner
	}{
		{"owner", caddyHeaderHash, 4 + 1},
		{"owner", caddyRoundRobin, 4 + 2},
	} {
		t.Run(tc.order+"/"+tc.front.String(), func(t *testing.T) {
			redis := startRedis(t)
			c := startCluster(t, clusterOptions{State: redisState(redis), Order: tc.order, Balancer: tc.front})
			// A few connects first, so that the figure leaves out loading the
			// scripts (a first EVALSHA answered NOSCRIPT is sent again as EVAL).
			wantNoFailure(t, runPipeline(t, c, "warm-up", 10))
			before := redisCommands(t, redis)
			res := runPipeline(t, c, "order "+tc.order+", "+tc.front.String(), n)
			wantNoFailure(t, res)
			perConnect := (redisCommands(t, redis) - before) / n
			t.Logf("order %s behind %s: %.2f Redis commands per connect, %d connects in %d ms", tc.order, tc.front, perConnect, n, res.ElapsedMs)
			// A write retried after a timeout under load may add one.
			if tc.most > 0 && perConnect > tc.most+0.05 {
				t.Errorf("%.2f Redis commands per connect, want at most %v (the record's writes and a lookup per other instance)", perConnect, tc.most)
			}
		})
	}
}

// The documented least-privilege ACL user, without any channel (Redis 7's
// default for a new user): order owner needs no announcement, so round
// robin connects and a handle's parallel calls go as fast and as safely as
// with every right.
func TestClusterOwnerWithTheLeastPrivilegedUserWithoutChannels(t *testing.T) {
	prerequisites(t)
	r := startRedis(t)
	addLeastPrivilegedUser(t, r, "resetchannels")
	state := "state redis {\n\taddress " + r.Addr + "\n\tusername " + leastPrivilegedUser + "\n\tpassword " + leastPrivilegedPassword + "\n}"
	c := startOwnerCluster(t, clusterOptions{State: state, Key: cartKey, Balancer: caddyRoundRobin})
	res := runPipeline(t, c, "order owner, least-privileged user without channels", clusterN(t, 100))
	wantNoFailure(t, res)
	wantNoLostUpdate(t, "order owner, least-privileged user without channels", runCartRace(t, c))
	if errs := nonZero(c.stateErrors(t)); len(errs) != 0 {
		t.Errorf("failed state calls: %v", errs)
	}
}

// A session's owner stops while a 7 s tool call runs there, and the
// session's next request goes to another instance, which takes the session
// over. Stopped gracefully (SIGTERM, as a rolling deploy does), the old
// owner stops listening at once but finishes the call, keeping the
// record's running mark fresh: the new owner sends the next request only
// once the call has ended. Killed (SIGKILL), its PHP-FPM worker still
// finishes the call, but nobody renews the mark: the new owner waits until
// it lapses (at most 5 s after the last renewal), and the overlap left is
// logged.
func TestClusterOwnerStoppedMidCallHandsItsSessionOnOnceTheCallEnds(t *testing.T) {
	prerequisites(t)
	const steps, step = 7, time.Second
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(strings.ToUpper(sig.String()), func(t *testing.T) {
			c := startOwnerCluster(t, clusterOptions{State: redisState(startRedis(t)), ProgressMS: int(step / time.Millisecond)})
			a, b := c.Instances[0], c.Instances[1]
			// Caddy's own default grace period is unbounded; the tests' 2 s
			// would cut the call.
			a.kill(t)
			conf, err := os.ReadFile(a.conf)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(a.conf, []byte(strings.Replace(string(conf), "grace_period 2s", "grace_period 30s", 1)), 0o644); err != nil {
				t.Fatal(err)
			}
			a.start(t)
			client := &http.Client{Timeout: 40 * time.Second}
			session := openSession(t, client, a.URL+"/mcp")

			callStart := time.Now()
			call, progressed := slowCountAsync(client, a.URL+"/mcp", session, steps)
			// The second step is reported a step after the first: the call
			// has run upstream that long when the owner stops.
			for range 2 {
				select {
				case <-progressed:
				case got := <-call:
					t.Fatalf("the call ended before its second step: %d %s", got.status, got.body)
				}
			}
			stopped := time.Now()
			if err := syscall.Kill(-a.proc.cmd.Process.Pid, sig); err != nil {
				t.Fatal(err)
			}
			a.waitRefusing(t)
			status, body, err := postNoFatal(client, b.URL+"/mcp", session, `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`)
			listAt := time.Now()
			if err != nil || status != http.StatusOK || !strings.Contains(string(body), `"tools"`) {
				t.Fatalf("tools/list on %s after %s stopped: %d %s %v", b.Name, a.Name, status, body, err)
			}
			// The worker's script ends steps × step after the call began,
			// whether or not its Caddy is still there to pass the answer on.
			callEnd := callStart.Add(steps * step)
			if sig == syscall.SIGTERM {
				got := <-call
				if got.status != http.StatusOK || !strings.Contains(string(got.body), "counted to") {
					t.Fatalf("the call on the gracefully stopping owner: %d %s", got.status, got.body)
				}
				callEnd = got.at
			}
			t.Logf("%v %s %v into a %v call; tools/list through %s answered %v after the stop, %v after the call ended",
				sig, a.Name, stopped.Sub(callStart).Round(time.Millisecond), steps*step, b.Name,
				listAt.Sub(stopped).Round(time.Millisecond), listAt.Sub(callEnd).Round(time.Millisecond))
			if n := sumValues(b.metrics(t, "caddy_mcp_serializer_takeovers_total")); n != 1 {
				t.Errorf("%s took over %v sessions, want 1", b.Name, n)
			}
			if sig == syscall.SIGTERM && listAt.Before(callEnd) {
				t.Errorf("tools/list was answered %v before the old owner's call ended: the two ran at once", callEnd.Sub(listAt).Round(time.Millisecond))
			}
			if sig == syscall.SIGKILL && listAt.Sub(stopped) < 2*time.Second {
				t.Errorf("tools/list was answered %v after the kill: the new owner did not wait for the running mark to lapse", listAt.Sub(stopped).Round(time.Millisecond))
			}
		})
	}
}

// slowCountAsync calls slow_count to n in session from its own goroutine,
// asking for progress: progressed gets a value per progress notification
// as it arrives, reply the answer once the call has ended (a failure to
// send or read comes as its body).
func slowCountAsync(client *http.Client, url, session string, n int) (reply <-chan timedReply, progressed <-chan struct{}) {
	replies, progress := make(chan timedReply, 1), make(chan struct{}, n)
	go func() {
		body := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"slow_count","arguments":{"n":` + strconv.Itoa(n) + `},"_meta":{"progressToken":"p"}}}`
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		if err != nil {
			replies <- timedReply{body: []byte(err.Error()), at: time.Now()}
			return
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Session-Id", session)
		resp, err := client.Do(req)
		if err != nil {
			replies <- timedReply{body: []byte(err.Error()), at: time.Now()}
			return
		}
		defer resp.Body.Close()
		var all bytes.Buffer
		lines := bufio.NewScanner(io.TeeReader(resp.Body, &all))
		for lines.Scan() {
			if strings.HasPrefix(lines.Text(), "data:") && strings.Contains(lines.Text(), `"notifications/progress"`) {
				progress <- struct{}{}
			}
		}
		if err := lines.Err(); err != nil {
			all.WriteString(err.Error())
		}
		replies <- timedReply{status: resp.StatusCode, body: all.Bytes(), at: time.Now()}
	}()
	return replies, progress
}

// A forward waiting in its owner's listener queue when the owner died,
// never accepted, reached nothing (the kernel resets what a closed
// listener still held): it waits for the owner's lease to lapse and is
// served after the takeover, not answered 502. The owner is frozen
// (SIGSTOP) so that the forward waits in its queue, and killed once it is
// there; a rolling deploy meets the same when a forward arrives as a
// stopping owner closes its listener.
func TestClusterOwnerAForwardQueuedAtAnOwnerThatDiedIsServedAfterTheTakeover(t *testing.T) {
	prerequisites(t)
	c := startOwnerCluster(t, clusterOptions{State: redisState(startRedis(t)), PHPWorkers: 2})
	a, b := c.Instances[0], c.Instances[1]
	client := &http.Client{Timeout: 40 * time.Second}
	session := openSession(t, client, b.URL+"/mcp")
	pid := b.proc.cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
	reply := make(chan timedReply, 1)
	go func() {
		status, body, err := postNoFatal(client, a.URL+"/mcp", session, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
		if err != nil {
			body = []byte(err.Error())
		}
		reply <- timedReply{status: status, body: body, at: time.Now()}
	}()
	waitFor(t, "a forward queued at the frozen owner's listener", 10*time.Second, func() bool { return listenQueue(t, b.Port) > 0 })
	b.kill(t)
	var got timedReply
	select {
	case got = <-reply:
	case <-time.After(45 * time.Second):
		t.Fatal("tools/list not answered within 45s")
	}
	forwardedBy(t, c)
	if got.status != http.StatusOK || !strings.Contains(string(got.body), `"tools"`) {
		t.Fatalf("tools/list whose forward the dead owner's kernel reset: %d %s; want it served after the takeover", got.status, got.body)
	}
	if n := sumValues(a.metrics(t, "caddy_mcp_serializer_takeovers_total")); n != 1 {
		t.Errorf("%s took over %v sessions, want the dead owner's one", a.Name, n)
	}
}

// listenQueue is how many connections wait, accepted by the kernel but
// not yet by the program, at the TCP listener on port.
func listenQueue(t *testing.T, port int) int {
	t.Helper()
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n")[1:] {
			f := strings.Fields(line)
			// local_address is ADDR:PORT in hex, st 0A is LISTEN, and a
			// listener's rx_queue is its accept queue.
			if len(f) < 5 || f[3] != "0A" || !strings.HasSuffix(f[1], fmt.Sprintf(":%04X", port)) {
				continue
			}
			_, rx, _ := strings.Cut(f[4], ":")
			n, _ := strconv.ParseInt(rx, 16, 64)
			return int(n)
		}
	}
	t.Fatalf("no TCP listener on port %d", port)
	return 0
}
