package caddymodule_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/fcgi"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/redistest"
	"github.com/mcpserializer/caddy-mcp-serializer/owner"
	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// upstreamID is the upstream's part of a client's session id: the id
// whole when it names no owner.
func upstreamID(clientID string) string {
	_, up, _ := owner.SplitOwner(clientID)
	return up
}

// echoingUpstream is an MCP upstream that, as the TypeScript SDK's server
// does, puts the session's id on every response of a session (the
// client adopts whichever it gets); initialize mints the id mint returns.
// GET answers an event stream with one event, and a tools/call named
// "sse" is answered as an event stream.
func echoingUpstream(t *testing.T, mint func() string) (*upstream, string) {
	t.Helper()
	return newUpstream(t, echoingAnswer(mint))
}

// echoingAnswer is echoingUpstream's answer function.
func echoingAnswer(mint func() string) func(http.ResponseWriter, *http.Request, []byte) {
	return func(w http.ResponseWriter, r *http.Request, body []byte) {
		m := parseRPC(body)
		if id := r.Header.Get("Mcp-Session-Id"); id != "" {
			w.Header().Set("Mcp-Session-Id", id)
		}
		switch {
		case r.Method == http.MethodGet:
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\"}\n\n")
		case r.Method == http.MethodDelete:
			w.WriteHeader(http.StatusOK)
		case m.Method == "initialize":
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Mcp-Session-Id", mint())
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-06-18","capabilities":{},"serverInfo":{"name":"test","version":"1"}}}`, m.ID)
		case len(m.ID) == 0:
			w.WriteHeader(http.StatusAccepted)
		case strings.Contains(string(body), `"sse"`):
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{}}\n\n", m.ID)
		default:
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{}}`, m.ID)
		}
	}
}

// expectUpstreamSawOnly checks that every request of a session reached
// the upstream with one Mcp-Session-Id, one of ids (initialize carries
// none).
func expectUpstreamSawOnly(t *testing.T, up *upstream, ids ...string) {
	t.Helper()
	for _, r := range up.requests() {
		got := r.Header.Values("Mcp-Session-Id")
		if r.Method == http.MethodPost && parseRPC(r.Body).Method == "initialize" {
			if len(got) != 0 {
				t.Errorf("initialize reached the upstream with Mcp-Session-Id %q", got)
			}
			continue
		}
		if len(got) != 1 || !slices.Contains(ids, got[0]) {
			t.Errorf("%s %s reached the upstream with Mcp-Session-Id %q, want one of %q", r.Method, r.Body, got, ids)
		}
	}
}

// tableSessions lists the session hashes the admin API shows in table
// name.
func tableSessions(t *testing.T, admin, name string) []string {
	t.Helper()
	_, _, v := adminRequest(t, http.MethodGet, admin+"/mcp_serializer/sessions?table="+name)
	tables, _ := v["tables"].([]any)
	var hashes []string
	for _, tb := range tables {
		sessions, _ := tb.(map[string]any)["sessions"].([]any)
		for _, s := range sessions {
			h, _ := s.(map[string]any)["session_hash"].(string)
			hashes = append(hashes, h)
		}
	}
	return hashes
}

// With order owner, the client's id names the instance that serves its
// session, on initialize's answer and on every later answer that carries
// the id (forwarded, event streams, GET and DELETE included); the
// upstream sees only the id it minted, and the table and the admin API
// know the session by it.
func TestWithOrderOwnerTheClientsIdNamesItsOwnerAndTheUpstreamSeesOnlyItsOwn(t *testing.T) {
	var minted atomic.Int64
	up, addr := echoingUpstream(t, func() string { return fmt.Sprintf("up-%d", minted.Add(1)) })
	in := startOwnerInstances(t, addr, "get_stream forward")
	ctx := context.Background()

	created := call(ctx, http.DefaultClient, http.MethodPost, in.a, "", initializeBody)
	cid := created.header.Get("Mcp-Session-Id")
	ida, upID, ok := owner.SplitOwner(cid)
	if created.status != http.StatusOK || !ok || upID != "up-1" || !serializer.ValidSessionID(cid) {
		t.Fatalf("initialize: %d, Mcp-Session-Id %q; want the upstream's up-1 with the instance's ID", created.status, cid)
	}
	expect := func(what string, a answer, status int) {
		t.Helper()
		if a.err != nil || a.status != status {
			t.Fatalf("%s: %d %v %s; want %d", what, a.status, a.err, a.body, status)
		}
		if got := a.header.Values("Mcp-Session-Id"); len(got) != 1 || got[0] != cid {
			t.Fatalf("%s: the client got Mcp-Session-Id %q, want %q", what, got, cid)
		}
	}
	expect("initialized at the owner", call(ctx, http.DefaultClient, http.MethodPost, in.a, cid, initializedBody), http.StatusAccepted)
	in.waitForOwnerRecord(t, "up-1")
	expect("tools/list forwarded", call(ctx, http.DefaultClient, http.MethodPost, in.b, cid, rpcRequest("2", "tools/list")), http.StatusOK)
	sse := call(ctx, http.DefaultClient, http.MethodPost, in.a, cid, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"sse"}}`)
	expect("a call answered as an event stream", sse, http.StatusOK)
	if !strings.Contains(string(sse.body), `"id":3`) {
		t.Fatalf("the event stream: %s", sse.body)
	}
	expect("GET at the owner", call(ctx, http.DefaultClient, http.MethodGet, in.a, cid, ""), http.StatusOK)
	expect("GET forwarded", call(ctx, http.DefaultClient, http.MethodGet, in.b, cid, ""), http.StatusOK)
	if got, want := tableSessions(t, in.admin, "a"), []string{serializer.SessionHash("up-1")}; !slices.Equal(got, want) {
		t.Fatalf("the owner's table holds %q, want the upstream id's hash %q", got, want)
	}

	// A session created on the other instance names that one.
	other := call(ctx, http.DefaultClient, http.MethodPost, in.b, "", initializeBody)
	idb, upID, ok := owner.SplitOwner(other.header.Get("Mcp-Session-Id"))
	if !ok || upID != "up-2" || idb == ida {
		t.Fatalf("a session created on b: Mcp-Session-Id %q; want up-2 with b's ID, not a's (%s)", other.header.Get("Mcp-Session-Id"), ida)
	}

	expect("DELETE forwarded", call(ctx, http.DefaultClient, http.MethodDelete, in.b, cid, ""), http.StatusOK)
	if n := len(up.requests()); n != 8 {
		t.Fatalf("the upstream saw %d requests, want 8: %q", n, up.labels())
	}
	expectUpstreamSawOnly(t, up, "up-1", "up-2")
}

