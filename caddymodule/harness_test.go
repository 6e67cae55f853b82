package caddymodule_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/testnet"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/wait"
)

// testCaddy is Caddy running in this process with one site.
type testCaddy struct {
	url       string // the site
	admin     string // the admin API
	port      int
	adminPort int
}

// startCaddy runs a site with the given directives at http://127.0.0.1:port
// in this process's Caddy, stopped when the test ends. Tests using it must
// not run in parallel: Caddy's running config is process-wide.
func startCaddy(t *testing.T, site string) *testCaddy {
	t.Helper()
	c := &testCaddy{port: testnet.FreePort(t), adminPort: testnet.FreePort(t)}
	c.url = fmt.Sprintf("http://127.0.0.1:%d", c.port)
	c.admin = fmt.Sprintf("http://127.0.0.1:%d", c.adminPort)
	cfg := c.adapt(t, site)
	loadCaddy(t, cfg)
	return c
}

// caddyfile returns the full Caddyfile for a site body.
func (c *testCaddy) caddyfile(site string) string {
	return fmt.Sprintf(`{
	admin 127.0.0.1:%d
	auto_https off
	persist_config off
	log {
		output discard
	}
}
http://127.0.0.1:%d {
%s
}
`, c.adminPort, c.port, site)
}

func (c *testCaddy) adapt(t *testing.T, site string) []byte {
	t.Helper()
	cfg, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(c.caddyfile(site)), nil)
	if err != nil {
		t.Fatalf("adapting Caddyfile: %v", err)
	}
	for _, w := range warnings {
		if !strings.Contains(w.Message, "not formatted") {
			t.Logf("Caddyfile warning: %s", w.Message)
		}
	}
	return cfg
}

// reload replaces the site's config through the admin API, as
// `caddy reload` does.
func (c *testCaddy) reload(t *testing.T, site string) {
	t.Helper()
	loadThroughAdmin(t, c.admin, c.caddyfile(site))
}

// loadThroughAdmin replaces the running config with caddyfile through the
// admin API at admin, as `caddy reload` does.
func loadThroughAdmin(t testing.TB, admin, caddyfile string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, admin+"/load", strings.NewReader(caddyfile))
	req.Header.Set("Content-Type", "text/caddyfile")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("reload: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("reload: %s: %s", resp.Status, body)
	}
	// A reload closes the server's idle keep-alive connections; a request
	// sent on one at that moment fails with EOF before Caddy reads it.
	http.DefaultClient.CloseIdleConnections()
}

// awaitWaiting waits until n requests wait for their turn, over every
// session table, as the admin endpoint counts them: a request sent
// asynchronously has then reached its place in its session's line.
func (c *testCaddy) awaitWaiting(t *testing.T, n int) {
	t.Helper()
	wait.Until(t, fmt.Sprintf("%d requests waiting", n), func() bool { return c.waiting(t) == n })
}

// waiting returns how many requests wait for their turn, over every
// session table, as the admin endpoint counts them.
func (c *testCaddy) waiting(t *testing.T) int {
	t.Helper()
	return c.count(t, "waiting_requests")
}

// initializing returns how many sessions wait for initialized, over
// every session table, as the admin endpoint counts them.
func (c *testCaddy) initializing(t *testing.T) int {
	t.Helper()
	return c.count(t, "initializing")
}

// count sums one of the admin endpoint's counts over every table.
func (c *testCaddy) count(t *testing.T, name string) int {
	t.Helper()
	_, _, v := adminRequest(t, http.MethodGet, c.admin+"/mcp_serializer/sessions")
	tables, _ := v["tables"].([]any)
	sum := 0
	for _, tb := range tables {
		counts, _ := tb.(map[string]any)["counts"].(map[string]any)
		n, _ := counts[name].(float64)
		sum += int(n)
	}
	return sum
}

