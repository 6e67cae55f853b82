package caddymodule_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/redis/go-redis/v9"

	"github.com/mcpserializer/caddy-mcp-serializer/integration/mcpstub"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/redistest"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/testnet"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/wait"
	"github.com/mcpserializer/caddy-mcp-serializer/owner"
	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// ownerInstances runs, in this process, two instances with order owner on
// one Redis (two sites with session tables of their own, each its own
// owner) and a front that sends requests to them in turn; settings are
// more lines for both instances' mcp_serializer.
type ownerInstances struct {
	a, b, front string // URLs
	redis       *redis.Client
	admin       string
	caddyfile   func(redisTimeout string) string
}

func startOwnerInstances(t testing.TB, upstream string, settings ...string) *ownerInstances {
	t.Helper()
	extra := ""
	for _, setting := range settings {
		extra += "\n\t\t" + setting
	}
	redisAddr := redistest.Start(t)
	adminPort, pa, pb, pf := testnet.FreePort(t), testnet.FreePort(t), testnet.FreePort(t), testnet.FreePort(t)
	// A setting may differ between the instances: {instance} is its name,
	// {port} its port.
	instance := func(name string, port int, redisLogin string) string {
		extra := strings.NewReplacer("{instance}", name, "{port}", strconv.Itoa(port)).Replace(extra)
		return fmt.Sprintf(`http://127.0.0.1:%d {
	metrics /metrics
	mcp_serializer {
		name %s
		order owner
		state redis %s {
			timeout 250ms%s
		}%s
	}
	reverse_proxy %s {
		flush_interval -1
	}
}
`, port, name, redisAddr, redisLogin, extra, upstream)
	}
	in := &ownerInstances{
		a: fmt.Sprintf("http://127.0.0.1:%d", pa), b: fmt.Sprintf("http://127.0.0.1:%d", pb),
		front: fmt.Sprintf("http://127.0.0.1:%d", pf), admin: fmt.Sprintf("http://127.0.0.1:%d", adminPort),
	}
	in.caddyfile = func(redisLogin string) string {
		return fmt.Sprintf(`{
	admin 127.0.0.1:%d
	auto_https off
	persist_config off
	log {
		output discard
	}
}
`, adminPort) + instance("a", pa, redisLogin) + instance("b", pb, redisLogin) + fmt.Sprintf(`http://127.0.0.1:%d {
	reverse_proxy 127.0.0.1:%d 127.0.0.1:%d {
		lb_policy round_robin
		flush_interval -1
	}
}
`, pf, pa, pb)
	}
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(in.caddyfile("")), nil)
	if err != nil {
		t.Fatal(err)
	}
	in.redis = redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { in.redis.Close() })
	loadCaddy(t, cfg)
	return in
}

// recordField reads one field of session id's record in Redis ("" if
// none).
func (in *ownerInstances) recordField(id, field string) string {
	v, _ := in.redis.HGet(context.Background(), "mcp_serializer:"+serializer.StoreKey(id), field).Result()
	return v
}

// waitForOwnerRecord waits until session id's record names its owner:
// another instance learns the owner from it, and it is written as
// initialize ends, on a slow machine after the answer.
func (in *ownerInstances) waitForOwnerRecord(t *testing.T, id string) {
	t.Helper()
	wait.Until(t, "the session's record names its owner", func() bool { return in.recordField(id, "owner") != "" })
}

