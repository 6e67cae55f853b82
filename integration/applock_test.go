package integration

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The comparison runs compareRounds rounds of compareN/compareRounds
// pipelined connects per path, the paths in a rotated order each round, so
// that a machine that gets busier or quieter during the run favours none.
const (
	compareN      = 300
	compareRounds = 3
)

// appLockDirectives serves the PHP backend with its app lock turned on for
// this site only (FastCGI parameters override the pool's environment), so
// that several sites can share one PHP-FPM pool.
func (f *phpFPM) appLockDirectives(params ...string) string {
	var env strings.Builder
	env.WriteString("\t\tenv MCP_PHP_APP_LOCK 1\n")
	for i := 0; i+1 < len(params); i += 2 {
		fmt.Fprintf(&env, "\t\tenv %s %s\n", params[i], params[i+1])
	}
	return fmt.Sprintf("\troot * %s\n\tphp_fastcgi unix/%s {\n%s\t}\n", f.PublicDir, f.Socket, env.String())
}

// What people do today against what the module does: the same pipelined
// connects of the SDK client, in rounds on the same PHP-FPM pool (8 static
// workers), through Caddy with php_fastcgi alone, with the
// application's own per-session lock (what the Laravel seed does with
// Cache::lock), and with mcp_serializer in front of php_fastcgi. The lock
// stops concurrent requests of a session from overwriting each other's
// saves but not from running out of order: a request that gets the lock
// before notifications/initialized is still rejected. The module does both.
// The test logs the comparison as a table (docs/benchmarks.md, "Against
// an app lock").
func TestAppLockComparedWithTheModule(t *testing.T) {
	prerequisites(t)
	fpm := startPHPFPM(t, phpFPMOptions{Workers: 8})
	paths := []struct {
		name string
		site string
	}{
		{"Caddy `php_fastcgi`, no protection", fpm.fastcgiDirectives()},
		{"Caddy `php_fastcgi`, app lock (`MCP_PHP_APP_LOCK=1`)", fpm.appLockDirectives()},
		{"Caddy `mcp_serializer` + `php_fastcgi`", "\tmcp_serializer\n" + fpm.fastcgiDirectives()},
	}
	bases := make([]string, len(paths))
	for i, p := range paths {
		bases[i] = startCaddy(t, caddySite(p.site))
	}
	results := make([]pipelineResult, len(paths))
	for round := range compareRounds {
		for k := range paths {
			i := (round + k) % len(paths)
			var res pipelineResult
			// --get skip on every path: the SDK's GET stream would pin a
			// worker per session; this compares the POSTs.
			runClient(t, 10*time.Minute, &res, "pipeline", "--url", bases[i]+"/mcp",
				"--n", strconv.Itoa(compareN/compareRounds), "--concurrency", "8", "--get", "skip")
			t.Logf("round %d/%d, %s: %s", round+1, compareRounds, paths[i].name, res.summary())
			logSamples(t, res.Samples)
			if res.Error != "" {
				t.Fatalf("%s: client error: %s", paths[i].name, res.Error)
			}
			results[i] = results[i].add(res)
		}
	}
	t.Logf("PHP error log (all paths): %s", fpm.logSummary())

	var table strings.Builder
	table.WriteString("\n| Path | Connects | Sessions with a failure | Rejected (-32600) | HTTP errors | Reply with the wrong id | Sessions left broken | Connect p50 | Connect p99 |\n|---|---|---|---|---|---|---|---|---|\n")
	for i, p := range paths {
		r := results[i]
		fmt.Fprintf(&table, "| %s | %d | %d (%.0f%%) | %d | %s | %d | %d | %.0f ms | %.0f ms |\n",
			p.name, r.N, r.FailedSessions, 100*float64(r.FailedSessions)/float64(max(r.N, 1)),
			r.Rejections, httpErrorCells(r), r.IDMismatches, r.Broken, percentileMs(r.ConnectMs, 0.50), percentileMs(r.ConnectMs, 0.99))
	}
	t.Logf("%d pipelined connects per path (%d rounds, paths rotated), 8 at a time, same PHP-FPM pool (8 static workers):%s",
		compareN, compareRounds, table.String())

	direct, locked, module := results[0], results[1], results[2]
	if direct.Connects == 0 || locked.Connects == 0 {
		t.Fatalf("no connect succeeded without the module (%d direct, %d with the app lock): the backend does not work at all", direct.Connects, locked.Connects)
	}
	if direct.FailedSessions == 0 {
		t.Errorf("no protection: expected sessions with failures, got none: the race is not reproduced")
	}
	// The lock serializes the saves: no reply lost or handed to another
	// request, no session left broken.
	if locked.Broken != 0 || locked.IDMismatches != 0 || locked.HTTPErrorCount != 0 || locked.UnexpectedReplies != 0 {
		t.Errorf("app lock: broken sessions %d, id mismatches %d, HTTP errors %v, unexpected replies %d; want none (the lock serializes load and save)",
			locked.Broken, locked.IDMismatches, locked.HTTPErrors, locked.UnexpectedReplies)
	}
	// ... but it does not order: requests that took the lock before
	// notifications/initialized are rejected.
	if locked.Rejections == 0 {
		t.Errorf("app lock: expected some -32600 rejections (a lock does not order the requests), got none")
	}
	if module.Failures != 0 || module.FailedSessions != 0 || module.Connects != compareN {
		t.Errorf("mcp_serializer: %d failures in %d sessions, %d of %d connects; want none and all", module.Failures, module.FailedSessions, module.Connects, compareN)
	}
}

