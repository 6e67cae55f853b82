package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/integration/mcpstub"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/testnet"
)

// The example Caddyfiles adapt with the module's binary and configure the
// handler where it belongs: before php_fastcgi / reverse_proxy.
func TestExampleCaddyfilesAdapt(t *testing.T) {
	root := repoRoot(t)
	for _, example := range []string{"laravel", "laravel-nginx", "reverse-proxy", "wordpress", "wordpress-nginx"} {
		t.Run(example, func(t *testing.T) {
			path := filepath.Join(root, "examples", example, "Caddyfile")
			out := caddyAdapt(t, path)
			var config map[string]any
			if err := json.Unmarshal([]byte(out), &config); err != nil {
				t.Fatalf("caddy adapt output is not JSON: %v\n%s", err, out)
			}
			serializer := strings.Index(out, `"handler":"mcp_serializer"`)
			upstream := strings.Index(out, `"handler":"reverse_proxy"`)
			if serializer < 0 || upstream < 0 {
				t.Fatalf("adapted config lacks mcp_serializer or reverse_proxy:\n%s", out)
			}
			if serializer > upstream {
				t.Errorf("mcp_serializer comes after the first reverse_proxy/php_fastcgi handler:\n%s", out)
			}
			if strings.Contains(out, `"get_stream":"forward"`) && example == "laravel" {
				t.Errorf("laravel example forwards the GET stream, which php-mcp's rewrites the session record:\n%s", out)
			}
		})
	}
}

// The cluster example's Caddyfiles adapt: each instance runs mcp_serializer
// with the shared state in Redis before its reverse_proxy and the default
// order (cluster, whatever the front), and the front hashes Mcp-Session-Id
// over the instances unless FRONT_POLICY=round_robin.
func TestClusterExampleCaddyfilesAdapt(t *testing.T) {
	dir := filepath.Join(repoRoot(t), "examples", "cluster")
	instance := caddyAdapt(t, filepath.Join(dir, "instance.Caddyfile"))
	serializer := strings.Index(instance, `"handler":"mcp_serializer"`)
	upstream := strings.Index(instance, `"handler":"reverse_proxy"`)
	if serializer < 0 || upstream < 0 || serializer > upstream {
		t.Errorf("instance.Caddyfile: want mcp_serializer before reverse_proxy:\n%s", instance)
	}
	if !strings.Contains(instance, `"module":"redis"`) || !strings.Contains(instance, `"127.0.0.1:6379"`) {
		t.Errorf("instance.Caddyfile: want state redis on 127.0.0.1:6379 by default:\n%s", instance)
	}
	if strings.Contains(instance, `"order":`) {
		t.Errorf("instance.Caddyfile: want the default order (cluster with state redis), not one written out:\n%s", instance)
	}
	if !strings.Contains(instance, `"listen":["127.0.0.1:8081"]`) || strings.Contains(instance, `"host":`) {
		t.Errorf("instance.Caddyfile: want a site on 127.0.0.1:8081 by default that matches no host:\n%s", instance)
	}
	if moved := caddyAdapt(t, filepath.Join(dir, "instance.Caddyfile"), "INSTANCE_PORT=9443", "INSTANCE_BIND=10.0.0.5"); !strings.Contains(moved, `"listen":["10.0.0.5:9443"]`) {
		t.Errorf("instance.Caddyfile with INSTANCE_PORT=9443 INSTANCE_BIND=10.0.0.5: want it listening on 10.0.0.5:9443:\n%s", moved)
	}
	front := caddyAdapt(t, filepath.Join(dir, "front.Caddyfile"))
	for _, want := range []string{`"policy":"header"`, `"field":"Mcp-Session-Id"`, `"flush_interval":-1`, `"dial":"127.0.0.1:8083"`} {
		if !strings.Contains(front, want) {
			t.Errorf("front.Caddyfile: adapted config lacks %s:\n%s", want, front)
		}
	}
	if strings.Contains(front, "mcp_serializer") {
		t.Errorf("front.Caddyfile: the front needs no mcp_serializer:\n%s", front)
	}
	roundRobin := caddyAdapt(t, filepath.Join(dir, "front.Caddyfile"), "FRONT_POLICY=round_robin")
	if !strings.Contains(roundRobin, `"selection_policy":{"policy":"round_robin"}`) {
		t.Errorf("front.Caddyfile with FRONT_POLICY=round_robin: adapted config lacks the round_robin policy:\n%s", roundRobin)
	}
}

