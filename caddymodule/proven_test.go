package caddymodule

import (
	"encoding/base64"
	"net/http"
	"strings"
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

// One password is proven once whichever way its client spells it (base64
// with or without padding, the user in any case, the spaces WordPress
// ignores in an Application Password), so that endless spellings of one
// valid password cannot push other users' proofs out; another password is
// not proven by it.
func TestAProofHoldsForEverySpellingOfItsCredentials(t *testing.T) {
	spell := func(user, password string, pad bool) *http.Request {
		enc := base64.StdEncoding.EncodeToString([]byte(user + ":" + password))
		if !pad {
			enc = strings.TrimRight(enc, "=")
		}
		return basicRequest("Basic " + enc)
	}
	want := provenSpelling(spell("admin", "abcd efgh ijkl mnop qrst uvwx", true))
	for _, r := range []*http.Request{
		spell("Admin", "abcdefghijklmnopqrstuvwx", true),
		spell("admin", "abcd efgh ijkl mnop qrst uvwx", false),
		spell("ADMIN", "ab cd ef gh ij kl mn op qr st uv wx", false),
	} {
		if got := provenSpelling(r); got != want {
			t.Errorf("%q is kept apart from the same password's proof", r.Header.Get("Authorization"))
		}
	}
	if provenSpelling(spell("admin", "abcdefghijklmnopqrstuvwy", true)) == want {
		t.Error("another password shares the proof")
	}
	if provenSpelling(spell("editor", "abcdefghijklmnopqrstuvwx", true)) == want {
		t.Error("another user's password shares the proof")
	}
}
