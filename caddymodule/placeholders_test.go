package caddymodule_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func hashOf(sid string) string {
	sum := sha256.Sum256([]byte(sid))
	return hex.EncodeToString(sum[:6])
}

// echoPlaceholders sends the module's placeholders back to the client
// (header, deferred to the response) and to the upstream (header_up),
// each in brackets so that an empty value shows as "[]" and an unknown
// placeholder stays visible.
const echoPlaceholders = `header {
	defer
	X-Session-Hash "[{http.mcp.session_hash}]"
	X-Method "[{http.mcp.method}]"
	X-Queue-Wait "[{http.mcp.queue_wait}]"
	X-Held "[{http.mcp.held}]"
}
mcp_serializer {
	init_timeout 10s
	get_stream forward
}
reverse_proxy %s {
	header_up X-Session-Hash "[{http.mcp.session_hash}]"
	header_up X-Method "[{http.mcp.method}]"
	header_up X-Held "[{http.mcp.held}]"
}`

type echoed struct{ hash, method, wait, held string }

func echoedBy(h http.Header) echoed {
	return echoed{h.Get("X-Session-Hash"), h.Get("X-Method"), h.Get("X-Queue-Wait"), h.Get("X-Held")}
}

func TestPlaceholdersReachHeaderAndLaterHandlers(t *testing.T) {
	const sid = "placeholder-session-0123456789"
	up, addr := newUpstream(t, mcpAnswer(sid, nil))
	c := startCaddy(t, fmt.Sprintf(echoPlaceholders, addr))
	ctx := context.Background()
	hash := "[" + hashOf(sid) + "]"

	// initialize: no session yet, so its body is not read; the response
	// creates the session, and names it.
	a := call(ctx, http.DefaultClient, http.MethodPost, c.url, "", initializeBody)
	if got, want := echoedBy(a.header), (echoed{hash, "[]", "[0s]", "[false]"}); got != want {
		t.Errorf("initialize: echoed %+v, want %+v", got, want)
	}
	if got := echoedBy(up.next(t).Header); got.hash != "[]" || got.method != "[]" || got.held != "[false]" {
		t.Errorf("initialize upstream saw %+v, want empty values", got)
	}

	// A request held at the gate until initialized is acknowledged.
	holds := c.metric(t, "caddy_mcp_serializer_gate_holds_total")
	held := callAsync(ctx, http.MethodPost, c.url, sid, rpcRequest("2", "tools/list"))
	stream := callAsync(ctx, http.MethodGet, c.url, sid, "")
	c.awaitMetric(t, "caddy_mcp_serializer_gate_holds_total", holds+2)
	time.Sleep(200 * time.Millisecond) // held for 200ms at least
	a = call(ctx, http.DefaultClient, http.MethodPost, c.url, sid, initializedBody)
	if got, want := echoedBy(a.header), (echoed{hash, "[notifications/initialized]", "[0s]", "[false]"}); got != want {
		t.Errorf("initialized: echoed %+v, want %+v", got, want)
	}
	a = await(t, held, 5*time.Second, "held tools/list")
	got := echoedBy(a.header)
	wait, err := time.ParseDuration(strings.Trim(got.wait, "[]"))
	if got.hash != hash || got.method != "[tools/list]" || got.held != "[true]" || err != nil || wait < 100*time.Millisecond {
		t.Errorf("held tools/list: echoed %+v, want its hash, method, held and a wait of at least the 200ms it was held", got)
	}

	a = await(t, stream, 5*time.Second, "GET stream held at the gate")
	if got := echoedBy(a.header); got.hash != hash || got.method != "[]" || got.held != "[true]" || got.wait == "[0s]" {
		t.Errorf("GET stream: echoed %+v, want its hash, no method, held, a wait", got)
	}

	// What the upstream saw, through header_up.
	seen := map[string]echoed{}
	for _, r := range up.requests() {
		seen[parseRPC(r.Body).label()] = echoedBy(r.Header)
	}
	if e := seen["tools/list#2"]; e.hash != hash || e.method != "[tools/list]" || e.held != "[true]" {
		t.Errorf("upstream saw tools/list with %+v", e)
	}

	for _, tc := range []struct{ name, method, body, want string }{
		{"batch", http.MethodPost, `[{"jsonrpc":"2.0","id":3,"method":"ping"},{"jsonrpc":"2.0","id":4,"method":"ping"}]`, "[batch]"},
		{"response", http.MethodPost, `{"jsonrpc":"2.0","id":0,"result":{}}`, "[response]"},
		{"malformed", http.MethodPost, `{"jsonrpc":`, "[]"},
		// The client chooses the method: shown printable and cut to 128 bytes.
		{"hostile method", http.MethodPost, `{"jsonrpc":"2.0","id":6,"method":"tools/list\r\n\u001b[2J` + strings.Repeat("x", 300) + `"}`,
			"[tools/list\ufffd\ufffd\ufffd[2J" + strings.Repeat("x", 128-22) + "]"},
		{"DELETE", http.MethodDelete, "", "[]"},
	} {
		a := call(ctx, http.DefaultClient, tc.method, c.url, sid, tc.body)
		if got := echoedBy(a.header); got.method != tc.want || got.hash != hash || got.held != "[false]" {
			t.Errorf("%s: echoed %+v, want method %s", tc.name, got, tc.want)
		}
	}

	// Without a session, every placeholder is known and empty.
	a = call(ctx, http.DefaultClient, http.MethodPost, c.url, "", rpcRequest("5", "tools/list"))
	if got, want := echoedBy(a.header), (echoed{"[]", "[]", "[0s]", "[false]"}); got != want {
		t.Errorf("session-less POST: echoed %+v, want %+v", got, want)
	}
}

