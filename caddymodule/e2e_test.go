package caddymodule_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/integration/mcpstub"
)

// The race this module exists for: concurrent workers that each save the
// whole session record. Direct, pipelined connects fail; through the
// module none do, and no session is left broken.
func TestPipelinedConnectsFailDirectButNeverThroughTheModule(t *testing.T) {
	backend := &mcpstub.Backend{WorkMin: time.Millisecond, WorkMax: 5 * time.Millisecond, DisableRequestLog: true}
	direct := httptest.NewServer(backend)
	defer direct.Close()
	ctx := context.Background()

	sum := mcpstub.RunPipelined(ctx, direct.URL, 100, 8)
	t.Logf("direct: %s", sum)
	if sum.Rejected == 0 {
		t.Fatalf("direct connects showed no race; the test upstream no longer reproduces it: %s", sum)
	}

	c := startCaddy(t, fmt.Sprintf(`
	mcp_serializer
	reverse_proxy %s {
		flush_interval -1
	}`, strings.TrimPrefix(direct.URL, "http://")))
	sum = mcpstub.RunPipelined(ctx, c.url+"/mcp", 500, 16)
	t.Logf("through mcp_serializer: %s", sum)
	if sum.Connects != 500 || sum.Failed != 0 || sum.Broken != 0 {
		t.Fatalf("through mcp_serializer: %s; samples: %v", sum, sum.Samples)
	}
}

func TestInvalidSessionIDIsAnswered400AndNotForwarded(t *testing.T) {
	up, addr := newUpstream(t, nil)
	c := startCaddy(t, "mcp_serializer\nreverse_proxy "+addr)
	for name, header := range map[string][]string{
		"space":     {"abc def"},
		"control":   {"abc\x01def"},
		"non-ASCII": {"sessi\xc3\xb6n"},
		"too long":  {strings.Repeat("a", 257)},
		"empty":     {""},
		"two ids":   {"a", "b"},
	} {
		t.Run(name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, c.url, strings.NewReader(`{"jsonrpc":"2.0","id":4,"method":"ping"}`))
			req.Header["Mcp-Session-Id"] = header
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Skipf("client refused to send this header: %v", err)
			}
			expectRPCError(t, resp, http.StatusBadRequest, "null")
		})
	}
	if n := len(up.requests()); n != 0 {
		t.Fatalf("upstream saw %d requests, want 0", n)
	}
	// 256 visible characters is a valid id.
	resp := post(t, c.url, strings.Repeat("~", 256), `{"jsonrpc":"2.0","id":1,"method":"ping"}`)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || len(up.requests()) != 1 {
		t.Fatalf("256-byte id: status %d, upstream saw %d", resp.StatusCode, len(up.requests()))
	}
}

// blockingUpstream holds requests whose body contains "block" until
// release is closed.
func blockingUpstream(t *testing.T) (*upstream, string, chan struct{}) {
	release := make(chan struct{})
	up, addr := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if strings.Contains(string(body), "block") {
			select {
			case <-release:
			case <-time.After(10 * time.Second):
			}
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
	})
	return up, addr, release
}

// sendAsync posts in the background and returns the response or error.
func sendAsync(ctx context.Context, url, id, body string) <-chan *http.Response {
	ch := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Mcp-Session-Id", id)
		resp, err := do(http.DefaultClient, req)
		if err != nil {
			resp = nil
		}
		ch <- resp
	}()
	return ch
}

func TestFullQueueIsAnswered429AndNotForwarded(t *testing.T) {
	up, addr, release := blockingUpstream(t)
	c := startCaddy(t, "mcp_serializer {\n\tmax_queue 1\n}\nreverse_proxy "+addr)
	first := sendAsync(context.Background(), c.url, "s1", `{"jsonrpc":"2.0","id":1,"method":"block"}`)
	up.next(t)
	second := sendAsync(context.Background(), c.url, "s1", `{"jsonrpc":"2.0","id":2,"method":"queued"}`)
	c.awaitWaiting(t, 1)

	e := expectRPCError(t, post(t, c.url, "s1", `{"jsonrpc":"2.0","id":"third","method":"tools/list"}`), http.StatusTooManyRequests, `"third"`)
	if !strings.Contains(e.Error.Message, "max_queue") {
		t.Errorf("message %q does not name max_queue", e.Error.Message)
	}
	close(release)
	for _, ch := range []<-chan *http.Response{first, second} {
		if resp := <-ch; resp == nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("queued request failed: %v", resp)
		}
	}
	for _, r := range up.requests() {
		if strings.Contains(string(r.Body), "third") {
			t.Fatal("the rejected request reached the upstream")
		}
	}
}