// reload logs the instances in to Redis as another user, through the
// admin API, as `caddy reload` with a rotated password does: a new Redis
// client on both, and the old one closed once the old config stops.
func (in *ownerInstances) reload(t testing.TB) {
	t.Helper()
	if err := in.redis.Do(context.Background(), "ACL", "SETUSER", "rotated", "on", ">rotated-secret", "~*", "&*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	loadThroughAdmin(t, in.admin, in.caddyfile("\n\t\t\tusername rotated\n\t\t\tpassword rotated-secret"))
}

// Pipelined connects behind round robin land each request on either
// instance; with order owner, every follow-up meets its initialize on the
// instance that created the session, so none fails.
func TestRoundRobinConnectsNeverFailWithOrderOwner(t *testing.T) {
	backend := &mcpstub.Backend{WorkMin: time.Millisecond, WorkMax: 5 * time.Millisecond, DisableRequestLog: true}
	srv := httptest.NewServer(backend)
	defer srv.Close()
	in := startOwnerInstances(t, strings.TrimPrefix(srv.URL, "http://"))
	before := scrapeMetric(t, in.a, `caddy_mcp_serializer_forwards_total{result="forwarded"}`)
	timedBefore := scrapeMetric(t, in.a, `caddy_mcp_serializer_forward_seconds_count`)

	sum := mcpstub.RunPipelined(context.Background(), in.front+"/mcp", 200, 8)
	t.Logf("round robin over two instances, order owner: %s", sum)
	if sum.Connects != 200 || sum.Failed != 0 || sum.Broken != 0 {
		t.Fatalf("%s; samples: %v", sum, sum.Samples)
	}
	// A forward is counted once the proxy has returned, a moment after its
	// client may have read the answer.
	wait.Until(t, "every forward timed and counted", func() bool {
		forwarded := scrapeMetric(t, in.a, `caddy_mcp_serializer_forwards_total{result="forwarded"}`) - before
		return forwarded >= 100 && scrapeMetric(t, in.a, `caddy_mcp_serializer_forward_seconds_count`)-timedBefore == forwarded
	})
}

// A session whose owner never held a lease (it ran a release without
// leases) is never forwarded to it: it waits until that owner has been
// seen absent for the lock delay; then this instance takes it over in
// Redis and serves it from then on.
func TestASessionWhoseOwnerHoldsNoLeaseAndDoesNotAnswerIsTakenOverAndServedHere(t *testing.T) {
	up, addr := newUpstream(t, nil)
	in := startOwnerInstances(t, addr)
	ctx := context.Background()
	key := "mcp_serializer:" + serializer.StoreKey("orphan")
	dead := owner.Owner{ID: "dead", Addr: strings.TrimPrefix(testnet.RefusedURL(t), "http://")}
	dead.Addr, _, _ = strings.Cut(dead.Addr, "/")
	if err := in.redis.HSet(ctx, key, "open", "1", "deadline", "0", "inflight", "0", "owner", dead.String()).Err(); err != nil {
		t.Fatal(err)
	}
	in.redis.Expire(ctx, key, time.Hour)
	const unreachable = `caddy_mcp_serializer_forwards_total{result="unreachable"}`
	before := scrapeMetric(t, in.b, unreachable)

	for i := range 3 {
		resp := post(t, in.b, "orphan", fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/list"}`, i))
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %s", i, resp.Status)
		}
	}
	if n := len(up.requests()); n != 3 {
		t.Fatalf("upstream saw %d requests, want 3", n)
	}
	if n := scrapeMetric(t, in.b, unreachable) - before; n != 0 {
		t.Fatalf("the owner that never held a lease was dialed %v times, want never", n)
	}
	recorded, _ := in.redis.HGet(ctx, key, "owner").Result()
	if o, ok := owner.Parse(recorded); !ok || o.ID == dead.ID || o.Addr != strings.TrimPrefix(in.b, "http://") {
		t.Fatalf("recorded owner %q, want instance b at its address", recorded)
	}
}

// A request sent as to an owner that is not this instance (a client's
// header, or a forward to an instance restarted since) is answered 421
// and never forwarded, upstream or to another instance.
func TestARequestSentToAnotherOwnerIsAnswered421AndNotForwarded(t *testing.T) {
	up, addr := newUpstream(t, nil)
	in := startOwnerInstances(t, addr)
	req, _ := http.NewRequest(http.MethodPost, in.a, strings.NewReader(`{"jsonrpc":"2.0","id":7,"method":"tools/list"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Mcp-Session-Id", "s1")
	req.Header.Set("Mcp-Serializer-Owner", "someone-else")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Header.Get("Mcp-Serializer-Not-Owner") == "" {
		t.Fatal("421 without Mcp-Serializer-Not-Owner")
	}
	expectRPCError(t, resp, http.StatusMisdirectedRequest, "7")
	if n := len(up.requests()); n != 0 {
		t.Fatalf("upstream saw %d requests, want 0", n)
	}
}

// scrapeMetric reads one series from a site's metrics; 0 if it is not
// there yet (a counter never incremented).
func scrapeMetric(t testing.TB, site, series string) float64 {
	t.Helper()
	resp, err := http.Get(site + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, value, _ := strings.Cut(sc.Text(), " ")
		if name == series {
			v, err := strconv.ParseFloat(value, 64)
			if err != nil {
				t.Fatalf("%s: %v", series, err)
			}
			return v
		}
	}
	return 0
}

// startWithLongSession starts two owner instances in front of an upstream
// whose tool call "block" runs until release is closed, and opens session
// s-long on instance a.
func startWithLongSession(t *testing.T, release <-chan struct{}) (*upstream, *ownerInstances) {
	t.Helper()
	up, addr := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "application/json")
		if strings.Contains(string(body), `"initialize"`) {
			w.Header().Set("Mcp-Session-Id", "s-long")
		}
		if strings.Contains(string(body), "block") {
			select {
			case <-release:
			case <-time.After(20 * time.Second):
			}
		}
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
	})
	in := startOwnerInstances(t, addr)
	post(t, in.a, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`).Body.Close()
	post(t, in.a, "s-long", `{"jsonrpc":"2.0","method":"notifications/initialized"}`).Body.Close()
	up.next(t)
	up.next(t)
	return up, in
}

// A reload that changes how Redis is reached (a new client on every
// instance) while a forwarded tool call runs at the owner: the call goes on
// to its end, and the session's next request is forwarded with the new
// config.
func TestAReloadChangingTheRedisConnectionCutsNoForwardedCall(t *testing.T) {
	release := make(chan struct{})
	up, in := startWithLongSession(t, release)

	in.waitForOwnerRecord(t, "s-long")
	const forwarded = `caddy_mcp_serializer_forwards_total{result="forwarded"}`
	before := scrapeMetric(t, in.b, forwarded)
	call := sendAsync(context.Background(), in.b, "s-long", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"block"}}`)
	up.next(t) // the call reached the upstream through the owner
	in.reload(t)
	close(release)
	select {
	case resp := <-call:
		if resp == nil {
			t.Fatal("the forwarded call failed across the reload")
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"result"`) {
			t.Fatalf("the forwarded call across the reload: %d %s", resp.StatusCode, body)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the forwarded call did not end within 30s")
	}

	resp := post(t, in.b, "s-long", `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the next request after the reload: %s", resp.Status)
	}
	if n := len(up.requests()); n != 4 {
		t.Fatalf("upstream saw %d requests, want 4 (initialize, initialized, the call, tools/list)", n)
	}
	// A forward is counted once the proxy has returned, a moment after
	// the client may have read the answer.
	deadline := time.Now().Add(10 * time.Second)
	for scrapeMetric(t, in.b, forwarded)-before != 2 {
		if time.Now().After(deadline) {
			var by []string
			for _, series := range []string{forwarded, `caddy_mcp_serializer_forwards_total{result="unreachable"}`,
				`caddy_mcp_serializer_forwards_total{result="not_owner"}`, `caddy_mcp_serializer_forwards_total{result="failed"}`,
				`caddy_mcp_serializer_state_errors_total{op="lookup"}`, `caddy_mcp_serializer_takeovers_total`} {
				by = append(by, fmt.Sprintf("%s %v", series, scrapeMetric(t, in.b, series)))
			}
			t.Fatalf("b forwarded %v of the session's two requests to its owner (before: %v); %s", scrapeMetric(t, in.b, forwarded)-before, before, strings.Join(by, ", "))
		}
		time.Sleep(time.Millisecond)
	}
}

// BenchmarkOwnerHop is what forwarding adds to a request: the same
// session's requests sent one at a time to its owner, and to another
// instance that forwards them there, on loopback, upstream answering at
// once. cpu-ns/op is the process's CPU time per request (both instances,
// the upstream and the client are in it).
func BenchmarkOwnerHop(b *testing.B) {
	up, addr := newUpstream(b, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "application/json")
		if strings.Contains(string(body), `"initialize"`) {
			w.Header().Set("Mcp-Session-Id", "s-bench")
		}
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}`)
	})
	go func() { // the upstream records every request; drop them
		for range up.arrived {
		}
	}()
	in := startOwnerInstances(b, addr)
	post(b, in.a, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`).Body.Close()
	post(b, in.a, "s-bench", `{"jsonrpc":"2.0","method":"notifications/initialized"}`).Body.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	body := []byte(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	for _, target := range []struct{ name, url string }{{"at-the-owner", in.a}, {"forwarded", in.b}} {
		b.Run(target.name, func(b *testing.B) {
			cpu := processCPU()
			for b.Loop() {
				req, _ := http.NewRequest(http.MethodPost, target.url, bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Mcp-Session-Id", "s-bench")
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatalf("%s: %s", target.name, resp.Status)
				}
			}
			b.ReportMetric(float64(processCPU()-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}

// processCPU is the CPU time this process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// A long call that began before a reload changing how Redis is reached
// keeps its session's running mark through the new config's client, and
// clears it at its end: no mark goes to the client the reload closed.
func TestALongCallKeepsItsRunningMarkAcrossAReload(t *testing.T) {
	release := make(chan struct{})
	up, in := startWithLongSession(t, release)

	const markErrors = `caddy_mcp_serializer_state_errors_total{op="mark_running"}`
	before := scrapeMetric(t, in.a, markErrors)
	call := sendAsync(context.Background(), in.a, "s-long", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"block"}}`)
	up.next(t)
	in.reload(t)
	markedBy := func() string { return in.recordField("s-long", "running_by") }
	wait.Until(t, "the call's running mark", func() bool { return markedBy() != "" })
	time.Sleep(2 * time.Second) // and a renewal
	close(release)
	select {
	case resp := <-call:
		if resp == nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("the long call across the reload: %v", resp)
		}
		resp.Body.Close()
	case <-time.After(30 * time.Second):
		t.Fatal("the long call did not end within 30s")
	}
	wait.Until(t, "the mark cleared at the call's end", func() bool { return markedBy() == "" })
	if n := scrapeMetric(t, in.a, markErrors) - before; n != 0 {
		t.Fatalf("%v running marks failed across the reload", n)
	}
}

