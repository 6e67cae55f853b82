package caddymodule_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/mcpserializer/caddy-mcp-serializer/caddymodule"
	"github.com/mcpserializer/caddy-mcp-serializer/integration/mcpstub"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/redistest"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/testclock"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/testnet"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/wait"
	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// `caddy reload` (through the admin API) under steady pipelined load
// loses no request and forwards none twice: every request id the clients
// sent reaches the upstream exactly once and every client gets its own
// answer. Sessions keep their FIFO (never two exchanges of a session at
// once at the upstream) and their gate (no connect is rejected as not
// initialized; a session held across every reload is released by its
// initialized). No goroutine is left behind.
func TestReloadUnderPipelinedLoadLosesNothing(t *testing.T) {
	backend := &mcpstub.Backend{WorkMin: 200 * time.Microsecond, WorkMax: 2 * time.Millisecond}
	upstreamSrv := httptest.NewServer(backend)
	defer upstreamSrv.Close()
	site := func(queueTimeout int) string {
		// Without upstream keep-alive: an old config's proxy keeps the
		// connections that were busy at its cleanup idle for two minutes,
		// which would hide a leak of ours in the goroutine count.
		return fmt.Sprintf("mcp_serializer {\n\tqueue_timeout %ds\n}\nreverse_proxy %s {\n\tflush_interval -1\n\ttransport http {\n\t\tkeepalive off\n\t}\n}",
			queueTimeout, strings.TrimPrefix(upstreamSrv.URL, "http://"))
	}
	// The table's timers run on a clock that stays put: the gated session
	// is released by its initialized, never by init_timeout (10 s) or
	// queue_timeout passing on a slow run.
	caddymodule.UseTableClock(t, testclock.New())
	c := startCaddy(t, site(10))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := mcpstub.NewClient(16)
	client.Transport = replayable{client.Transport}
	driver := mcpstub.Driver{Client: client, URL: c.url, Delete: true}

	// Warm up, and count goroutines with one reload behind us: what a
	// process starts once is not a leak.
	if r := driver.Connect(ctx); r.Failed() {
		t.Fatalf("warm-up connect: %v", r.Err())
	}
	c.reload(t, site(11))
	client.CloseIdleConnections()
	baseline := settledGoroutines(0, time.Second)

	// A session still initializing, with a request held at its gate.
	init := call(ctx, client, http.MethodPost, c.url, "", initializeBody)
	gated := init.header.Get("Mcp-Session-Id")
	if init.status != http.StatusOK || gated == "" {
		t.Fatalf("initialize: %d %s", init.status, init.body)
	}
	held := make(chan answer, 1)
	go func() { held <- call(ctx, client, http.MethodPost, c.url, gated, rpcRequest(`"held"`, "tools/list")) }()

	// Steady sessions: initialized, then three concurrent senders each.
	const steadySessions, senders = 3, 3
	steady := make([]string, steadySessions)
	for i := range steady {
		a := call(ctx, client, http.MethodPost, c.url, "", initializeBody)
		steady[i] = a.header.Get("Mcp-Session-Id")
		if a := call(ctx, client, http.MethodPost, c.url, steady[i], initializedBody); a.status != http.StatusAccepted {
			t.Fatalf("initialized: %d %s", a.status, a.body)
		}
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var sum mcpstub.Summary
	var inFlight, completed atomic.Int64 // pipelined connects
	sent := map[string][]string{}        // session -> ids sent by steady senders
	var failures []string
	for range 3 { // pipelined connects, back to back
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				inFlight.Add(1)
				r := driver.Connect(ctx)
				inFlight.Add(-1)
				mu.Lock()
				sum.Add(r)
				mu.Unlock()
				completed.Add(1)
			}
		})
	}
	for _, sid := range steady {
		for s := range senders {
			wg.Go(func() {
				for n := 0; ; n++ {
					select {
					case <-stop:
						return
					default:
					}
					id := fmt.Sprintf(`"%s-%d-%d"`, sid[:8], s, n)
					a := call(ctx, client, http.MethodPost, c.url, sid, rpcRequest(id, "tools/list"))
					mu.Lock()
					sent[sid] = append(sent[sid], id)
					if a.err != nil || a.status != http.StatusOK || string(parseRPC(a.body).ID) != id || strings.Contains(string(a.body), `"error"`) {
						failures = append(failures, fmt.Sprintf("%s: %d %v %.200s", id, a.status, a.err, a.body))
					}
					mu.Unlock()
				}
			})
		}
	}

	// A reload after every perReload connects completed, and perReload
	// more after the last: on a slow machine the run takes longer but
	// holds as many connects, before, between and after the reloads.
	// Each reload begins with connects in flight (counted here, checked
	// below): the loops run them back to back.
	const reloads, perReload = 6, 3
	var busyAtReload [reloads]int64
	awaitConnects := func(n int) {
		t.Helper()
		wait.Until(t, fmt.Sprintf("%d pipelined connects completed", n), func() bool { return completed.Load() >= int64(n) })
	}
	for i := range reloads {
		awaitConnects((i + 1) * perReload)
		busyAtReload[i] = inFlight.Load()
		c.reload(t, site(10+i%2))
	}
	awaitConnects((reloads + 1) * perReload)
	close(stop)
	wg.Wait()
	for i, n := range busyAtReload {
		if n == 0 {
			t.Errorf("reload %d began with no pipelined connect in flight (in flight at each: %v)", i+1, busyAtReload)
		}
	}

	// The held request is still held, and goes once initialized is in.
	select {
	case a := <-held:
		t.Fatalf("a request held at the gate was answered during the reloads: %d %s", a.status, a.body)
	default:
	}
	if a := call(ctx, client, http.MethodPost, c.url, gated, initializedBody); a.status != http.StatusAccepted {
		t.Fatalf("initialized: %d %s", a.status, a.body)
	}
	expectResult(t, await(t, held, 5*time.Second, "held request"), `"held"`)

	t.Logf("%d reloads under load: %d pipelined connects (%d failed; in flight at each reload: %v), %d steady requests (%d failed)",
		reloads, sum.Connects, sum.Failed, busyAtReload, countAll(sent), len(failures))
	if sum.Connects < (reloads+1)*perReload || sum.Failed != 0 {
		t.Errorf("pipelined connects across reloads: %s", sum)
	}
	if len(failures) > 0 {
		t.Errorf("%d steady requests failed, e.g. %s", len(failures), failures[0])
	}

	// At the upstream: every id exactly once, one exchange per session at
	// a time.
	arrived := map[string]map[string]int{} // session -> label -> count
	for _, r := range backend.Requests() {
		sid := r.SessionID
		if sid == "" {
			sid = r.NewSessionID
		}
		if arrived[sid] == nil {
			arrived[sid] = map[string]int{}
		}
		if r.HTTPMethod == http.MethodDelete {
			arrived[sid]["DELETE"]++
		}
		for _, m := range r.Messages {
			arrived[sid][m.Method+"#"+m.ID]++
		}
	}
	for sid, ids := range sent {
		for _, id := range ids {
			if n := arrived[sid]["tools/list#"+id]; n != 1 {
				t.Errorf("steady request %s reached the upstream %d times, want once", id, n)
			}
		}
		if n, want := len(arrived[sid]), len(ids)+2; n != want { // + initialize, initialized
			t.Errorf("session %s: %d distinct messages upstream, want %d", sid[:8], n, want)
		}
	}
	connects := 0
	for sid, got := range arrived {
		if got["DELETE"] == 0 {
			continue // not a driver connect
		}
		connects++
		want := map[string]int{"initialize#1": 1, "notifications/initialized#": 1,
			"logging/setLevel#2": 1, "tools/list#3": 1, "tools/list#4": 1, "DELETE": 1}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("connect %s: upstream got %v, want each message once: %v", sid[:8], got, want)
		}
	}
	if connects != sum.Connects+1 { // + the warm-up
		t.Errorf("upstream saw %d connects, the clients made %d", connects, sum.Connects+1)
	}
	for sid, st := range backend.AllStats() {
		if st.MaxInFlight > 1 {
			t.Errorf("session %s had %d exchanges at the upstream at once", sid[:8], st.MaxInFlight)
		}
	}

	client.CloseIdleConnections()
	n := settledGoroutines(baseline, 3*time.Second)
	t.Logf("goroutines: %d before the reloads, %d after", baseline, n)
	if n > baseline {
		buf := make([]byte, 1<<20)
		t.Errorf("goroutines: %d before the reloads, %d after\n%s", baseline, n, buf[:runtime.Stack(buf, true)])
	}
}

