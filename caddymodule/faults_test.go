package caddymodule_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/caddymodule"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/testclock"
)

// Fault tests: the upstream fails, hangs or goes away, clients leave at
// every stage, and every request still ends with the upstream's answer or
// a clear JSON-RPC error, within the configured bounds.

// rpcMsg is what the test upstreams read of a JSON-RPC body.
type rpcMsg struct {
	Method string          `json:"method"`
	ID     json.RawMessage `json:"id"`
}

func parseRPC(body []byte) rpcMsg {
	var m rpcMsg
	_ = json.Unmarshal(body, &m)
	return m
}

// label names a request for upstream logs: "method#id".
func (m rpcMsg) label() string {
	if len(m.ID) == 0 {
		return m.Method
	}
	return m.Method + "#" + string(m.ID)
}

// mcpAnswer is an upstream answer function that behaves like an MCP
// server: initialize creates session sid, notifications get 202, requests
// a result carrying their own id. hook, if set, sees every message first
// and returns true when it has answered it.
func mcpAnswer(sid string, hook func(m rpcMsg, w http.ResponseWriter, r *http.Request) bool) func(http.ResponseWriter, *http.Request, []byte) {
	return func(w http.ResponseWriter, r *http.Request, body []byte) {
		m := parseRPC(body)
		if hook != nil && hook(m, w, r) {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == http.MethodDelete:
			w.WriteHeader(http.StatusOK)
		case m.Method == "initialize":
			w.Header().Set("Mcp-Session-Id", sid)
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-06-18","capabilities":{},"serverInfo":{"name":"test","version":"1"}}}`, m.ID)
		case len(m.ID) == 0:
			w.WriteHeader(http.StatusAccepted)
		default:
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{}}`, m.ID)
		}
	}
}

// labels lists what reached the upstream, in arrival order.
func (u *upstream) labels() []string {
	var out []string
	for _, r := range u.requests() {
		if r.Method != http.MethodPost {
			out = append(out, r.Method)
			continue
		}
		out = append(out, parseRPC(r.Body).label())
	}
	return out
}

// count returns how many requests carrying label reached the upstream.
func (u *upstream) count(label string) int {
	n := 0
	for _, l := range u.labels() {
		if l == label {
			n++
		}
	}
	return n
}

// drain empties the arrival channel, for tests that read the log instead.
func (u *upstream) drain() {
	for {
		select {
		case <-u.arrived:
		default:
			return
		}
	}
}

// restartable serves a handler on a fixed address and can stop, so that
// connections are refused, and start again on the same address.
type restartable struct {
	t    *testing.T
	addr string
	h    http.Handler
	mu   sync.Mutex
	srv  *http.Server
}

func serveRestartable(t *testing.T, h http.Handler) *restartable {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &restartable{t: t, addr: l.Addr().String(), h: h}
	s.serve(l)
	t.Cleanup(s.stop)
	return s
}

func (s *restartable) serve(l net.Listener) {
	srv := &http.Server{Handler: s.h}
	s.mu.Lock()
	s.srv = srv
	s.mu.Unlock()
	go srv.Serve(l)
}

// stop closes the listener and every connection: dials are refused.
func (s *restartable) stop() {
	s.mu.Lock()
	srv := s.srv
	s.srv = nil
	s.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
}

func (s *restartable) start() {
	l, err := net.Listen("tcp", s.addr)
	if err != nil {
		s.t.Fatalf("listening again on %s: %v", s.addr, err)
	}
	s.serve(l)
}

// answer is a response read in full, or the error that replaced it.
type answer struct {
	status int
	header http.Header
	body   []byte
	err    error
	at     time.Time // when it arrived
}

// asResponse lets expectRPCError check an answer.
func (a answer) asResponse() *http.Response {
	return &http.Response{StatusCode: a.status, Header: a.header, Body: io.NopCloser(bytes.NewReader(a.body))}
}

// call sends one request and reads the whole answer.
func call(ctx context.Context, client *http.Client, method, url, sid, body string) answer {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return answer{err: err, at: time.Now()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
	}
	resp, err := do(client, req)
	if err != nil {
		return answer{err: err, at: time.Now()}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: b, err: err, at: time.Now()}
}

// callAsync is call in the background.
func callAsync(ctx context.Context, method, url, sid, body string) <-chan answer {
	ch := make(chan answer, 1)
	go func() { ch <- call(ctx, http.DefaultClient, method, url, sid, body) }()
	return ch
}

// await returns the answer, failing the test if none comes within d.
func await(t *testing.T, ch <-chan answer, d time.Duration, what string) answer {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(d):
		t.Fatalf("%s: no answer within %v", what, d)
		return answer{}
	}
}

// expectResult checks a 2xx answer that carries the request's own id.
func expectResult(t *testing.T, a answer, id string) {
	t.Helper()
	if a.err != nil {
		t.Fatalf("request %s: %v", id, a.err)
	}
	m := parseRPC(a.body)
	if a.status != http.StatusOK || string(m.ID) != id {
		t.Fatalf("request %s: status %d, body %s; want 200 with its own id", id, a.status, a.body)
	}
}

const initializeBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`

const initializedBody = `{"jsonrpc":"2.0","method":"notifications/initialized"}`

func rpcRequest(id, method string) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"method":%q}`, id, method)
}

// initialize opens session sid through Caddy and returns when the
// client has the answer; with order owner, the client's id names its
// owner beside sid.
func initialize(t *testing.T, c *testCaddy, sid string) time.Time {
	t.Helper()
	a := call(context.Background(), http.DefaultClient, http.MethodPost, c.url, "", initializeBody)
	if a.err != nil || a.status != http.StatusOK || upstreamID(a.header.Get("Mcp-Session-Id")) != sid {
		t.Fatalf("initialize: %d %v %s", a.status, a.err, a.body)
	}
	return a.at
}

// Upstream refuses connections, answers 5xx, or hangs while the
// session's notifications/initialized is in flight. The requests held
// behind the gate are released by on_init_timeout (forward, synthesize,
// reject) or, when the hung exchange keeps the slot, by queue_timeout:
// each one ends with the upstream's answer or a clear JSON-RPC error, and
// none waits longer than the configured bounds. Afterwards the session
// works again.
func TestUpstreamFaultDuringInitializedReleasesHeldRequests(t *testing.T) {
	for _, fault := range []string{"refused", "5xx", "hang"} {
		for _, action := range []string{"forward", "synthesize", "reject"} {
			t.Run(fault+"/"+action, func(t *testing.T) { runInitializedFault(t, fault, action) })
		}
	}
}

func runInitializedFault(t *testing.T, fault, action string) {
	const initTimeout, queueTimeout = 300 * time.Millisecond, time.Second
	sid := "fault-" + fault + "-" + action
	var fail5xx, hangOn atomic.Bool
	hang := make(chan struct{})
	up := &upstream{arrived: make(chan seenRequest, 256)}
	up.answer = mcpAnswer(sid, func(m rpcMsg, w http.ResponseWriter, r *http.Request) bool {
		if m.Method != "notifications/initialized" {
			return false
		}
		if fail5xx.CompareAndSwap(true, false) { // the first one only
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"jsonrpc":"2.0","id":null,"error":{"code":-32603,"message":"database unavailable"}}`)
			return true
		}
		if hangOn.Load() {
			select {
			case <-hang:
			case <-time.After(10 * time.Second):
			}
		}
		return false
	})
	srv := serveRestartable(t, up)
	// The table's timers run on a clock moved by hand: init_timeout passes
	// once every request below has reached its place, however slow the
	// machine.
	clock := testclock.New()
	caddymodule.UseTableClock(t, clock)
	c := startCaddy(t, fmt.Sprintf(`mcp_serializer {
	init_timeout %s
	on_init_timeout %s
	queue_timeout %s
}
reverse_proxy %s`, initTimeout, action, queueTimeout, srv.addr))
	releaseHang := sync.OnceFunc(func() { close(hang) })
	defer releaseHang()

	initialize(t, c, sid)
	up.drain()
	switch fault {
	case "refused":
		srv.stop()
	case "5xx":
		fail5xx.Store(true)
	case "hang":
		hangOn.Store(true)
	}
	ctx := context.Background()
	setLevel := callAsync(ctx, http.MethodPost, c.url, sid, rpcRequest("2", "logging/setLevel"))
	c.awaitWaiting(t, 1) // arrival order: setLevel, then tools/list
	toolsList := callAsync(ctx, http.MethodPost, c.url, sid, rpcRequest("3", "tools/list"))
	c.awaitWaiting(t, 2)
	notification := callAsync(ctx, http.MethodPost, c.url, sid, initializedBody)

	// The client's own notifications/initialized goes through the gate:
	// it hangs at the upstream, or fails.
	switch fault {
	case "hang":
		if got := parseRPC(up.next(t).Body).Method; got != "notifications/initialized" {
			t.Fatalf("upstream got %s first, want notifications/initialized", got)
		}
	case "refused":
		if a := await(t, notification, 5*time.Second, "initialized"); a.status != http.StatusBadGateway {
			t.Fatalf("initialized with the upstream down: %d, want 502", a.status)
		}
	case "5xx":
		if a := await(t, notification, 5*time.Second, "initialized"); a.status != http.StatusServiceUnavailable {
			t.Fatalf("initialized: %d, want the upstream's 503", a.status)
		}
	}
	// Until init_timeout, both requests stay held.
	if n := c.waiting(t); n != 2 {
		t.Fatalf("%d requests waiting before init_timeout, want the 2 held at the gate", n)
	}
	clock.Advance(initTimeout)
	if fault == "hang" && action != "reject" {
		// The gate opened (or the synthesized initialized waits), but the
		// hung initialized keeps the slot: the held requests wait until
		// their queue_timeout, counted from their arrival.
		clock.Advance(queueTimeout - initTimeout)
	}

	held := map[string]answer{
		"2": await(t, setLevel, 5*time.Second, "held logging/setLevel"),
		"3": await(t, toolsList, 5*time.Second, "held tools/list"),
	}
	for id, a := range held {
		if a.err != nil {
			t.Fatalf("held request %s: %v", id, a.err)
		}
		switch {
		case action == "reject":
			// Answered locally at init_timeout, whatever the fault.
			e := expectRPCError(t, a.asResponse(), http.StatusBadRequest, id)
			if e.Error.Code != -32600 || !strings.Contains(e.Error.Message, "not initialized") {
				t.Errorf("reject: error %+v", e.Error)
			}
		case fault == "hang":
			// The gate opened, but the hung initialized keeps the slot.
			if a.header.Get("Retry-After") == "" {
				t.Errorf("held request %s: 503 without Retry-After", id)
			}
			expectRPCError(t, a.asResponse(), http.StatusServiceUnavailable, id)
		case fault == "refused":
			// Forwarded, and the proxy answers for the absent upstream.
			if a.status != http.StatusBadGateway {
				t.Errorf("held request %s: status %d, want 502 from the proxy", id, a.status)
			}
		case fault == "5xx":
			expectResult(t, a, id)
		}
	}

	switch fault {
	case "hang":
		releaseHang()
		if a := await(t, notification, 5*time.Second, "hung initialized"); a.status != http.StatusAccepted {
			t.Fatalf("hung initialized, once released: %d %s", a.status, a.body)
		}
	case "refused":
		srv.start()
	}
	if action == "reject" && fault != "hang" {
		// The gate rejects until the client's initialized gets a 2xx.
		expectRPCError(t, post(t, c.url, sid, rpcRequest("4", "ping")), http.StatusBadRequest, "4")
		resp := post(t, c.url, sid, initializedBody)
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("initialized, again: %d", resp.StatusCode)
		}
	}

	// The session works again (a slot still taken would answer 503).
	expectResult(t, call(ctx, http.DefaultClient, http.MethodPost, c.url, sid, rpcRequest("5", "tools/list")), "5")

	// What the upstream saw, when it was up.
	labels := up.labels()
	want := map[string][]string{
		"5xx/forward":    {"notifications/initialized", "logging/setLevel#2", "tools/list#3", "tools/list#5"},
		"5xx/synthesize": {"notifications/initialized", "notifications/initialized", "logging/setLevel#2", "tools/list#3", "tools/list#5"},
		"5xx/reject":     {"notifications/initialized", "notifications/initialized", "tools/list#5"},
		// Timed out in the queue: never forwarded. Synthesize sends nothing
		// once the client's own initialized has been acknowledged.
		"hang/forward":    {"notifications/initialized", "tools/list#5"},
		"hang/synthesize": {"notifications/initialized", "tools/list#5"},
		"hang/reject":     {"notifications/initialized", "tools/list#5"},
		// Down for everything before tools/list.
		"refused/forward":    {"tools/list#5"},
		"refused/synthesize": {"tools/list#5"},
		"refused/reject":     {"notifications/initialized", "tools/list#5"},
	}[fault+"/"+action]
	want = append([]string{"initialize#1"}, want...)
	if strings.Join(labels, " ") != strings.Join(want, " ") {
		t.Fatalf("upstream saw %q, want %q", labels, want)
	}
	for _, r := range up.requests()[1:] {
		if r.Header.Get("Mcp-Session-Id") != sid {
			t.Errorf("a request reached the upstream with session %q, want %q", r.Header.Get("Mcp-Session-Id"), sid)
		}
	}
}