func TestWaitPastQueueTimeoutIsAnswered503WithRetryAfter(t *testing.T) {
	up, addr, release := blockingUpstream(t)
	c := startCaddy(t, "mcp_serializer {\n\tqueue_timeout 200ms\n}\nreverse_proxy "+addr)
	first := sendAsync(context.Background(), c.url, "s1", `{"jsonrpc":"2.0","id":1,"method":"block"}`)
	up.next(t)

	resp := post(t, c.url, "s1", `{"jsonrpc":"2.0","id":2,"method":"late"}`)
	if resp.Header.Get("Retry-After") == "" {
		t.Error("503 without Retry-After")
	}
	expectRPCError(t, resp, http.StatusServiceUnavailable, "2")
	close(release)
	<-first
	resp = post(t, c.url, "s1", `{"jsonrpc":"2.0","id":3,"method":"after"}`)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("session did not recover: %d", resp.StatusCode)
	}
	for _, r := range up.requests() {
		if strings.Contains(string(r.Body), "late") {
			t.Fatal("the timed-out request reached the upstream")
		}
	}
}

func TestClientLeavingTheQueueIsNeverForwarded(t *testing.T) {
	up, addr, release := blockingUpstream(t)
	c := startCaddy(t, "mcp_serializer\nreverse_proxy "+addr)
	first := sendAsync(context.Background(), c.url, "s1", `{"jsonrpc":"2.0","id":1,"method":"block"}`)
	up.next(t)
	ctx, cancel := context.WithCancel(context.Background())
	gone := sendAsync(ctx, c.url, "s1", `{"jsonrpc":"2.0","id":2,"method":"gone"}`)
	c.awaitWaiting(t, 1)
	cancel()
	<-gone
	c.awaitWaiting(t, 0) // Caddy saw the disconnect
	close(release)
	<-first
	resp := post(t, c.url, "s1", `{"jsonrpc":"2.0","id":3,"method":"after"}`)
	resp.Body.Close()
	for _, r := range up.requests() {
		if strings.Contains(string(r.Body), "gone") {
			t.Fatal("a request whose client left was forwarded")
		}
	}
	if n := len(up.requests()); n != 2 {
		t.Fatalf("upstream saw %d requests, want 2", n)
	}
}