// The access log gets mcp_session_hash, mcp_method and mcp_queue_wait with
// no configuration, and, with the README's filter on the header, holds the
// session id nowhere.
func TestAccessLogCarriesSessionHashMethodAndWait(t *testing.T) {
	const sid = "access-log-SeCrEt-0123456789abcdef"
	logFile := filepath.Join(t.TempDir(), "access.log")
	_, addr := newUpstream(t, mcpAnswer(sid, nil))
	c := startCaddy(t, fmt.Sprintf(`log {
	output file %s
	format filter {
		request>headers>Mcp-Session-Id hash
		resp_headers>Mcp-Session-Id hash
	}
}
mcp_serializer
reverse_proxy %s`, logFile, addr))
	ctx := context.Background()

	call(ctx, http.DefaultClient, http.MethodPost, c.url, "", initializeBody)
	held := callAsync(ctx, http.MethodPost, c.url, sid, rpcRequest("2", "tools/list"))
	c.awaitWaiting(t, 1)
	time.Sleep(200 * time.Millisecond) // held for 200ms at least
	call(ctx, http.DefaultClient, http.MethodPost, c.url, sid, initializedBody)
	await(t, held, 5*time.Second, "held tools/list")
	call(ctx, http.DefaultClient, http.MethodPost, c.url, sid, `[{"jsonrpc":"2.0","id":3,"method":"ping"}]`)
	call(ctx, http.DefaultClient, http.MethodPost, c.url, "", rpcRequest("4", "tools/list"))

	want := []struct {
		method string
		held   bool // so waited at least the 200ms
	}{{"", false}, {"notifications/initialized", false}, {"tools/list", true}, {"batch", false}}
	var entries []map[string]any
	deadline := time.Now().Add(5 * time.Second)
	for {
		data, err := os.ReadFile(logFile)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		if bytes.Contains(data, []byte(sid)) {
			t.Fatalf("the access log holds the session id:\n%s", data)
		}
		entries = entries[:0]
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var e map[string]any
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				t.Fatalf("access log line is not JSON: %s", sc.Text())
			}
			entries = append(entries, e)
		}
		if len(entries) >= 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d access log entries within 5s, want 5:\n%s", len(entries), data)
		}
		time.Sleep(20 * time.Millisecond)
	}

	byMethod := map[string]map[string]any{}
	var sessionless map[string]any
	for _, e := range entries {
		if _, ok := e["mcp_session_hash"]; !ok {
			sessionless = e
			continue
		}
		byMethod[fmt.Sprint(e["mcp_method"])] = e
	}
	for _, w := range want {
		e, ok := byMethod[w.method]
		if !ok {
			t.Errorf("no access log entry with mcp_method %q; entries: %v", w.method, entries)
			continue
		}
		if e["mcp_session_hash"] != hashOf(sid) {
			t.Errorf("%q: mcp_session_hash = %v, want %s", w.method, e["mcp_session_hash"], hashOf(sid))
		}
		wait, ok := e["mcp_queue_wait"].(float64) // seconds, as Caddy logs durations
		if !ok || (w.held && wait < 0.1) || (!w.held && wait > 0.1) {
			t.Errorf("%q: mcp_queue_wait = %v, held %v", w.method, e["mcp_queue_wait"], w.held)
		}
	}
	if sessionless == nil {
		t.Error("the session-less request has no access log entry without mcp fields")
	}
}