// metric reads one series of the module's metrics on the admin endpoint,
// named as exposed (`name` or `name{label="value"}`); 0 if it is absent.
// The counters are the process's: compare with a reading taken before.
func (c *testCaddy) metric(t *testing.T, series string) float64 {
	t.Helper()
	resp, err := get(c.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), series+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

// awaitMetric waits until a series of the module's metrics reaches want.
func (c *testCaddy) awaitMetric(t *testing.T, series string, want float64) {
	t.Helper()
	wait.Until(t, fmt.Sprintf("%s at %v", series, want), func() bool { return c.metric(t, series) >= want })
}

// upstream is a scripted MCP upstream that records what reaches it.
type upstream struct {
	mu      sync.Mutex
	seen    []seenRequest
	arrived chan seenRequest // every request, as it arrives
	// answer writes the response; nil answers 200 {"jsonrpc":"2.0","id":1,"result":{}}.
	answer func(w http.ResponseWriter, r *http.Request, body []byte)
}

type seenRequest struct {
	Method           string
	Body             []byte
	ContentLength    int64
	TransferEncoding []string
	Header           http.Header
}

func newUpstream(t testing.TB, answer func(http.ResponseWriter, *http.Request, []byte)) (*upstream, string) {
	u := &upstream{answer: answer, arrived: make(chan seenRequest, 1024)}
	srv := httptest.NewServer(u)
	t.Cleanup(srv.Close)
	return u, srv.Listener.Addr().String()
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s := seenRequest{r.Method, body, r.ContentLength, r.TransferEncoding, r.Header.Clone()}
	u.mu.Lock()
	u.seen = append(u.seen, s)
	u.mu.Unlock()
	u.arrived <- s
	if u.answer != nil {
		u.answer(w, r, body)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
}

func (u *upstream) requests() []seenRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]seenRequest(nil), u.seen...)
}

// next returns the next request to arrive, failing after five seconds.
func (u *upstream) next(t *testing.T) seenRequest {
	t.Helper()
	select {
	case s := <-u.arrived:
		return s
	case <-time.After(5 * time.Second):
		t.Fatal("no request reached the upstream within 5s")
		return seenRequest{}
	}
}

// post sends a JSON-RPC body in session id ("" for none).
func post(t testing.TB, url, id, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if id != "" {
		req.Header.Set("Mcp-Session-Id", id)
	}
	resp, err := do(http.DefaultClient, req)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	return resp
}

// loadCaddy runs cfg in this process until the test ends.
func loadCaddy(t testing.TB, cfg []byte) {
	t.Helper()
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatalf("loading Caddy config: %v\n%s", err, cfg)
	}
	t.Cleanup(func() {
		if err := caddy.Stop(); err != nil {
			t.Errorf("stopping Caddy: %v", err)
		}
		http.DefaultClient.CloseIdleConnections()
	})
}

// rpcError is the error member of a JSON-RPC error response.
type rpcError struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Error   struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// expectRPCError checks a local error reply: status, JSON-RPC shape, id.
func expectRPCError(t *testing.T, resp *http.Response, status int, id string) rpcError {
	t.Helper()
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status {
		t.Fatalf("status = %d, want %d (body %s)", resp.StatusCode, status, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type = %q, want application/json", ct)
	}
	var e rpcError
	if err := json.Unmarshal(body, &e); err != nil || e.JSONRPC != "2.0" || e.Error.Code == 0 || e.Error.Message == "" {
		t.Fatalf("not a JSON-RPC error: %s (%v)", body, err)
	}
	if !bytes.Equal(e.ID, []byte(id)) {
		t.Fatalf("error id = %s, want %s", e.ID, id)
	}
	return e
}

// get sends a GET, and again, up to three times in all, while the
// connection closes before any answer: a reload replaces the admin
// endpoint's listener (and a site's), and the old one, closing, may take
// a fresh connection and drop it unread, or close the keep-alive
// connection the last request went on. A GET changes nothing, so sending
// it again is safe.
func get(url string) (*http.Response, error) {
	for try := 1; ; try++ {
		resp, err := http.Get(url)
		if err == nil || try == 3 || !(errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
			return resp, err
		}
	}
}

// do sends req, and once more if the connection closed before any answer
// came: a reload closes connections Caddy has not read a request from yet,
// so nothing was forwarded. Tests that count at the upstream would still
// see a request forwarded twice.
func do(client *http.Client, req *http.Request) (*http.Response, error) {
	resp, err := client.Do(req)
	if err == nil || req.GetBody == nil || !(errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
		return resp, err
	}
	retry := req.Clone(req.Context())
	if retry.Body, err = req.GetBody(); err != nil {
		return nil, err
	}
	return client.Do(retry)
}
