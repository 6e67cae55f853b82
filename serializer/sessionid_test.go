package serializer

import (
	"strings"
	"testing"
)

// referenceValidSessionID is the rule for Mcp-Session-Id values, written
// out: 1 to 256 bytes, each visible ASCII (0x21 to 0x7E).
func referenceValidSessionID(id string) bool {
	if id == "" || len(id) > 256 {
		return false
	}
	for _, c := range []byte(id) {
		if c < '!' || c > '~' {
			return false
		}
	}
	return true
}

var sessionIDSeeds = []string{
	"4f8c2a1e-9b7d-4e2f-a1c3-5d6e7f809a1b", // UUID (TypeScript SDK)
	"mcp_6650e1f2a3b4c5d6e7f8a9b0c1d2e3f4", // php-mcp
	"c2Vzc2lvbi1pZC1iYXNlNjQ=",             // base64
	"a", "~", "!", "a,b", `"quoted"`, "{}", "%20", "a;b=c",
	strings.Repeat("~", 256), strings.Repeat("a", 257), strings.Repeat("x", 4096),
	"", " ", "a b", "a\tb", "\x7f", "\x80", "\xff", "sessi\xc3\xb6n", "\x00abc",
	"abc\r\nX-Injected: 1", "abc\n", "\u00a0abc",
}

func TestValidSessionIDFollowsTheSpecCharset(t *testing.T) {
	for id, want := range map[string]bool{
		"4f8c2a1e-9b7d-4e2f-a1c3-5d6e7f809a1b": true,
		"!":                                    true,
		"~":                                    true,
		strings.Repeat("~", MaxSessionIDLen):   true,
		strings.Repeat("a", MaxSessionIDLen+1): false,
		"":                                     false,
		"a b":                                  false,
		"\x7f":                                 false,
		"sessi\xc3\xb6n":                       false,
		"abc\r\nX-Injected: 1":                 false,
	} {
		if got := ValidSessionID(id); got != want {
			t.Errorf("ValidSessionID(%q) = %v, want %v", id, got, want)
		}
	}
}

// FuzzValidSessionID checks ValidSessionID against the written-out rule.
// Run it with
//
//	go test ./serializer -run '^$' -fuzz '^FuzzValidSessionID$' -fuzztime 30s
func FuzzValidSessionID(f *testing.F) {
	for _, id := range sessionIDSeeds {
		f.Add(id)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if got, want := ValidSessionID(id), referenceValidSessionID(id); got != want {
			t.Fatalf("ValidSessionID(%q) = %v, want %v", id, got, want)
		}
	})
}