// An instance run from examples/cluster/instance.Caddyfile answers whatever
// Host the front passes on (a Caddy front, and nginx.conf, pass the
// client's): with Host mcp.example.com, /healthz answers "ok", and a
// session's initialize, notifications/initialized and tools/list go
// through mcp_serializer, which tracks the session, to the app server,
// which sees that Host. A site address naming a host, an IP included, would
// answer them with an empty 200.
func TestClusterExampleInstanceAnswersAnyHost(t *testing.T) {
	requireModule(t, redisStateModule)
	redis := startRedis(t)
	const host = "mcp.example.com"
	stub := &mcpstub.Backend{}
	var mu sync.Mutex
	var upstreamHosts []string
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		upstreamHosts = append(upstreamHosts, r.Host)
		mu.Unlock()
		stub.ServeHTTP(w, r)
	}))
	t.Cleanup(upstream.Close)

	dir := t.TempDir()
	in := &caddyInstance{Name: "example instance", Port: testnet.FreePort(t), Admin: testnet.FreePort(t), dir: dir,
		conf: filepath.Join(repoRoot(t), "examples", "cluster", "instance.Caddyfile"), log: filepath.Join(dir, "caddy.log")}
	in.URL = "http://127.0.0.1:" + strconv.Itoa(in.Port)
	in.env = []string{
		"INSTANCE_PORT=" + strconv.Itoa(in.Port),
		"INSTANCE_BIND=127.0.0.1",
		"INSTANCE_ADMIN=127.0.0.1:" + strconv.Itoa(in.Admin),
		"UPSTREAM=" + strings.TrimPrefix(upstream.URL, "http://"),
		"REDIS_ADDRESS=" + redis.Addr,
	}
	dumpOnFailure(t, in.Name, in.log)
	in.start(t)

	client := &http.Client{Timeout: 10 * time.Second, Transport: hostHeader{host}}
	resp, err := client.Get(in.URL + "/healthz")
	if err != nil {
		t.Fatalf("GET /healthz: %v", err)
	}
	health, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(health) != "ok" {
		t.Errorf("GET /healthz with Host %s: %s %q, want 200 \"ok\"", host, resp.Status, health)
	}

	resp, body := post(t, client, in.URL+"/mcp", "", initializeBody)
	session := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || session == "" || !strings.Contains(string(body), `"result"`) {
		t.Fatalf("initialize with Host %s: %s, session id present %v, body %q: the instance did not route it to its app server", host, resp.Status, session != "", body)
	}
	if counts := instanceSessionCounts(t, in); counts["sessions"] != 1 || counts["initializing"] != 1 {
		t.Errorf("mcp_serializer's table after initialize: %v, want one session, initializing", counts)
	}
	if resp, body := post(t, client, in.URL+"/mcp", session, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("notifications/initialized: %s %s", resp.Status, body)
	}
	if resp, body := post(t, client, in.URL+"/mcp", session, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`); resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"tools"`) {
		t.Fatalf("tools/list: %s %s", resp.Status, body)
	}
	if counts := instanceSessionCounts(t, in); counts["sessions"] != 1 || counts["open"] != 1 {
		t.Errorf("mcp_serializer's table after notifications/initialized: %v, want one session, open", counts)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(upstreamHosts) != 3 {
		t.Errorf("the app server got %d requests, want 3 (initialize, notifications/initialized, tools/list)", len(upstreamHosts))
	}
	for _, h := range upstreamHosts {
		if h != host {
			t.Errorf("the app server saw Host %q, want the front's %q", h, host)
		}
	}
}

// hostHeader sends every request with Host set to its value, as a front
// passing the client's Host on does.
type hostHeader struct{ host string }

func (h hostHeader) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Host = h.host
	return http.DefaultTransport.RoundTrip(r)
}

// instanceSessionCounts is the counts of the instance's session table, from
// GET /mcp_serializer/sessions on its admin endpoint.
func instanceSessionCounts(t *testing.T, in *caddyInstance) map[string]int {
	t.Helper()
	status, _, body := adminCall(t, http.MethodGet, "http://127.0.0.1:"+strconv.Itoa(in.Admin)+"/mcp_serializer/sessions?limit=0")
	var rep sessionsReport
	if err := json.Unmarshal(body, &rep); status != http.StatusOK || err != nil || len(rep.Tables) != 1 {
		t.Fatalf("GET /mcp_serializer/sessions: %d %v %s", status, err, body)
	}
	return rep.Tables[0].Counts
}