// redisCalls counts the commands Redis has run for the module: its
// scripts, lookups and deletes (a client's connection handshake and the
// INFO that asks are left out).
func redisCalls(t *testing.T, r *redis.Client) int {
	t.Helper()
	info, err := r.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(info, "\n") {
		name, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
		switch strings.TrimPrefix(name, "cmdstat_") {
		case "evalsha", "eval", "hmget", "hget", "del":
		default:
			continue
		}
		if !ok {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(stats, "calls="), ",")
		c, _ := strconv.Atoi(calls)
		n += c
	}
	return n
}

// Behind a front that keeps a session on one instance, its requests cost
// no Redis command, however far apart they come; an instance meeting the
// session for the first time asks once, then knows.
func TestASessionsRequestsCostNoRedisCommandAtAnyPacing(t *testing.T) {
	up, addr := newUpstream(t, mcpAnswer("paced", nil))
	in := startOwnerInstances(t, addr)
	post(t, in.a, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`).Body.Close()
	post(t, in.a, "paced", `{"jsonrpc":"2.0","method":"notifications/initialized"}`).Body.Close()
	up.next(t)
	up.next(t)
	wait.Until(t, "the session's record is open", func() bool { return in.recordField("paced", "open") == "1" })
	list := func(site string) {
		t.Helper()
		resp := post(t, site, "paced", `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("tools/list: %s", resp.Status)
		}
	}
	for _, gap := range []time.Duration{0, time.Second, 5 * time.Second} {
		time.Sleep(gap)
		before := redisCalls(t, in.redis)
		list(in.a)
		if n := redisCalls(t, in.redis) - before; n != 0 {
			t.Fatalf("a request %v after the last cost %d Redis commands on its owner, want 0", gap, n)
		}
	}
	before := redisCalls(t, in.redis)
	list(in.b)
	if n := redisCalls(t, in.redis) - before; n != 1 {
		t.Fatalf("the first request on another instance cost %d Redis commands, want 1 (the owner's lookup)", n)
	}
	time.Sleep(time.Second)
	before = redisCalls(t, in.redis)
	list(in.b)
	if n := redisCalls(t, in.redis) - before; n != 0 {
		t.Fatalf("a later request on that instance cost %d Redis commands, want 0", n)
	}
}

// A client that leaves in the middle of a forwarded event stream ends the
// forward as it ends a plain proxied one (the proxy aborts the handler),
// and the forward is still counted.
func TestAForwardWhoseClientLeavesMidStreamIsCounted(t *testing.T) {
	up, addr := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if strings.Contains(string(body), `"initialize"`) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Mcp-Session-Id", "s-stream")
			io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
			return
		}
		if !strings.Contains(string(body), "stream") {
			w.WriteHeader(http.StatusAccepted)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n")
		http.NewResponseController(w).Flush()
		select {
		case <-r.Context().Done():
		case <-time.After(20 * time.Second):
		}
	})
	in := startOwnerInstances(t, addr)
	post(t, in.a, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`).Body.Close()
	post(t, in.a, "s-stream", `{"jsonrpc":"2.0","method":"notifications/initialized"}`).Body.Close()
	up.next(t)
	up.next(t)
	in.waitForOwnerRecord(t, "s-stream")

	const forwarded = `caddy_mcp_serializer_forwards_total{result="forwarded"}`
	before := scrapeMetric(t, in.b, forwarded)
	ctx, leave := context.WithCancel(context.Background())
	resp := <-sendAsync(ctx, in.b, "s-stream", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"stream"}}`)
	if resp == nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the forwarded stream: %v", resp)
	}
	if _, err := resp.Body.Read(make([]byte, 16)); err != nil {
		t.Fatalf("the stream's first event: %v", err)
	}
	leave()
	resp.Body.Close()
	wait.Until(t, "the forward counted", func() bool { return scrapeMetric(t, in.b, forwarded)-before == 1 })
}