// replayable marks every request with an Idempotency-Key, so that Go's
// transport resends it when a reload closes the idle keep-alive connection
// it was sent on before the server read it (a race between any HTTP
// client and a server closing idle connections, module or not). Were the
// request read and resent, the upstream would count it twice.
type replayable struct{ http.RoundTripper }

func (r replayable) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set("Idempotency-Key", "1")
	resp, err := r.RoundTripper.RoundTrip(req)
	// Like do: resend once when a reload reset or closed a fresh connection
	// before any answer. Had it been forwarded, the upstream would count
	// the request twice.
	if err == nil || (req.Body != nil && req.GetBody == nil) || !(errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
		return resp, err
	}
	if req.GetBody != nil {
		if req.Body, err = req.GetBody(); err != nil {
			return nil, err
		}
	}
	return r.RoundTripper.RoundTrip(req)
}

func (r replayable) CloseIdleConnections() {
	r.RoundTripper.(interface{ CloseIdleConnections() }).CloseIdleConnections()
}

// settledGoroutines polls the goroutine count until it is at most want
// (or, with want 0, stops changing), for at most d, and returns it.
func settledGoroutines(want int, d time.Duration) int {
	deadline := time.Now().Add(d)
	last := -1
	for {
		n := runtime.NumGoroutine()
		if (want > 0 && n <= want) || (want == 0 && n == last) || time.Now().After(deadline) {
			return n
		}
		last = n
		time.Sleep(50 * time.Millisecond)
	}
}

