package caddymodule_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/mcpserializer/caddy-mcp-serializer/caddymodule"
)

// discardWriter is a ResponseWriter that keeps nothing.
type discardWriter struct{ header http.Header }

func (w *discardWriter) Header() http.Header         { return w.header }
func (w *discardWriter) WriteHeader(int)             {}
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }

var benchAnswer = []byte(`{"jsonrpc":"2.0","id":3,"result":{"tools":[]}}`)

// answerAtOnce stands in for reverse_proxy: it reads the body and answers.
var answerAtOnce = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(benchAnswer)
	return nil
})

// BenchmarkServeHTTP is the handler's own cost per request, on requests
// prepared as Caddy's server prepares them (replacer, vars, extra log
// fields); preparing them is not counted.
func BenchmarkServeHTTP(b *testing.B) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	h := &caddymodule.Handler{Name: "bench-serve-http"}
	if err := h.Provision(ctx); err != nil {
		b.Fatal(err)
	}
	defer h.Cleanup()
	body := []byte(`{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{}}`)

	logging := &caddyhttp.Server{Logs: &caddyhttp.ServerLogConfig{}}
	for _, c := range []struct {
		name, method, sid string
		modern            bool              // MCP 2026-07-28 headers
		server            *caddyhttp.Server // with Logs: an access log is written
	}{
		{"sessionless-GET", http.MethodGet, "", false, nil},
		{"sessionless-POST", http.MethodPost, "", false, nil},
		{"modern-POST", http.MethodPost, "", true, nil},
		{"modern-POST-access-log", http.MethodPost, "", true, logging},
		{"session-POST", http.MethodPost, "0123456789abcdef0123456789abcdef", false, nil},
		{"session-POST-access-log", http.MethodPost, "0123456789abcdef0123456789abcdef", false, logging},
	} {
		b.Run(c.name, func(b *testing.B) {
			w := &discardWriter{header: make(http.Header)}
			// Requests are prepared in batches with the timer stopped:
			// stopping it per request would cost more than the handler. Small
			// batches keep each request as warm in the cache as a served one.
			batch := make([]*http.Request, 32)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if i%len(batch) == 0 {
					b.StopTimer()
					for j := range batch {
						req, _ := http.NewRequest(c.method, "http://127.0.0.1/mcp", bytes.NewReader(body))
						if c.sid != "" {
							req.Header.Set("Mcp-Session-Id", c.sid)
						}
						if c.modern {
							req.Header.Set("MCP-Protocol-Version", "2026-07-28")
							req.Header.Set("Mcp-Method", "tools/list")
						}
						batch[j] = caddyhttp.PrepareRequest(req, caddy.NewReplacer(), w, c.server)
					}
					b.StartTimer()
				}
				clear(w.header)
				if err := h.ServeHTTP(w, batch[i%len(batch)], answerAtOnce); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSessionPOSTBody is the handler's cost per session POST by body
// size and framing: reading, holding and classifying the body.
func BenchmarkSessionPOSTBody(b *testing.B) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	h := &caddymodule.Handler{Name: "bench-session-post-body"}
	if err := h.Provision(ctx); err != nil {
		b.Fatal(err)
	}
	defer h.Cleanup()
	for _, c := range []struct {
		name    string
		size    int
		chunked bool
	}{
		{"300B", 300, false},
		{"16KiB", 16 << 10, false},
		{"256KiB", 256 << 10, false},
		{"1MiB", 1 << 20, false},
		{"256KiB-chunked", 256 << 10, true},
		{"4MiB-over-max_body", 4 << 20, false},
	} {
		body := append([]byte(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"s":"`),
			bytes.Repeat([]byte("x"), c.size)...)
		body = append(body[:c.size-3], `"}}`...)
		b.Run(c.name, func(b *testing.B) {
			w := &discardWriter{header: make(http.Header)}
			b.SetBytes(int64(c.size))
			b.ReportAllocs()
			for b.Loop() {
				req, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1/mcp", bytes.NewReader(body))
				if c.chunked {
					req.Body, req.ContentLength = io.NopCloser(bytes.NewReader(body)), -1
				}
				req.Header.Set("Mcp-Session-Id", "0123456789abcdef0123456789abcdef")
				clear(w.header)
				if err := h.ServeHTTP(w, req, answerAtOnce); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
