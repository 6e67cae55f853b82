package caddymodule_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/fcgi"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/testcerts"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/testnet"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/warnlimit"
)

// startCaddyTLS is startCaddy with the site served over HTTPS, as
// https://testcerts.ServerName:port, and the client that trusts it (it
// dials 127.0.0.1 whatever the name).
func startCaddyTLS(t *testing.T, site string) (*testCaddy, *http.Client) {
	t.Helper()
	caFile, certFile, keyFile, err := testcerts.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := &testCaddy{port: testnet.FreePort(t), adminPort: testnet.FreePort(t)}
	c.url = fmt.Sprintf("https://%s:%d", testcerts.ServerName, c.port)
	c.admin = fmt.Sprintf("http://127.0.0.1:%d", c.adminPort)
	caddyfile := fmt.Sprintf(`{
	admin 127.0.0.1:%d
	auto_https off
	persist_config off
	log {
		output discard
	}
}
%s {
	tls %s %s
%s
}
`, c.adminPort, c.url, certFile, keyFile, site)
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
	if err != nil {
		t.Fatalf("adapting Caddyfile: %v", err)
	}
	loadCaddy(t, cfg)

	ca, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca)
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	transport := &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: testcerts.ServerName, MinVersion: tls.VersionTLS12},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, network, fmt.Sprintf("127.0.0.1:%d", c.port))
		},
	}
	t.Cleanup(transport.CloseIdleConnections)
	return c, &http.Client{Transport: transport}
}

// On a site served over HTTPS, the notifications/initialized that
// on_init_timeout synthesize sends on the client's behalf reaches the
// upstream as the client's own would: X-Forwarded-Proto https. An app that
// requires HTTPS (Laravel behind a proxy) redirects a plain-HTTP one, and
// a 301 acknowledges nothing.
func TestSynthesizedInitializedKeepsTheClientsHTTPS(t *testing.T) {
	const sid = "synth-https"
	up, addr := newUpstream(t, mcpAnswer(sid, func(m rpcMsg, w http.ResponseWriter, r *http.Request) bool {
		if r.Header.Get("X-Forwarded-Proto") != "https" {
			http.Redirect(w, r, "https://"+r.Host+r.URL.Path, http.StatusMovedPermanently)
			return true
		}
		return false
	}))
	c, client := startCaddyTLS(t, `mcp_serializer {
	init_timeout 200ms
	on_init_timeout synthesize
}
reverse_proxy `+addr)
	ctx := context.Background()

	if a := call(ctx, client, http.MethodPost, c.url, "", initializeBody); a.err != nil || a.status != http.StatusOK || a.header.Get("Mcp-Session-Id") != sid {
		t.Fatalf("initialize: %d %v %s", a.status, a.err, a.body)
	}
	// Held at the gate until the synthesized notification has ended.
	expectResult(t, call(ctx, client, http.MethodPost, c.url, sid, rpcRequest("2", "tools/list")), "2")

	var synthesized []seenRequest
	for _, r := range up.requests() {
		if parseRPC(r.Body).Method == "notifications/initialized" {
			synthesized = append(synthesized, r)
		}
	}
	if len(synthesized) != 1 {
		t.Fatalf("%d notifications/initialized reached the upstream, want 1 (synthesized); it saw %q", len(synthesized), up.labels())
	}
	if got := synthesized[0].Header.Get("X-Forwarded-Proto"); got != "https" {
		t.Fatalf("synthesized notifications/initialized: X-Forwarded-Proto %q, want https (the initialize came over HTTPS)", got)
	}
	if got := up.requests()[0].Header.Get("X-Forwarded-Proto"); got != "https" {
		t.Fatalf("initialize: X-Forwarded-Proto %q, want https", got)
	}
}

