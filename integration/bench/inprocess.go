package main

import (
	"bytes"
	"context"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/mcpserializer/caddy-mcp-serializer/caddymodule"
	"github.com/mcpserializer/caddy-mcp-serializer/integration/mcpstub"
)

// handlerCost is the module's own CPU cost per request, measured in this
// process without a network: the Handler's ServeHTTP in front of a next
// handler that answers at once, minus that next handler called alone.
type handlerCost struct {
	name          string
	module, alone time.Duration // per request
	allocs        int64         // allocations per request added by the module
	bytes         int64         // bytes allocated per request added by the module
}

func (c handlerCost) added() time.Duration { return c.module - c.alone }

// discardWriter is a ResponseWriter that keeps nothing.
type discardWriter struct {
	header http.Header
	status int
}

func (w *discardWriter) Header() http.Header         { return w.header }
func (w *discardWriter) WriteHeader(status int)      { w.status = status }
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }

var answer = []byte(`{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"hello from the benchmark"}],"isError":false}}`)

// upstreamStandIn reads the request body, as reverse_proxy would to send
// it on, and writes a small JSON answer.
var upstreamStandIn = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(answer)
	return nil
})

// measureHandler provisions a Handler with the default settings and
// benchmarks it on a session-less POST and on a POST of an open session.
// With a profile directory, it writes the CPU profile of the Handler runs
// there.
func measureHandler(profileDir string) ([]handlerCost, error) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	h := &caddymodule.Handler{Name: "bench-in-process"}
	if err := h.Provision(ctx); err != nil {
		return nil, err
	}
	defer h.Cleanup()

	body := []byte(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello from the benchmark"}}}`)
	var out []handlerCost
	for _, c := range []struct {
		name string
		sid  string
	}{
		{"session-less POST", ""},
		{"POST in an open session", "0123456789abcdef0123456789abcdef"},
	} {
		req, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1/mcp", nil)
		req.Header.Set("Content-Type", "application/json")
		if c.sid != "" {
			req.Header.Set(mcpstub.SessionHeader, c.sid)
		}
		w := &discardWriter{header: make(http.Header)}
		reset := func() {
			req.Body = io.NopCloser(bytes.NewReader(body))
			req.ContentLength = int64(len(body))
		}
		stop := func() {}
		if profileDir != "" {
			f, err := os.Create(filepath.Join(profileDir, "handler-"+strings.ReplaceAll(c.name, " ", "-")+".pprof"))
			if err != nil {
				return nil, err
			}
			if err := pprof.StartCPUProfile(f); err != nil {
				return nil, err
			}
			stop = func() { pprof.StopCPUProfile(); f.Close() }
		}
		withModule := func() error { reset(); return h.ServeHTTP(w, req, upstreamStandIn) }
		alone := func() error { reset(); return upstreamStandIn.ServeHTTP(w, req) }
		// Alternate the two and keep the fastest run of each: noise from
		// elsewhere only ever adds time.
		var m, a timedRun
		for i := range 7 {
			rm, err := timeLoop(20_000, withModule)
			if err != nil {
				return nil, err
			}
			ra, err := timeLoop(20_000, alone)
			if err != nil {
				return nil, err
			}
			if i == 0 || rm.perOp < m.perOp {
				m = rm
			}
			if i == 0 || ra.perOp < a.perOp {
				a = ra
			}
		}
		stop()
		out = append(out, handlerCost{
			name:   c.name,
			module: m.perOp,
			alone:  a.perOp,
			allocs: int64(math.Round(m.allocs - a.allocs)),
			bytes:  int64(math.Round(m.bytes - a.bytes)),
		})
	}
	return out, nil
}

// timedRun is the outcome of one timeLoop.
type timedRun struct {
	perOp         time.Duration
	allocs, bytes float64 // per op
}

// timeLoop runs f n times (after a few unmeasured runs) and returns the
// time and allocations per run.
func timeLoop(n int, f func() error) (timedRun, error) {
	for range 100 {
		if err := f(); err != nil {
			return timedRun{}, err
		}
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	for range n {
		if err := f(); err != nil {
			return timedRun{}, err
		}
	}
	elapsed := time.Since(start)
	runtime.ReadMemStats(&after)
	return timedRun{
		perOp:  elapsed / time.Duration(n),
		allocs: float64(after.Mallocs-before.Mallocs) / float64(n),
		bytes:  float64(after.TotalAlloc-before.TotalAlloc) / float64(n),
	}, nil
}
