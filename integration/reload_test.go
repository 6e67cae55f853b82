package integration

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/testnet"
)

// A config the built binary refuses changes nothing that runs. The live
// config has table "t" with on_init_timeout reject; a `POST /load` of a
// config whose two handlers of table "t" disagree is refused, after one of
// them was provisioned; the live site still answers a request held past
// init_timeout with its own 400, forwarding nothing.
func TestRefusedConfigLeavesTheRunningSettingsAlone(t *testing.T) {
	backend := startFastStub(t)
	live := `	mcp_serializer {
		name t
		init_timeout 500ms
		on_init_timeout reject
	}
	reverse_proxy ` + backend
	c := runCaddy(t, caddySite(live))

	// The same site with forward, and a second site with synthesize: both
	// disagree with reject, whichever Caddy provisions first.
	conflicting := strings.Replace(caddySite(strings.Replace(live, "reject", "forward", 1)),
		"{$MCP_TEST_PORT}", c.URL[strings.LastIndex(c.URL, ":")+1:], 1)
	conflicting = strings.Replace(conflicting, "{$MCP_TEST_ADMIN}", c.Admin, 1)
	conflicting += fmt.Sprintf("\nhttp://127.0.0.1:%d {\n%s\n}\n", testnet.FreePort(t), strings.Replace(live, "reject", "synthesize", 1))
	req, _ := http.NewRequest(http.MethodPost, "http://"+c.Admin+"/load", strings.NewReader(conflicting))
	req.Header.Set("Content-Type", "text/caddyfile")
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("POST /load: %v", err)
	}
	refusal, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		t.Fatalf("POST /load of two handlers of table t with different on_init_timeout succeeded; want it refused\n%s", conflicting)
	}
	if !strings.Contains(string(refusal), "on_init_timeout") {
		t.Fatalf("POST /load refused for another reason: %s %s", resp.Status, refusal)
	}

	client := &http.Client{Timeout: 10 * time.Second}
	status, sid, err := initializeOnly(t.Context(), client, c.URL)
	if err != nil || status != http.StatusOK || sid == "" {
		t.Fatalf("initialize after the refused load: %d %q %v", status, sid, err)
	}
	start := time.Now()
	status, body, err := postNoFatal(client, c.URL, sid, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	if err != nil {
		t.Fatalf("tools/list: %v", err)
	}
	t.Logf("held tools/list answered %d after %v: %s", status, time.Since(start).Round(time.Millisecond), body)
	if status != http.StatusBadRequest || !strings.Contains(string(body), "mcp_serializer: Client session not initialized") || !strings.Contains(string(body), `"id":2`) {
		t.Fatalf("held tools/list answered %d %s; want the live config's on_init_timeout reject: 400, -32600 not initialized, id 2", status, body)
	}
}
