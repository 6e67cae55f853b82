package caddymodule_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/mcpserializer/caddy-mcp-serializer/caddymodule"
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
	redisAddr := caddymodule.StartRedis(t)
	_, upstream := sessionUpstream(t)
	for _, state := range []string{
		"state redis",
		"state redis {\n\t\taddress " + redisAddr + "\n\t}",
		"state redis " + redisAddr,
		"state storage",
		"state storage {\n\t\ttimeout 500ms\n\t\tsweep_interval 1m\n\t}",
	} {
		t.Run(strings.ReplaceAll(state, "\n", " "), func(t *testing.T) {
			port, adminPort := freePort(t), freePort(t)
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
`, adminPort, t.TempDir(), port, state, upstream)
			cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
			if err != nil {
				t.Fatalf("adapting: %v\n%s", err, caddyfile)
			}
			loadCaddy(t, cfg)
			connect(t, fmt.Sprintf("http://127.0.0.1:%d", port))
		})
	}
}

// The minimal JSON forms of `state` provision and serve.
func TestStateJSONFormsServe(t *testing.T) {
	_, upstream := sessionUpstream(t)
	for _, state := range []string{`{"module": "redis"}`, `{"module": "storage"}`} {
		t.Run(state, func(t *testing.T) {
			port := freePort(t)
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
			}`, t.TempDir(), port, state, upstream)
			if !json.Valid([]byte(cfg)) {
				t.Fatalf("bad test config:\n%s", cfg)
			}
			loadCaddy(t, []byte(cfg))
			connect(t, fmt.Sprintf("http://127.0.0.1:%d", port))
		})
	}
}

func loadCaddy(t *testing.T, cfg []byte) {
	t.Helper()
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatalf("loading Caddy config: %v\n%s", err, cfg)
	}
	t.Cleanup(func() {
		if err := caddy.Stop(); err != nil {
			t.Errorf("stopping Caddy: %v", err)
		}
		http.DefaultClient.CloseIdleConnections()
	})
}
