package integration

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/testnet"
)

// Both MCP protocol eras through the module: MCP 2026-07-28 (session-less,
// opened by a `server/discover` probe, MCP-Protocol-Version, Mcp-Method,
// Mcp-Name and Mcp-Param-* headers on every POST) and the 2025 era
// (`initialize`, Mcp-Session-Id). The clients: the v1 SDK client
// (client.mjs), and the v2 SDK client (v2client.mjs, @modelcontextprotocol/
// client 2.4.0) negotiating "auto" or pinned to 2026-07-28. The backends:
// integration/php under PHP-FPM with MCP_PHP_ERAS=legacy (what php-mcp style
// apps serve today), the same app serving both eras, and the v2 SDK's own
// dual-era server (v2server.mjs).

const modernVersion = "2026-07-28"

// v2Script returns node and one of the v2 SDK scripts, failing the test
// with what to install when node or the v2 packages are missing.
func v2Script(t testing.TB, name string) (node, script string) {
	t.Helper()
	node, v1 := clientScript(t)
	dir := filepath.Dir(v1)
	for _, pkg := range []string{"client", "server"} {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", pkg, "package.json")); err != nil {
			t.Fatalf("@modelcontextprotocol/%s not installed in %s (%v): run `npm ci --prefix integration/client` from the repository root", pkg, dir, err)
		}
	}
	return node, filepath.Join(dir, name)
}

// runV2Client runs v2client.mjs with args and decodes its last stdout line
// into result, as runClient does for client.mjs.
func runV2Client(t testing.TB, timeout time.Duration, result any, args ...string) {
	t.Helper()
	node, script := v2Script(t, "v2client.mjs")
	runNodeScript(t, "v2client", node, script, 4000, scriptIO{}, timeout, result, args...)
}

// v2Connects is v2client.mjs's connects mode's final line.
type v2Connects struct {
	OK             bool           `json:"ok"`
	Error          string         `json:"error"`
	N              int            `json:"n"`
	Connects       int            `json:"connects"`
	FailedConnects int            `json:"failedConnects"`
	FailedSteps    map[string]int `json:"failedSteps"`
	Eras           map[string]int `json:"eras"`
	HTTPErrors     map[string]int `json:"httpErrors"`
	Posts          int            `json:"posts"`
	Failures       int            `json:"failures"`
	Samples        []string       `json:"samples"`
	ElapsedMs      int            `json:"elapsedMs"`
	First          struct {
		Era             string     `json:"era"`
		ProtocolVersion string     `json:"protocolVersion"`
		SessionID       string     `json:"sessionId"`
		Tools           []string   `json:"tools"`
		Cart            *cartRace  `json:"cart"`
		Probe           *v2Probe   `json:"probe"`
		Exchanges       []v2Packet `json:"exchanges"`
	} `json:"first"`
}

func (r v2Connects) summary() string {
	return fmt.Sprintf("%d/%d connects, %d failed %v, eras %v, HTTP errors %v, %d POSTs, in %d ms",
		r.Connects, r.N, r.FailedConnects, r.FailedSteps, r.Eras, r.HTTPErrors, r.Posts, r.ElapsedMs)
}

// cartRace is the handle race on one cart: Adds cart_add calls at once.
type cartRace struct {
	Adds                 int      `json:"adds"`
	FailedCalls          int      `json:"failedCalls"`
	FailedSamples        []string `json:"failedSamples"`
	Items                int      `json:"items"`
	Lost                 int      `json:"lost"`
	Posts                int      `json:"posts"`
	PostsWithParamHeader int      `json:"postsWithParamHeader"`
}

// v2Probe is the first POST of a connect, byte for byte.
type v2Probe struct {
	Request struct {
		Headers map[string]string `json:"headers"`
		Body    string            `json:"body"`
	} `json:"request"`
	Response struct {
		Status  int               `json:"status"`
		Headers map[string]string `json:"headers"`
		Body    string            `json:"body"`
	} `json:"response"`
}

