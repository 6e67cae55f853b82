package integration

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/testnet"
)

// threePHPSites is one Caddyfile with three sites in front of the same
// PHP-FPM pool, each with its own on_init_timeout; name, when not empty,
// is a format giving each handler its own table (%s is the action).
func threePHPSites(fpm *phpFPM, addrs [3]string, name string) string {
	var b strings.Builder
	b.WriteString("{\n\tadmin {$MCP_TEST_ADMIN}\n\tauto_https off\n\tpersist_config off\n\tgrace_period 2s\n}\n")
	for i, action := range []string{"synthesize", "forward", "reject"} {
		named := ""
		if name != "" {
			named = "\t\tname " + fmt.Sprintf(name, action) + "\n"
		}
		fmt.Fprintf(&b, "\nhttp://%s {\n\tmcp_serializer {\n%s\t\tinit_timeout 1s\n\t\ton_init_timeout %s\n\t}\n%s}\n",
			addrs[i], named, action, fpm.fastcgiDirectives())
	}
	return b.String()
}

// Three sites without a name share one session table: `caddy validate`
// refuses the config, naming the setting and the fix, instead of letting
// the last handler's on_init_timeout govern all three.
func TestThreeSitesSharingATableWithDifferentActionsAreRefused(t *testing.T) {
	prerequisites(t)
	fpm := startPHPFPM(t, phpFPMOptions{Workers: 2})
	addrs := [3]string{"127.0.0.1:8081", "127.0.0.1:8082", "127.0.0.1:8083"} // validated, never bound
	path := filepath.Join(t.TempDir(), "Caddyfile")
	if err := os.WriteFile(path, []byte(threePHPSites(fpm, addrs, "")), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, caddyBinary(t), "validate", "--config", path, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "MCP_TEST_ADMIN=127.0.0.1:"+fmt.Sprint(testnet.FreePort(t)))
	out, err := cmd.CombinedOutput()
	t.Logf("caddy validate: %v\n%s", err, tail(string(out), 2000))
	if err == nil {
		t.Fatal("caddy validate accepted three unnamed handlers with different on_init_timeout")
	}
	for _, want := range []string{"on_init_timeout:", "in another mcp_serializer handler", "`name`"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("caddy validate's message lacks %q", want)
		}
	}
}

// With a name each, the same three sites run as written against real
// PHP: a tools/list sent without notifications/initialized is answered
// after init_timeout by PHP once the module sent initialized itself
// (synthesize), by PHP's own "not initialized" rejection (forward), or by
// the module's 400 (reject).
func TestThreeNamedSitesInFrontOfOnePoolBehaveAsWritten(t *testing.T) {
	prerequisites(t)
	fpm := startPHPFPM(t, phpFPMOptions{Workers: 4})
	addrs := [3]string{"127.0.0.1:{$MCP_TEST_PORT}", fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t)), fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t))}
	urls := [3]string{runCaddy(t, threePHPSites(fpm, addrs, "site_%s")).URL, "http://" + addrs[1], "http://" + addrs[2]}
	client := &http.Client{Timeout: 15 * time.Second}

	want := map[string]struct {
		status int
		body   string
	}{
		"synthesize": {http.StatusOK, `"tools"`},
		"forward":    {http.StatusOK, `Client session not initialized`},
		"reject":     {http.StatusBadRequest, `init_timeout`},
	}
	for i, action := range []string{"synthesize", "forward", "reject"} {
		url := urls[i] + "/mcp"
		resp, body := post(t, client, url, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"go-test","version":"1"}}}`)
		session := resp.Header.Get("Mcp-Session-Id")
		if session == "" {
			t.Fatalf("%s: initialize: status %d, body %s", action, resp.StatusCode, body)
		}
		start := time.Now()
		resp, body = post(t, client, url, session, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
		held := time.Since(start)
		t.Logf("%s: tools/list without initialized answered %d after %v: %s", action, resp.StatusCode, held.Round(time.Millisecond), tail(string(body), 200))
		if resp.StatusCode != want[action].status || !strings.Contains(string(body), want[action].body) {
			t.Errorf("%s: got %d %s, want %d with %s", action, resp.StatusCode, body, want[action].status, want[action].body)
		}
		if held < 900*time.Millisecond {
			t.Errorf("%s: answered after %v, before init_timeout (1s)", action, held)
		}
	}
}
