package integration

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
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