// v2Packet is one HTTP exchange of the first connect.
type v2Packet struct {
	Method          string          `json:"method"`
	RPCMethod       string          `json:"rpcMethod"`
	Session         bool            `json:"session"`
	ProtocolVersion string          `json:"mcp-protocol-version"`
	McpMethod       string          `json:"mcp-method"`
	McpName         string          `json:"mcp-name"`
	ParamCart       string          `json:"mcp-param-cart"`
	Status          json.RawMessage `json:"status"`
}

// startV2Server runs v2server.mjs (the v2 SDK's dual-era server) and
// returns its /mcp URL and the path of its request log.
func startV2Server(t testing.TB, args ...string) (url, logPath string) {
	t.Helper()
	node, script := v2Script(t, "v2server.mjs")
	addr := "127.0.0.1:" + strconv.Itoa(testnet.FreePort(t))
	logPath = filepath.Join(t.TempDir(), "v2server.log")
	dumpOnFailure(t, "v2 server", logPath)
	cmd := exec.Command(node, append([]string{script, "--port", strings.TrimPrefix(addr, "127.0.0.1:")}, args...)...)
	cmd.Dir = filepath.Dir(script)
	p := startProcess(t, "v2server", cmd, logPath, syscall.SIGTERM, 5*time.Second)
	waitTCP(t, p, addr, logPath)
	return "http://" + addr + "/mcp", logPath
}

// erasCaddy runs Caddy with one site holding directives, its module's
// debug log and the site's access log written as JSON to logPath.
func erasCaddy(t testing.TB, directives string) (c *caddyProcess, logPath string) {
	t.Helper()
	logPath = filepath.Join(t.TempDir(), "caddy-json.log")
	dumpOnFailure(t, "caddy logs", logPath)
	return runCaddy(t, `{
	admin {$MCP_TEST_ADMIN}
	auto_https off
	persist_config off
	grace_period 2s
	log {
		output file `+logPath+`
		format json
		level DEBUG
	}
}

http://127.0.0.1:{$MCP_TEST_PORT} {
	log {
		output file `+logPath+`
		format json
	}
`+strings.TrimRight(directives, "\n")+`
}
`), logPath
}

// logEntries returns the JSON log lines whose "msg" is msg.
func logEntries(t testing.TB, path, msg string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("caddy log: %v", err)
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var entry map[string]any
		if json.Unmarshal(sc.Bytes(), &entry) == nil && entry["msg"] == msg {
			out = append(out, entry)
		}
	}
	return out
}

// moduleCounts is the module's metrics that tell whether requests waited:
// the queue_wait_seconds histogram's count, gate holds, rejections and
// session-less bypasses.
type moduleCounts struct {
	Waits, Holds, Rejections, Sessionless float64
}

func readModuleCounts(t testing.TB, admin string) moduleCounts {
	t.Helper()
	return moduleCounts{
		Waits:       sumValues(adminMetric(t, admin, "caddy_mcp_serializer_queue_wait_seconds_count")),
		Holds:       sumValues(adminMetric(t, admin, "caddy_mcp_serializer_gate_holds_total")),
		Rejections:  sumValues(adminMetric(t, admin, "caddy_mcp_serializer_rejections_total")),
		Sessionless: adminMetric(t, admin, "caddy_mcp_serializer_bypasses_total")[`{kind="sessionless"}`],
	}
}

func (a moduleCounts) minus(b moduleCounts) moduleCounts {
	return moduleCounts{a.Waits - b.Waits, a.Holds - b.Holds, a.Rejections - b.Rejections, a.Sessionless - b.Sessionless}
}

// pinnedFailure is what the v2 client pinned to 2026-07-28 says of a
// server that answers the probe as a 2025-era server does.
const pinnedFailure = "Version negotiation failed: the server did not offer pinned protocol version 2026-07-28 via server/discover (no fallback in pin mode)"

