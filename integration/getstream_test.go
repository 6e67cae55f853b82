package integration

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The GET stream in front of PHP-FPM. The SDK client opens it right after
// initialization; integration/php's GET handler, like php-mcp's, then
// rewrites the session record every second and holds its PHP-FPM worker
// until the session is gone or a write to the client fails.

// sessionsResult is the client's sessions mode's final line.
type sessionsResult struct {
	Mode           string         `json:"mode"`
	OK             bool           `json:"ok"`
	Error          string         `json:"error"`
	N              int            `json:"n"`
	Concurrency    int            `json:"concurrency"`
	Completed      int            `json:"completed"`
	FailedSessions int            `json:"failedSessions"`
	FailedSteps    map[string]int `json:"failedSteps"`
	GetStatuses    map[string]int `json:"getStatuses"`
	Samples        []string       `json:"samples"`
	ElapsedMs      int            `json:"elapsedMs"`
}

func (r sessionsResult) summary() string {
	return strconv.Itoa(r.Completed) + "/" + strconv.Itoa(r.N) + " sessions completed, " +
		strconv.Itoa(r.FailedSessions) + " failed " + jsonString(r.FailedSteps) +
		", GET statuses " + jsonString(r.GetStatuses) +
		", " + strconv.Itoa(r.Concurrency) + " at once, in " + strconv.Itoa(r.ElapsedMs) + " ms"
}

// runSessions runs n ordinary SDK client sessions, concurrency at a time,
// each request bounded by requestTimeout.
func runSessions(t *testing.T, url string, n, concurrency int, requestTimeout time.Duration) sessionsResult {
	t.Helper()
	var res sessionsResult
	runClient(t, 10*time.Minute, &res, "sessions", "--url", url, "--n", strconv.Itoa(n),
		"--concurrency", strconv.Itoa(concurrency), "--timeout", strconv.Itoa(int(requestTimeout.Milliseconds())))
	if res.Error != "" {
		t.Fatalf("client error: %s", res.Error)
	}
	return res
}

// phpSite is a Caddyfile serving the PHP backend with the given
// mcp_serializer directive and no grace_period, so that `caddy stop`
// behaves as it does with Caddy's defaults.
func phpSite(fpm *phpFPM, serializer string) string {
	return `{
	admin {$MCP_TEST_ADMIN}
	auto_https off
	persist_config off
}

http://127.0.0.1:{$MCP_TEST_PORT} {
	` + serializer + `
` + fpm.fastcgiDirectives() + `}
`
}

// A bare `mcp_serializer` (no options) in front of php_fastcgi: the GET
// gets 405 with the JSON-RPC error body and Allow, and the session works.
func TestBareDirectiveAnswersGetStream405InFrontOfPHPFPM(t *testing.T) {
	prerequisites(t)
	fpm := startPHPFPM(t, phpFPMOptions{})
	caddyfile := phpSite(fpm, "mcp_serializer")
	if out := caddyAdaptText(t, caddyfile); !containsAll(out, `"handler":"mcp_serializer"`) || containsAll(out, `"get_stream"`) {
		t.Fatalf("a bare mcp_serializer should adapt to a handler with no settings:\n%s", out)
	}
	url := startCaddy(t, caddyfile) + "/mcp"
	client := &http.Client{Timeout: 15 * time.Second}

	resp, body := post(t, client, url, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"go-test","version":"1"}}}`)
	session := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || session == "" {
		t.Fatalf("initialize: status %d, session %q, body %s", resp.StatusCode, session, body)
	}
	if resp, body = post(t, client, url, session, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("notifications/initialized: status %d, body %s", resp.StatusCode, body)
	}
	status, allow, reply := getOnce(t, client, url, session)
	t.Logf("GET: %d, Allow %q, %s", status, allow, jsonString(reply))
	if status != http.StatusMethodNotAllowed || allow != "POST, DELETE" {
		t.Fatalf("GET: status %d, Allow %q; want 405 with \"POST, DELETE\"", status, allow)
	}
	if reply.JSONRPC != "2.0" || reply.Error.Code != -32000 || reply.Error.Message == "" || string(reply.ID) != "null" {
		t.Fatalf("GET: not the module's JSON-RPC error: %+v", reply)
	}
	if resp, body = post(t, client, url, session, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`); resp.StatusCode != http.StatusOK || !containsAll(string(body), `"echo"`) {
		t.Fatalf("tools/list after the GET: status %d, body %s", resp.StatusCode, body)
	}

	// The SDK's ordinary flow through the same config.
	var res flowResult
	runClient(t, 2*time.Minute, &res, "flow", "--url", url, "--expect-get")
	if !res.OK {
		t.Fatalf("flow failed: %s (transport errors %v)", res.Error, res.TransportErrors)
	}
	checkFlowBasics(t, res)
	if len(res.GetStatuses) != 1 || string(res.GetStatuses[0]) != "405" {
		t.Errorf("GET stream statuses: got %s, want [405]", jsonString(res.GetStatuses))
	}
}