// Every client learns instance IDs from its session ids. A client that
// sends a session's request straight to another instance with
// Mcp-Serializer-Owner naming that instance must not get it served
// there, beside the session's owner.
func TestAClientsOwnerHeaderNamingAnotherInstanceDoesNotServeTheSessionThere(t *testing.T) {
	var minted, running, peak atomic.Int64
	release := make(chan struct{})
	echo := echoingAnswer(func() string { return fmt.Sprintf("up-%d", minted.Add(1)) })
	_, addr := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if r.Header.Get("Mcp-Session-Id") == "up-1" && strings.Contains(string(body), "tools/call") {
			n := running.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			select {
			case <-release:
			case <-time.After(3 * time.Second):
			}
			defer running.Add(-1)
		}
		echo(w, r, body)
	})
	in := startOwnerInstances(t, addr)
	ctx := context.Background()
	cid := call(ctx, http.DefaultClient, http.MethodPost, in.a, "", initializeBody).header.Get("Mcp-Session-Id")
	call(ctx, http.DefaultClient, http.MethodPost, in.a, cid, initializedBody)
	in.waitForOwnerRecord(t, "up-1")
	idb, _, ok := owner.SplitOwner(call(ctx, http.DefaultClient, http.MethodPost, in.b, "", initializeBody).header.Get("Mcp-Session-Id"))
	if !ok {
		t.Fatal("b's session id names no owner")
	}

	first := make(chan answer, 1)
	go func() {
		first <- call(ctx, http.DefaultClient, http.MethodPost, in.a, cid, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"slow"}}`)
	}()
	for running.Load() == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	req, _ := http.NewRequest(http.MethodPost, in.b, strings.NewReader(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"slow"}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", cid)
	req.Header.Set("Mcp-Serializer-Owner", idb)
	second := make(chan *http.Response, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		second <- resp
	}()
	wait.Until(t, "the request sent to b answered, or running beside the owner's", func() bool {
		return len(second) == 1 || running.Load() >= 2
	})
	close(release)
	<-first
	if resp := <-second; resp != nil {
		t.Logf("the request with the owner header: %s", resp.Status)
	}
	if p := peak.Load(); p > 1 {
		t.Fatalf("%d of the session's calls ran upstream at once: the one sent to b with its ID as owner ran beside the owner's", p)
	}
}

// A session's record names an owner at an address now held by another
// program (the owner's pod is gone and its IP given to another service),
// an owner this instance never saw hold a lease. Nothing is sent there:
// the session is taken over once the owner has been absent for the lock
// delay, and whatever listens at the address gets neither the request
// nor the client's credentials.
func TestAnAnswerFromAnotherProgramAtARecordedOwnersAddressIsNotPassedOn(t *testing.T) {
	_, addr := newUpstream(t, nil)
	in := startOwnerInstances(t, addr)
	var sawAuth atomic.Value
	stranger := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sawAuth.Store(r.Header.Get("Authorization"))
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{"from":"stranger"}}`)
	}))
	defer stranger.Close()
	ctx := context.Background()
	key := "mcp_serializer:" + serializer.StoreKey("moved")
	gone := owner.Owner{ID: "0123456789abcdef", Addr: strings.TrimPrefix(stranger.URL, "http://")}
	if err := in.redis.HSet(ctx, key, "open", "1", "deadline", "0", "inflight", "0", "owner", gone.String()).Err(); err != nil {
		t.Fatal(err)
	}
	in.redis.Expire(ctx, key, time.Hour)
	req, _ := http.NewRequest(http.MethodPost, in.b, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", "moved")
	req.Header.Set("Authorization", "Bearer secret-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.Contains(string(body), "stranger") {
		t.Fatalf("the client got the other program's answer as its session's: %s %s", resp.Status, body)
	}
	if v, _ := sawAuth.Load().(string); v != "" {
		t.Fatalf("the other program got the client's Authorization %q", v)
	}
}

// A reload that drops an instance's site stops that instance as SIGTERM
// does: once Caddy has finished its requests, it hands its sessions over
// (their records name no owner) and ends its lease, so that another
// instance takes the session over at its next request without waiting
// for the lease to lapse.
func TestAnInstanceDroppedByAReloadHandsItsSessionsOver(t *testing.T) {
	var minted atomic.Int64
	_, addr := newUpstream(t, echoingAnswer(func() string { return fmt.Sprintf("up-%d", minted.Add(1)) }))
	in := startOwnerInstances(t, addr)
	ctx := context.Background()
	cid := call(ctx, http.DefaultClient, http.MethodPost, in.a, "", initializeBody).header.Get("Mcp-Session-Id")
	named, upstreamID, ok := owner.SplitOwner(cid)
	if !ok {
		t.Fatalf("a's session id %q names no owner", cid)
	}
	call(ctx, http.DefaultClient, http.MethodPost, in.a, cid, initializedBody)
	in.waitForOwnerRecord(t, upstreamID)

	// Site a is gone from the new config; b and the front stay.
	loadThroughAdmin(t, in.admin, withoutSite(in.caddyfile(""), in.a))

	if o := in.recordField(upstreamID, "owner"); o != "" {
		t.Fatalf("after a's site was dropped its session's record names %q, want no owner (handed over)", o)
	}
	lease, _ := in.redis.HGet(ctx, "mcp_serializer:members", named).Result()
	if exp, _, _ := strings.Cut(lease, " "); exp == "" {
		t.Fatalf("a's lease %q", lease)
	} else if ms, _ := strconv.ParseInt(exp, 10, 64); time.UnixMilli(ms).After(time.Now().Add(-owner.LeaseLife)) {
		t.Fatalf("a's lease %q still stands, or lapsed less than the lock delay ago", lease)
	}
	if a := call(ctx, http.DefaultClient, http.MethodPost, in.b, cid, rpcRequest("2", "tools/list")); a.status != http.StatusOK {
		t.Fatalf("the session's request at b: %d %s", a.status, a.body)
	}
	if n := scrapeMetric(t, in.b, "caddy_mcp_serializer_takeovers_total"); n != 1 {
		t.Fatalf("b took %v sessions over, want 1", n)
	}
}

