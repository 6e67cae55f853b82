package integration

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/testnet"
)

// caddyBin is the Caddy binary to test: $MCP_SERIALIZER_CADDY when set (the
// Makefile exports it as bin/caddy), else the result of `make -C <repo root>
// caddy`, built once per test binary.
var caddyBin = &testBinary{
	env:  "MCP_SERIALIZER_CADDY",
	hint: "build it with `make caddy`, or unset the variable to let the tests run it",
	build: func(ctx context.Context, root string) (string, error) {
		if _, err := exec.LookPath("make"); err != nil {
			return "", fmt.Errorf("make not found (apt-get install -y make), needed to build Caddy with the module: %w", err)
		}
		cmd := exec.CommandContext(ctx, "make", "-C", root, "caddy")
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("make -C %s caddy: %w\n%s", root, err, out)
		}
		return filepath.Join(root, "bin", "caddy"), nil
	},
}

func caddyBinary(t testing.TB) string {
	t.Helper()
	return caddyBin.path(t)
}

// testBinary is a program the tests run: the path in an environment
// variable when set (a relative path is taken from the repository root),
// else one built once per test binary.
type testBinary struct {
	env   string // the variable naming a prebuilt binary
	hint  string // what to do when that path is wrong
	build func(ctx context.Context, root string) (string, error)

	once  sync.Once
	built string
	err   error
}

func (b *testBinary) path(t testing.TB) string {
	t.Helper()
	if path := os.Getenv(b.env); path != "" {
		if !filepath.IsAbs(path) {
			path = filepath.Join(repoRoot(t), path)
		}
		info, err := os.Stat(path)
		if err != nil {
			t.Fatalf("%s=%s: %v (%s)", b.env, path, err, b.hint)
		}
		if info.IsDir() || info.Mode()&0o111 == 0 {
			t.Fatalf("%s=%s is not an executable file", b.env, path)
		}
		return path
	}
	b.once.Do(func() {
		root, err := findRepoRoot()
		if err != nil {
			b.err = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		b.built, b.err = b.build(ctx, root)
		if b.err == nil {
			if _, err := os.Stat(b.built); err != nil {
				b.err = fmt.Errorf("built, but %s is missing: %w", b.built, err)
			}
		}
	})
	if b.err != nil {
		t.Fatalf("building the binary %s would otherwise name: %v", b.env, b.err)
	}
	return b.built
}

// caddySite builds a Caddyfile with the global options the harness needs and
// one site, on the address startCaddy picks, holding the given directives.
func caddySite(directives string) string {
	return `{
	admin {$MCP_TEST_ADMIN}
	auto_https off
	persist_config off
	grace_period 2s
}

http://127.0.0.1:{$MCP_TEST_PORT} {
` + strings.TrimRight(directives, "\n") + `
}
`
}

// startCaddy runs `caddy run` on the given Caddyfile and returns the site's
// base URL. The Caddyfile is written into a temporary directory and can use
// the placeholders {$MCP_TEST_PORT} (the site's port) and {$MCP_TEST_ADMIN}
// (an admin address), both on free loopback ports. Caddy is stopped at the
// end of the test, and its log is shown if the test failed.
func startCaddy(t testing.TB, caddyfile string) (baseURL string) {
	t.Helper()
	return runCaddy(t, caddyfile).URL
}

// caddyProcess is a running `caddy run`.
type caddyProcess struct {
	URL   string // the site, http://127.0.0.1:{$MCP_TEST_PORT}
	Admin string // the admin address, 127.0.0.1:{$MCP_TEST_ADMIN}
	proc  *process
}

// runCaddy is startCaddy returning the process too.
func runCaddy(t testing.TB, caddyfile string) *caddyProcess {
	t.Helper()
	bin := caddyBinary(t)
	dir := t.TempDir()
	config := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(config, []byte(caddyfile), 0o644); err != nil {
		t.Fatal(err)
	}
	port := testnet.FreePort(t)
	admin := testnet.FreePort(t)
	logPath := filepath.Join(dir, "caddy.log")
	dumpOnFailure(t, "caddy", config, logPath)

	cmd := exec.Command(bin, "run", "--config", config, "--adapter", "caddyfile")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"MCP_TEST_PORT="+strconv.Itoa(port),
		"MCP_TEST_ADMIN=127.0.0.1:"+strconv.Itoa(admin),
		"HOME="+dir,
		"XDG_CONFIG_HOME="+filepath.Join(dir, "config"),
		"XDG_DATA_HOME="+filepath.Join(dir, "data"),
	)
	c := &caddyProcess{
		URL:   "http://127.0.0.1:" + strconv.Itoa(port),
		Admin: "127.0.0.1:" + strconv.Itoa(admin),
		proc:  startProcess(t, "caddy", cmd, logPath, syscall.SIGINT, 10*time.Second),
	}
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if !c.proc.running() {
			t.Fatalf("caddy exited during startup: %v\n%s", c.proc.err, tailFile(logPath, 8000))
		}
		if caddyReady(client, "http://"+c.Admin+"/config/", "127.0.0.1:"+strconv.Itoa(port)) {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("caddy did not answer on %s within 30s\n%s", c.URL, tailFile(logPath, 8000))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop runs `caddy stop` against the instance's admin endpoint, as an
// operator would, and reports how long the process took to exit, or
// false if it was still running after limit.
func (c *caddyProcess) stop(t testing.TB, limit time.Duration) (time.Duration, bool) {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	out, err := exec.CommandContext(ctx, caddyBinary(t), "stop", "--address", c.Admin).CombinedOutput()
	if err != nil && ctx.Err() == nil {
		t.Fatalf("caddy stop: %v\n%s", err, out)
	}
	select {
	case <-c.proc.exited:
		return time.Since(start), true
	case <-ctx.Done():
		return time.Since(start), false
	}
}

// caddyReady reports whether the admin API answers and the site's port accepts connections.
func caddyReady(client *http.Client, adminURL, siteAddr string) bool {
	resp, err := client.Get(adminURL)
	if err != nil {
		return false
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false
	}
	conn, err := net.DialTimeout("tcp", siteAddr, time.Second)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

// caddyAdapt runs `caddy adapt` on a Caddyfile and returns the JSON config.
func caddyAdapt(t testing.TB, caddyfile string, env ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, caddyBinary(t), "adapt", "--config", caddyfile, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("caddy adapt %s: %v\n%s%s", caddyfile, err, out, stderr.String())
	}
	if strings.Contains(stderr.String(), "WARN") {
		t.Logf("caddy adapt %s warned:\n%s", caddyfile, stderr.String())
	}
	return strings.TrimSpace(string(out))
}