// The same through php_fastcgi: PHP sees HTTPS=on for the synthesized
// notification, as for the client's own requests.
func TestSynthesizedInitializedKeepsTheClientsHTTPSThroughPHPFastCGI(t *testing.T) {
	const sid = "synth-https-fcgi"
	type seen struct {
		method     string
		https      bool   // net/http/fcgi sets r.TLS from HTTPS=on
		serverAddr string // from the connection's local address
	}
	arrived := make(chan seen, 64)
	answer := mcpAnswer(sid, nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go fcgi.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		arrived <- seen{parseRPC(body).Method, r.TLS != nil, fcgi.ProcessEnv(r)["SERVER_ADDR"]}
		if r.TLS == nil {
			http.Redirect(w, r, "https://"+r.Host+r.URL.Path, http.StatusMovedPermanently)
			return
		}
		answer(w, r, body)
	}))
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "index.php"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	c, client := startCaddyTLS(t, `root * `+root+`
mcp_serializer {
	init_timeout 200ms
	on_init_timeout synthesize
}
php_fastcgi `+l.Addr().String())
	ctx := context.Background()

	if a := call(ctx, client, http.MethodPost, c.url, "", initializeBody); a.err != nil || a.status != http.StatusOK || a.header.Get("Mcp-Session-Id") != sid {
		t.Fatalf("initialize: %d %v %s", a.status, a.err, a.body)
	}
	expectResult(t, call(ctx, client, http.MethodPost, c.url, sid, rpcRequest("2", "tools/list")), "2")
	serverAddr := ""
	for _, want := range []string{"initialize", "notifications/initialized", "tools/list"} {
		select {
		case s := <-arrived:
			if s.method != want || !s.https {
				t.Fatalf("PHP saw %s (HTTPS=on: %v), want %s with HTTPS=on", s.method, s.https, want)
			}
			if serverAddr == "" {
				serverAddr = s.serverAddr
			}
			if s.serverAddr == "" || s.serverAddr != serverAddr {
				t.Fatalf("PHP saw %s with SERVER_ADDR %q, want %q as for initialize", s.method, s.serverAddr, serverAddr)
			}
		default:
			t.Fatalf("%s never reached PHP", want)
		}
	}
}

// Any client can create sessions and walk away without initialized: the
// WARN each synthesized notification writes is spaced as the gate-timeout
// WARN is, at most one per warnlimit.Interval, the next naming how many it
// held back.
func TestSynthesizeWarnsAtMostOncePerInterval(t *testing.T) {
	const sessions = 20
	var created atomic.Int32
	_, addr := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		sid := fmt.Sprintf("walked-away-%d", created.Add(1))
		mcpAnswer(sid, nil)(w, r, body)
	})
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	start := time.Now()
	c := startCaddyLogging(t, logFile, `mcp_serializer {
	init_timeout 300ms
	on_init_timeout synthesize
}
reverse_proxy `+addr)
	ctx := context.Background()

	var ids []string
	for range sessions {
		a := call(ctx, http.DefaultClient, http.MethodPost, c.url, "", initializeBody)
		if a.err != nil || a.status != http.StatusOK {
			t.Fatalf("initialize: %d %v %s", a.status, a.err, a.body)
		}
		ids = append(ids, a.header.Get("Mcp-Session-Id"))
	}
	// A request held in each session is let go once the synthesized
	// notification has ended, its WARN written.
	var held []<-chan answer
	for _, id := range ids {
		held = append(held, callAsync(ctx, http.MethodPost, c.url, id, rpcRequest("2", "tools/list")))
	}
	for _, h := range held {
		expectResult(t, await(t, h, 5*time.Second, "held request"), "2")
	}
	elapsed := time.Since(start)

	module, _ := readLogs(t, logFile, "walked-away-")
	var warns []map[string]any
	for _, l := range module {
		if l["msg"] == "sent notifications/initialized on the client's behalf (on_init_timeout synthesize)" {
			warns = append(warns, l)
		}
	}
	bound := 1 + int(elapsed/warnlimit.Interval)
	if len(warns) == 0 || len(warns) > bound {
		t.Fatalf("%d synthesize WARN lines for %d sessions in %v, want 1 to %d", len(warns), sessions, elapsed, bound)
	}
	if got := warns[0]["suppressed"]; got != float64(0) {
		t.Errorf("first synthesize WARN: suppressed = %v, want 0", got)
	}
}
