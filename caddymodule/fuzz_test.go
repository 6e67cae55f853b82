package caddymodule

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// FuzzSessionPOST sends a POST with an arbitrary Mcp-Session-Id and body
// through the handler: an id serializer.ValidSessionID refuses (fuzzed
// against the written-out rule in package serializer) is answered 400 with
// a JSON-RPC error and never forwarded; a valid one is forwarded once with
// its body intact. Run it with
//
//	go test ./caddymodule -run '^$' -fuzz '^FuzzSessionPOST$' -fuzztime 30s
func FuzzSessionPOST(f *testing.F) {
	bodies := []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`[{"jsonrpc":"2.0","id":1,"result":{}}]`,
		`{"jsonrpc":"2.0","id":`,
		``,
	}
	ids := []string{
		"4f8c2a1e-9b7d-4e2f-a1c3-5d6e7f809a1b", // UUID (TypeScript SDK)
		"mcp_6650e1f2a3b4c5d6e7f8a9b0c1d2e3f4", // php-mcp
		"c2Vzc2lvbi1pZC1iYXNlNjQ=",             // base64
		"a", "~", "!", "a,b", `"quoted"`, "{}", "%20", "a;b=c",
		strings.Repeat("~", 256), strings.Repeat("a", 257), strings.Repeat("x", 4096),
		"", " ", "a b", "a\tb", "\x7f", "\x80", "\xff", "sessi\xc3\xb6n", "\x00abc",
		"abc\r\nX-Injected: 1", "abc\n", "\u00a0abc",
	}
	for i, id := range ids {
		f.Add(id, []byte(bodies[i%len(bodies)]))
	}
	const maxBody = 1 << 10
	h := newBareHandler(f, maxBody)
	f.Fuzz(func(t *testing.T, id string, body []byte) {
		valid := serializer.ValidSessionID(id)

		var calls int
		var forwarded []byte
		var forwardedLen int64
		next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			calls++
			forwarded, _ = io.ReadAll(r.Body)
			forwardedLen = r.ContentLength
			if got := r.Header.Get(sessionHeader); got != id {
				t.Errorf("forwarded with session id %q, want %q", got, id)
			}
			w.WriteHeader(http.StatusOK)
			return nil
		})
		r := httptest.NewRequest(http.MethodPost, "/mcp", bytes.NewReader(body))
		r.Header[sessionHeader] = []string{id}
		w := httptest.NewRecorder()
		if err := h.ServeHTTP(w, r, next); err != nil {
			t.Fatalf("ServeHTTP: %v", err)
		}

		if !valid {
			if calls != 0 || w.Code != http.StatusBadRequest {
				t.Fatalf("invalid id %q: status %d, forwarded %d times; want 400, never", id, w.Code, calls)
			}
			var e struct {
				JSONRPC string          `json:"jsonrpc"`
				ID      json.RawMessage `json:"id"`
				Error   struct{ Code int }
			}
			if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.JSONRPC != "2.0" || string(e.ID) != "null" || e.Error.Code != codeInvalidRequest {
				t.Fatalf("invalid id %q: answer %s is not a JSON-RPC error (%v)", id, w.Body.Bytes(), err)
			}
			return
		}
		if calls != 1 || w.Code != http.StatusOK {
			t.Fatalf("valid id %q: status %d, forwarded %d times; want 200, once", id, w.Code, calls)
		}
		if !bytes.Equal(forwarded, body) {
			t.Fatalf("body changed on the way: sent %q, forwarded %q", body, forwarded)
		}
		if len(body) <= maxBody && forwardedLen != int64(len(body)) {
			t.Fatalf("Content-Length %d, want %d", forwardedLen, len(body))
		}
	})
}
