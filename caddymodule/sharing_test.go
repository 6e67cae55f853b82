package caddymodule_test

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/testnet"
)

// threeSites is one Caddyfile with three sites, each with its own
// on_init_timeout action, in front of the same upstream; nameFmt, when
// not empty, gives each handler a table name (%s is the action).
func threeSites(adminPort int, ports [3]int, upstream, nameFmt string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "{\n\tadmin 127.0.0.1:%d\n\tauto_https off\n\tpersist_config off\n\tlog {\n\t\toutput discard\n\t}\n}\n", adminPort)
	for i, action := range []string{"synthesize", "forward", "reject"} {
		name := ""
		if nameFmt != "" {
			name = "\t\tname " + fmt.Sprintf(nameFmt, action) + "\n"
		}
		fmt.Fprintf(&b, "http://127.0.0.1:%d {\n\tmcp_serializer {\n%s\t\tinit_timeout 1s\n\t\ton_init_timeout %s\n\t}\n\treverse_proxy %s\n}\n",
			ports[i], name, action, upstream)
	}
	return b.String()
}

func loadCaddyfile(t *testing.T, caddyfile string) error {
	t.Helper()
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
	if err != nil {
		t.Fatalf("adapting Caddyfile: %v\n%s", err, caddyfile)
	}
	return caddy.Load(cfg, true)
}

func TestHandlersSharingATableWithDifferentSettingsAreRefused(t *testing.T) {
	_, addr := sessionUpstream(t)
	ports := [3]int{testnet.FreePort(t), testnet.FreePort(t), testnet.FreePort(t)}
	err := loadCaddyfile(t, threeSites(testnet.FreePort(t), ports, addr, ""))
	if err == nil {
		caddy.Stop()
		t.Fatal("three unnamed handlers with different on_init_timeout loaded; want the config refused")
	}
	msg := err.Error()
	t.Logf("refused: %s", msg)
	for _, want := range []string{"on_init_timeout", "`name`"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not mention %q", msg, want)
		}
	}
	// Servers are provisioned in no fixed order: any two of the values.
	named := 0
	for _, action := range []string{"synthesize", "forward", "reject"} {
		if strings.Contains(msg, action+" here") || strings.Contains(msg, "but "+action+" in another") {
			named++
		}
	}
	if named != 2 {
		t.Errorf("error %q does not name both values", msg)
	}
}

func TestHandlersSharingATableWithEqualSettingsLoad(t *testing.T) {
	_, addr := sessionUpstream(t)
	caddyfile := fmt.Sprintf("{\n\tadmin 127.0.0.1:%d\n\tauto_https off\n\tpersist_config off\n}\n", testnet.FreePort(t))
	for range 2 {
		// The same values, spelled and defaulted differently.
		caddyfile += fmt.Sprintf("http://127.0.0.1:%d {\n\tmcp_serializer\n\treverse_proxy %s\n}\n", testnet.FreePort(t), addr)
		caddyfile += fmt.Sprintf("http://127.0.0.1:%d {\n\tmcp_serializer {\n\t\tinit_timeout 10000ms\n\t\tmax_queue 32\n\t}\n\treverse_proxy %s\n}\n", testnet.FreePort(t), addr)
	}
	if err := loadCaddyfile(t, caddyfile); err != nil {
		t.Fatalf("handlers sharing a table with equal settings: %v", err)
	}
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
}

// With a name each, the three sites behave as written: a tools/list sent
// without notifications/initialized is, after init_timeout, preceded by a
// synthesized initialized, forwarded as it is, or answered 400.
func TestNamedHandlersKeepTheirOwnSettings(t *testing.T) {
	up, addr := sessionUpstream(t)
	ports := [3]int{testnet.FreePort(t), testnet.FreePort(t), testnet.FreePort(t)}
	if err := loadCaddyfile(t, threeSites(testnet.FreePort(t), ports, addr, "site-%s")); err != nil {
		t.Fatalf("named handlers: %v", err)
	}
	t.Cleanup(func() { caddy.Stop() })

	status := map[string]int{}
	for i, action := range []string{"synthesize", "forward", "reject"} {
		url := fmt.Sprintf("http://127.0.0.1:%d", ports[i])
		resp := post(t, url, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`)
		resp.Body.Close()
		start := time.Now()
		resp = post(t, url, "s-new", `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if held := time.Since(start); held < 900*time.Millisecond {
			t.Errorf("%s: tools/list answered after %v, before init_timeout (1s)", action, held)
		}
		status[action] = resp.StatusCode
	}
	want := map[string]int{"synthesize": http.StatusOK, "forward": http.StatusOK, "reject": http.StatusBadRequest}
	for action, code := range want {
		if status[action] != code {
			t.Errorf("%s: tools/list answered %d, want %d", action, status[action], code)
		}
	}
	var got []string
	for _, r := range up.requests() {
		got = append(got, rpcMethod(r.Body))
	}
	wantSeen := []string{
		"initialize", "notifications/initialized", "tools/list", // synthesize
		"initialize", "tools/list", // forward
		"initialize", // reject: nothing after initialize
	}
	if strings.Join(got, ",") != strings.Join(wantSeen, ",") {
		t.Errorf("upstream saw %v, want %v", got, wantSeen)
	}
}

// rpcMethod is the method of a single JSON-RPC message, for test logs.
func rpcMethod(body []byte) string {
	return parseRPC(body).Method
}

// Two handlers of one table whose state settings differ only in the Redis
// password are refused with a message that names the field, and shows
// neither the passwords nor anything derived from them.
func TestStateConflictNamesTheFieldNotTheSecret(t *testing.T) {
	_, addr := sessionUpstream(t)
	caddyfile := fmt.Sprintf("{\n\tadmin 127.0.0.1:%d\n\tauto_https off\n\tpersist_config off\n}\n", testnet.FreePort(t))
	for _, password := range []string{"first-secret", "second-secret"} {
		caddyfile += fmt.Sprintf("http://127.0.0.1:%d {\n\tmcp_serializer {\n\t\tstate redis {\n\t\t\taddress 127.0.0.1:1\n\t\t\tpassword %s\n\t\t}\n\t}\n\treverse_proxy %s\n}\n",
			testnet.FreePort(t), password, addr)
	}
	err := loadCaddyfile(t, caddyfile)
	if err == nil {
		caddy.Stop()
		t.Fatal("handlers of one table with different Redis passwords loaded; want the config refused")
	}
	msg := err.Error()
	t.Logf("refused: %s", msg)
	if !strings.Contains(msg, "state: redis settings differ") || !strings.Contains(msg, "in password;") {
		t.Errorf("error %q does not say that the redis password differs", msg)
	}
	if strings.Contains(msg, "secret") || hexRun.MatchString(msg) {
		t.Errorf("error %q shows a password or a digest", msg)
	}
}

// hexRun matches what a digest would print: eight or more hex digits.
var hexRun = regexp.MustCompile(`[0-9a-f]{8,}`)