// eraBackend is one backend of the matrix, served directly and through
// the module.
type eraBackend struct {
	name          string
	modern        bool   // serves 2026-07-28
	direct        string // plain Caddy (php_fastcgi) or the server itself
	module        *caddyProcess
	moduleLog     string
	upstreamLog   string // the v2 server's request log, "" for PHP
	discoverOwner string // the serverInfo name in its discover answer
}

// Every client connects through the module to every backend it can speak
// to with no failure; the discovery probe and its answer pass unchanged;
// a fallback `initialize` starts a gated session; modern requests wait in
// no queue and at no gate.
func TestBothErasConnectThroughTheModule(t *testing.T) {
	prerequisites(t)
	v2Script(t, "v2client.mjs")
	const n = 8
	fpm := startPHPFPM(t, phpFPMOptions{Workers: 6})
	php := func(eras string) string {
		return fmt.Sprintf("\troot * %s\n\tphp_fastcgi unix/%s {\n\t\tenv MCP_PHP_ERAS %s\n\t}\n", fpm.PublicDir, fpm.Socket, eras)
	}
	v2URL, v2Log := startV2Server(t)
	v2Addr := strings.TrimSuffix(strings.TrimPrefix(v2URL, "http://"), "/mcp")

	var backends []*eraBackend
	for _, b := range []struct {
		name, site string
		modern     bool
		owner      string
	}{
		{"PHP-FPM, 2025 era only (MCP_PHP_ERAS=legacy)", php("legacy"), false, ""},
		{"PHP-FPM, both eras", php("both"), true, "mcp-php-fpm-backend"},
		{"v2 SDK server, both eras", "\treverse_proxy " + v2Addr + "\n", true, "mcp-serializer-v2-server"},
	} {
		eb := &eraBackend{name: b.name, modern: b.modern, discoverOwner: b.owner}
		eb.module, eb.moduleLog = erasCaddy(t, "\tmcp_serializer\n"+b.site)
		if strings.HasPrefix(b.name, "v2") {
			eb.direct, eb.upstreamLog = v2URL, v2Log
		} else {
			eb.direct = startCaddy(t, caddySite(b.site)) + "/mcp"
		}
		backends = append(backends, eb)
	}

	type cell struct{ connects, failed int }
	table := map[string]map[string]cell{}
	for _, b := range backends {
		table[b.name] = map[string]cell{}
		url := b.module.URL + "/mcp"

		// The probe, direct and through the module: the same bytes come back.
		var direct, through v2Connects
		runV2Client(t, 2*time.Minute, &direct, "connects", "--url", b.direct, "--negotiation", "auto", "--n", "1", "--adds", "0")
		before := readModuleCounts(t, b.module.Admin)
		runV2Client(t, 2*time.Minute, &through, "connects", "--url", url, "--negotiation", "auto", "--n", strconv.Itoa(n), "--adds", "0")
		table[b.name]["v2 auto"] = cell{through.Connects, through.FailedConnects}
		t.Logf("%s, v2 client auto: %s", b.name, through.summary())
		checkProbe(t, b, direct, through)
		var seq strings.Builder
		for _, e := range through.First.Exchanges {
			fmt.Fprintf(&seq, "\n  %s %s (MCP-Protocol-Version %q, Mcp-Method %q, Mcp-Name %q, session %v) -> %s",
				e.Method, e.RPCMethod, e.ProtocolVersion, e.McpMethod, e.McpName, e.Session, e.Status)
		}
		t.Logf("%s, v2 client auto, the first connect's exchanges through the module:%s", b.name, seq.String())
		if through.Connects != n || through.Failures != 0 {
			t.Errorf("%s, v2 client auto: %s; samples %q", b.name, through.summary(), through.Samples)
		}
		if b.modern {
			if through.Eras["modern"] != n {
				t.Errorf("%s, v2 client auto: eras %v, want all %d modern", b.name, through.Eras, n)
			}
			checkNeverWaited(t, b.name+", v2 client auto", readModuleCounts(t, b.module.Admin).minus(before), through.Posts)
		} else {
			if through.Eras["legacy"] != n {
				t.Errorf("%s, v2 client auto: eras %v, want all %d legacy (the fallback initialize)", b.name, through.Eras, n)
			}
			// Each fallback initialize started a session the module held until initialized.
			if created := len(logEntries(t, b.moduleLog, "session created, held until initialized")); created != n {
				t.Errorf("%s: the module logged %d gated sessions for %d fallback connects", b.name, created, n)
			}
		}

		var pinned v2Connects
		before = readModuleCounts(t, b.module.Admin)
		runV2Client(t, 2*time.Minute, &pinned, "connects", "--url", url, "--negotiation", "pin", "--n", strconv.Itoa(n), "--adds", "0")
		table[b.name]["v2 pinned 2026-07-28"] = cell{pinned.Connects, pinned.FailedConnects}
		t.Logf("%s, v2 client pinned: %s", b.name, pinned.summary())
		if b.modern {
			if pinned.Connects != n || pinned.Failures != 0 {
				t.Errorf("%s, v2 client pinned: %s; samples %q", b.name, pinned.summary(), pinned.Samples)
			}
			checkNeverWaited(t, b.name+", v2 client pinned", readModuleCounts(t, b.module.Admin).minus(before), pinned.Posts)
		} else {
			// Pinned means no fallback: a 2025-era server cannot serve it, with or without the module.
			if pinned.Connects != 0 || pinned.FailedSteps["connect"] != n || len(pinned.Samples) == 0 || !strings.Contains(pinned.Samples[0], pinnedFailure) {
				t.Errorf("%s, v2 client pinned: want every connect to fail with %q: %s; samples %q", b.name, pinnedFailure, pinned.summary(), pinned.Samples)
			}
		}

		v1 := runSessions(t, url, n, 4, 20*time.Second)
		table[b.name]["v1 SDK"] = cell{v1.Completed, v1.FailedSessions}
		t.Logf("%s, v1 client: %s", b.name, v1.summary())
		if v1.Completed != n || v1.FailedSessions != 0 {
			t.Errorf("%s, v1 client: %s; samples %q", b.name, v1.summary(), v1.Samples)
		}
		// Each v1 initialize (and each fallback one before) started a gated session.
		want := n
		if !b.modern {
			want += n
		}
		if got := len(logEntries(t, b.moduleLog, "session created, held until initialized")); got != want {
			t.Errorf("%s: the module logged %d gated sessions, want %d", b.name, got, want)
		}
	}

	var md strings.Builder
	md.WriteString("| backend (through mcp_serializer) | v1 SDK | v2 auto | v2 pinned 2026-07-28 |\n|---|---|---|---|\n")
	for _, b := range backends {
		fmt.Fprintf(&md, "| %s |", b.name)
		for _, c := range []string{"v1 SDK", "v2 auto", "v2 pinned 2026-07-28"} {
			fmt.Fprintf(&md, " %d connects, %d failed |", table[b.name][c].connects, table[b.name][c].failed)
		}
		md.WriteString("\n")
	}
	t.Logf("connects and failures per client and backend, %d connects each:\n%s", n, md.String())
}