// Behind a listener wrapper such as proxy_protocol, a connection's local
// address comes from the PROXY header, which a client admitted by allow
// writes: the address an instance records and advertises is its socket's,
// never the one a client claimed.
func TestBehindAListenerWrapperTheAddressRecordedIsTheSockets(t *testing.T) {
	redisAddr := redistest.Start(t)
	_, addr := newUpstream(t, mcpAnswer("behind-proxy-protocol", nil))
	c := &testCaddy{port: testnet.FreePort(t), adminPort: testnet.FreePort(t)}
	c.url = fmt.Sprintf("http://127.0.0.1:%d", c.port)
	file := strings.Replace(c.caddyfile("mcp_serializer {\n\tstate redis "+redisAddr+"\n}\nreverse_proxy "+addr),
		"persist_config off\n", "persist_config off\n\tservers {\n\t\tlistener_wrappers {\n\t\t\tproxy_protocol {\n\t\t\t\tallow 127.0.0.1/32\n\t\t\t}\n\t\t}\n\t}\n", 1)
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(file), nil)
	if err != nil {
		t.Fatal(err)
	}
	loadCaddy(t, cfg)

	conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", c.port))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The client claims the instance was reached at 10.9.9.9:6666.
	fmt.Fprintf(conn, "PROXY TCP4 203.0.113.7 10.9.9.9 5555 6666\r\n")
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		c.port, len(initializeBody), initializeBody)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if _, upstreamID, ok := owner.SplitOwner(resp.Header.Get("Mcp-Session-Id")); !ok || upstreamID != "behind-proxy-protocol" {
		t.Fatalf("initialize through the PROXY header: %s, id %q", resp.Status, resp.Header.Get("Mcp-Session-Id"))
	}
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	wait.Until(t, "the session's record names its owner", func() bool {
		o, _ := rdb.HGet(context.Background(), "mcp_serializer:"+serializer.StoreKey("behind-proxy-protocol"), "owner").Result()
		return o != ""
	})
	want := fmt.Sprintf("127.0.0.1:%d", c.port)
	if o, _ := rdb.HGet(context.Background(), "mcp_serializer:"+serializer.StoreKey("behind-proxy-protocol"), "owner").Result(); !strings.HasSuffix(o, " "+want) {
		t.Fatalf("the record names owner %q, want this instance at its socket's address %s", o, want)
	}
	wait.Until(t, "the instance's lease written", func() bool {
		n, _ := rdb.HLen(context.Background(), "mcp_serializer:members").Result()
		return n == 1
	})
	for _, lease := range rdb.HGetAll(context.Background(), "mcp_serializer:members").Val() {
		if !strings.HasSuffix(lease, " "+want) {
			t.Fatalf("the lease %q advertises another address than the socket's, %s", lease, want)
		}
	}
}

// A reload that keeps site a but turns its order from owner to local
// (same name, same Redis) keeps a's table: a hands its sessions over and
// ends its lease as if it stopped, so that b serves a's session rather
// than forward it to an instance that no longer answers as its owner.
func TestAReloadThatTurnsOrderOwnerOffHandsTheSessionsOver(t *testing.T) {
	var minted, hits atomic.Int64
	_, addr := newUpstream(t, func() func(http.ResponseWriter, *http.Request, []byte) {
		echo := echoingAnswer(func() string { return fmt.Sprintf("up-%d", minted.Add(1)) })
		return func(w http.ResponseWriter, r *http.Request, b []byte) { hits.Add(1); echo(w, r, b) }
	}())
	in := startOwnerInstances(t, addr)
	ctx := context.Background()
	cid := call(ctx, http.DefaultClient, http.MethodPost, in.a, "", initializeBody).header.Get("Mcp-Session-Id")
	if _, _, ok := owner.SplitOwner(cid); !ok {
		t.Fatalf("a's session id %q names no owner", cid)
	}
	call(ctx, http.DefaultClient, http.MethodPost, in.a, cid, initializedBody)

	loadThroughAdmin(t, in.admin, siteWith(in.caddyfile(""), in.a, orderLocal))

	before := hits.Load()
	a := call(ctx, http.DefaultClient, http.MethodPost, in.b, cid, rpcRequest("2", "tools/list"))
	if a.status != http.StatusOK {
		t.Fatalf("after a's order owner was turned off, the session's request at b: %d (upstream ran it %d times) %s",
			a.status, hits.Load()-before, a.body)
	}
}

// hopRelay passes TCP connections on to target until cut, which refuses
// and breaks them from then on: a partition of the hop to one instance,
// while the front and Redis still reach it. After hold, it accepts
// connections and passes nothing on: a black hole past the handshake.
// After breakNext, it breaks the next connection its own way.
type hopRelay struct {
	ln      net.Listener
	mu      sync.Mutex
	conns   []net.Conn
	holding bool
	held    int
	breaker func(net.Conn)
	broke   chan struct{} // a breaker is done with its connection
	// sent holds what each connection it passed on sent the owner, in
	// the order it accepted them.
	sent []*bytes.Buffer
}

func startHopRelay(t *testing.T, target string) *hopRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &hopRelay{ln: ln, broke: make(chan struct{}, 16)}
	t.Cleanup(h.cut)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.mu.Lock()
			if brk := h.breaker; brk != nil {
				h.breaker = nil
				h.conns = append(h.conns, c)
				h.mu.Unlock()
				go func() {
					brk(c)
					h.broke <- struct{}{}
				}()
				continue
			}
			if h.holding {
				h.conns = append(h.conns, c)
				h.held++
				h.mu.Unlock()
				continue
			}
			h.mu.Unlock()
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			h.mu.Lock()
			h.conns = append(h.conns, c, up)
			h.mu.Unlock()
			var sent bytes.Buffer
			h.mu.Lock()
			h.sent = append(h.sent, &sent)
			h.mu.Unlock()
			go func() { io.Copy(up, io.TeeReader(c, lockedWriter{&h.mu, &sent})); up.Close() }()
			go func() { io.Copy(c, up); c.Close() }()
		}
	}()
	return h
}

// passed is how many connections the relay has passed on.
func (h *hopRelay) passed() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return (len(h.conns) - h.held) / 2
}

// hold accepts every later connection and never answers it, nor passes
// it on.
func (h *hopRelay) hold() {
	h.mu.Lock()
	h.holding = true
	h.mu.Unlock()
}

// firstCarrying is the index, in accept order, of the first connection
// the relay passed on that sent the owner what; -1 for none.
func (h *hopRelay) firstCarrying(what string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, b := range h.sent {
		if strings.Contains(b.String(), what) {
			return i
		}
	}
	return -1
}

// lockedWriter writes to w under mu.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// breakNext hands the next connection the relay accepts to brk instead
// of passing it on; later ones pass again.
func (h *hopRelay) breakNext(brk func(net.Conn)) {
	h.mu.Lock()
	h.breaker = brk
	h.mu.Unlock()
}

// resetOnRequest reads a request's head and resets the connection
// without reading its body or answering: a stopping owner's kernel does
// so to a connection still queued when its listener closes.
func resetOnRequest(c net.Conn) {
	http.ReadRequest(bufio.NewReader(c))
	resetConn(c)
}

// resetOnBody is resetOnRequest for an owner that asked for the body
// (100 Continue) and read it all before it failed: bodies counts them.
func resetOnBody(bodies *atomic.Int32) func(net.Conn) {
	return func(c net.Conn) {
		req, err := http.ReadRequest(bufio.NewReader(c))
		if err == nil {
			if strings.EqualFold(req.Header.Get("Expect"), "100-continue") {
				io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\n")
			}
			if b, err := io.ReadAll(req.Body); err == nil && len(b) > 0 {
				bodies.Add(1)
			}
		}
		resetConn(c)
	}
}