// Upstream hangs on an ordinary request: every request queued behind it
// gets 503 with Retry-After once queue_timeout has passed (and not much
// later), none of them is forwarded, other sessions are not slowed down,
// and when the upstream answers the session works again at once.
func TestHungExchangeTimesOutItsQueueAndTheSessionRecovers(t *testing.T) {
	const queueTimeout = 300 * time.Millisecond
	up, addr, release := blockingUpstream(t)
	c := startCaddy(t, fmt.Sprintf("mcp_serializer {\n\tqueue_timeout %s\n}\nreverse_proxy %s", queueTimeout, addr))
	ctx := context.Background()
	hung := callAsync(ctx, http.MethodPost, c.url, "hung", `{"jsonrpc":"2.0","id":1,"method":"block"}`)
	up.next(t)

	start := time.Now()
	var queued []<-chan answer
	for _, id := range []string{"2", `"three"`, "4"} {
		queued = append(queued, callAsync(ctx, http.MethodPost, c.url, "hung", rpcRequest(id, "tools/list")))
	}
	other := call(ctx, http.DefaultClient, http.MethodPost, c.url, "other", rpcRequest("7", "tools/list"))
	if other.status != http.StatusOK || time.Since(start) > 2*time.Second {
		t.Fatalf("another session waited for the hung one: %d after %v", other.status, time.Since(start))
	}
	for i, id := range []string{"2", `"three"`, "4"} {
		a := await(t, queued[i], 5*time.Second, "queued request "+id)
		if a.header.Get("Retry-After") == "" {
			t.Errorf("request %s: 503 without Retry-After", id)
		}
		e := expectRPCError(t, a.asResponse(), http.StatusServiceUnavailable, id)
		if !strings.Contains(e.Error.Message, "queue_timeout") {
			t.Errorf("message %q does not name queue_timeout", e.Error.Message)
		}
		if waited := a.at.Sub(start); waited < queueTimeout-20*time.Millisecond || waited > queueTimeout+2*time.Second {
			t.Errorf("request %s answered after %v, want about queue_timeout (%v)", id, waited, queueTimeout)
		}
	}
	// Still hung: a latecomer times out the same way.
	expectRPCError(t, post(t, c.url, "hung", rpcRequest("5", "ping")), http.StatusServiceUnavailable, "5")

	close(release)
	if a := await(t, hung, 5*time.Second, "hung request"); a.status != http.StatusOK {
		t.Fatalf("hung request, once answered: %d", a.status)
	}
	// A slot still taken would answer 503 after queue_timeout.
	if a := call(ctx, http.DefaultClient, http.MethodPost, c.url, "hung", rpcRequest("6", "tools/list")); a.status != http.StatusOK {
		t.Fatalf("session after the upstream answered: %d %s", a.status, a.body)
	}
	for _, r := range up.requests() {
		if id := string(parseRPC(r.Body).ID); id == "2" || id == `"three"` || id == "4" || id == "5" {
			t.Fatalf("request %s, timed out in the queue, reached the upstream", id)
		}
	}
	if n := len(up.requests()); n != 3 {
		t.Fatalf("upstream saw %d requests, want 3 (block, other, 6)", n)
	}
}

