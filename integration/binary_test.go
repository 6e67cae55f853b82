package integration

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The binary built with xcaddy, as the README documents, carries the module
// and understands the Caddyfile that `make run` serves.
func TestBuiltBinaryListsModuleAndAdaptsDemoCaddyfile(t *testing.T) {
	bin := caddyBinary(t)
	out, err := exec.Command(bin, "list-modules").CombinedOutput()
	if err != nil {
		t.Fatalf("caddy list-modules: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "http.handlers.mcp_serializer\n") {
		t.Fatalf("caddy list-modules lacks http.handlers.mcp_serializer:\n%s", out)
	}
	adapted := caddyAdapt(t, filepath.Join(repoRoot(t), "xcaddy.Caddyfile"))
	if !strings.Contains(adapted, `"handler":"mcp_serializer"`) {
		t.Fatalf("xcaddy.Caddyfile does not configure mcp_serializer:\n%s", adapted)
	}
}

// The demo that `make run` serves answers whatever host name a newcomer
// types: http://127.0.0.1:8080/mcp as well as http://localhost:8080/mcp
// (a site address naming one host answers the others with an empty 200).
func TestDemoCaddyfileAnswersEveryHostName(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "xcaddy.Caddyfile"))
	if err != nil {
		t.Fatal(err)
	}
	backend := startFastStub(t)
	caddyfile := string(data)
	for from, to := range map[string]string{
		"admin localhost:2019": "admin {$MCP_TEST_ADMIN}",
		"http://:8080 {":       "http://:{$MCP_TEST_PORT} {",
		"127.0.0.1:9081":       backend,
	} {
		if strings.Count(caddyfile, from) != 1 {
			t.Fatalf("xcaddy.Caddyfile has %q %d times, want once:\n%s", from, strings.Count(caddyfile, from), caddyfile)
		}
		caddyfile = strings.Replace(caddyfile, from, to, 1)
	}
	c := runCaddy(t, caddyfile)
	port := strings.TrimPrefix(c.URL, "http://127.0.0.1:")
	client := &http.Client{}
	for _, host := range []string{"127.0.0.1", "localhost"} {
		url := "http://" + host + ":" + port + "/mcp"
		status, sid, err := initializeOnly(t.Context(), client, url)
		if err != nil || status != http.StatusOK || sid == "" {
			t.Errorf("initialize at %s: status %d, session id given %v, err %v; want 200 with a session", url, status, sid != "", err)
		}
	}
}