// resetConn closes c with a TCP reset.
func resetConn(c net.Conn) {
	if tcp, ok := c.(*net.TCPConn); ok {
		tcp.SetLinger(0)
	}
	c.Close()
}

// heldConns is how many connections hold has accepted.
func (h *hopRelay) heldConns() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.held
}

func (h *hopRelay) cut() {
	h.ln.Close()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.conns {
		c.Close()
	}
}

// startOwnerBehindRelay starts two owner instances (settings for both),
// a advertising a relay the test can cut, and a session created on a
// whose request through b has reached a over the relay once.
func startOwnerBehindRelay(t *testing.T, settings ...string) (*upstream, *ownerInstances, *hopRelay, string) {
	t.Helper()
	var minted atomic.Int64
	up, addr := newUpstream(t, echoingAnswer(func() string { return fmt.Sprintf("up-%d", minted.Add(1)) }))
	in := startOwnerInstances(t, addr, settings...)
	relay := startHopRelay(t, strings.TrimPrefix(in.a, "http://"))
	full := in.caddyfile("")
	start := strings.Index(full, in.a+" {")
	site := strings.Replace(full[start:], "\t\torder owner\n", "\t\torder owner\n\t\tadvertise "+relay.ln.Addr().String()+"\n", 1)
	loadThroughAdmin(t, in.admin, full[:start]+site)

	ctx := context.Background()
	cid := call(ctx, http.DefaultClient, http.MethodPost, in.a, "", initializeBody).header.Get("Mcp-Session-Id")
	call(ctx, http.DefaultClient, http.MethodPost, in.a, cid, initializedBody)
	// b learns a's advertised address with a's next lease renewal; until
	// then it reaches a directly.
	wait.Until(t, "b reaching a over the relay", func() bool {
		if a := call(ctx, http.DefaultClient, http.MethodPost, in.b, cid, rpcRequest("2", "tools/list")); a.status != http.StatusOK {
			t.Fatalf("through the hop before it was cut: %d %s", a.status, a.body)
		}
		return relay.passed() > 0
	})
	return up, in, relay, cid
}

// A partition between instances (the hop to the owner cut, while the
// front and Redis still reach it) costs requests on the far side a 503
// after queue_timeout: the owner's lease stands, so its session is never
// taken over and never served beside it; on the owner's side it goes on.
func TestAPartitionBetweenInstancesCosts503sNeverTwoServers(t *testing.T) {
	up, in, relay, cid := startOwnerBehindRelay(t, "queue_timeout 2s")
	ctx := context.Background()
	relay.cut()
	before := len(up.requests())
	a := call(ctx, http.DefaultClient, http.MethodPost, in.b, cid, rpcRequest("3", "tools/call"))
	if a.status != http.StatusServiceUnavailable || !strings.Contains(string(a.body), "could not be reached") {
		t.Fatalf("across the partition: %d %s; want 503, owner unreachable", a.status, a.body)
	}
	if n := len(up.requests()) - before; n != 0 {
		t.Fatalf("the upstream got %d requests from across the partition, want none", n)
	}
	if n := scrapeMetric(t, in.b, "caddy_mcp_serializer_takeovers_total"); n != 0 {
		t.Fatalf("b took over %v sessions across the partition, want none", n)
	}
	if a := call(ctx, http.DefaultClient, http.MethodPost, in.a, cid, rpcRequest("4", "tools/list")); a.status != http.StatusOK {
		t.Fatalf("on the owner's side of the partition: %d %s", a.status, a.body)
	}
}

// A hop to the owner that accepts connections and then answers nothing
// (a middlebox that accepts for it, or a network that drops packets once
// the handshake is done) holds a request without a body (a DELETE)
// forwarded there past queue_timeout: it may have reached the owner, and
// the owner's lease stands, so it is neither answered 503 nor served
// elsewhere. Only its client's leaving ends it. (A request with a body
// is answered 503 at queue_timeout, its body never sent:
// TestAForwardTheOwnerNeverAsksForEndsAtQueueTimeoutWithItsBodyUnsent. A
// hop that drops the handshake too fails the dial after
// forwardDialTimeout, as a refused one fails it at once:
// TestAPartitionBetweenInstancesCosts503sNeverTwoServers.)
func TestABlackHoledHopToALiveOwnerHoldsABodilessRequestUntilItsClientLeaves(t *testing.T) {
	const queueTimeout = 2 * time.Second
	up, in, relay, cid := startOwnerBehindRelay(t, "queue_timeout "+queueTimeout.String())
	ctx := context.Background()
	relay.hold()
	before := len(up.requests())
	const waited = queueTimeout + 3*time.Second
	clientCtx, leave := context.WithTimeout(ctx, waited)
	defer leave()
	began := time.Now()
	a := call(clientCtx, http.DefaultClient, http.MethodDelete, in.b, cid, "")
	if a.err == nil {
		t.Fatalf("a DELETE across the black hole: answered %d after %v: %s; want no answer while the client waits (%v, past queue_timeout %v)",
			a.status, time.Since(began).Round(time.Millisecond), a.body, waited, queueTimeout)
	}
	if relay.heldConns() != 1 {
		t.Fatalf("the relay held %d connections, want the one forward", relay.heldConns())
	}
	if n := len(up.requests()) - before; n != 0 {
		t.Fatalf("the upstream got %d requests while the hop was silent, want none", n)
	}
	if n := scrapeMetric(t, in.b, "caddy_mcp_serializer_takeovers_total"); n != 0 {
		t.Fatalf("b took over %v sessions across the black hole, want none", n)
	}
	if a := call(ctx, http.DefaultClient, http.MethodPost, in.a, cid, rpcRequest("4", "tools/list")); a.status != http.StatusOK {
		t.Fatalf("on the owner's side of the black hole: %d %s", a.status, a.body)
	}
}