// checkProbe compares the first connect's probe direct and through the
// module: the request the client sent, the status and body that came back
// (byte for byte), and, for the v2 server, the body the upstream received.
func checkProbe(t *testing.T, b *eraBackend, direct, through v2Connects) {
	t.Helper()
	d, m := direct.First.Probe, through.First.Probe
	if d == nil || m == nil {
		t.Errorf("%s: no probe recorded (direct %v, through the module %v)", b.name, d != nil, m != nil)
		return
	}
	t.Logf("%s: probe request headers %v\n  body %s\n  answered %d %s\n  %s", b.name, m.Request.Headers, m.Request.Body,
		m.Response.Status, m.Response.Headers["content-type"], m.Response.Body)
	if m.Request.Headers["mcp-method"] != "server/discover" || m.Request.Headers["mcp-protocol-version"] != modernVersion || m.Request.Headers["mcp-session-id"] != "" {
		t.Errorf("%s: the probe's headers: %v", b.name, m.Request.Headers)
	}
	if d.Request.Body != m.Request.Body {
		t.Errorf("%s: the client sent different probes:\n direct %s\n module %s", b.name, d.Request.Body, m.Request.Body)
	}
	if d.Response.Status != m.Response.Status || d.Response.Body != m.Response.Body || d.Response.Headers["content-type"] != m.Response.Headers["content-type"] {
		t.Errorf("%s: the probe's answer differs through the module:\n direct %d %s %q\n module %d %s %q", b.name,
			d.Response.Status, d.Response.Headers["content-type"], d.Response.Body, m.Response.Status, m.Response.Headers["content-type"], m.Response.Body)
	}
	if b.modern {
		if m.Response.Status != 200 || !strings.Contains(m.Response.Body, `"supportedVersions":["`+modernVersion+`"]`) || !strings.Contains(m.Response.Body, b.discoverOwner) {
			t.Errorf("%s: want the upstream's DiscoverResult, got %d %s", b.name, m.Response.Status, m.Response.Body)
		}
	} else if m.Response.Status != 400 || strings.Contains(m.Response.Body, "-32022") {
		t.Errorf("%s: want a 400 without a modern error, got %d %s", b.name, m.Response.Status, m.Response.Body)
	}
	// The access log names the probe by its Mcp-Method header.
	probes := 0
	for _, e := range logEntries(t, b.moduleLog, "handled request") {
		if e["mcp_method"] == "server/discover" {
			probes++
			if probes == 1 {
				line, _ := json.Marshal(map[string]any{"status": e["status"], "mcp_method": e["mcp_method"], "mcp_protocol_version": e["mcp_protocol_version"], "mcp_session_hash": e["mcp_session_hash"]})
				t.Logf("%s: access log of a probe: %s", b.name, line)
			}
		}
	}
	if probes == 0 {
		t.Errorf("%s: no access log entry with mcp_method server/discover", b.name)
	}
	if b.upstreamLog != "" {
		sum := sha256.Sum256([]byte(m.Request.Body))
		if want := "body-sha256=" + hex.EncodeToString(sum[:]); !strings.Contains(tailFile(b.upstreamLog, 1<<20), want) {
			t.Errorf("%s: the upstream never received the probe's exact body (%s)", b.name, want)
		}
	}
}