// The cluster example's nginx.conf and haproxy.cfg pass the programs' own
// checks as written and in their round-robin variants, the ones
// TestClusterBehindEachFront runs. Each sends a session to one instance by
// a consistent hash of Mcp-Session-Id and lets event streams through.
func TestClusterExampleNginxAndHAProxyConfigsCheck(t *testing.T) {
	dir := filepath.Join(repoRoot(t), "examples", "cluster")
	t.Run("nginx", func(t *testing.T) {
		nginx := sbinTool(t, "nginx")
		conf := filepath.Join(dir, "nginx.conf")
		text := renderExample(t, "cluster", "nginx.conf", nil)
		for _, want := range []string{nginxExampleHash, "proxy_http_version 1.1;", `proxy_set_header Connection "";`, "proxy_buffering off;", "proxy_read_timeout 1h;"} {
			if !strings.Contains(text, want) {
				t.Errorf("nginx.conf lacks %q", want)
			}
		}
		roundRobin := filepath.Join(t.TempDir(), "nginx.conf")
		if err := os.WriteFile(roundRobin, []byte(renderNginxExample(t, exampleFrontAddr, []string{"127.0.0.1:8081", "127.0.0.1:8082", "127.0.0.1:8083"}, false)), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, c := range []string{conf, roundRobin} {
			out, err := exec.Command(nginx, nginxArgs(t.TempDir(), c, "-t")...).CombinedOutput()
			if err != nil {
				t.Errorf("nginx -t %s: %v\n%s", c, err, out)
			}
		}
	})
	t.Run("haproxy", func(t *testing.T) {
		haproxy := sbinTool(t, "haproxy")
		conf := filepath.Join(dir, "haproxy.cfg")
		text := renderExample(t, "cluster", "haproxy.cfg", nil)
		for _, want := range []string{haproxyExampleHash, "\thash-type consistent\n", "timeout server 1h"} {
			if !strings.Contains(text, want) {
				t.Errorf("haproxy.cfg lacks %q", want)
			}
		}
		roundRobin := filepath.Join(t.TempDir(), "haproxy.cfg")
		if err := os.WriteFile(roundRobin, []byte(renderHAProxyExample(t, exampleFrontAddr, []string{"127.0.0.1:8081", "127.0.0.1:8082", "127.0.0.1:8083"}, false)), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, c := range []string{conf, roundRobin} {
			out, err := exec.Command(haproxy, "-c", "-f", c).CombinedOutput()
			if err != nil {
				t.Errorf("haproxy -c -f %s: %v\n%s", c, err, out)
			}
			if strings.Contains(string(out), "WARNING") {
				t.Errorf("haproxy -c -f %s warned:\n%s", c, out)
			}
		}
	})
}

// The reverse-proxy example, run as written in front of four replicas of the
// PHP backend (PHP's built-in server, two workers each) that share one
// session store: pipelined connects see no failure.
func TestReverseProxyExampleWithReplicas(t *testing.T) {
	prerequisites(t)
	root := repoRoot(t)
	fpmBin := phpFPMBinary(t) // the replicas use the CLI that comes with it
	store := &phpFPM{
		PublicDir: filepath.Join(root, "integration", "php", "public"),
		Dir:       t.TempDir(),
	}
	store.Store = filepath.Join(store.Dir, "sessions.sqlite")
	initStore(t, fpmBin, store)
	cli, err := exec.LookPath(phpCLIName(fpmBin))
	if err != nil {
		t.Fatalf("PHP CLI not found (%v): %s", err, phpFPMInstallHint)
	}

	var upstreams []string
	for i := 0; i < 4; i++ {
		addr := "127.0.0.1:" + strconv.Itoa(testnet.FreePort(t))
		upstreams = append(upstreams, addr)
		logPath := filepath.Join(store.Dir, fmt.Sprintf("replica-%d.log", i))
		dumpOnFailure(t, "replica", logPath)
		cmd := exec.Command(cli, "-S", addr, "-t", store.PublicDir, filepath.Join(store.PublicDir, "index.php"))
		cmd.Env = append(os.Environ(),
			"PHP_CLI_SERVER_WORKERS=2",
			"MCP_PHP_STORE="+store.Store,
			"MCP_PHP_WORK_MS=2-8",
		)
		p := startProcess(t, "php -S "+addr, cmd, logPath, syscall.SIGTERM, 5*time.Second)
		waitTCP(t, p, addr, logPath)
	}

	caddyfile := exampleCaddyfile(t, "reverse-proxy", map[string]string{
		"{$UPSTREAMS:127.0.0.1:9001 127.0.0.1:9002 127.0.0.1:9003 127.0.0.1:9004}": strings.Join(upstreams, " "),
	})

	// First without the module: the replicas do race.
	start := strings.Index(caddyfile, "\t\tmcp_serializer {")
	end := strings.Index(caddyfile[start:], "\n\t\t}\n")
	if start < 0 || end < 0 {
		t.Fatalf("cannot find the mcp_serializer block in the example")
	}
	direct := startCaddy(t, caddyfile[:start]+caddyfile[start+end+len("\n\t\t}\n"):])
	var without pipelineResult
	runClient(t, 5*time.Minute, &without, "pipeline", "--url", direct+"/mcp", "--n", "100", "--concurrency", "8", "--get", "skip")
	t.Logf("without mcp_serializer, 100 pipelined connects: %s", without.summary())
	if without.Connects == 0 || without.Failures == 0 {
		t.Fatalf("the replicas should race without the module: %s", without.summary())
	}

	base := startCaddy(t, caddyfile)
	// --get skip: each built-in server worker handles one request at a time,
	// so a GET stream would take a whole worker away.
	wantEveryConnect(t, runConnects(t, "reverse-proxy example, 4 replicas", base+"/mcp", 300, "skip"), 300)
}

// The Laravel example, run as written in front of PHP-FPM serving the PHP
// backend (a stand-in for a Laravel app with php-mcp): pipelined connects see
// no failure, and the SDK's flow, SSE progress included, works with the GET
// stream rejected.
func TestLaravelExampleWithPHPFPM(t *testing.T) {
	prerequisites(t)
	fpm := startPHPFPM(t, phpFPMOptions{})
	caddyfile := exampleCaddyfile(t, "laravel", map[string]string{
		"{$APP_ROOT:/var/www/app}":                   filepath.Dir(fpm.PublicDir),
		"{$PHP_FPM_SOCKET:/run/php/php8.2-fpm.sock}": fpm.Socket,
	})
	base := startCaddy(t, caddyfile)

	wantEveryConnect(t, runConnects(t, "laravel example", base+"/mcp", 300, "open"), 300)
	wantStreamedProgress(t, base+"/mcp")
}

// runConnects runs n of the SDK's pipelined connects at url, 8 at a time,
// with its GET stream opened or skipped (get), and logs what they met.
func runConnects(t *testing.T, label, url string, n int, get string) pipelineResult {
	t.Helper()
	var res pipelineResult
	runClient(t, 5*time.Minute, &res, "pipeline", "--url", url, "--n", strconv.Itoa(n), "--concurrency", "8", "--get", get)
	t.Logf("%s: %d pipelined connects: %s", label, n, res.summary())
	logSamples(t, res.Samples)
	return res
}

// wantEveryConnect fails the test unless all n connects succeeded cleanly.
func wantEveryConnect(t *testing.T, res pipelineResult, n int) {
	t.Helper()
	if res.Connects != n || res.Failures != 0 || !res.OK {
		t.Errorf("want %d connects and no failure, got %s", n, res.summary())
	}
}

// exampleCaddyfile reads examples/<name>/Caddyfile, points its site address
// at the port startCaddy picks, makes the given replacements and adds the
// harness's global options.
func exampleCaddyfile(t testing.TB, name string, replacements map[string]string) string {
	t.Helper()
	replacements["{$SITE_ADDRESS:mcp.example.com}"] = "http://127.0.0.1:{$MCP_TEST_PORT}"
	return exampleCaddyfileAsIs(t, name, replacements)
}

// exampleCaddyfileAsIs is exampleCaddyfile for a Caddyfile whose site
// address the replacements point at startCaddy's port themselves.
func exampleCaddyfileAsIs(t testing.TB, name string, replacements map[string]string) string {
	t.Helper()
	example, err := os.ReadFile(filepath.Join(repoRoot(t), "examples", name, "Caddyfile"))
	if err != nil {
		t.Fatal(err)
	}
	caddyfile := string(example)
	for placeholder, value := range replacements {
		if !strings.Contains(caddyfile, placeholder) {
			t.Fatalf("examples/%s/Caddyfile no longer contains %s; update this test", name, placeholder)
		}
		caddyfile = strings.ReplaceAll(caddyfile, placeholder, value)
	}
	return "{\n\tadmin {$MCP_TEST_ADMIN}\n\tauto_https off\n\tpersist_config off\n\tgrace_period 2s\n}\n\n" + caddyfile
}

// phpCLIName is the PHP CLI that belongs with the given php-fpm binary.
func phpCLIName(fpmBin string) string {
	if cli := os.Getenv("MCP_SERIALIZER_PHP_CLI"); cli != "" {
		return cli
	}
	if version := strings.TrimPrefix(filepath.Base(fpmBin), "php-fpm"); version != "" {
		return "php" + version
	}
	return "php"
}

// waitTCP waits until addr accepts connections or the process exits.
func waitTCP(t testing.TB, p *process, addr, logPath string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		if !p.running() {
			t.Fatalf("%s exited during startup: %v\n%s", p.name, p.err, tailFile(logPath, 4000))
		}
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s did not listen on %s within 20s\n%s", p.name, addr, tailFile(logPath, 4000))
		case <-time.After(50 * time.Millisecond):
		}
	}
}