// add sums two runs' counts and joins their connect times.
func (r pipelineResult) add(o pipelineResult) pipelineResult {
	sum := r
	sum.N += o.N
	sum.Connects += o.Connects
	sum.FailedConnects += o.FailedConnects
	sum.Rejections += o.Rejections
	sum.HTTPErrorCount += o.HTTPErrorCount
	sum.IDMismatches += o.IDMismatches
	sum.Broken += o.Broken
	sum.UnexpectedReplies += o.UnexpectedReplies
	sum.FailedSessions += o.FailedSessions
	sum.Failures += o.Failures
	sum.ElapsedMs += o.ElapsedMs
	sum.ConnectTimed += o.ConnectTimed
	sum.ConnectMs = append(slices.Clone(r.ConnectMs), o.ConnectMs...)
	sum.HTTPErrors = addCounts(r.HTTPErrors, o.HTTPErrors)
	sum.GetStatuses = addCounts(r.GetStatuses, o.GetStatuses)
	sum.ConnectP50Ms, sum.ConnectP99Ms = percentileMs(sum.ConnectMs, 0.50), percentileMs(sum.ConnectMs, 0.99)
	return sum
}

func addCounts(a, b map[string]int) map[string]int {
	sum := make(map[string]int, len(a)+len(b))
	for k, v := range a {
		sum[k] += v
	}
	for k, v := range b {
		sum[k] += v
	}
	return sum
}