// The notifications/initialized that on_init_timeout synthesize sends
// reaches the upstream with the upstream's id, as the client's own does,
// even when that id itself names an owner (another such cluster behind
// this one): exactly one owner comes off.
func TestTheSynthesizedInitializedCarriesTheUpstreamsId(t *testing.T) {
	const inner = "mcps1.00000000000000aa.inner"
	up, addr := echoingUpstream(t, func() string { return inner })
	in := startOwnerInstances(t, addr, "init_timeout 200ms", "on_init_timeout synthesize")
	ctx := context.Background()

	created := call(ctx, http.DefaultClient, http.MethodPost, in.a, "", initializeBody)
	cid := created.header.Get("Mcp-Session-Id")
	if created.status != http.StatusOK || upstreamID(cid) != inner || cid == inner {
		t.Fatalf("initialize: %d, Mcp-Session-Id %q; want %q with the instance's ID", created.status, cid, inner)
	}
	// Held at the gate until the synthesized notification has ended.
	expectResult(t, call(ctx, http.DefaultClient, http.MethodPost, in.a, cid, rpcRequest("2", "tools/list")), "2")
	if n := up.count("notifications/initialized"); n != 1 {
		t.Fatalf("%d notifications/initialized reached the upstream, want 1 (synthesized): %q", n, up.labels())
	}
	expectUpstreamSawOnly(t, up, inner)
}