// A client that leaves in the middle of an initialize answered as an event
// stream (reverse_proxy then aborts the handler with a panic) frees the
// session it created: the client's next request gets its turn at once.
func TestClientLeavingAnInitializeStreamFreesTheNewSession(t *testing.T) {
	const sid = "left-mid-initialize"
	_, addr := newUpstream(t, mcpAnswer(sid, func(m rpcMsg, w http.ResponseWriter, r *http.Request) bool {
		if m.Method != "initialize" {
			return false
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Mcp-Session-Id", sid)
		io.WriteString(w, ": open\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done() // Caddy cancels it once the client has left
		return true
	}))
	c := startCaddy(t, "mcp_serializer {\n\tqueue_timeout 3s\n}\nreverse_proxy "+addr)

	ctx, leave := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.url, strings.NewReader(initializeBody))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if first, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || first != ": open\n" || resp.Header.Get("Mcp-Session-Id") != sid {
		t.Fatalf("initialize stream: %d, session %q, first line %q, %v", resp.StatusCode, resp.Header.Get("Mcp-Session-Id"), first, err)
	}
	leave()
	resp.Body.Close()

	// Waits for the initialize exchange to end, then goes: 503 at
	// queue_timeout if that exchange never gave its turn back.
	if a := call(context.Background(), http.DefaultClient, http.MethodPost, c.url, sid, initializedBody); a.status != http.StatusAccepted {
		t.Fatalf("initialized after the client left the initialize stream: %d %s, want 202", a.status, a.body)
	}
}

func TestBodiesReachUpstreamByteIdenticalWithContentLength(t *testing.T) {
	up, addr := newUpstream(t, nil)
	c := startCaddy(t, "mcp_serializer {\n\tmax_body 1KiB\n}\nreverse_proxy "+addr)
	big := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"x":"` + strings.Repeat("y", 4096) + `"}}`
	for name, tc := range map[string]struct {
		body    string
		chunked bool
	}{
		"malformed JSON":         {`{"jsonrpc":"2.0","method":`, false},
		"chunked small body":     {`{"jsonrpc":"2.0","method":"notifications/initialized"}`, true},
		"oversized body":         {big, false},
		"oversized chunked body": {big, true},
	} {
		t.Run(name, func(t *testing.T) {
			var body io.Reader = strings.NewReader(tc.body)
			if tc.chunked {
				body = io.MultiReader(body) // hides the length: sent chunked
			}
			req, _ := http.NewRequest(http.MethodPost, c.url, body)
			req.Header.Set("Mcp-Session-Id", "s1")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			got := up.next(t)
			if string(got.Body) != tc.body {
				t.Fatalf("upstream body differs: got %d bytes, sent %d", len(got.Body), len(tc.body))
			}
			small := len(tc.body) <= 1024
			if (small || !tc.chunked) && (got.ContentLength != int64(len(tc.body)) || len(got.TransferEncoding) != 0) {
				t.Fatalf("Content-Length %d, Transfer-Encoding %v; want %d and none", got.ContentLength, got.TransferEncoding, len(tc.body))
			}
		})
	}
}

func TestEventStreamReachesClientAsItIsWritten(t *testing.T) {
	clientGotFirst := make(chan struct{})
	_, addr := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-clientGotFirst:
			io.WriteString(w, "data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n")
		case <-time.After(5 * time.Second):
			io.WriteString(w, "data: buffered\n\n")
		}
	})
	c := startCaddy(t, "mcp_serializer\nreverse_proxy "+addr+" {\n\tflush_interval -1\n}")
	resp := post(t, c.url, "s1", `{"jsonrpc":"2.0","id":1,"method":"tools/call"}`)
	defer resp.Body.Close()
	lines := bufio.NewReader(resp.Body)
	first, _ := lines.ReadString('\n')
	if !strings.Contains(first, "notifications/progress") {
		t.Fatalf("first line %q", first)
	}
	close(clientGotFirst)
	rest, _ := io.ReadAll(lines)
	if strings.Contains(string(rest), "buffered") || !strings.Contains(string(rest), `"result"`) {
		t.Fatalf("event stream was held back: %q", rest)
	}
}

// By default the GET stream is answered 405 locally: a backend whose GET
// stream rewrites the session record (php-mcp) must not get one.
func TestGetStreamIsAnswered405ByDefault(t *testing.T) {
	up, addr := newUpstream(t, nil)
	c := startCaddy(t, "mcp_serializer\nreverse_proxy "+addr)
	resp := getStream(t, context.Background(), c.url, "s1")
	if got := resp.Header.Get("Allow"); got != "POST, DELETE" {
		t.Errorf("Allow = %q, want \"POST, DELETE\"", got)
	}
	expectRPCError(t, resp, http.StatusMethodNotAllowed, "null")
	if n := len(up.requests()); n != 0 {
		t.Fatalf("upstream saw %d requests, want 0", n)
	}
}

// getStream opens the server-to-client event stream of session id.
func getStream(t *testing.T, ctx context.Context, url, id string) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	req.Header.Set("Mcp-Session-Id", id)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// sessionUpstream creates session "s-new" on initialize and otherwise
// answers every request at once.
func sessionUpstream(t *testing.T) (*upstream, string) {
	return newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "application/json")
		if strings.Contains(string(body), `"initialize"`) {
			w.Header().Set("Mcp-Session-Id", "s-new")
		}
		if strings.Contains(string(body), "notifications/") {
			w.WriteHeader(http.StatusAccepted)
			return
		}
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
	})
}

func TestSessionStillInitializingIsGatedAcrossReload(t *testing.T) {
	up, addr := sessionUpstream(t)
	site := "mcp_serializer {\n\tqueue_timeout %s\n}\nreverse_proxy " + addr
	c := startCaddy(t, fmt.Sprintf(site, "30s"))
	resp := post(t, c.url, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`)
	resp.Body.Close()
	if resp.Header.Get("Mcp-Session-Id") != "s-new" {
		t.Fatalf("initialize: %s", resp.Status)
	}
	up.next(t)
	setLevel := sendAsync(context.Background(), c.url, "s-new", `{"jsonrpc":"2.0","id":2,"method":"logging/setLevel"}`)
	c.awaitWaiting(t, 1)

	c.reload(t, fmt.Sprintf(site, "20s"))
	toolsList := sendAsync(context.Background(), c.url, "s-new", `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`)
	c.awaitWaiting(t, 2)
	if n := len(up.requests()); n != 1 {
		t.Fatalf("upstream saw %d requests before initialized, want only initialize", n)
	}
	resp = post(t, c.url, "s-new", `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	resp.Body.Close()
	for _, want := range []string{"notifications/initialized", "logging/setLevel", "tools/list"} {
		if got := up.next(t); !strings.Contains(string(got.Body), want) {
			t.Fatalf("upstream got %s, want %s next", got.Body, want)
		}
	}
	for _, ch := range []<-chan *http.Response{setLevel, toolsList} {
		if r := <-ch; r == nil || r.StatusCode != http.StatusOK {
			t.Fatalf("held request failed: %v", r)
		}
	}
}

func TestMetricsAreExposedWithoutSessionIDs(t *testing.T) {
	_, addr := sessionUpstream(t)
	c := startCaddy(t, "metrics /metrics\nmcp_serializer\nreverse_proxy "+addr)
	resp := post(t, c.url, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`)
	resp.Body.Close()
	resp = post(t, c.url, "s-new", `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	resp.Body.Close()
	resp = post(t, c.url, "bad id", `{}`)
	resp.Body.Close()

	resp, err := http.Get(c.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	text, _ := io.ReadAll(resp.Body)
	for _, want := range []string{
		"caddy_mcp_serializer_sessions 1",
		"caddy_mcp_serializer_queue_wait_seconds_count",
		`caddy_mcp_serializer_rejections_total{reason="invalid_session_id"}`,
		`caddy_mcp_serializer_bypasses_total{kind="sessionless"}`,
	} {
		if !strings.Contains(string(text), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if strings.Contains(string(text), "s-new") {
		t.Error("a session id appears in the metrics")
	}
}
