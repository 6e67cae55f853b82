package caddymodule

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/testclock"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/warnlimit"
	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// Sessions whose client never sends initialized are counted each, but
// logged at most once per interval, the next line naming how many were
// held back: any client can open sessions and walk away.
func TestGateTimeoutWarnsOncePerIntervalAndCountsEvery(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	ev := newEvents(zap.New(core))
	clock := testclock.New()
	ev.now = clock.Now
	counter := metrics.gateTimeout.WithLabelValues(serializer.Forward.String())
	before := testutil.ToFloat64(counter)

	id := func(i int) string { return fmt.Sprintf("walked-away-%d", i) }
	for i := range 5 {
		ev.GateTimedOut(id(i), serializer.Forward)
	}
	if n := logs.Len(); n != 1 {
		t.Fatalf("%d WARN lines for 5 gate timeouts within the interval, want 1", n)
	}
	clock.Advance(warnlimit.Interval)
	ev.GateTimedOut(id(5), serializer.Forward)
	lines := logs.All()
	if len(lines) != 2 {
		t.Fatalf("%d WARN lines after the interval, want 2", len(lines))
	}
	if got := lines[0].ContextMap()["suppressed"]; got != int64(0) {
		t.Errorf("first line: suppressed = %v, want 0", got)
	}
	if got := lines[1].ContextMap()["suppressed"]; got != int64(4) {
		t.Errorf("second line: suppressed = %v, want 4", got)
	}
	if got := testutil.ToFloat64(counter) - before; got != 6 {
		t.Errorf("gate_timeouts_total rose by %v, want 6: every timeout counts", got)
	}
	for i, l := range lines {
		if s := fmt.Sprint(l.ContextMap()); strings.Contains(s, "walked-away") {
			t.Errorf("line %d shows a session id: %s", i, s)
		}
	}
	if lines[1].ContextMap()["session"] != serializer.SessionHash(id(5)) {
		t.Errorf("second line names session %v, want %s", lines[1].ContextMap()["session"], serializer.SessionHash(id(5)))
	}
}