// checkNeverWaited fails unless the module passed a run's modern POSTs
// straight through: no queue wait observed, no gate hold, no rejection,
// each counted as a session-less bypass.
func checkNeverWaited(t *testing.T, label string, d moduleCounts, posts int) {
	t.Helper()
	t.Logf("%s: module metrics over the run: %+v for %d POSTs", label, d, posts)
	if d.Waits != 0 || d.Holds != 0 || d.Rejections != 0 {
		t.Errorf("%s: modern requests waited or were refused: %+v", label, d)
	}
	if d.Sessionless != float64(posts) {
		t.Errorf("%s: %v session-less bypasses for %d POSTs", label, d.Sessionless, posts)
	}
}

// Parallel cart_add calls on one handle, from the v2 client (which mirrors
// the handle, marked "x-mcp-header": "Cart", into Mcp-Param-Cart): straight
// to PHP-FPM (plain php_fastcgi) and through the module without `key`, the
// whole-record saves overwrite each other and updates are lost; through the
// module with `key {http.request.header.Mcp-Param-Cart}` the calls on one
// cart run one at a time and none is lost. The same for the v2 SDK server,
// whose cart_add pauses between load and save too.
func TestParallelCallsOnOneHandleLoseNoUpdateWithKey(t *testing.T) {
	prerequisites(t)
	v2Script(t, "v2client.mjs")
	const adds = 24
	fpm := startPHPFPM(t, phpFPMOptions{Workers: 8})
	v2URL, _ := startV2Server(t)
	v2Proxy := "\treverse_proxy " + strings.TrimSuffix(strings.TrimPrefix(v2URL, "http://"), "/mcp") + "\n"
	const keyed = "\tmcp_serializer {\n\t\tkey {http.request.header.Mcp-Param-Cart}\n\t}\n"

	race := func(label, url string) cartRace {
		t.Helper()
		var res v2Connects
		runV2Client(t, 2*time.Minute, &res, "connects", "--url", url, "--negotiation", "pin", "--n", "1", "--adds", strconv.Itoa(adds))
		if res.First.Cart == nil {
			t.Fatalf("%s: no cart race ran: %s; samples %q", label, res.summary(), res.Samples)
		}
		c := *res.First.Cart
		t.Logf("%s: %d parallel cart_add on one cart: %d items kept, %d updates lost, %d calls failed; %d of %d POSTs carried Mcp-Param-Cart",
			label, c.Adds, c.Items, c.Lost, c.FailedCalls, c.PostsWithParamHeader, c.Posts)
		if c.FailedCalls != 0 || res.FailedConnects != 0 {
			t.Errorf("%s: %d calls failed %q; %s", label, c.FailedCalls, c.FailedSamples, res.summary())
		}
		if c.PostsWithParamHeader != adds {
			t.Errorf("%s: %d of %d cart_add POSTs carried Mcp-Param-Cart equal to the handle: the v2 client did not mirror x-mcp-header", label, c.PostsWithParamHeader, adds)
		}
		return c
	}

	for _, b := range []struct{ name, site, direct string }{
		{"PHP-FPM", fpm.fastcgiDirectives(), ""},
		{"v2 SDK server", v2Proxy, v2URL},
	} {
		direct := b.direct
		if direct == "" {
			direct = startCaddy(t, caddySite(b.site)) + "/mcp"
		}
		if lost := race(b.name+" direct", direct).Lost; lost == 0 {
			t.Errorf("%s direct: no update lost: the race is not reproduced (widen MCP_PHP_CART_MS / --delay-ms)", b.name)
		}

		plain, _ := erasCaddy(t, "\tmcp_serializer\n"+b.site)
		race(b.name+" through mcp_serializer without key", plain.URL+"/mcp")

		withKey, _ := erasCaddy(t, keyed+b.site)
		before := readModuleCounts(t, withKey.Admin)
		c := race(b.name+" through mcp_serializer with key {http.request.header.Mcp-Param-Cart}", withKey.URL+"/mcp")
		d := readModuleCounts(t, withKey.Admin).minus(before)
		t.Logf("%s with key: module metrics over the run: %+v", b.name, d)
		if c.Lost != 0 || c.Items != adds {
			t.Errorf("%s with key: %d of %d items kept, %d lost: calls on one handle were not run one at a time", b.name, c.Items, adds, c.Lost)
		}
		if d.Holds != 0 || d.Rejections != 0 || d.Waits < adds {
			t.Errorf("%s with key: want every cart_add to take a turn (queue_wait count >= %d), no gate hold, no rejection: %+v", b.name, adds, d)
		}
	}
}