// A request too large to keep whose body went to the instance its id
// names, which refused it (421: it does not serve the session), is
// answered 503 with Retry-After and sent nowhere else: its body is gone,
// and serving it here or forwarding it again would send none of it.
func TestALargeRequestRefusedByTheOwnerItNamesIsAnswered503NotServedWithoutItsBody(t *testing.T) {
	var minted atomic.Int64
	up, addr := newUpstream(t, echoingAnswer(func() string { return fmt.Sprintf("up-%d", minted.Add(1)) }))
	in := startOwnerInstances(t, addr, "max_body 1KiB")
	ctx := context.Background()
	made := call(ctx, http.DefaultClient, http.MethodPost, in.a, "", initializeBody).header.Get("Mcp-Session-Id")
	instanceA, _, ok := owner.SplitOwner(made)
	if !ok {
		t.Fatalf("a's session id %q names no instance", made)
	}
	// b forwards an id naming a once its listing shows a's lease; until
	// then such an id is an unknown session, served where it lands.
	const refused = `caddy_mcp_serializer_forwards_total{result="not_owner"}`
	wait.Until(t, "b forwards to a", func() bool {
		probe, _ := owner.WithOwner(instanceA, "probe")
		before := scrapeMetric(t, in.b, refused)
		call(ctx, http.DefaultClient, http.MethodPost, in.b, probe, rpcRequest("2", "tools/list"))
		return scrapeMetric(t, in.b, refused) > before
	})
	// An id naming a, for a session a never served.
	unknown, _ := owner.WithOwner(instanceA, "never-served-by-a")
	before := len(up.requests())
	large := `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"pad":"` + strings.Repeat("x", 8<<10) + `"}}`
	a := call(ctx, http.DefaultClient, http.MethodPost, in.b, unknown, large)
	if a.status != http.StatusServiceUnavailable || a.header.Get("Retry-After") == "" || !strings.Contains(string(a.body), "moved") {
		t.Fatalf("a large request refused by the instance its id names: %d %v %s; want 503 with Retry-After, owner moved", a.status, a.header, a.body)
	}
	if n := len(up.requests()) - before; n != 0 {
		t.Fatalf("the upstream got %d requests, want none: the body went to the instance that refused it", n)
	}
}

// A forward whose connection broke before the owner asked for its body
// (100 Continue) never reached the owner's upstream: a stopping owner's
// kernel resets connections still queued when its listener closes. It is
// sent again while the owner's lease stands, and answered by the owner,
// not with a 502.
func TestAForwardBrokenBeforeTheOwnerAskedForItsBodyIsSentAgain(t *testing.T) {
	up, in, relay, cid := startOwnerBehindRelay(t)
	ctx := context.Background()
	relay.breakNext(resetOnRequest)
	before := len(up.requests())
	a := call(ctx, http.DefaultClient, http.MethodPost, in.b, cid, rpcRequest("3", "tools/call"))
	select {
	case <-relay.broke:
	default:
		t.Fatal("the relay broke no forward")
	}
	expectResult(t, a, "3")
	if n := len(up.requests()) - before; n != 1 {
		t.Fatalf("the upstream ran the request %d times, want once", n)
	}
	if n := scrapeMetric(t, in.b, "caddy_mcp_serializer_takeovers_total"); n != 0 {
		t.Fatalf("b took over %v sessions, want none: the owner's lease stands", n)
	}
}

// A forward whose connection broke after the owner took its body may
// have reached the owner's upstream: it is answered 502 and never sent
// again, to the owner or anywhere else.
func TestAForwardBrokenAfterTheOwnerTookItsBodyIsAnswered502AndNotSentAgain(t *testing.T) {
	up, in, relay, cid := startOwnerBehindRelay(t)
	ctx := context.Background()
	var bodies atomic.Int32
	relay.breakNext(resetOnBody(&bodies))
	before := len(up.requests())
	a := call(ctx, http.DefaultClient, http.MethodPost, in.b, cid, rpcRequest("3", "tools/call"))
	<-relay.broke
	if a.status != http.StatusBadGateway || !strings.Contains(string(a.body), "may have reached") {
		t.Fatalf("a forward broken after the owner took its body: %d %s; want 502, it may have reached the MCP server", a.status, a.body)
	}
	if bodies.Load() != 1 {
		t.Fatalf("the owner's side got %d bodies, want the one", bodies.Load())
	}
	if n := len(up.requests()) - before; n != 0 {
		t.Fatalf("the upstream ran the request %d times, want none: it was never sent again", n)
	}
}

// A client that asks for 100 Continue gets it from the instance it
// reached; the owner's own 100 Continue to the forward is not an answer,
// and the request is served there, without the hop's Expect.
func TestARequestExpecting100ContinueIsServedByItsOwner(t *testing.T) {
	up, in, _, cid := startOwnerBehindRelay(t)
	body := rpcRequest("3", "tools/call")
	req, _ := http.NewRequest(http.MethodPost, in.b, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", cid)
	req.Header.Set("Expect", "100-continue")
	client := &http.Client{Transport: &http.Transport{ExpectContinueTimeout: time.Minute}}
	before := len(up.requests())
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	expectResult(t, answer{status: resp.StatusCode, header: resp.Header, body: got}, "3")
	seen := up.requests()[before:]
	if len(seen) != 1 {
		t.Fatalf("the upstream ran the request %d times, want once", len(seen))
	}
	if e := seen[0].Header.Get("Expect"); e != "" {
		t.Fatalf("the upstream got Expect %q, the hop's own", e)
	}
}

// An owner asks for a forwarded request's body (100 Continue) as it reads
// it, before anything of the request goes upstream: a forward broken
// before the ask is sent again (above), so nothing may have left by then.
func TestAnOwnerAsksForAForwardsBodyBeforeAnythingOfItGoesUpstream(t *testing.T) {
	up, in, _, cid := startOwnerBehindRelay(t)
	named, _, ok := owner.SplitOwner(cid)
	if !ok {
		t.Fatalf("the session id %q names no owner", cid)
	}
	before := len(up.requests())
	host := strings.TrimPrefix(in.a, "http://")
	c, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	body := rpcRequest("3", "tools/call")
	fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"+
		"Mcp-Session-Id: %s\r\nMcp-Serializer-Owner: %s\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", host, cid, named, len(body))
	status, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || !strings.HasPrefix(status, "HTTP/1.1 100 ") {
		t.Fatalf("the owner's first answer to a forward expecting 100-continue: %q %v", status, err)
	}
	resetConn(c)
	// The session's next request runs after whatever the broken one did.
	expectResult(t, call(context.Background(), http.DefaultClient, http.MethodPost, in.a, cid, rpcRequest("4", "tools/list")), "4")
	if seen := up.requests()[before:]; len(seen) != 1 || !strings.Contains(string(seen[0].Body), `"id":4`) {
		t.Fatalf("the upstream got %d requests after the forward broke at the owner's ask, want only the next one", len(seen))
	}
}

