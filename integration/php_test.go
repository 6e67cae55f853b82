package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// prerequisites fails the test at once, saying what to install, when php-fpm,
// node, the client's packages or the Caddy binary is missing.
func prerequisites(t *testing.T) {
	t.Helper()
	phpFPMBinary(t)
	clientScript(t)
	caddyBinary(t)
}

// pipelineN is the number of pipelined connects for the test through the
// module: at least 1000, more with MCP_SERIALIZER_PIPELINE_N.
func pipelineN(t *testing.T) int {
	n := 1000
	if v := os.Getenv("MCP_SERIALIZER_PIPELINE_N"); v != "" {
		parsed, err := strconv.Atoi(v)
		if err != nil || parsed < n {
			t.Fatalf("MCP_SERIALIZER_PIPELINE_N=%q: want an integer >= %d", v, n)
		}
		n = parsed
	}
	return n
}

// Without the module, PHP-FPM's workers race on the session record: a
// pipelined `logging/setLevel` is rejected as "not initialized", its stale
// save can leave the session broken, and parked replies get lost. This proves
// the harness reproduces the failures the module exists to prevent.
func TestDirectPHPFPMReproducesRace(t *testing.T) {
	prerequisites(t)
	fpm := startPHPFPM(t, phpFPMOptions{})
	base := startCaddy(t, caddySite(fpm.fastcgiDirectives()))

	const n = 200
	var res pipelineResult
	// --get skip: the SDK's GET stream would pin one of the 8 PHP-FPM workers
	// per session for its whole life; this test is about the POSTs.
	runClient(t, 5*time.Minute, &res, "pipeline", "--url", base+"/mcp", "--n", strconv.Itoa(n), "--concurrency", "8", "--get", "skip")
	t.Logf("direct to PHP-FPM, %d pipelined connects: %s", n, res.summary())
	t.Logf("PHP error log: %s", fpm.logSummary())
	logSamples(t, res.Samples)
	if res.Error != "" {
		t.Fatalf("client error: %s", res.Error)
	}
	if res.Connects == 0 {
		t.Fatalf("no connect succeeded: the backend does not work at all")
	}
	if res.Rejections == 0 && res.Broken == 0 {
		t.Fatalf("expected pipelined connects straight to PHP-FPM to be rejected or left broken, got none: the race is not reproduced (widen MCP_PHP_WORK_MS)")
	}
	if res.Failures == 0 {
		t.Fatalf("expected failures without the module, got none")
	}
}

// Through the module with its default settings, the same pipelined
// connects see no failure at all.
func TestSerializerPipelinedConnects(t *testing.T) {
	prerequisites(t)
	fpm := startPHPFPM(t, phpFPMOptions{})
	base := startCaddy(t, caddySite("\tmcp_serializer\n"+fpm.fastcgiDirectives()))

	n := pipelineN(t)
	var res pipelineResult
	runClient(t, 10*time.Minute, &res, "pipeline", "--url", base+"/mcp", "--n", strconv.Itoa(n), "--concurrency", "8", "--get", "open")
	t.Logf("through mcp_serializer, %d pipelined connects: %s", n, res.summary())
	t.Logf("PHP error log: %s", fpm.logSummary())
	logSamples(t, res.Samples)
	if res.Error != "" {
		t.Fatalf("client error: %s", res.Error)
	}
	if res.Connects != n {
		t.Errorf("connects: got %d of %d", res.Connects, n)
	}
	if res.Rejections != 0 {
		t.Errorf("rejections (-32600): got %d, want 0", res.Rejections)
	}
	if res.HTTPErrorCount != 0 {
		t.Errorf("HTTP errors: got %v, want none", res.HTTPErrors)
	}
	if res.IDMismatches != 0 || res.UnexpectedReplies != 0 {
		t.Errorf("replies not matching their requests: %d id mismatches, %d unexpected replies", res.IDMismatches, res.UnexpectedReplies)
	}
	if res.Broken != 0 {
		t.Errorf("broken sessions (later tools/list failed): got %d, want 0", res.Broken)
	}
	if res.Failures != 0 || !res.OK {
		t.Errorf("failures: got %d, want 0", res.Failures)
	}
	for status, count := range res.GetStatuses {
		if status != "405" {
			t.Errorf("GET answered %s %d times, want 405 only (get_stream reject, the default)", status, count)
		}
	}
}