// v2Listen is v2client.mjs's listen mode's final line.
type v2Listen struct {
	OK          bool     `json:"ok"`
	Error       string   `json:"error"`
	Streams     int      `json:"streams"`
	Opened      int      `json:"opened"`
	FailedOpens int      `json:"failedOpens"`
	OpenMs      []int    `json:"openMs"`
	Samples     []string `json:"samples"`
	ClosedHow   string   `json:"closedHow"`
	WhileHeld   struct {
		Answered bool   `json:"answered"`
		Ms       int    `json:"ms"`
		Error    string `json:"error"`
	} `json:"whileHeld"`
	AfterOneClosed struct {
		Answered     bool   `json:"answered"`
		Ms           int    `json:"ms"`
		SinceCloseMs int    `json:"sinceCloseMs"`
		Error        string `json:"error"`
	} `json:"afterOneClosed"`
}

// runListen opens streams listen streams at url and reports what another
// client met meanwhile.
func runListen(t *testing.T, label, url string, streams int) v2Listen {
	t.Helper()
	var res v2Listen
	runV2Client(t, 2*time.Minute, &res, "listen", "--url", url, "--streams", strconv.Itoa(streams), "--probe-timeout", "2000")
	t.Logf("%s: %d listen streams opened of %d (in %v ms); another client's connect + tools/list while they are open: answered %v in %d ms %s; after one stream closed (%s): answered %v, %d ms after the close",
		label, res.Opened, streams, res.OpenMs, res.WhileHeld.Answered, res.WhileHeld.Ms, res.WhileHeld.Error, res.ClosedHow, res.AfterOneClosed.Answered, res.AfterOneClosed.SinceCloseMs)
	if res.Error != "" || res.Opened != streams {
		t.Fatalf("%s: %d of %d streams opened: %s %q", label, res.Opened, streams, res.Error, res.Samples)
	}
	if !res.AfterOneClosed.Answered {
		t.Errorf("%s: after one stream closed, another client was still not answered: %s", label, res.AfterOneClosed.Error)
	}
	return res
}

