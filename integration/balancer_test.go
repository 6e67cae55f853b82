package integration

import (
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/testnet"
)

// balancer is the load balancer in front of a cluster's instances.
type balancer int

const (
	caddyHeaderHash   balancer = iota // Caddy, lb_policy header Mcp-Session-Id
	caddyRoundRobin                   // Caddy, lb_policy round_robin
	nginxHash                         // examples/cluster/nginx.conf as written
	nginxRoundRobin                   // the same without its hash line
	haproxyHash                       // examples/cluster/haproxy.cfg as written
	haproxyRoundRobin                 // the same with balance roundrobin
)

func (b balancer) String() string {
	switch b {
	case caddyHeaderHash:
		return "caddy_header_hash"
	case caddyRoundRobin:
		return "caddy_round_robin"
	case nginxHash:
		return "nginx_hash"
	case nginxRoundRobin:
		return "nginx_round_robin"
	case haproxyHash:
		return "haproxy_hash"
	case haproxyRoundRobin:
		return "haproxy_round_robin"
	}
	return "balancer(" + strconv.Itoa(int(b)) + ")"
}

// hashes reports whether the front sends every request of a session to one
// instance.
func (b balancer) hashes() bool {
	return b == caddyHeaderHash || b == nginxHash || b == haproxyHash
}

// The lines of examples/cluster/nginx.conf and haproxy.cfg the tests
// replace: the front's address, the instances, and the hash that the
// round-robin variant drops.
const (
	exampleFrontAddr     = "127.0.0.1:8080"
	nginxExampleHash     = "\t\thash $http_mcp_session_id consistent;\n"
	haproxyExampleServer = "\tserver instance-1 127.0.0.1:8081\n\tserver instance-2 127.0.0.1:8082\n\tserver instance-3 127.0.0.1:8083\n"
	haproxyExampleHash   = "\tbalance hdr(Mcp-Session-Id)\n"
)

// front is a running balancer in front of a cluster's instances.
type front struct {
	URL  string // its base URL
	opts clusterOptions
	// A Caddy front.
	caddy *caddyProcess
	// An nginx or HAProxy front: where it listens, its config file and
	// its process.
	addr, conf string
	proc       *process
}

// startFront starts the balancer of opts in front of the instances at
// dials.
func startFront(t testing.TB, opts clusterOptions, dials []string) *front {
	t.Helper()
	f := &front{opts: opts}
	switch opts.Balancer {
	case caddyHeaderHash, caddyRoundRobin:
		f.caddy = runCaddy(t, f.caddyfile(dials))
		f.URL = f.caddy.URL
		return f
	}
	if opts.Front != "" {
		t.Fatalf("clusterOptions.Front holds lines for a Caddy front; the %v front runs its file in examples/cluster", opts.Balancer)
	}
	f.addr = "127.0.0.1:" + strconv.Itoa(testnet.FreePort(t))
	switch opts.Balancer {
	case nginxHash, nginxRoundRobin:
		f.conf, f.proc = startNginx(t, renderNginxExample(t, f.addr, dials, opts.Balancer == nginxHash), f.addr)
	case haproxyHash, haproxyRoundRobin:
		f.conf, f.proc = startHAProxy(t, renderHAProxyExample(t, f.addr, dials, opts.Balancer == haproxyHash), f.addr)
	default:
		t.Fatalf("unknown front %v", opts.Balancer)
	}
	f.URL = "http://" + f.addr
	return f
}

// caddyfile is a Caddy front's Caddyfile in front of dials.
func (f *front) caddyfile(dials []string) string {
	policy := "\t\t# initialize carries no session id and lands on any instance;\n" +
		"\t\t# every later request of the session on the one its id hashes to.\n" +
		"\t\tlb_policy header Mcp-Session-Id\n"
	if f.opts.Balancer == caddyRoundRobin {
		policy = "\t\tlb_policy round_robin\n"
	}
	proxy := "\treverse_proxy " + strings.Join(dials, " ") + " {\n" + policy + "\t\tflush_interval -1\n"
	if f.opts.Front != "" {
		proxy += "\t\t" + strings.ReplaceAll(strings.TrimSpace(f.opts.Front), "\n", "\n\t\t") + "\n"
	}
	proxy += "\t}\n"
	site := caddySite(proxy)
	if f.opts.FrontGracePeriod != 0 {
		site = strings.Replace(site, "\tgrace_period 2s\n", "\tgrace_period "+f.opts.FrontGracePeriod.String()+"\n", 1)
	}
	return site
}

