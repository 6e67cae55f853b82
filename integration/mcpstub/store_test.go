package mcpstub

import (
	"testing"
	"time"
)

// Two Backends on one StoreDir serve each other's sessions, as app servers
// on one database do, and a DELETE through one ends the session for both.
func TestStoreDirSharesSessionsBetweenBackends(t *testing.T) {
	dir := t.TempDir()
	a, b := &Backend{StoreDir: dir}, &Backend{StoreDir: dir}
	urlA, urlB := serve(t, a), serve(t, b)

	sid := readySession(t, urlA)
	if rec, ok := b.Session(sid); !ok || !rec.Initialized {
		t.Fatalf("second backend sees %+v, %v; want the initialized record", rec, ok)
	}
	r := post(t, urlB, sid, `{"jsonrpc":"2.0","id":2,"method":"logging/setLevel","params":{"level":"debug"}}`)
	wantResult(t, only(t, r))
	if rec, _ := a.Session(sid); rec.LogLevel != "debug" {
		t.Fatalf("first backend sees level %q after the second saved debug", rec.LogLevel)
	}
	if r := send(t, "DELETE", urlB, sid, ""); r.status != 200 {
		t.Fatalf("DELETE through the second backend: %d", r.status)
	}
	if _, ok := a.Session(sid); ok || a.Sessions() != 0 {
		t.Fatalf("session still stored after DELETE (%d left)", a.Sessions())
	}
}

// The race the stand-in reproduces is the same with a shared directory:
// pipelined connects spread over two Backends fail without serialization.
func TestStoreDirKeepsTheRace(t *testing.T) {
	b := &Backend{StoreDir: t.TempDir(), WorkMin: time.Millisecond, WorkMax: 5 * time.Millisecond}
	sum := RunPipelined(t.Context(), serve(t, b), 100, 8)
	t.Log(sum)
	if sum.Connects != 100 || sum.Rejected == 0 {
		t.Fatalf("want 100 connects with rejections, got %v", sum)
	}
	if sum.HTTPErrors != 0 || sum.IDMismatches != 0 || sum.TransportErrors != 0 || sum.OtherErrors != 0 {
		t.Fatalf("unexpected failures: %v", sum)
	}
}