// As many SDK clients at once as PHP-FPM has workers, each doing the
// ordinary connect flow, through the module's default config: none fails,
// and `caddy stop` returns promptly afterwards, since no GET stream holds
// a connection open.
func TestAsManySDKClientsAsWorkersThroughTheDefaultConfig(t *testing.T) {
	prerequisites(t)
	const workers = 8
	fpm := startPHPFPM(t, phpFPMOptions{Workers: workers})
	c := runCaddy(t, phpSite(fpm, "mcp_serializer"))

	res := runSessions(t, c.URL+"/mcp", 5*workers, workers, 20*time.Second)
	t.Logf("default config, %d SDK clients at once on %d workers: %s", workers, workers, res.summary())
	logSamples(t, res.Samples)
	if !res.OK || res.FailedSessions != 0 {
		t.Errorf("failed sessions: %d of %d, want none", res.FailedSessions, res.N)
	}
	if n := res.GetStatuses["405"]; n != res.N {
		t.Errorf("GET answered 405 %d times of %d: %s", n, res.N, jsonString(res.GetStatuses))
	}

	took, stopped := c.stop(t, 30*time.Second)
	t.Logf("caddy stop after the run: exited after %v", took.Round(time.Millisecond))
	if !stopped {
		t.Errorf("caddy was still running %v after `caddy stop`", took.Round(time.Second))
	}
}

// The SDK's ordinary connect flow, which opens the GET stream, for many
// sessions at once through the default config: every session's requests,
// the later tools/list and tools/call included, succeed.
func TestSDKConnectFlowWithGetStreamThroughTheDefaultConfig(t *testing.T) {
	prerequisites(t)
	fpm := startPHPFPM(t, phpFPMOptions{})
	url := startCaddy(t, phpSite(fpm, "mcp_serializer")) + "/mcp"

	const n, concurrency = 500, 16
	res := runSessions(t, url, n, concurrency, 20*time.Second)
	t.Logf("default config, %d SDK sessions: %s", n, res.summary())
	t.Logf("PHP error log: %s", fpm.logSummary())
	logSamples(t, res.Samples)
	if res.Completed != n || res.FailedSessions != 0 {
		t.Errorf("sessions: %d of %d completed, %d failed %s; want all", res.Completed, n, res.FailedSessions, jsonString(res.FailedSteps))
	}
}

// With `get_stream forward` the same clients take PHP-FPM down: each GET
// stream holds a worker for as long as its session lives, so once as many
// sessions as workers have opened one, POSTs wait for a worker until the
// clients give up. This pins the outage the default avoids, and that an
// open stream keeps `caddy stop` waiting.
func TestGetStreamForwardTiesUpPHPFPMWorkers(t *testing.T) {
	prerequisites(t)
	const workers = 8
	fpm := startPHPFPM(t, phpFPMOptions{Workers: workers})
	c := runCaddy(t, phpSite(fpm, "mcp_serializer {\n\t\tget_stream forward\n\t}"))

	res := runSessions(t, c.URL+"/mcp", 5*workers, workers, 5*time.Second)
	t.Logf("get_stream forward, %d SDK clients at once on %d workers: %s", workers, workers, res.summary())
	t.Logf("PHP error log: %s", fpm.logSummary())
	logSamples(t, res.Samples)
	if res.FailedSessions == 0 {
		t.Errorf("no session failed with get_stream forward; expected the GET streams to tie up every worker")
	}

	// One session left open with its GET stream, as a client that stays
	// connected does; then `caddy stop`.
	client := &http.Client{Timeout: 15 * time.Second}
	resp, body := post(t, client, c.URL+"/mcp", "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"go-test","version":"1"}}}`)
	session := resp.Header.Get("Mcp-Session-Id")
	if session == "" {
		t.Fatalf("initialize after the run: status %d, body %s", resp.StatusCode, body)
	}
	post(t, client, c.URL+"/mcp", session, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream := openGetStream(t, ctx, c.URL+"/mcp", session)
	defer stream.Body.Close()
	if stream.StatusCode != http.StatusOK {
		t.Fatalf("GET with get_stream forward: status %d", stream.StatusCode)
	}
	took, stopped := c.stop(t, 15*time.Second)
	t.Logf("caddy stop with one GET stream open: exited %v after %v (the test's limit is 15s)", stopped, took.Round(time.Millisecond))
}

// caddyAdaptText adapts a Caddyfile given as text, with the test
// placeholders set.
func caddyAdaptText(t *testing.T, caddyfile string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "Caddyfile")
	if err := os.WriteFile(path, []byte(caddyfile), 0o644); err != nil {
		t.Fatal(err)
	}
	return caddyAdapt(t, path, "MCP_TEST_PORT=8080", "MCP_TEST_ADMIN=127.0.0.1:2019")
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// jsonRPCReply is a JSON-RPC error reply as the module writes it.
type jsonRPCReply struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Error   struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// openGetStream opens session's server-to-client stream; the caller
// closes the body.
func openGetStream(t *testing.T, ctx context.Context, url, session string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", session)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET: %v", err)
	}
	return resp
}

// getOnce sends a GET on session and reads the whole answer.
func getOnce(t *testing.T, client *http.Client, url, session string) (status int, allow string, reply jsonRPCReply) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), client.Timeout)
	defer cancel()
	resp := openGetStream(t, ctx, url, session)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET: reading the body: %v", err)
	}
	if err := json.Unmarshal(body, &reply); err != nil {
		t.Fatalf("GET: status %d, body is not JSON: %q", resp.StatusCode, body)
	}
	return resp.StatusCode, resp.Header.Get("Allow"), reply
}
