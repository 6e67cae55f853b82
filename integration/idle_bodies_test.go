package integration

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Sixty-four connections that announce a 1 MiB body each, with made-up
// session ids, and send none of it, beside 200 pipelined connects through
// the built binary and PHP-FPM: the bodies that never come hold none of
// max_buffered (64 MiB by default), so the connects fail none. Their
// elapsed time beside the idle bodies is reported against a run without
// them, not asserted.
func TestIdleBodiesLockNoSessionOutThroughPHPFPM(t *testing.T) {
	prerequisites(t)
	const idle, announced = 64, 1 << 20
	fpm := startPHPFPM(t, phpFPMOptions{})
	site := caddySite("\tmcp_serializer\n" + fpm.fastcgiDirectives())
	// Caddy's request metrics tell when the idle requests are all in the
	// handler, reading their bodies.
	c := runCaddy(t, strings.Replace(site, "\tgrace_period 2s\n", "\tgrace_period 2s\n\tmetrics\n", 1))
	const n = 200

	var alone pipelineResult
	runClient(t, 10*time.Minute, &alone, "pipeline", "--url", c.URL+"/mcp", "--n", strconv.Itoa(n), "--concurrency", "8", "--get", "skip")
	t.Logf("alone: %s", alone.summary())

	addr := strings.TrimPrefix(c.URL, "http://")
	for i := range idle {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		head := fmt.Sprintf("POST /mcp HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMcp-Session-Id: idle-body-%d\r\nContent-Length: %d\r\n\r\n", addr, i, announced)
		if _, err := conn.Write([]byte(head)); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(time.Minute)
	for sumValues(adminMetric(t, c.Admin, "caddy_http_requests_in_flight")) < idle {
		if time.Now().After(deadline) {
			t.Fatalf("%v requests in flight a minute after %d connections sent their headers", adminMetric(t, c.Admin, "caddy_http_requests_in_flight"), idle)
		}
		time.Sleep(20 * time.Millisecond)
	}

	var beside pipelineResult
	runClient(t, 10*time.Minute, &beside, "pipeline", "--url", c.URL+"/mcp", "--n", strconv.Itoa(n), "--concurrency", "8", "--get", "skip")
	t.Logf("beside %d idle 1 MiB bodies: %s", idle, beside.summary())
	if alone.ElapsedMs > 0 {
		t.Logf("elapsed: %d ms alone, %d ms beside the idle bodies (factor %.2f)", alone.ElapsedMs, beside.ElapsedMs, float64(beside.ElapsedMs)/float64(alone.ElapsedMs))
	}
	if beside.Connects != n || beside.Failures != 0 {
		t.Errorf("beside the idle bodies: %s; want %d connects and no failure", beside.summary(), n)
	}
	if got := adminMetric(t, c.Admin, "caddy_mcp_serializer_rejections_total"); got[`{reason="body_budget"}`] != 0 {
		t.Errorf("rejections: %v, want no body_budget", got)
	}
}
