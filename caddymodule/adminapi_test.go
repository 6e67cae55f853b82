package caddymodule_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func adminRequest(t *testing.T, method, url string) (int, http.Header, map[string]any) {
	t.Helper()
	var resp *http.Response
	var err error
	if method == http.MethodGet {
		resp, err = get(url) // again if a reload closed the connection
	} else {
		req, _ := http.NewRequest(method, url, nil)
		resp, err = http.DefaultClient.Do(req)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var v map[string]any
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("%s %s: %d, not JSON: %s", method, url, resp.StatusCode, body)
	}
	return resp.StatusCode, resp.Header, v
}

// Tables are reported by name, ?table= and ?limit= bound the answer, and
// bad input gets a JSON error with the right status.
func TestAdminSessionsByTableWithLimitsAndErrors(t *testing.T) {
	_, addr := newUpstream(t, nil)
	c := startCaddy(t, fmt.Sprintf(`route /a* {
	mcp_serializer {
		name alpha
	}
	reverse_proxy %s
}
route /b* {
	mcp_serializer {
		name beta
	}
	reverse_proxy %s
}`, addr, addr))
	ctx := context.Background()
	for i := range 5 {
		call(ctx, http.DefaultClient, http.MethodPost, c.url+"/a", fmt.Sprintf("alpha-%d", i), rpcRequest("1", "ping"))
	}
	call(ctx, http.DefaultClient, http.MethodPost, c.url+"/b", "beta-0", rpcRequest("1", "ping"))
	api := c.admin + "/mcp_serializer/sessions"

	status, _, v := adminRequest(t, http.MethodGet, api+"?limit=2")
	tables, _ := v["tables"].([]any)
	if status != http.StatusOK || len(tables) != 2 {
		t.Fatalf("GET: %d %v", status, v)
	}
	alpha, beta := tables[0].(map[string]any), tables[1].(map[string]any)
	if alpha["name"] != "alpha" || beta["name"] != "beta" {
		t.Fatalf("tables not by name in order: %v", v)
	}
	if n := len(alpha["sessions"].([]any)); n != 2 || alpha["matching"] != 5.0 || alpha["counts"].(map[string]any)["sessions"] != 5.0 {
		t.Fatalf("alpha with limit 2: %d listed of %v: %v", n, alpha["matching"], alpha)
	}
	if strings.Contains(fmt.Sprint(v), "alpha-") {
		t.Fatalf("raw session id in %v", v)
	}

	status, _, v = adminRequest(t, http.MethodGet, api+"?table=beta&state=open")
	if tables := v["tables"].([]any); status != http.StatusOK || len(tables) != 1 || tables[0].(map[string]any)["matching"] != 1.0 {
		t.Fatalf("?table=beta&state=open: %d %v", status, v)
	}

	for _, tc := range []struct {
		method, query string
		status        int
	}{
		{http.MethodGet, "?limit=1001", http.StatusBadRequest},
		{http.MethodGet, "?limit=-1", http.StatusBadRequest},
		{http.MethodGet, "?limit=x", http.StatusBadRequest},
		{http.MethodGet, "?state=stuck", http.StatusBadRequest},
		{http.MethodGet, "?table=gamma", http.StatusNotFound},
		{http.MethodDelete, "/NOT-A-HASH", http.StatusBadRequest},
		{http.MethodDelete, "/0123456789ab", http.StatusNotFound},
		{http.MethodGet, "/0123456789ab", http.StatusMethodNotAllowed},
		{http.MethodPut, "", http.StatusMethodNotAllowed},
		{http.MethodGet, "/a/b", http.StatusNotFound},
	} {
		status, _, v := adminRequest(t, tc.method, api+tc.query)
		if status != tc.status || v["error"] == nil {
			t.Errorf("%s %s: %d %v, want %d with an error", tc.method, tc.query, status, v, tc.status)
		}
	}
}

// The admin endpoint reads the session table while the handler creates
// sessions (initialize answered with a new Mcp-Session-Id): run with
// -race, it reads nothing a new session is still being filled in with.
// The upstream holds each initialize answer's body a moment after its
// headers, the time during which the handler has begun the session and
// still serves its initialize exchange.
func TestAdminSessionsPolledWhileSessionsAreCreated(t *testing.T) {
	var n atomic.Int64
	_, addr := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Mcp-Session-Id", fmt.Sprintf("admin-race-%d", n.Add(1)))
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		time.Sleep(time.Millisecond)
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-06-18","capabilities":{},"serverInfo":{"name":"test","version":"1"}}}`)
	})
	c := startCaddy(t, fmt.Sprintf("mcp_serializer\nreverse_proxy %s", addr))
	api := c.admin + "/mcp_serializer/sessions?limit=1000"

	stop := make(chan struct{})
	var polls sync.WaitGroup
	var pollFailures atomic.Int64
	polls.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			resp, err := http.Get(api)
			if err != nil || resp.StatusCode != http.StatusOK {
				pollFailures.Add(1)
			}
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
	})
	const sessions = 200
	var creators sync.WaitGroup
	for w := range 4 {
		creators.Go(func() {
			for range sessions / 4 {
				a := call(context.Background(), http.DefaultClient, http.MethodPost, c.url, "", initializeBody)
				if a.err != nil || a.status != http.StatusOK {
					t.Errorf("initialize from creator %d: %d %v", w, a.status, a.err)
					return
				}
			}
		})
	}
	creators.Wait()
	close(stop)
	polls.Wait()
	if pollFailures.Load() > 0 {
		t.Errorf("%d polls of the admin endpoint failed", pollFailures.Load())
	}
	status, _, v := adminRequest(t, http.MethodGet, api+"&state=initializing")
	tables, _ := v["tables"].([]any)
	if status != http.StatusOK || len(tables) != 1 || tables[0].(map[string]any)["matching"] != float64(sessions) {
		t.Fatalf("after %d initializes: %d %v, want them all initializing", sessions, status, v)
	}
}