// A client that leaves while its request is held at the gate (a POST, or
// the GET stream) takes nothing with it: the request is never forwarded,
// and once initialized is acknowledged the session's next request is
// served at once.
func TestClientLeavingAtTheGateIsNeverForwarded(t *testing.T) {
	const gateHolds = "caddy_mcp_serializer_gate_holds_total"
	const clientsGone = `caddy_mcp_serializer_rejections_total{reason="client_gone"}`
	const sid = "gate-leave"
	up, addr := newUpstream(t, mcpAnswer(sid, nil))
	c := startCaddy(t, "mcp_serializer {\n\tinit_timeout 10s\n\tqueue_timeout 2s\n\tget_stream forward\n}\nreverse_proxy "+addr)
	initialize(t, c, sid)

	holds, gone := c.metric(t, gateHolds), c.metric(t, clientsGone)
	ctx, cancel := context.WithCancel(context.Background())
	left := callAsync(ctx, http.MethodPost, c.url, sid, rpcRequest(`"left"`, "tools/list"))
	stream := callAsync(ctx, http.MethodGet, c.url, sid, "")
	c.awaitMetric(t, gateHolds, holds+2) // both held
	cancel()
	for _, ch := range []<-chan answer{left, stream} {
		if a := await(t, ch, 5*time.Second, "leaving client"); a.err == nil {
			t.Fatalf("a held request was answered %d before initialized", a.status)
		}
	}
	c.awaitMetric(t, clientsGone, gone+2) // Caddy saw both disconnects

	resp := post(t, c.url, sid, initializedBody)
	resp.Body.Close()
	// A slot still taken would answer 503 after queue_timeout.
	expectResult(t, call(context.Background(), http.DefaultClient, http.MethodPost, c.url, sid, rpcRequest("3", "tools/list")), "3")
	if got, want := strings.Join(up.labels(), " "), "initialize#1 notifications/initialized tools/list#3"; got != want {
		t.Fatalf("upstream saw %q, want %q", got, want)
	}
}

