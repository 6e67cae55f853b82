package caddymodule

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// settled runs a proof of cred to its end with verdict v, as sendProof
// does, and fails the test if the credential had a verdict already.
func settled(t *testing.T, p *proofs, cred string, v verdict, now time.Time, acceptedFor time.Duration) {
	t.Helper()
	_, call, lead := p.lookup(cred, now)
	if !lead {
		t.Fatalf("%s: no proof was started for a credential without a verdict", cred)
	}
	p.settle(cred, call, v, now, now.Add(acceptedFor))
}

// An accepted credential is kept until its time is up, a refused one for
// refusedFor; a full record forgets a verdict of the same kind to take a
// new one, so that refusals, which anyone can cause, never push an
// acceptance out.
func TestProofVerdictsAreKeptUntilTheirTimeAndBoundedByKind(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	p := newProofs(2)
	settled(t, p, "a", verdictAccepted, now, time.Minute)
	if v, _, _ := p.lookup("a", now.Add(59*time.Second)); v != verdictAccepted {
		t.Fatal("an accepted credential is not kept before its time is up")
	}
	if v, _, lead := p.lookup("a", now.Add(time.Minute)); v != 0 || !lead {
		t.Fatal("an accepted credential is kept after its time is up")
	}
	p = newProofs(2)
	settled(t, p, "a", verdictAccepted, now, time.Hour)
	settled(t, p, "b", verdictAccepted, now, time.Hour)
	for i := range 10 {
		settled(t, p, fmt.Sprintf("wrong-%d", i), verdictRefused, now, time.Hour)
	}
	if n := p.len(); n != 4 {
		t.Fatalf("%d verdicts kept, want 2 of each kind", n)
	}
	for _, cred := range []string{"a", "b"} {
		if v, _, _ := p.lookup(cred, now); v != verdictAccepted {
			t.Errorf("refusals pushed the acceptance of %s out", cred)
		}
	}
	if v, _, _ := p.lookup("wrong-9", now.Add(refusedFor-time.Second)); v != verdictRefused {
		t.Error("the last refusal is not kept for refusedFor")
	}
	if v, _, _ := p.lookup("wrong-9", now.Add(refusedFor)); v != 0 {
		t.Error("a refusal is kept past refusedFor")
	}
	settled(t, p, "c", verdictUndecided, now, time.Hour)
	if v, _, lead := p.lookup("c", now); v != 0 || !lead {
		t.Error("an undecided proof is kept: the next request would not be proven again")
	}
}

// Requests of one credential that arrive while its proof is in flight
// wait for that proof rather than send one each.
func TestACredentialHasOneProofInFlight(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	p := newProofs(4)
	_, call, lead := p.lookup("a", now)
	_, again, leadAgain := p.lookup("a", now)
	if !lead || leadAgain || again != call {
		t.Fatalf("a second request of a credential in proof started its own (lead %v, same call %v)", leadAgain, again == call)
	}
	p.settle("a", call, verdictAccepted, now, now.Add(time.Minute))
	select {
	case <-again.done:
	default:
		t.Fatal("the waiting request was not told the verdict")
	}
	if again.verdict != verdictAccepted {
		t.Fatalf("the waiting request was told %v", again.verdict)
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
