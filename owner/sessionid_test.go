package owner

import (
	"strings"
	"testing"

	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

func TestWithOwnerNamesTheInstanceAndSplitOwnerTakesItOff(t *testing.T) {
	id := NewID()
	client, ok := WithOwner(id, "0f8c2a1e-6a3b-4c5d-9e7f-112233445566")
	if !ok || client != "mcps1."+id+".0f8c2a1e-6a3b-4c5d-9e7f-112233445566" {
		t.Fatalf("WithOwner = %q, %v", client, ok)
	}
	if !serializer.ValidSessionID(client) {
		t.Fatalf("%q is not a valid session id", client)
	}
	inst, up, ok := SplitOwner(client)
	if !ok || inst != id || up != "0f8c2a1e-6a3b-4c5d-9e7f-112233445566" {
		t.Fatalf("SplitOwner(%q) = %q, %q, %v", client, inst, up, ok)
	}
}

// NewID's IDs are what WithOwner accepts: a change to either shows here.
func TestEveryNewIDCanNameAnOwner(t *testing.T) {
	for range 100 {
		if id := NewID(); !isInstanceID(id) {
			t.Fatalf("NewID() = %q, which WithOwner refuses", id)
		}
	}
}

// Ids minted by upstreams before owners were carried, and ids that only
// look like an owner's, are the upstream's whole.
func TestSplitOwnerLeavesAnIdWithoutAnOwnerWhole(t *testing.T) {
	for _, id := range []string{
		"s1",
		"0f8c2a1e-6a3b-4c5d-9e7f-112233445566",
		"a3f09c2b4d5e6f708192a3b4c5d6e7f8",
		"mcps1",
		"mcps1.",
		"mcps1.0123456789abcdef",                 // no upstream id
		"mcps1.0123456789abcdef.",                // an empty upstream id
		"mcps1.0123456789ABCDEF.s1",              // upper case: not NewID's
		"mcps1.0123456789abcde.s1",               // 15 digits
		"mcps1.0123456789abcdef0.s1",             // 17 digits
		"mcps1.0123456789abcdeg.s1",              // not hex
		"mcps1-0123456789abcdef.s1",              // another separator
		"MCPS1.0123456789abcdef.s1",              // the marker is exact
		"mcps2.0123456789abcdef.s1",              // another version
		"xmcps1.0123456789abcdef.s1",             // the marker opens the id
		"mcps1.0123456789abcdef_s1",              // no dot after the ID
		"mcps1." + strings.Repeat("0", 16) + "-", // as above
	} {
		inst, up, ok := SplitOwner(id)
		if ok || inst != "" || up != id {
			t.Errorf("SplitOwner(%q) = %q, %q, %v; want the id whole", id, inst, up, ok)
		}
	}
}

// An id at the limit cannot carry a prefix: the client gets it as it
// is, and it names no owner.
func TestAnIdTooLongForAPrefixIsLeftAsItIs(t *testing.T) {
	id := NewID()
	longest := strings.Repeat("x", serializer.MaxSessionIDLen-len("mcps1.")-16-1)
	client, ok := WithOwner(id, longest)
	if !ok || len(client) != serializer.MaxSessionIDLen {
		t.Fatalf("an id of %d bytes: WithOwner = %d bytes, %v", len(longest), len(client), ok)
	}
	tooLong := longest + "x"
	if client, ok := WithOwner(id, tooLong); ok || client != tooLong {
		t.Fatalf("an id of %d bytes: WithOwner = %q, %v; want it as it is", len(tooLong), client, ok)
	}
}

func TestWithOwnerRefusesWhatItCannotCarry(t *testing.T) {
	for _, c := range []struct{ instance, upstream string }{
		{"", "s1"},
		{"0123456789ABCDEF", "s1"},
		{"0123456789abcdef0", "s1"},
		{"0123456789abcdef", ""},
		{"0123456789abcdef", "has space"},
		{"0123456789abcdef", "é"},
	} {
		if client, ok := WithOwner(c.instance, c.upstream); ok || client != c.upstream {
			t.Errorf("WithOwner(%q, %q) = %q, %v; want the upstream's id as it is", c.instance, c.upstream, client, ok)
		}
	}
}

// An upstream that names owners the same way (another such cluster
// behind this one) gets its own id back: one prefix comes off.
func TestSplitOwnerTakesOffOnePrefix(t *testing.T) {
	inner, _ := WithOwner("00000000000000aa", "s1")
	outer, ok := WithOwner("00000000000000bb", inner)
	if !ok {
		t.Fatalf("WithOwner(%q) refused", inner)
	}
	inst, up, ok := SplitOwner(outer)
	if !ok || inst != "00000000000000bb" || up != inner {
		t.Fatalf("SplitOwner(%q) = %q, %q, %v", outer, inst, up, ok)
	}
}

// FuzzSessionIDOwner checks that WithOwner and SplitOwner round-trip and
// never yield an invalid id. Run it with
//
//	go test ./owner -run '^$' -fuzz '^FuzzSessionIDOwner$' -fuzztime 30s
func FuzzSessionIDOwner(f *testing.F) {
	for _, seed := range []struct{ instance, id string }{
		{"0123456789abcdef", "s1"},
		{"0123456789abcdef", "mcps1.fedcba9876543210.s1"},
		{"0123456789abcdef", strings.Repeat("x", 233)},
		{"0123456789abcdef", strings.Repeat("x", 234)},
		{"0123456789ABCDEF", "s1"},
		{"", "mcps1.0123456789abcdef."},
		{"x", "mcps1.0123456789abcdef.\x00"},
	} {
		f.Add(seed.instance, seed.id)
	}
	f.Fuzz(func(t *testing.T, instance, id string) {
		// Whatever a client sends that passes the edge's check splits into
		// an upstream id that passes it too.
		if serializer.ValidSessionID(id) {
			inst, up, ok := SplitOwner(id)
			if !serializer.ValidSessionID(up) {
				t.Fatalf("SplitOwner(%q) gives the invalid upstream id %q", id, up)
			}
			if ok {
				if !isInstanceID(inst) {
					t.Fatalf("SplitOwner(%q) gives the instance ID %q", id, inst)
				}
				if back, ok := WithOwner(inst, up); !ok || back != id {
					t.Fatalf("SplitOwner(%q) then WithOwner = %q, %v", id, back, ok)
				}
			} else if inst != "" || up != id {
				t.Fatalf("SplitOwner(%q) = %q, %q, false; want the id whole", id, inst, up)
			}
		}
		client, ok := WithOwner(instance, id)
		if !ok {
			if isInstanceID(instance) && serializer.ValidSessionID(id) && len(id) <= serializer.MaxSessionIDLen-idPrefixLen {
				t.Fatalf("WithOwner(%q, %q) refused an id it can carry", instance, id)
			}
			if client != id {
				t.Fatalf("WithOwner(%q, %q) refused but changed the id to %q", instance, id, client)
			}
			return
		}
		if !serializer.ValidSessionID(client) {
			t.Fatalf("WithOwner(%q, %q) = the invalid id %q", instance, id, client)
		}
		inst, up, split := SplitOwner(client)
		if !split || inst != instance || up != id {
			t.Fatalf("WithOwner(%q, %q) = %q, which splits into %q, %q, %v", instance, id, client, inst, up, split)
		}
	})
}

// Two session tables of one instance, two MCP endpoints whose sessions
// two upstreams hold, never share an ID, whatever their instance name.
func TestIDForDiffersBetweenTablesOfOneInstance(t *testing.T) {
	if IDFor("replica-1", "a") == IDFor("replica-1", "b") {
		t.Fatal("two tables of one instance share an ID")
	}
	if IDFor("replica-1", "a") != IDFor("replica-1", "a") || !isInstanceID(IDFor("replica-1", "a")) {
		t.Fatal("IDFor is not a stable instance ID")
	}
}