// A client that leaves in the middle of a streamed (SSE) response ends
// the exchange: the upstream sees the cancellation, and the request
// queued behind the stream goes at once, not at queue_timeout.
func TestClientLeavingMidStreamFreesTheSlot(t *testing.T) {
	const sid = "stream-leave"
	upstreamSawLeave := make(chan struct{})
	up, addr := newUpstream(t, mcpAnswer(sid, func(m rpcMsg, w http.ResponseWriter, r *http.Request) bool {
		if m.Method != "tools/call" {
			return false
		}
		w.Header().Set("Content-Type", "text/event-stream")
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progress\":%d}}\n\n", i)
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				close(upstreamSawLeave)
				return true
			case <-tick.C:
			case <-time.After(10 * time.Second):
				return true
			}
		}
	}))
	c := startCaddy(t, "mcp_serializer {\n\tqueue_timeout 3s\n}\nreverse_proxy "+addr+" {\n\tflush_interval -1\n}")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.url, strings.NewReader(rpcRequest("1", "tools/call")))
	req.Header.Set("Mcp-Session-Id", sid)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(resp.Body).ReadString('\n')
	if !strings.Contains(line, "notifications/progress") {
		t.Fatalf("first event line %q", line)
	}
	up.drain()
	queued := callAsync(context.Background(), http.MethodPost, c.url, sid, rpcRequest("2", "tools/list"))
	time.Sleep(100 * time.Millisecond)
	select {
	case a := <-queued:
		t.Fatalf("a request overtook the stream: %d", a.status)
	default:
	}

	left := time.Now()
	cancel()
	resp.Body.Close()
	select {
	case <-upstreamSawLeave:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream never saw the client leave")
	}
	a := await(t, queued, 5*time.Second, "request queued behind the stream")
	expectResult(t, a, "2")
	if d := a.at.Sub(left); d > 2*time.Second {
		t.Fatalf("the queued request went %v after the client left: the slot was held", d)
	}
	expectResult(t, call(context.Background(), http.DefaultClient, http.MethodPost, c.url, sid, rpcRequest("3", "ping")), "3")
}

