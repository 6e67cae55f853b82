package caddymodule_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/redis/go-redis/v9"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/redistest"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/testnet"
)

// connect runs a session's opening exchanges through url and fails unless
// each is answered 2xx.
func connect(t *testing.T, url string) {
	t.Helper()
	for _, step := range []struct{ id, body string }{
		{"", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`},
		{"s-new", `{"jsonrpc":"2.0","method":"notifications/initialized"}`},
		{"s-new", `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`},
	} {
		resp := post(t, url, step.id, step.body)
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			t.Fatalf("%s: %s", step.body, resp.Status)
		}
	}
}

// The minimal Caddyfile forms of `state` load and serve as written.
func TestStateCaddyfileFormsServe(t *testing.T) {
	redisAddr := redistest.Start(t)
	_, upstream := sessionUpstream(t)
	for _, state := range []string{
		"state redis",
		"state redis {\n\t\taddress " + redisAddr + "\n\t}",
		"state redis " + redisAddr,
		"state storage",
		"state storage {\n\t\ttimeout 500ms\n\t\tsweep_interval 1m\n\t}",
	} {
		t.Run(strings.ReplaceAll(state, "\n", " "), func(t *testing.T) {
			port, adminPort := testnet.FreePort(t), testnet.FreePort(t)
			root := t.TempDir()
			caddyfile := fmt.Sprintf(`{
	admin 127.0.0.1:%d
	auto_https off
	persist_config off
	storage file_system %s
	log {
		output discard
	}
}
http://127.0.0.1:%d {
	mcp_serializer {
		%s
	}
	reverse_proxy %s
}
`, adminPort, root, port, state, upstream)
			cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
			if err != nil {
				t.Fatalf("adapting: %v\n%s", err, caddyfile)
			}
			loadCaddy(t, cfg)
			connect(t, fmt.Sprintf("http://127.0.0.1:%d", port))
			if strings.HasPrefix(state, "state storage") {
				waitForOpenRecord(t, root, "s-new")
			}
		})
	}
}

// waitForOpenRecord waits until the storage under root holds the open
// fact of session id's record: the table writes it after the response.
func waitForOpenRecord(t *testing.T, root, id string) {
	t.Helper()
	sum := sha256.Sum256([]byte(id))
	file := filepath.Join(root, "mcp_serializer", "sessions", hex.EncodeToString(sum[:]), "open")
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(file); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no open record at %s after 5s", file)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The minimal JSON forms of `state` provision and serve.
func TestStateJSONFormsServe(t *testing.T) {
	_, upstream := sessionUpstream(t)
	for _, state := range []string{`{"module": "redis"}`, `{"module": "storage"}`} {
		t.Run(state, func(t *testing.T) {
			port := testnet.FreePort(t)
			root := t.TempDir()
			cfg := fmt.Sprintf(`{
				"admin": {"disabled": true},
				"storage": {"module": "file_system", "root": %q},
				"apps": {"http": {"servers": {"srv0": {
					"listen": ["127.0.0.1:%d"],
					"automatic_https": {"disable": true},
					"routes": [{"handle": [
						{"handler": "mcp_serializer", "state": %s},
						{"handler": "reverse_proxy", "upstreams": [{"dial": %q}]}
					]}]
				}}}}
			}`, root, port, state, upstream)
			if !json.Valid([]byte(cfg)) {
				t.Fatalf("bad test config:\n%s", cfg)
			}
			loadCaddy(t, []byte(cfg))
			connect(t, fmt.Sprintf("http://127.0.0.1:%d", port))
			if strings.Contains(state, "storage") {
				waitForOpenRecord(t, root, "s-new")
			}
		})
	}
}

// twoTables is one Caddy with two sites, each with its own session table
// and the same state engine: two instances in one process.
func twoTables(t *testing.T, state, upstream string) (a, b, root string) {
	t.Helper()
	ports := [2]int{testnet.FreePort(t), testnet.FreePort(t)}
	root = t.TempDir()
	caddyfile := fmt.Sprintf("{\n\tadmin 127.0.0.1:%d\n\tauto_https off\n\tpersist_config off\n\tstorage file_system %s\n\tlog {\n\t\toutput discard\n\t}\n}\n",
		testnet.FreePort(t), root)
	for i, port := range ports {
		caddyfile += fmt.Sprintf("http://127.0.0.1:%d {\n\tmetrics /metrics\n\tmcp_serializer {\n\t\tname instance%d\n\t\t%s\n\t}\n\treverse_proxy %s\n}\n",
			port, i, state, upstream)
	}
	if err := loadCaddyfile(t, caddyfile); err != nil {
		t.Fatalf("loading: %v\n%s", err, caddyfile)
	}
	t.Cleanup(func() {
		caddy.Stop()
		http.DefaultClient.CloseIdleConnections()
	})
	return fmt.Sprintf("http://127.0.0.1:%d", ports[0]), fmt.Sprintf("http://127.0.0.1:%d", ports[1]), root
}

// A session created behind one table is gated behind the other, through
// each engine: its follow-up waits for notifications/initialized.
func TestSessionCreatedBehindOneTableIsGatedBehindAnother(t *testing.T) {
	redisAddr := redistest.Start(t)
	// Generous timeouts (the longest order cluster, redis' default,
	// allows): on a busy machine the first call, which dials, must not
	// fall back to local behaviour.
	for _, engine := range []string{"redis " + redisAddr, "storage"} {
		timeout := "1s"
		if engine == "storage" {
			timeout = "5s"
		}
		state := "state " + engine + " {\n\t\t\ttimeout " + timeout + "\n\t\t}"
		t.Run(engine, func(t *testing.T) {
			up, upstream := sessionUpstream(t)
			a, b, root := twoTables(t, state, upstream)
			resp := post(t, a, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`)
			resp.Body.Close()
			if upstreamID(resp.Header.Get("Mcp-Session-Id")) != "s-new" {
				t.Fatalf("initialize: %s", resp.Status)
			}
			up.next(t)
			setLevel := sendAsync(context.Background(), b, "s-new", `{"jsonrpc":"2.0","id":2,"method":"logging/setLevel"}`)
			time.Sleep(200 * time.Millisecond)
			if n := len(up.requests()); n != 1 {
				t.Fatalf("upstream saw %d requests before initialized, want only initialize", n)
			}
			resp = post(t, b, "s-new", `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
			resp.Body.Close()
			for _, want := range []string{"notifications/initialized", "logging/setLevel"} {
				if got := up.next(t); !strings.Contains(string(got.Body), want) {
					t.Fatalf("upstream got %s, want %s next", got.Body, want)
				}
			}
			if r := <-setLevel; r == nil || r.StatusCode != http.StatusOK {
				t.Fatalf("held request failed: %v", r)
			}
			if engine == "storage" {
				waitForOpenRecord(t, root, "s-new")
			}
		})
	}
}

// An engine that is down costs the initialize its timeout at most, fails
// nothing, and is counted.
func TestStateEngineDownFailsNoRequestAndIsCounted(t *testing.T) {
	_, upstream := sessionUpstream(t)
	down := fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t))
	a, _, _ := twoTables(t, "state redis "+down+" {\n\t\t\ttimeout 100ms\n\t\t}", upstream)
	connect(t, a)
	resp, err := http.Get(a + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	text, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(text), `caddy_mcp_serializer_state_errors_total{op="created"}`) {
		t.Fatalf("metrics lack state_errors_total{op=\"created\"}:\n%s", text)
	}
}

func TestHandlersSharingATableMustAgreeOnState(t *testing.T) {
	_, upstream := sessionUpstream(t)
	for _, states := range [][2]string{
		{"state storage", ""},
		{"state redis {\n\t\tpassword first-secret\n\t}", "state redis {\n\t\tpassword second-secret\n\t}"},
	} {
		caddyfile := fmt.Sprintf("{\n\tadmin 127.0.0.1:%d\n\tauto_https off\n\tpersist_config off\n}\n", testnet.FreePort(t))
		for _, state := range states {
			caddyfile += fmt.Sprintf("http://127.0.0.1:%d {\n\tmcp_serializer {\n\t\t%s\n\t}\n\treverse_proxy %s\n}\n",
				testnet.FreePort(t), state, upstream)
		}
		err := loadCaddyfile(t, caddyfile)
		if err == nil {
			caddy.Stop()
			t.Fatalf("handlers of one table with %q and %q loaded; want the config refused", states[0], states[1])
		}
		if msg := err.Error(); !strings.Contains(msg, "state:") || strings.Contains(msg, "secret") {
			t.Errorf("error %q: want one naming state, without its settings", msg)
		}
	}
}

// An exchange runs to its end while Redis does not answer (here it pauses
// every client's writes): nothing in it waits on Redis, and stopping the
// proxied request would not stop a PHP-FPM worker anyway.
func TestAnExchangeRunsToItsEndWhileRedisDoesNotAnswer(t *testing.T) {
	redisAddr := redistest.Start(t)
	const sid = "long-call"
	const callTime = 5 * time.Second
	up, addr := newUpstream(t, mcpAnswer(sid, func(m rpcMsg, w http.ResponseWriter, r *http.Request) bool {
		if m.Method != "tools/call" {
			return false
		}
		select { // a long tool call
		case <-r.Context().Done():
		case <-time.After(callTime):
		}
		return false
	}))
	c := startCaddy(t, "mcp_serializer {\n\tstate redis "+redisAddr+"\n}\nreverse_proxy "+addr)
	initialize(t, c, sid)
	ctx := context.Background()
	if a := call(ctx, http.DefaultClient, http.MethodPost, c.url, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); a.status != http.StatusAccepted {
		t.Fatalf("initialized: %d %s", a.status, a.body)
	}
	long := callAsync(ctx, http.MethodPost, c.url, sid, rpcRequest("3", "tools/call"))
	for parseRPC(up.next(t).Body).Method != "tools/call" { // it reached the upstream
	}
	pause := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer pause.Close()
	if err := pause.Do(ctx, "CLIENT", "PAUSE", "10000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	defer pause.Do(ctx, "CLIENT", "UNPAUSE")
	a := await(t, long, callTime+10*time.Second, "the long call")
	if a.status != http.StatusOK || !strings.Contains(string(a.body), `"id":3`) || !strings.Contains(string(a.body), `"result"`) {
		t.Fatalf("long call while Redis did not answer: %d %s; want its answer", a.status, a.body)
	}
}