// One instance without state, or with state and order local, leaves ids
// as the upstream minted them, byte for byte, even one that looks like
// an id naming its owner.
func TestWithoutOwnersIdsPassUntouched(t *testing.T) {
	const sid = "mcps1.0123456789abcdef.x"
	redisAddr := redistest.Start(t)
	for _, c := range []struct{ name, settings string }{
		{"no state", ""},
		{"state redis, order local", "\n\tstate redis " + redisAddr + "\n\torder local"},
	} {
		t.Run(c.name, func(t *testing.T) {
			up, addr := echoingUpstream(t, func() string { return sid })
			site := startCaddy(t, "mcp_serializer {\n\tget_stream forward"+c.settings+"\n}\nreverse_proxy "+addr)
			ctx := context.Background()
			for _, step := range []struct {
				method, id, body string
				status           int
			}{
				{http.MethodPost, "", initializeBody, http.StatusOK},
				{http.MethodPost, sid, initializedBody, http.StatusAccepted},
				{http.MethodPost, sid, rpcRequest("2", "tools/list"), http.StatusOK},
				{http.MethodGet, sid, "", http.StatusOK},
				{http.MethodDelete, sid, "", http.StatusOK},
			} {
				a := call(ctx, http.DefaultClient, step.method, site.url, step.id, step.body)
				if a.err != nil || a.status != step.status || a.header.Get("Mcp-Session-Id") != sid {
					t.Fatalf("%s %s: %d %v, Mcp-Session-Id %q; want %d with %q", step.method, step.body, a.status, a.err, a.header.Get("Mcp-Session-Id"), step.status, sid)
				}
			}
			expectUpstreamSawOnly(t, up, sid)
		})
	}
}

// A session begun before owners were carried keeps its id, which names
// no owner: the module uses it whole, and it is the same session as the
// id that names its owner.
func TestAnIdThatNamesNoOwnerIsUsedWhole(t *testing.T) {
	const sid = "legacy-1"
	up, addr := echoingUpstream(t, func() string { return sid })
	in := startOwnerInstances(t, addr)
	ctx := context.Background()

	cid := call(ctx, http.DefaultClient, http.MethodPost, in.a, "", initializeBody).header.Get("Mcp-Session-Id")
	if upstreamID(cid) != sid || cid == sid {
		t.Fatalf("initialize: Mcp-Session-Id %q, want %q with the instance's ID", cid, sid)
	}
	if a := call(ctx, http.DefaultClient, http.MethodPost, in.a, sid, initializedBody); a.status != http.StatusAccepted {
		t.Fatalf("initialized with the id whole: %d %s", a.status, a.body)
	}
	in.waitForOwnerRecord(t, sid)
	for i, step := range []struct{ site, id string }{{in.b, sid}, {in.b, cid}, {in.a, sid}, {in.a, cid}} {
		reqID := fmt.Sprint(i + 2)
		expectResult(t, call(ctx, http.DefaultClient, http.MethodPost, step.site, step.id, rpcRequest(reqID, "tools/list")), reqID)
	}
	if got, want := tableSessions(t, in.admin, "a"), []string{serializer.SessionHash(sid)}; !slices.Equal(got, want) {
		t.Fatalf("the owner's table holds %q, want one session, %q", got, want)
	}
	if n := len(up.requests()); n != 6 {
		t.Fatalf("the upstream saw %d requests, want 6: %q", n, up.labels())
	}
	expectUpstreamSawOnly(t, up, sid)
}