// The SDK's ordinary flow passes through the module unchanged, including an
// SSE response whose progress notifications must arrive as they are sent;
// its GET stream is answered 405 (get_stream reject, the default).
func TestSerializerSDKFlowWithProgress(t *testing.T) {
	prerequisites(t)
	const progressMS = 150
	const steps = 5
	fpm := startPHPFPM(t, phpFPMOptions{ProgressMS: progressMS})
	base := startCaddy(t, caddySite("\tmcp_serializer\n"+fpm.fastcgiDirectives()))

	var res flowResult
	runClient(t, 2*time.Minute, &res, "flow", "--url", base+"/mcp", "--n", strconv.Itoa(steps), "--expect-get")
	if !res.OK {
		t.Fatalf("flow failed: %s (transport errors %v, id mismatches %d)", res.Error, res.TransportErrors, res.IDMismatches)
	}
	checkFlowBasics(t, res)

	if len(res.Progress) != steps {
		t.Fatalf("progress notifications: got %d, want %d", len(res.Progress), steps)
	}
	for i, p := range res.Progress {
		t.Logf("progress %v/%v at %.1f ms", p.Progress, p.Total, p.At-res.CallStartedAt)
		if int(p.Progress) != i+1 || int(p.Total) != steps {
			t.Errorf("progress %d: got %v/%v, want %d/%d", i, p.Progress, p.Total, i+1, steps)
		}
		if i > 0 && p.At < res.Progress[i-1].At {
			t.Errorf("progress %d arrived before progress %d", i, i-1)
		}
		if p.At > res.ResultAt {
			t.Errorf("progress %d arrived at %.1f ms, after the result at %.1f ms", i, p.At, res.ResultAt)
		}
	}
	t.Logf("result at %.1f ms", res.ResultAt-res.CallStartedAt)
	// The backend pauses progressMS after each event: streamed as sent, the
	// first event comes about steps*progressMS before the result, and the
	// events are spread over (steps-1)*progressMS. Buffered, all would arrive
	// together with the result.
	first, last := res.Progress[0].At, res.Progress[steps-1].At
	if lead := res.ResultAt - first; lead < float64(steps*progressMS)/2 {
		t.Errorf("first progress only %.1f ms before the result, want >= %d ms: the SSE response was buffered", lead, steps*progressMS/2)
	}
	if spread := last - first; spread < float64((steps-1)*progressMS)/2 {
		t.Errorf("progress events spread over %.1f ms, want >= %d ms: the SSE response was buffered", spread, (steps-1)*progressMS/2)
	}

	if len(res.GetStatuses) != 1 || string(res.GetStatuses[0]) != "405" {
		t.Errorf("GET stream statuses: got %s, want [405]", jsonString(res.GetStatuses))
	}
	sse := false
	for _, e := range res.Exchanges {
		if e.Method == "POST" && e.ContentType == "text/event-stream" {
			sse = true
		}
	}
	if !sse {
		t.Errorf("no POST was answered as text/event-stream: %s", jsonString(res.Exchanges))
	}
}

func checkFlowBasics(t *testing.T, res flowResult) {
	t.Helper()
	if res.SessionID == "" {
		t.Errorf("no session id")
	}
	if strings.Join(res.Tools, ",") != "echo,slow_count" {
		t.Errorf("tools: got %v, want [echo slow_count]", res.Tools)
	}
	if res.Echo != "hello through caddy" {
		t.Errorf("echo: got %q", res.Echo)
	}
	if !strings.HasPrefix(res.SlowResult, "counted to ") {
		t.Errorf("slow_count result: got %q", res.SlowResult)
	}
	if len(res.TransportErrors) != 0 {
		t.Errorf("transport errors: %v", res.TransportErrors)
	}
}

