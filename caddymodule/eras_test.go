package caddymodule_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// modernPOST sends a session-less MCP 2026-07-28 request: the method in
// Mcp-Method, the version in MCP-Protocol-Version, and a cart handle in
// Mcp-Param-Cart when cart is not empty.
func modernPOST(url, method, cart, body string) (*http.Response, error) {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", method)
	if cart != "" {
		req.Header.Set("Mcp-Param-Cart", cart)
	}
	return http.DefaultClient.Do(req)
}

// concurrencyUpstream answers after a pause and records, per Mcp-Param-Cart
// value, the most requests it ever had at once.
type concurrencyUpstream struct {
	mu      sync.Mutex
	now     map[string]int
	most    map[string]int
	arrived []string
}

func (u *concurrencyUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	cart := r.Header.Get("Mcp-Param-Cart")
	u.mu.Lock()
	u.now[cart]++
	u.most[cart] = max(u.most[cart], u.now[cart])
	u.arrived = append(u.arrived, string(body))
	u.mu.Unlock()
	time.Sleep(30 * time.Millisecond)
	u.mu.Lock()
	u.now[cart]--
	u.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
}

func startConcurrencyUpstream(t *testing.T) (*concurrencyUpstream, string) {
	u := &concurrencyUpstream{now: map[string]int{}, most: map[string]int{}}
	srv := httptest.NewServer(u)
	t.Cleanup(srv.Close)
	return u, srv.Listener.Addr().String()
}

func TestKeyRunsSessionlessRequestsOneAtATimePerValue(t *testing.T) {
	up, addr := startConcurrencyUpstream(t)
	c := startCaddy(t, fmt.Sprintf("mcp_serializer {\n\tkey {http.request.header.Mcp-Param-Cart}\n}\nreverse_proxy %s", addr))
	var wg sync.WaitGroup
	var failed atomic.Int32
	send := func(cart string, i int) {
		defer wg.Done()
		resp, err := modernPOST(c.url, "tools/call", cart,
			fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"cart_add","arguments":{"cart":%q,"item":"x"}}}`, i, cart))
		if err != nil || resp.StatusCode != http.StatusOK {
			failed.Add(1)
			return
		}
		resp.Body.Close()
	}
	for i := range 8 {
		wg.Add(3)
		go send("cart-a", i)
		go send("cart-b", i)
		go send("", i) // no handle: not queued
	}
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d requests failed", failed.Load())
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	if up.most["cart-a"] != 1 || up.most["cart-b"] != 1 {
		t.Errorf("most at once per cart: a=%d b=%d, want 1 each", up.most["cart-a"], up.most["cart-b"])
	}
	if up.most[""] < 2 {
		t.Errorf("requests without a cart ran at most %d at once: they must not be queued", up.most[""])
	}
}

func TestInitializeWithAKeyStillStartsAGatedSession(t *testing.T) {
	const sid = "keyed-initialize-session-0123"
	up, addr := newUpstream(t, mcpAnswer(sid, nil))
	c := startCaddy(t, fmt.Sprintf("mcp_serializer {\n\tkey {http.request.header.X-Tenant}\n\tinit_timeout 10s\n}\nreverse_proxy %s", addr))
	req, _ := http.NewRequest(http.MethodPost, c.url, strings.NewReader(initializeBody))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Tenant", "t1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	up.next(t)
	held := callAsync(t.Context(), http.MethodPost, c.url, sid, rpcRequest("2", "tools/list"))
	select {
	case <-held:
		t.Fatal("a follow-up of a session whose initialize carried a key went before notifications/initialized")
	case <-time.After(200 * time.Millisecond):
	}
	call(t.Context(), http.DefaultClient, http.MethodPost, c.url, sid, initializedBody)
	await(t, held, 5*time.Second, "held tools/list")
}

func TestModernRequestsNameTheirMethodAndVersionFromHeadersBodyUntouched(t *testing.T) {
	up, addr := newUpstream(t, nil)
	c := startCaddy(t, fmt.Sprintf(`header {
	defer
	X-Method "[{http.mcp.method}]"
	X-Version "[{http.mcp.protocol_version}]"
}
mcp_serializer
reverse_proxy %s`, addr))
	// The body says otherwise: the headers are what the placeholders read.
	body := `{"jsonrpc":"2.0","id":"d","method":"something/else"}` + "\n  "
	resp, err := modernPOST(c.url, "server/discover", "", body)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if m, v := resp.Header.Get("X-Method"), resp.Header.Get("X-Version"); m != "[server/discover]" || v != "[2026-07-28]" {
		t.Errorf("placeholders: method %s, version %s; want [server/discover], [2026-07-28]", m, v)
	}
	seen := up.next(t)
	if !bytes.Equal(seen.Body, []byte(body)) || seen.ContentLength != int64(len(body)) {
		t.Errorf("upstream got %q (Content-Length %d), want the body untouched", seen.Body, seen.ContentLength)
	}
}