func countAll(m map[string][]string) int {
	n := 0
	for _, v := range m {
		n += len(v)
	}
	return n
}

// A session created before a reload and left without initialized gets its
// synthesized notifications/initialized after the reload through the
// route of the config in force then, not the route that served
// initialize, which the reload has cleaned up: here the reload moves the
// site to another upstream, and the notification and the held request
// both go there. The table's clock is moved by hand, so the init_timeout
// passes once the reload is done and the request is held, however long
// the reload takes.
func TestSynthesizeAfterReloadGoesThroughTheRunningConfig(t *testing.T) {
	const sid = "synth-reload"
	before, beforeAddr := newUpstream(t, mcpAnswer(sid, nil))
	after, afterAddr := newUpstream(t, mcpAnswer(sid, nil))
	clock := testclock.New()
	caddymodule.UseTableClock(t, clock)
	site := "mcp_serializer {\n\tinit_timeout %s\n\ton_init_timeout synthesize\n}\nreverse_proxy %s"
	c := startCaddy(t, fmt.Sprintf(site, "500ms", beforeAddr))
	initialize(t, c, sid)
	c.reload(t, fmt.Sprintf(site, "400ms", afterAddr))
	held := callAsync(context.Background(), http.MethodPost, c.url, sid, rpcRequest("2", "tools/list"))
	c.awaitWaiting(t, 1)
	clock.Advance(500 * time.Millisecond) // the init_timeout the session began with
	expectResult(t, await(t, held, 5*time.Second, "held request"), "2")
	if got, want := strings.Join(before.labels(), " "), "initialize#1"; got != want {
		t.Errorf("upstream of the config before the reload saw %q, want %q", got, want)
	}
	if got, want := strings.Join(after.labels(), " "), "notifications/initialized tools/list#2"; got != want {
		t.Fatalf("upstream of the running config saw %q, want %q", got, want)
	}
	if got := after.requests()[0].Header.Get("Mcp-Session-Id"); got != sid {
		t.Fatalf("synthesized initialized carried session %q, want %q", got, sid)
	}
}

// A reload that changes get_stream applies to GET streams opened after it;
// a stream already open is left alone and keeps delivering events.
func TestReloadChangingGetStreamAppliesToNewStreamsOnly(t *testing.T) {
	const sid = "get-reload"
	sendEvent := make(chan struct{})
	_, addr := newUpstream(t, mcpAnswer(sid, func(m rpcMsg, w http.ResponseWriter, r *http.Request) bool {
		if r.Method != http.MethodGet {
			return false
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, ": open\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-sendEvent:
			io.WriteString(w, "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\"}\n\n")
		case <-r.Context().Done():
		}
		return true
	}))
	site := "mcp_serializer {\n\tget_stream %s\n}\nreverse_proxy " + addr + " {\n\tflush_interval -1\n}"
	c := startCaddy(t, fmt.Sprintf(site, "forward"))
	initialize(t, c, sid)
	resp := post(t, c.url, sid, initializedBody)
	resp.Body.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	open := getStream(t, ctx, c.url, sid)
	defer open.Body.Close()
	lines := bufio.NewReader(open.Body)
	if first, err := lines.ReadString('\n'); open.StatusCode != http.StatusOK || err != nil || first != ": open\n" {
		t.Fatalf("GET with get_stream forward: %d %q %v", open.StatusCode, first, err)
	}

	c.reload(t, fmt.Sprintf(site, "reject"))
	// For a moment after the reload the old server may still accept a
	// connection and close it unread (EOF), as guarantees.md says; a client
	// sends such a request again.
	var rejected *http.Response
	for try := 0; rejected == nil; try++ {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.url, nil)
		req.Header.Set("Mcp-Session-Id", sid)
		req.Header.Set("Accept", "text/event-stream")
		r, err := http.DefaultClient.Do(req)
		switch {
		case err == nil:
			rejected = r
		case try == 2:
			t.Fatalf("GET after the reload, three times: %v", err)
		}
	}
	expectRPCError(t, rejected, http.StatusMethodNotAllowed, "null")

	close(sendEvent)
	for {
		line, err := lines.ReadString('\n')
		if err != nil {
			t.Fatalf("the stream opened before the reload ended before its event: %v", err)
		}
		if strings.Contains(line, "notifications/message") {
			break
		}
	}
}