// A body over max_body, streamed rather than held, is still unread on
// its client's connection when a forward breaks before the owner asked
// for it: it is sent again too.
func TestALargeForwardBrokenBeforeTheOwnerAskedForItsBodyIsSentAgain(t *testing.T) {
	up, in, relay, cid := startOwnerBehindRelay(t, "max_body 1KiB")
	relay.breakNext(resetOnRequest)
	before := len(up.requests())
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"pad":%q}}`, strings.Repeat("x", 3000))
	a := call(context.Background(), http.DefaultClient, http.MethodPost, in.b, cid, body)
	<-relay.broke
	expectResult(t, a, "3")
	seen := up.requests()[before:]
	if len(seen) != 1 || string(seen[0].Body) != body {
		t.Fatalf("the upstream got %d requests, want the one with its whole body", len(seen))
	}
}

// A forward sends no body until the owner asks for it, however long it
// waits: an owner frozen with the forward queued at its listener (which
// its kernel accepted) must not find the body there on waking, after the
// request was given up or sent elsewhere. Here the client gives up first.
func TestAForwardSendsNoBodyBeforeTheOwnerAsksHoweverLongItWaits(t *testing.T) {
	_, in, relay, cid := startOwnerBehindRelay(t)
	var bodyBytes atomic.Int64
	relay.breakNext(func(c net.Conn) {
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err == nil {
			n, _ := io.Copy(io.Discard, br) // until the forward is given up
			bodyBytes.Store(n)
		}
		c.Close()
	})
	// Longer than a fixed wait for the owner's ask would be, within
	// queue_timeout.
	ctx, leave := context.WithTimeout(context.Background(), 8*time.Second)
	defer leave()
	if a := call(ctx, http.DefaultClient, http.MethodPost, in.b, cid, rpcRequest("3", "tools/call")); a.err == nil {
		t.Fatalf("answered %d %s while the owner never asked for the body", a.status, a.body)
	}
	<-relay.broke
	if n := bodyBytes.Load(); n != 0 {
		t.Fatalf("the forward sent %d bytes of body the owner never asked for", n)
	}
}

// A forward sent again keeps its place: the session's next request,
// arriving at the same instance after it, goes out only once the owner
// has the first (asked for its body). Judged by the order in which the
// owner's side accepted their connections, which that makes causal; the
// owner queues each as it has read its body.
func TestAForwardSentAgainKeepsItsPlaceBeforeTheSessionsNextRequest(t *testing.T) {
	_, in, relay, cid := startOwnerBehindRelay(t)
	ctx := context.Background()
	relay.breakNext(resetOnRequest)
	first := callAsync(ctx, http.MethodPost, in.b, cid, rpcRequest("3", "tools/call"))
	<-relay.broke
	expectResult(t, call(ctx, http.DefaultClient, http.MethodPost, in.b, cid, rpcRequest("4", "tools/call")), "4")
	expectResult(t, await(t, first, 10*time.Second, "the first request"), "3")
	three, four := relay.firstCarrying(`"id":3`), relay.firstCarrying(`"id":4`)
	if three < 0 || four < 0 || three > four {
		t.Fatalf("the owner's side accepted the connection of request 3 as #%d and of 4 as #%d; want 3's first, in arrival order", three, four)
	}
}

// A forward still on its way to an instance whose reload turned order
// owner off (and handed its sessions over) is answered 421, stamped, not
// served there: served, it would run beside the session's next owner.
func TestAForwardReachingAnInstanceThatTurnedOrderOwnerOffIsAnswered421(t *testing.T) {
	up, addr := newUpstream(t, echoingAnswer(func() string { return "up-1" }))
	in := startOwnerInstances(t, addr)
	ctx := context.Background()
	cid := call(ctx, http.DefaultClient, http.MethodPost, in.a, "", initializeBody).header.Get("Mcp-Session-Id")
	named, _, ok := owner.SplitOwner(cid)
	if !ok {
		t.Fatalf("a's session id %q names no owner", cid)
	}
	call(ctx, http.DefaultClient, http.MethodPost, in.a, cid, initializedBody)
	loadThroughAdmin(t, in.admin, siteWith(in.caddyfile(""), in.a, orderLocal))

	before := len(up.requests())
	req, _ := http.NewRequest(http.MethodPost, in.a, strings.NewReader(rpcRequest("2", "tools/list")))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", cid)
	req.Header.Set("Mcp-Serializer-Owner", named) // as b forwards it
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusMisdirectedRequest || resp.Header.Get("Mcp-Serializer-Served-By") != named || resp.Header.Get("Mcp-Serializer-Not-Owner") == "" {
		t.Fatalf("a forward at a after it turned order owner off: %d %v %s; want 421 stamped with a's ID", resp.StatusCode, resp.Header, body)
	}
	if n := len(up.requests()) - before; n != 0 {
		t.Fatalf("the upstream ran the forward %d times at a, want none", n)
	}
}

// A forward whose owner never asks for the body (frozen, its kernel
// holding the connection) is cut at the request's queue_timeout and
// answered 503, its body never sent: every wait has its bound.
func TestAForwardTheOwnerNeverAsksForEndsAtQueueTimeoutWithItsBodyUnsent(t *testing.T) {
	_, in, relay, cid := startOwnerBehindRelay(t, "queue_timeout 2s")
	var bodyBytes atomic.Int64
	relay.breakNext(func(c net.Conn) {
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err == nil {
			n, _ := io.Copy(io.Discard, br) // until the forward is cut
			bodyBytes.Store(n)
		}
		c.Close()
	})
	// Later forwards find the owner frozen too.
	relay.hold()
	ctx, leave := context.WithTimeout(context.Background(), time.Minute)
	defer leave()
	a := call(ctx, http.DefaultClient, http.MethodPost, in.b, cid, rpcRequest("3", "tools/call"))
	if a.status != http.StatusServiceUnavailable || a.header.Get("Retry-After") == "" {
		t.Fatalf("a forward the owner never asked for: %d %s %v; want 503 with Retry-After at queue_timeout", a.status, a.body, a.err)
	}
	<-relay.broke
	if n := bodyBytes.Load(); n != 0 {
		t.Fatalf("the forward sent %d bytes of body the owner never asked for", n)
	}
}
