package caddymodule

import (
	"testing"

	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// UseTableClock makes the session tables created until the test ends run
// their timers (init_timeout, queue_timeout) on clock. Call it before
// starting Caddy: a table keeps the clock it was created with, across
// reloads, until the last config using it stops.
func UseTableClock(t testing.TB, clock serializer.Clock) {
	t.Helper()
	if !tableClock.CompareAndSwap(nil, &clock) {
		t.Fatal("UseTableClock: another clock is in use")
	}
	t.Cleanup(func() { tableClock.Store(nil) })
}