// A `subscriptions/listen` stream (MCP 2026-07-28's long-lived POST) holds
// one PHP-FPM worker for as long as it is open, as the 2025 era's GET
// stream does, and the module lets it through as any session-less POST.
// With one stream fewer than the pool's workers another client is served;
// with as many streams as workers nothing else is until a stream closes.
// A Caddy matcher on the Mcp-Method header sends the streams to a pool of
// their own, and the app's pool stays free.
func TestSubscriptionsListenHoldsAPHPFPMWorkerPerStream(t *testing.T) {
	prerequisites(t)
	v2Script(t, "v2client.mjs")
	const workers = 2
	fpm := startPHPFPM(t, phpFPMOptions{Workers: workers})
	// A stream notices a departed client at its next keepalive write.
	fastcgi := func(f *phpFPM) string {
		return fmt.Sprintf("php_fastcgi unix/%s {\n\t\tenv MCP_PHP_GET_POLL_MS 200\n\t}", f.Socket)
	}
	c, _ := erasCaddy(t, fmt.Sprintf("\tmcp_serializer\n\troot * %s\n\t%s\n", fpm.PublicDir, fastcgi(fpm)))

	for _, streams := range []int{workers - 1, workers} {
		res := runListen(t, fmt.Sprintf("one pool of %d workers", workers), c.URL+"/mcp", streams)
		if free := streams < workers; res.WhileHeld.Answered != free {
			t.Errorf("%d streams on %d workers: another client answered %v, want %v", streams, workers, res.WhileHeld.Answered, free)
		}
	}
	d := readModuleCounts(t, c.Admin)
	t.Logf("module metrics: %+v", d)
	if d.Waits != 0 || d.Holds != 0 || d.Rejections != 0 {
		t.Errorf("listen streams and their clients waited in the module or were refused: %+v", d)
	}

	// The streams on a pool of their own (sharing the store), by Mcp-Method.
	streamsPool := startPHPFPM(t, phpFPMOptions{Workers: workers, Store: fpm.Store})
	split, _ := erasCaddy(t, fmt.Sprintf(`	mcp_serializer
	root * %s
	@listen header Mcp-Method subscriptions/listen
	handle @listen {
		%s
	}
	handle {
		%s
	}
`, fpm.PublicDir, fastcgi(streamsPool), fastcgi(fpm)))
	if res := runListen(t, fmt.Sprintf("streams routed to a second pool of %d workers", workers), split.URL+"/mcp", workers); !res.WhileHeld.Answered {
		t.Errorf("with the streams on their own pool, another client was not answered: %s", res.WhileHeld.Error)
	}
}
