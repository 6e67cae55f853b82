package integration

import (
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