// With order owner, the module's logs and the access log's
// mcp_session_hash name a session by its upstream id's hash, as the
// admin API does, whichever id the client sent: never the raw id.
func TestWithOrderOwnerLogsHashTheUpstreamsId(t *testing.T) {
	secret := make([]byte, 8)
	rand.Read(secret)
	sid := "SeCrEt-" + hex.EncodeToString(secret)
	release := make(chan struct{})
	defer close(release)
	answer := echoingAnswer(func() string { return sid })
	up, addr := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if parseRPC(body).Method == "block" {
			<-release
		}
		answer(w, r, body)
	})
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	c := startCaddyLogging(t, logFile, "mcp_serializer {\n\tstate redis "+redistest.Start(t)+"\n\tqueue_timeout 200ms\n}\nreverse_proxy "+addr)
	ctx := context.Background()

	cid := call(ctx, http.DefaultClient, http.MethodPost, c.url, "", initializeBody).header.Get("Mcp-Session-Id")
	if upstreamID(cid) != sid || cid == sid {
		t.Fatalf("initialize: Mcp-Session-Id %q, want %q with the instance's ID", cid, sid)
	}
	if a := call(ctx, http.DefaultClient, http.MethodPost, c.url, cid, initializedBody); a.status != http.StatusAccepted {
		t.Fatalf("initialized: %d %s", a.status, a.body)
	}
	blocked := callAsync(ctx, http.MethodPost, c.url, cid, rpcRequest("2", "block"))
	for parseRPC(up.next(t).Body).Method != "block" {
	}
	// Answered locally: it times out behind the blocked call.
	expectRPCError(t, call(ctx, http.DefaultClient, http.MethodPost, c.url, cid, rpcRequest("3", "ping")).asResponse(), http.StatusServiceUnavailable, "3")
	release <- struct{}{}
	expectResult(t, await(t, blocked, 5*time.Second, "the blocked call"), "2")

	want := serializer.SessionHash(sid)
	module, _ := readLogs(t, logFile, sid, cid)
	named := map[string]bool{}
	for _, l := range module {
		if s, ok := l["session"]; ok {
			if s != want {
				t.Errorf("a log line names session %v, want %s (the upstream id's hash): %v", s, want, l)
			}
			named[fmt.Sprint(l["msg"])] = true
		}
	}
	for _, msg := range []string{"session created, held until initialized", "request answered locally"} {
		if !named[msg] {
			t.Errorf("no log line %q naming the session; named: %v", msg, named)
		}
	}
	data, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	accessLines := 0
	for line := range strings.Lines(string(data)) {
		var entry map[string]any
		if json.Unmarshal([]byte(line), &entry) != nil || !strings.HasPrefix(fmt.Sprint(entry["logger"]), "http.log.access") {
			continue
		}
		if h, ok := entry["mcp_session_hash"]; ok {
			accessLines++
			if h != want {
				t.Errorf("an access log line has mcp_session_hash %v, want %s: %s", h, want, line)
			}
		}
	}
	if accessLines < 4 {
		t.Errorf("%d access log lines name the session, want 4 or more", accessLines)
	}
}

// Through php_fastcgi, PHP's HTTP_MCP_SESSION_ID is the id the app
// minted, on every follow-up, while the client holds the id naming its
// owner.
func TestThroughPHPFastCGITheAppSeesOnlyItsOwnId(t *testing.T) {
	const sid = "php-session"
	answer := echoingAnswer(func() string { return sid })
	seen := make(chan string, 64)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go fcgi.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if parseRPC(body).Method != "initialize" {
			seen <- r.Header.Get("Mcp-Session-Id") // net/http/fcgi's reading of HTTP_MCP_SESSION_ID
		}
		answer(w, r, body)
	}))
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "index.php"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	c := startCaddy(t, "root * "+root+"\nmcp_serializer {\n\tstate redis "+redistest.Start(t)+"\n}\nphp_fastcgi "+l.Addr().String())
	ctx := context.Background()

	cid := call(ctx, http.DefaultClient, http.MethodPost, c.url, "", initializeBody).header.Get("Mcp-Session-Id")
	if upstreamID(cid) != sid || cid == sid {
		t.Fatalf("initialize: Mcp-Session-Id %q, want %q with the instance's ID", cid, sid)
	}
	for _, body := range []string{initializedBody, rpcRequest("2", "tools/list")} {
		if a := call(ctx, http.DefaultClient, http.MethodPost, c.url, cid, body); a.status/100 != 2 || a.header.Get("Mcp-Session-Id") != cid {
			t.Fatalf("%s: %d, Mcp-Session-Id %q; want 2xx with %q", body, a.status, a.header.Get("Mcp-Session-Id"), cid)
		}
		select {
		case got := <-seen:
			if got != sid {
				t.Fatalf("%s: PHP saw Mcp-Session-Id %q, want %q", body, got, sid)
			}
		default:
			t.Fatalf("%s never reached PHP", body)
		}
	}
}
