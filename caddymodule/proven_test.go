package caddymodule

import (
	"testing"
	"time"
)

// A credential the MCP server accepted stays proven until its time is up;
// a full record forgets one to take a new one, never grows past its bound.
func TestAcceptedCredentialsAreProvenUntilTheirTimeAndBounded(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	p := newProvenPasswords(2)
	if p.proven("a", now) {
		t.Fatal("a credential never accepted is proven")
	}
	p.accepted("a", now.Add(time.Minute))
	if !p.proven("a", now) || !p.proven("a", now.Add(59*time.Second)) {
		t.Fatal("an accepted credential is not proven before its time is up")
	}
	if p.proven("a", now.Add(time.Minute)) {
		t.Fatal("a credential is proven after its time is up")
	}
	for _, c := range []string{"b", "c", "d"} {
		p.accepted(c, now.Add(time.Minute))
	}
	if n := p.len(); n != 2 {
		t.Fatalf("%d credentials kept, want the bound, 2", n)
	}
	if !p.proven("d", now) {
		t.Fatal("the credential accepted last was forgotten")
	}
}
