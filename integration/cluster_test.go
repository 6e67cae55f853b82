package integration

import (
	"context"
	"fmt"
	"io"
	"net"
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

// clusterOptions describes several Caddy instances, each with mcp_serializer
// in front of its own upstream, all upstreams on one shared session store,
// and a front that spreads requests over the instances: by default a Caddy
// hashing Mcp-Session-Id.
type clusterOptions struct {
	Instances int // default 3
	// State is the mcp_serializer `state` line or block ("" for none),
	// e.g. "state redis {\n\taddress 127.0.0.1:6379\n}".
	State string
	// Global holds extra global options for every instance, e.g.
	// "storage file_system /shared/dir".
	Global string
	// Stub puts the Go stand-in (demo-backend with -store-dir) behind each
	// instance instead of PHP-FPM.
	Stub bool
	// PHPWorkers is the size of each instance's PHP-FPM pool (default 4).
	PHPWorkers int
	// ProgressMS is each pool's MCP_PHP_PROGRESS_MS (default 150): a
	// slow_count call of n steps takes n times as long.
	ProgressMS int
	// Order is mcp_serializer's `order` setting on every instance ("" leaves
	// it out: the default, cluster with state redis and local otherwise).
	Order string
	// Key is mcp_serializer's `key` setting on every instance ("" for none),
	// e.g. cartKey.
	Key string
	// KeySecret is mcp_serializer's `key_secret` on every instance ("" for
	// none).
	KeySecret string
	// Balancer is the front (default: Caddy with lb_policy header
	// Mcp-Session-Id).
	Balancer balancer
	// Front holds extra lines for a Caddy front's reverse_proxy block
	// (health checks, lb_try_duration).
	Front string
	// CountOverlap has each PHP-FPM pool count every session's requests
	// running at once in the shared store (overlapReport reads it).
	CountOverlap bool
	// GracePeriod is each instance's grace_period (default 2s): how long a
	// stopping instance finishes its requests.
	GracePeriod time.Duration
	// FrontGracePeriod is a Caddy front's grace_period (default 2s): how
	// long the front's old config finishes its requests when it loads a
	// new one (cluster.addInstance).
	FrontGracePeriod time.Duration
	// QueueTimeout is each instance's queue_timeout (default 30s): how
	// long a request waits for its session's turn, or for an owner that
	// cannot be reached, before it is answered 503.
	QueueTimeout time.Duration
	// Relays puts a TCP relay in the test process in front of each
	// instance, which the instance advertises (mcp_serializer's
	// advertise): the other instances reach it through the relay only,
	// so that cutting it partitions them from the instance while the
	// front and Redis still reach it.
	Relays bool
}

// clusterInitTimeout is the instances' init_timeout.
const clusterInitTimeout = 10 * time.Second

// cluster is a running set of instances behind a front.
type cluster struct {
	Front     string // the front's base URL; clients use Front + "/mcp"
	Instances []*caddyInstance
	fpms      []*phpFPM
	opts      clusterOptions // as started, defaults filled in
	phpStore  string         // the PHP pools' shared store (not with Stub)
	stubDir   string         // the stubs' shared store (with Stub)
	front     *front
}

// caddyInstance is one Caddy process on fixed loopback ports, so that it can
// be killed and started again where the front expects it.
type caddyInstance struct {
	Name  string
	URL   string // base URL
	Port  int
	Admin int
	dir   string
	conf  string
	log   string
	env   []string // more environment for its Caddyfile, e.g. an example's settings
	proc  *process
	relay *hopRelay // the relay it advertises (clusterOptions.Relays), or nil
}

// startCluster starts the upstreams, the instances and the front.
func startCluster(t *testing.T, opts clusterOptions) *cluster {
	t.Helper()
	if opts.Instances == 0 {
		opts.Instances = 3
	}
	if opts.PHPWorkers == 0 {
		opts.PHPWorkers = 4
	}
	if opts.QueueTimeout == 0 {
		opts.QueueTimeout = 30 * time.Second
	}
	c := &cluster{opts: opts}
	if opts.Stub {
		c.stubDir = t.TempDir()
	} else {
		c.phpStore = sharedPHPStore(t)
	}
	for i := 0; i < opts.Instances; i++ {
		c.newInstance(t)
	}
	for _, in := range c.Instances {
		in.start(t)
	}
	c.front = startFront(t, opts, c.dials())
	c.Front = c.front.URL
	return c
}

// newInstance starts an upstream of its own for one more instance and
// writes the instance's Caddyfile, behind a relay it advertises if
// opts.Relays; start runs it. The front does not know it yet.
func (c *cluster) newInstance(t *testing.T) *caddyInstance {
	t.Helper()
	i := len(c.Instances)
	name := fmt.Sprintf("instance-%c", 'a'+i)
	var upstream string // the Caddyfile lines that serve MCP on the instance
	if c.opts.Stub {
		addr := startStub(t, c.stubDir, i)
		upstream = fmt.Sprintf("\t\treverse_proxy %s {\n\t\t\tflush_interval -1\n\t\t}\n", addr)
	} else {
		fpm := startPHPFPM(t, phpFPMOptions{Workers: c.opts.PHPWorkers, Store: c.phpStore, ProgressMS: c.opts.ProgressMS, CountOverlap: c.opts.CountOverlap, Pool: name})
		c.fpms = append(c.fpms, fpm)
		upstream = "\t" + strings.ReplaceAll(fpm.fastcgiDirectives(), "\n\t", "\n\t\t")
	}
	var relay *hopRelay
	advertise := ""
	if c.opts.Relays {
		relay = startHopRelay(t)
		advertise = relay.Addr()
	}
	in := newCaddyInstance(t, name, c.opts.Global, `	handle /healthz {
		respond "ok" 200
	}
	handle {
`+c.serializer(advertise)+upstream+`	}
`)
	if relay != nil {
		relay.setTarget("127.0.0.1:" + strconv.Itoa(in.Port))
		in.relay = relay
	}
	if c.opts.GracePeriod != 0 {
		in.setGracePeriod(t, c.opts.GracePeriod)
	}
	c.Instances = append(c.Instances, in)
	return in
}

// serializer is the mcp_serializer block of every instance, with
// advertise when not "".
func (c *cluster) serializer(advertise string) string {
	opts := c.opts
	serializer := "\t\tmcp_serializer {\n\t\t\tget_stream reject\n\t\t\tinit_timeout " + clusterInitTimeout.String() + "\n\t\t\tqueue_timeout " + opts.QueueTimeout.String() + "\n"
	if opts.Order != "" {
		serializer += "\t\t\torder " + opts.Order + "\n"
	}
	if advertise != "" {
		serializer += "\t\t\tadvertise " + advertise + "\n"
	}
	if opts.Key != "" {
		serializer += "\t\t\tkey " + opts.Key + "\n"
	}
	if opts.KeySecret != "" {
		serializer += "\t\t\tkey_secret " + opts.KeySecret + "\n"
	}
	if opts.State != "" {
		serializer += "\t\t\t" + strings.ReplaceAll(strings.TrimSpace(opts.State), "\n", "\n\t\t\t") + "\n"
	}
	return serializer + "\t\t}\n"
}

// dials are the instances' addresses, as the front dials them.
func (c *cluster) dials() []string {
	var dials []string
	for _, in := range c.Instances {
		dials = append(dials, "127.0.0.1:"+strconv.Itoa(in.Port))
	}
	return dials
}

// addInstance starts one more instance, on an upstream of its own, waits
// until it answers, and then adds it to the front: a Caddy front loads
// its config again through its admin API, nginx reloads its file
// (SIGHUP).
func (c *cluster) addInstance(t *testing.T) *caddyInstance {
	t.Helper()
	in := c.newInstance(t)
	in.start(t)
	c.front.setInstances(t, c.dials())
	return in
}

// sharedPHPStore creates one SQLite session store for several PHP-FPM pools.
func sharedPHPStore(t testing.TB) string {
	t.Helper()
	f := &phpFPM{
		PublicDir: filepath.Join(repoRoot(t), "integration", "php", "public"),
		Dir:       t.TempDir(),
	}
	f.Store = filepath.Join(f.Dir, "sessions.sqlite")
	initStore(t, phpFPMBinary(t), f)
	return f.Store
}

// instanceSite is an instance's site address: a port and no host, as in
// examples/cluster/instance.Caddyfile, so that it answers whatever Host the
// front passes on (HAProxy's health check sends none).
const instanceSite = "http://:{$MCP_TEST_PORT} {\n\tbind 127.0.0.1\n"

// newCaddyInstance writes a Caddyfile with one site holding the directives
// on ports of its own; start runs it.
func newCaddyInstance(t testing.TB, name, global, directives string) *caddyInstance {
	t.Helper()
	dir := t.TempDir()
	in := &caddyInstance{Name: name, Port: testnet.FreePort(t), Admin: testnet.FreePort(t), dir: dir}
	in.URL = "http://127.0.0.1:" + strconv.Itoa(in.Port)
	in.conf = filepath.Join(dir, "Caddyfile")
	in.log = filepath.Join(dir, "caddy.log")
	const siteWithHost = "http://127.0.0.1:{$MCP_TEST_PORT} {\n"
	caddyfile := caddySite(directives)
	if !strings.Contains(caddyfile, siteWithHost) {
		t.Fatalf("caddySite no longer starts its site with %q; update newCaddyInstance", siteWithHost)
	}
	caddyfile = strings.Replace(caddyfile, siteWithHost, instanceSite, 1)
	if global != "" {
		caddyfile = strings.Replace(caddyfile, "\tgrace_period 2s\n", "\tgrace_period 2s\n\t"+strings.ReplaceAll(strings.TrimSpace(global), "\n", "\n\t")+"\n", 1)
	}
	if err := os.WriteFile(in.conf, []byte(caddyfile), 0o644); err != nil {
		t.Fatal(err)
	}
	dumpOnFailure(t, name, in.conf, in.log)
	return in
}

// setGracePeriod sets the instance's grace_period in its Caddyfile, for
// its next start.
func (in *caddyInstance) setGracePeriod(t testing.TB, d time.Duration) {
	t.Helper()
	conf, err := os.ReadFile(in.conf)
	if err != nil {
		t.Fatal(err)
	}
	line := regexp.MustCompile(`(?m)^\tgrace_period \S+$`)
	if !line.Match(conf) {
		t.Fatalf("%s: no grace_period line in its Caddyfile", in.Name)
	}
	if err := os.WriteFile(in.conf, line.ReplaceAll(conf, []byte("\tgrace_period "+d.String())), 0o644); err != nil {
		t.Fatal(err)
	}
}

// start runs `caddy run` on the instance's Caddyfile and waits until it
// serves. It can be called again after kill: same ports, same config, an
// empty memory.
func (in *caddyInstance) start(t testing.TB) {
	t.Helper()
	cmd := exec.Command(caddyBinary(t), "run", "--config", in.conf, "--adapter", "caddyfile")
	cmd.Dir = in.dir
	cmd.Env = append(os.Environ(),
		"MCP_TEST_PORT="+strconv.Itoa(in.Port),
		"MCP_TEST_ADMIN=127.0.0.1:"+strconv.Itoa(in.Admin),
		"HOME="+in.dir,
		"XDG_CONFIG_HOME="+filepath.Join(in.dir, "config"),
		"XDG_DATA_HOME="+filepath.Join(in.dir, "data"),
	)
	cmd.Env = append(cmd.Env, in.env...)
	in.proc = startProcess(t, in.Name, cmd, in.log, syscall.SIGINT, 10*time.Second)
	client := &http.Client{Timeout: 2 * time.Second}
	adminURL := "http://127.0.0.1:" + strconv.Itoa(in.Admin) + "/config/"
	deadline := time.Now().Add(30 * time.Second)
	for {
		if !in.proc.running() {
			t.Fatalf("%s exited during startup: %v\n%s", in.Name, in.proc.err, tailFile(in.log, 8000))
		}
		if caddyReady(client, adminURL, "127.0.0.1:"+strconv.Itoa(in.Port)) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not answer on %s within 30s\n%s", in.Name, in.URL, tailFile(in.log, 8000))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// kill ends the instance at once (SIGKILL): no graceful shutdown, its
// in-memory session table is gone.
func (in *caddyInstance) kill(t testing.TB) {
	t.Helper()
	in.proc.stop(t, syscall.SIGKILL, 5*time.Second)
}

// waitRefusing waits until the instance's port refuses connections (a
// stopping Caddy closes its listener first), failing after 30 s.
func (in *caddyInstance) waitRefusing(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(in.Port), time.Second)
		if err != nil {
			return
		}
		conn.Close()
		if time.Now().After(deadline) {
			t.Fatalf("%s still accepts connections 30s after it was told to stop", in.Name)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// metrics returns the sum of every sample of a metric on the instance's
// logText is what the instance has logged so far.
func (in *caddyInstance) logText(t testing.TB) string {
	t.Helper()
	data, err := os.ReadFile(in.log)
	if err != nil {
		t.Fatalf("%s's log: %v", in.Name, err)
	}
	return string(data)
}

// admin endpoint, by label set ("" when it has none).
func (in *caddyInstance) metrics(t testing.TB, name string) map[string]float64 {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://127.0.0.1:" + strconv.Itoa(in.Admin) + "/metrics")
	if err != nil {
		t.Fatalf("%s metrics: %v", in.Name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s metrics: %v", in.Name, err)
	}
	out := map[string]float64{}
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `(\{[^}]*\})? (\S+)$`)
	for _, m := range re.FindAllStringSubmatch(string(body), -1) {
		v, err := strconv.ParseFloat(m[2], 64)
		if err == nil {
			out[m[1]] += v
		}
	}
	return out
}

// stateErrors sums caddy_mcp_serializer_state_errors_total over the
// instances that are running, by label set.
func (c *cluster) stateErrors(t testing.TB) map[string]float64 {
	t.Helper()
	return c.metrics(t, "caddy_mcp_serializer_state_errors_total")
}

// metrics sums a metric over the instances that are running, by label set.
func (c *cluster) metrics(t testing.TB, name string) map[string]float64 {
	t.Helper()
	total := map[string]float64{}
	for _, in := range c.Instances {
		if !in.proc.running() {
			continue
		}
		for labels, v := range in.metrics(t, name) {
			total[labels] += v
		}
	}
	return total
}

// logSummary is the PHP error logs' summary, per pool.
func (c *cluster) logSummary() string {
	var b strings.Builder
	for i, f := range c.fpms {
		fmt.Fprintf(&b, "\n pool %d: %s", i, f.logSummary())
	}
	if b.Len() == 0 {
		return "(no PHP pools)"
	}
	return b.String()
}

// demoBackendBin is the stand-in MCP server: $MCP_SERIALIZER_DEMO_BACKEND when
// set (the Makefile exports bin/demo-backend), else one built with `go
// build`, once per test binary.
var demoBackendBin = &testBinary{
	env:  "MCP_SERIALIZER_DEMO_BACKEND",
	hint: "build it with `make bin/demo-backend`",
	build: func(ctx context.Context, root string) (string, error) {
		dir, err := os.MkdirTemp("", "mcp-demo-backend-")
		if err != nil {
			return "", err
		}
		out := filepath.Join(dir, "demo-backend")
		cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./examples/demo-backend")
		cmd.Dir = root
		if msg, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("go build ./examples/demo-backend: %w\n%s", err, msg)
		}
		return out, nil
	},
}

func demoBackendBinary(t testing.TB) string {
	t.Helper()
	return demoBackendBin.path(t)
}

// startStub runs the stand-in MCP server on a free loopback port with its
// sessions in storeDir, shared by every stub given the same directory.
func startStub(t testing.TB, storeDir string, i int) string {
	t.Helper()
	addr := "127.0.0.1:" + strconv.Itoa(testnet.FreePort(t))
	logPath := filepath.Join(t.TempDir(), fmt.Sprintf("stub-%d.log", i))
	dumpOnFailure(t, "stub", logPath)
	cmd := exec.Command(demoBackendBinary(t), "-listen", addr, "-store-dir", storeDir, "-work-min", "1ms", "-work-max", "5ms")
	p := startProcess(t, "demo-backend "+addr, cmd, logPath, syscall.SIGTERM, 5*time.Second)
	waitTCP(t, p, addr, logPath)
	return addr
}

// requireModule fails the test when the Caddy binary lacks a module.
func requireModule(t testing.TB, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, caddyBinary(t), "list-modules").Output()
	if err != nil {
		t.Fatalf("caddy list-modules: %v", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.TrimSpace(line) == id {
			return
		}
	}
	t.Fatalf("the Caddy binary %s has no module %s (rebuild it with `make caddy`)", caddyBinary(t), id)
}