// setInstances has the front spread requests over dials from now on: a
// Caddy front loads its config again (POST /load, which returns once the
// old config has finished its requests, within its grace_period), nginx
// reloads its file (SIGHUP: new workers take new connections, the old
// ones finish their requests).
func (f *front) setInstances(t testing.TB, dials []string) {
	t.Helper()
	switch {
	case f.caddy != nil:
		port := f.caddy.URL[strings.LastIndex(f.caddy.URL, ":")+1:]
		config := strings.NewReplacer("{$MCP_TEST_PORT}", port, "{$MCP_TEST_ADMIN}", f.caddy.Admin).Replace(f.caddyfile(dials))
		req, err := http.NewRequest(http.MethodPost, "http://"+f.caddy.Admin+"/load", strings.NewReader(config))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "text/caddyfile")
		resp, err := (&http.Client{Timeout: 2 * time.Minute}).Do(req)
		if err != nil {
			t.Fatalf("the front's POST /load: %v", err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("the front's POST /load: %s %s", resp.Status, body)
		}
	case f.opts.Balancer == nginxHash || f.opts.Balancer == nginxRoundRobin:
		config := renderNginxExample(t, f.addr, dials, f.opts.Balancer == nginxHash)
		if err := os.WriteFile(f.conf, []byte(config), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(f.proc.cmd.Process.Pid, syscall.SIGHUP); err != nil {
			t.Fatalf("nginx: SIGHUP: %v", err)
		}
	default:
		t.Fatalf("the %v front cannot change its instances here", f.opts.Balancer)
	}
}

// nginxExampleServers are the server lines of examples/cluster/nginx.conf:
// the three instances, each with the same parameters.
var nginxExampleServers = regexp.MustCompile(`\t\tserver 127\.0\.0\.1:808[1-3]( [^;\n]*)?;\n`)

// renderNginxExample is examples/cluster/nginx.conf listening on addr in
// front of dials, each with the parameters the example gives its servers,
// without its hash line unless hash.
func renderNginxExample(t testing.TB, addr string, dials []string, hash bool) string {
	t.Helper()
	text := renderExample(t, "cluster", "nginx.conf", nil)
	lines := nginxExampleServers.FindAllStringSubmatch(text, -1)
	block := ""
	for _, l := range lines {
		block += l[0]
	}
	if len(lines) != 3 || lines[1][1] != lines[0][1] || lines[2][1] != lines[0][1] || !strings.Contains(text, block) {
		t.Fatalf("examples/cluster/nginx.conf no longer lists its three instances together as server 127.0.0.1:8081 to 8083, with the same parameters; update this test")
	}
	params := lines[0][1]
	var servers strings.Builder
	for _, d := range dials {
		servers.WriteString("\t\tserver " + d + params + ";\n")
	}
	edits := [][2]string{{"listen " + exampleFrontAddr + ";", "listen " + addr + ";"}, {block, servers.String()}}
	if !hash {
		edits = append(edits, [2]string{nginxExampleHash, ""})
	}
	return renderExample(t, "cluster", "nginx.conf", edits)
}

// renderHAProxyExample is examples/cluster/haproxy.cfg bound to addr in
// front of dials, with balance roundrobin unless hash.
func renderHAProxyExample(t testing.TB, addr string, dials []string, hash bool) string {
	t.Helper()
	var servers strings.Builder
	for i, d := range dials {
		servers.WriteString("\tserver instance-" + strconv.Itoa(i+1) + " " + d + "\n")
	}
	edits := [][2]string{{"bind " + exampleFrontAddr + "\n", "bind " + addr + "\n"}, {haproxyExampleServer, servers.String()}}
	if !hash {
		edits = append(edits, [2]string{haproxyExampleHash, "\tbalance roundrobin\n"})
	}
	return renderExample(t, "cluster", "haproxy.cfg", edits)
}

// renderExample reads examples/<example>/<name> and makes each edit (old,
// new) once, failing when the file no longer holds an old text.
func renderExample(t testing.TB, example, name string, edits [][2]string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "examples", example, name))
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	for _, e := range edits {
		if strings.Count(text, e[0]) != 1 {
			t.Fatalf("examples/%s/%s no longer holds %q once; update this test", example, name, e[0])
		}
		text = strings.Replace(text, e[0], e[1], 1)
	}
	return text
}

// sbinTool finds a program that Debian installs in /usr/sbin, which is not
// on every user's PATH.
func sbinTool(t testing.TB, name string) string {
	t.Helper()
	if path, err := exec.LookPath(name); err == nil {
		return path
	}
	path := "/usr/sbin/" + name
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("%s not found: apt-get install -y %s (or run scripts/install-test-deps)", name, name)
	}
	return path
}

// startNginx runs nginx in the foreground on config, with its pid file and
// scratch files in a directory of its own (the system nginx's are not
// touched), waits until it listens on addr, and returns its config file
// and process.
func startNginx(t testing.TB, config, addr string) (string, *process) {
	t.Helper()
	dir := t.TempDir()
	conf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(conf, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "nginx.log")
	dumpOnFailure(t, "nginx", conf, logPath)
	cmd := exec.Command(sbinTool(t, "nginx"), nginxArgs(dir, conf)...)
	cmd.Dir = dir
	// SIGTERM: nginx's fast shutdown, the workers with it.
	p := startProcess(t, "nginx", cmd, logPath, syscall.SIGTERM, 5*time.Second)
	waitTCP(t, p, addr, logPath)
	return conf, p
}

// nginxArgs runs conf with the prefix (pid file, scratch files) in dir and
// errors on stderr; -t first tests it.
func nginxArgs(dir, conf string, test ...string) []string {
	return append(test, "-p", dir+"/", "-c", conf, "-e", "stderr", "-g", "daemon off; pid nginx.pid;")
}

// startHAProxy runs haproxy in the foreground on config, waits until it
// listens on addr, and returns its config file and process.
func startHAProxy(t testing.TB, config, addr string) (string, *process) {
	t.Helper()
	dir := t.TempDir()
	conf := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(conf, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "haproxy.log")
	dumpOnFailure(t, "haproxy", conf, logPath)
	cmd := exec.Command(sbinTool(t, "haproxy"), "-db", "-f", conf)
	cmd.Dir = dir
	p := startProcess(t, "haproxy", cmd, logPath, syscall.SIGTERM, 5*time.Second)
	waitTCP(t, p, addr, logPath)
	return conf, p
}