// percentileMs is the nearest-rank percentile, as the client computes it.
func percentileMs(ms []float64, p float64) float64 {
	if len(ms) == 0 {
		return 0
	}
	s := slices.Clone(ms)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// httpErrorCells is the HTTP error count with its breakdown, for the table.
func httpErrorCells(r pipelineResult) string {
	if r.HTTPErrorCount == 0 {
		return "0"
	}
	keys := make([]string, 0, len(r.HTTPErrors))
	for k := range r.HTTPErrors {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d × %s", r.HTTPErrors[k], k)
	}
	return fmt.Sprintf("%d (%s)", r.HTTPErrorCount, strings.Join(parts, ", "))
}

// With the app lock on, a request that cannot get its session's lock within
// the wait fails the way Laravel shows a LockTimeoutException: HTTP 500,
// here with a JSON-RPC error body. A lock whose holder outlives its expiry
// frees itself: the next request gets it without waiting for the holder.
func TestAppLockTimesOutAndExpires(t *testing.T) {
	prerequisites(t)
	// slow_count streams inside the lock: 20 steps of 150 ms hold it for 3 s.
	fpm := startPHPFPM(t, phpFPMOptions{AppLock: true, ProgressMS: 150})
	client := &http.Client{Timeout: 30 * time.Second}

	t.Run("wait runs out", func(t *testing.T) {
		url := startCaddy(t, caddySite(fpm.appLockDirectives("MCP_PHP_LOCK_WAIT_MS", "300"))) + "/mcp"
		session := openSession(t, client, url)
		holding, done := holdLock(t, client, url, session)
		<-holding
		resp, body := post(t, client, url, session, `{"jsonrpc":"2.0","id":7,"method":"tools/list"}`)
		t.Logf("tools/list while the lock is held: %d %s", resp.StatusCode, body)
		if resp.StatusCode != http.StatusInternalServerError || !strings.Contains(string(body), `"code":-32603`) {
			t.Errorf("tools/list while the lock is held: status %d, body %s; want 500 with a -32603 JSON-RPC error", resp.StatusCode, body)
		}
		if err := <-done; err != nil {
			t.Fatalf("slow_count holding the lock: %v", err)
		}
		resp, body = post(t, client, url, session, `{"jsonrpc":"2.0","id":8,"method":"tools/list"}`)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"slow_count"`) {
			t.Errorf("tools/list after the lock was released: status %d, body %s", resp.StatusCode, body)
		}
	})

	t.Run("lock expires", func(t *testing.T) {
		url := startCaddy(t, caddySite(fpm.appLockDirectives("MCP_PHP_LOCK_SECONDS", "1"))) + "/mcp"
		session := openSession(t, client, url)
		holding, done := holdLock(t, client, url, session)
		<-holding
		resp, body := post(t, client, url, session, `{"jsonrpc":"2.0","id":7,"method":"tools/list"}`)
		select {
		case err := <-done:
			t.Errorf("tools/list was answered only after the holder ended (%v): the expired lock did not free itself", err)
		default:
		}
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"slow_count"`) {
			t.Errorf("tools/list after the lock expired: status %d, body %s", resp.StatusCode, body)
		}
		if err := <-done; err != nil {
			t.Fatalf("slow_count holding the lock: %v", err)
		}
	})
}

// openSession runs initialize and notifications/initialized one after the
// other and returns the session id.
func openSession(t *testing.T, client *http.Client, url string) string {
	t.Helper()
	resp, body := post(t, client, url, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"go-test","version":"1"}}}`)
	session := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || session == "" {
		t.Fatalf("initialize: status %d, session %q, body %s", resp.StatusCode, session, body)
	}
	resp, body = post(t, client, url, session, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("notifications/initialized: status %d, body %s", resp.StatusCode, body)
	}
	return session
}

// holdLock starts a slow_count of 20 steps on the session, which holds the
// session's lock while it streams. holding is closed once its first event
// arrived (the lock is held); done gets the call's outcome when it ends.
func holdLock(t *testing.T, client *http.Client, url, session string) (holding <-chan struct{}, done <-chan error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"slow_count","arguments":{"n":20},"_meta":{"progressToken":"p"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", session)
	h := make(chan struct{})
	d := make(chan error, 1)
	var once sync.Once
	go func() {
		defer once.Do(func() { close(h) })
		resp, err := client.Do(req)
		if err != nil {
			d <- err
			return
		}
		defer resp.Body.Close()
		first := make([]byte, 1)
		if _, err := io.ReadFull(resp.Body, first); err != nil {
			d <- fmt.Errorf("status %d, no event: %w", resp.StatusCode, err)
			return
		}
		once.Do(func() { close(h) })
		rest, err := io.ReadAll(resp.Body)
		if err == nil && !strings.Contains(string(rest), "counted to 20") {
			err = fmt.Errorf("status %d, no result in %q", resp.StatusCode, tail(string(rest), 300))
		}
		d <- err
	}()
	return h, d
}