// A config Caddy refuses changes nothing that runs: here two handlers
// sharing table "t" disagree, so the config is refused after one of them
// was provisioned, and the live handler's on_init_timeout reject still
// answers a held request itself instead of forwarding it.
func TestRefusedConfigLeavesTheLiveTableSettingsAlone(t *testing.T) {
	const sid = "refused-reload"
	up, addr := newUpstream(t, mcpAnswer(sid, nil))
	live := "mcp_serializer {\n\tname t\n\tinit_timeout 300ms\n\ton_init_timeout reject\n}\nreverse_proxy " + addr
	c := startCaddy(t, live)

	conflicting := fmt.Sprintf("{\n\tadmin 127.0.0.1:%d\n\tauto_https off\n\tpersist_config off\n}\n", c.adminPort)
	for port, action := range map[int]string{c.port: "forward", testnet.FreePort(t): "synthesize"} {
		conflicting += fmt.Sprintf("http://127.0.0.1:%d {\n\tmcp_serializer {\n\t\tname t\n\t\tinit_timeout 300ms\n\t\ton_init_timeout %s\n\t}\n\treverse_proxy %s\n}\n", port, action, addr)
	}
	req, _ := http.NewRequest(http.MethodPost, c.admin+"/load", strings.NewReader(conflicting))
	req.Header.Set("Content-Type", "text/caddyfile")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	refusal, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		t.Fatal("a config with two handlers of table t disagreeing on on_init_timeout loaded; want it refused")
	}
	t.Logf("refused: %s", refusal)
	http.DefaultClient.CloseIdleConnections()

	initialize(t, c, sid)
	held := callAsync(context.Background(), http.MethodPost, c.url, sid, rpcRequest("2", "tools/list"))
	a := await(t, held, 5*time.Second, "held request")
	if a.status != http.StatusBadRequest || !strings.Contains(string(a.body), "not initialized") {
		t.Fatalf("held request after the refused reload: %d %s; want 400 not initialized (on_init_timeout reject)", a.status, a.body)
	}
	if got, want := strings.Join(up.labels(), " "), "initialize#1"; got != want {
		t.Fatalf("upstream saw %q, want %q", got, want)
	}
}

// A reload that moves the state to another Redis hands the session table
// the new engine when the old config stops, not with the new config's
// first request: a gate that times out in between is checked in the new
// engine, never through the old config's closed client.
func TestReloadHandsBackgroundWorkTheNewEngineBeforeAnyRequest(t *testing.T) {
	const sid = "state-moved"
	first, second := redistest.Start(t), redistest.Start(t)
	_, addr := newUpstream(t, mcpAnswer(sid, nil))
	// order local: the leases of order owner are renewed on their own
	// clock, and one in flight on the old client as it closes fails.
	site := func(redis string) string {
		return "metrics /metrics\nmcp_serializer {\n\tinit_timeout 500ms\n\torder local\n\tstate redis " + redis + "\n}\nreverse_proxy " + addr
	}
	// The table's clock is moved by hand: init_timeout passes once the
	// reload is done, however long it takes.
	clock := testclock.New()
	caddymodule.UseTableClock(t, clock)
	c := startCaddy(t, site(first))
	initialize(t, c, sid) // gated, its init_timeout running
	// The end of the initialize exchange is written after its answer:
	// once it is in the first Redis, nothing is left to write there.
	old := goredis.NewClient(&goredis.Options{Addr: first})
	defer old.Close()
	wait.Until(t, "the initialize's end written", func() bool {
		v, _ := old.HGet(context.Background(), "mcp_serializer:"+serializer.StoreKey(sid), "inflight").Result()
		return v == "0"
	})
	before := stateErrors(t, c)
	c.reload(t, site(second))
	clock.Advance(time.Second) // init_timeout passes with no request served
	wait.Until(t, "the gate settled", func() bool { return c.initializing(t) == 0 })
	after := stateErrors(t, c)
	for op, n := range after {
		if n != before[op] {
			t.Errorf("after the reload: %v more state_errors_total%s", n-before[op], op)
		}
	}
}

// stateErrors reads caddy_mcp_serializer_state_errors_total by label from
// the site's /metrics (the counters are the process's, shared by tests).
func stateErrors(t *testing.T, c *testCaddy) map[string]float64 {
	t.Helper()
	resp, err := http.Get(c.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	text, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	errs := map[string]float64{}
	for _, line := range strings.Split(string(text), "\n") {
		if rest, ok := strings.CutPrefix(line, "caddy_mcp_serializer_state_errors_total"); ok {
			label, value, _ := strings.Cut(rest, " ")
			n, _ := strconv.ParseFloat(value, 64)
			errs[label] = n
		}
	}
	return errs
}