// A slow client that sends its body a byte at a time holds nothing while
// it does: its body is read before it queues, so the same session's other
// requests and other sessions go ahead, and the slow body arrives intact.
func TestSlowBodyDoesNotBlockItsSessionOrOthers(t *testing.T) {
	up, addr := newUpstream(t, mcpAnswer("unused", nil))
	c := startCaddy(t, "mcp_serializer\nreverse_proxy "+addr)
	for _, chunked := range []bool{false, true} {
		t.Run(fmt.Sprintf("chunked=%v", chunked), func(t *testing.T) {
			sid := fmt.Sprintf("slow-%v", chunked)
			body := rpcRequest(`"slow"`, "tools/call")
			conn, err := net.Dial("tcp", strings.TrimPrefix(c.url, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			framing := fmt.Sprintf("Content-Length: %d", len(body))
			if chunked {
				framing = "Transfer-Encoding: chunked"
			}
			fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nMcp-Session-Id: %s\r\n%s\r\n\r\n",
				strings.TrimPrefix(c.url, "http://"), sid, framing)
			// The body's second half waits until the others have been
			// served: they must not wait for it, however slow the machine.
			sent, othersServed := make(chan error, 1), make(chan struct{})
			var release sync.Once
			defer release.Do(func() { close(othersServed) })
			go func() {
				for i := range len(body) {
					if i == len(body)/2 {
						<-othersServed
					}
					var err error
					if chunked {
						_, err = fmt.Fprintf(conn, "1\r\n%c\r\n", body[i])
					} else {
						_, err = conn.Write([]byte{body[i]})
					}
					if err != nil {
						sent <- err
						return
					}
					time.Sleep(15 * time.Millisecond)
				}
				if chunked {
					_, err := io.WriteString(conn, "0\r\n\r\n")
					sent <- err
					return
				}
				sent <- nil
			}()

			time.Sleep(50 * time.Millisecond) // the slow body has started
			for _, s := range []string{sid, "bystander"} {
				expectResult(t, call(context.Background(), http.DefaultClient, http.MethodPost, c.url, s, rpcRequest("2", "tools/list")), "2")
			}
			release.Do(func() { close(othersServed) })
			if err := <-sent; err != nil {
				t.Fatal(err)
			}
			conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || string(parseRPC(got).ID) != `"slow"` {
				t.Fatalf("slow request: %d %s", resp.StatusCode, got)
			}
			var last seenRequest
			for _, r := range up.requests() {
				if r.Header.Get("Mcp-Session-Id") == sid {
					last = r
				}
			}
			if string(last.Body) != body || last.ContentLength != int64(len(body)) {
				t.Fatalf("upstream got %q (Content-Length %d), want %q last in its session", last.Body, last.ContentLength, body)
			}
		})
	}
}