// post sends one JSON-RPC POST the way a Streamable HTTP client does.
func post(t *testing.T, client *http.Client, url, session, body string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if session != "" {
		req.Header.Set("Mcp-Session-Id", session)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", body, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: reading body: %v", body, err)
	}
	if resp.StatusCode == http.StatusOK && json.Valid(data) == false && !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("POST %s: invalid JSON reply %s", body, data)
	}
	return resp, data
}

// logSamples shows a few of the client's failure descriptions.
func logSamples(t *testing.T, samples []string) {
	t.Helper()
	const max = 8
	for i, s := range samples {
		if i == max {
			t.Logf("  … %d more", len(samples)-max)
			break
		}
		t.Logf("  %s", s)
	}
}

// callsResult is the client's `calls` mode report.
type callsResult struct {
	OK             bool           `json:"ok"`
	Error          string         `json:"error"`
	Calls          int            `json:"calls"`
	WrongCalls     int            `json:"wrongCalls"`
	IDMismatches   int            `json:"idMismatches"`
	HTTPErrors     map[string]int `json:"httpErrors"`
	HTTPErrorCount int            `json:"httpErrorCount"`
	FailedConnects int            `json:"failedConnects"`
	Samples        []string       `json:"samples"`
	RoundP50Ms     float64        `json:"roundP50Ms"`
	ElapsedMs      int            `json:"elapsedMs"`
}

func (r callsResult) summary() string {
	return fmt.Sprintf("%d calls: %d wrong or unanswered, %d replies with another request's id, HTTP errors %v; a round's p50 %.0f ms, took %d ms",
		r.Calls, r.WrongCalls, r.IDMismatches, r.HTTPErrors, r.RoundP50Ms, r.ElapsedMs)
}

// An agent sends the calls of one turn at once, all on its session.
// Straight to PHP-FPM, the workers' whole-record saves hand calls each
// other's replies or lose them (HTTP 500); through the module they run one
// after another, and every call gets its own answer.
func TestParallelCallsOfOneSessionGetTheirOwnAnswersOnlyThroughTheModule(t *testing.T) {
	prerequisites(t)
	fpm := startPHPFPM(t, phpFPMOptions{})
	direct := startCaddy(t, caddySite(fpm.fastcgiDirectives()))
	through := startCaddy(t, caddySite("\tmcp_serializer\n"+fpm.fastcgiDirectives()))
	args := []string{"--n", "20", "--concurrency", "4", "--calls", "3", "--timeout", "2000"}

	var d, th callsResult
	runClient(t, 5*time.Minute, &d, append([]string{"calls", "--url", direct + "/mcp"}, args...)...)
	t.Logf("direct to PHP-FPM: %s", d.summary())
	logSamples(t, d.Samples)
	runClient(t, 5*time.Minute, &th, append([]string{"calls", "--url", through + "/mcp"}, args...)...)
	t.Logf("through mcp_serializer: %s", th.summary())
	logSamples(t, th.Samples)
	t.Logf("PHP error log: %s", fpm.logSummary())

	if d.Error != "" || th.Error != "" {
		t.Fatalf("client error: %q direct, %q through", d.Error, th.Error)
	}
	if d.FailedConnects != 0 || d.Calls != 60 {
		t.Fatalf("direct: %d connects failed, %d calls made of 60: the backend does not work at all", d.FailedConnects, d.Calls)
	}
	if d.WrongCalls+d.IDMismatches+d.HTTPErrorCount == 0 {
		t.Errorf("direct: every call got its own answer: the race between one session's calls is not reproduced (widen MCP_PHP_WORK_MS)")
	}
	if !th.OK || th.WrongCalls != 0 || th.IDMismatches != 0 || th.HTTPErrorCount != 0 {
		t.Errorf("through the module: %s; want every call answered with its own reply", th.summary())
	}
}
