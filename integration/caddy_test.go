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
)

var (
	caddyOnce  sync.Once
	caddyBuilt string
	caddyErr   error
)

// caddyBinary returns the Caddy binary to test: $MCP_SERIALIZER_CADDY when set
// (the Makefile exports it as bin/caddy; a relative path is taken from the
// repository root), else the result of `make -C <repo root> caddy`, built once
// per test binary.
func caddyBinary(t testing.TB) string {
	t.Helper()
	if path := os.Getenv("MCP_SERIALIZER_CADDY"); path != "" {
		if !filepath.IsAbs(path) {
			path = filepath.Join(repoRoot(t), path)
		}
		info, err := os.Stat(path)
		if err != nil {
			t.Fatalf("MCP_SERIALIZER_CADDY=%s: %v (build it with `make caddy`, or unset the variable to let the tests run it)", path, err)
		}
		if info.IsDir() || info.Mode()&0o111 == 0 {
			t.Fatalf("MCP_SERIALIZER_CADDY=%s is not an executable file", path)
		}
		return path
	}
	caddyOnce.Do(func() {
		root, err := findRepoRoot()
		if err != nil {
			caddyErr = err
			return
		}
		if _, err := exec.LookPath("make"); err != nil {
			caddyErr = fmt.Errorf("make not found (apt-get install -y make), needed to build Caddy with the module: %w", err)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "make", "-C", root, "caddy")
		out, err := cmd.CombinedOutput()
		if err != nil {
			caddyErr = fmt.Errorf("make -C %s caddy: %w\n%s", root, err, out)
			return
		}
		caddyBuilt = filepath.Join(root, "bin", "caddy")
		if _, err := os.Stat(caddyBuilt); err != nil {
			caddyErr = fmt.Errorf("make caddy succeeded but %s is missing: %w", caddyBuilt, err)
		}
	})
	if caddyErr != nil {
		t.Fatalf("building Caddy with the module: %v", caddyErr)
	}
	return caddyBuilt
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
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
	port := freePort(t)
	admin := freePort(t)
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
