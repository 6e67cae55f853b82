// Command demo-backend runs the mcpstub stand-in MCP server, a backend that
// fails the way a multi-process PHP server does when a client pipelines its
// first requests:
//
//	demo-backend -listen 127.0.0.1:9081 -work-min 1ms -work-max 5ms
//
// Compare it directly with the same backend behind Caddy's mcp_serializer
// using the Caddy binary built with the module:
//
//	caddy mcp-probe --url http://127.0.0.1:9081/mcp --compare http://localhost:8080/mcp
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/integration/mcpstub"
)

func main() {
	var (
		listen        = flag.String("listen", "127.0.0.1:9081", "address to serve on")
		workMin       = flag.Duration("work-min", time.Millisecond, "least random work per request, between loading and saving the session")
		workMax       = flag.Duration("work-max", 5*time.Millisecond, "most random work per request")
		serviceTime   = flag.Duration("service-time", 0, "fixed work added to every request")
		sse           = flag.Bool("sse", false, "answer requests with text/event-stream instead of JSON")
		progressPause = flag.Duration("progress-pause", 200*time.Millisecond, "pause before each event of the progress tool")
		streamMax     = flag.Duration("stream-max", 30*time.Second, "longest a GET stream stays open")
		verbose       = flag.Bool("v", false, "log every request")
		storeDir      = flag.String("store-dir", "", "keep sessions as files in this directory, shared by every demo-backend given the same one (default: in memory)")
	)
	flag.Parse()
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	backend := &mcpstub.Backend{
		WorkMin:         *workMin,
		WorkMax:         *workMax,
		ServiceTime:     *serviceTime,
		StreamResponses: *sse,
		ProgressPause:   *progressPause,
		StreamMax:       *streamMax,
		// A long-running demo keeps counters only, not every request.
		DisableRequestLog: true,
		StoreDir:          *storeDir,
	}
	var handler http.Handler = backend
	if *verbose {
		handler = logRequests(backend)
	}
	srv := &http.Server{
		Addr:              *listen,
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		// Open GET streams end with the process, not after Shutdown's wait.
		BaseContext: func(net.Listener) context.Context { return ctx },
	}
	if *storeDir != "" {
		if err := os.MkdirAll(*storeDir, 0o700); err != nil {
			log.Fatal(err)
		}
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("demo-backend: MCP stand-in on http://%s/ (any path), work %v–%v + %v, sse=%v",
		ln.Addr(), *workMin, *workMax, *serviceTime, *sse)

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		log.Fatal(err)
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		log.Print(err)
	}
	log.Printf("demo-backend: stopped after %d requests, %d rejected as not initialized", backend.Count(), backend.Rejected())
}

// logRequests logs one line per request: HTTP method, the first characters
// of the session id, the JSON-RPC methods, status and duration.
func logRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		var methods []string
		if r.Method == http.MethodPost {
			body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
			r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), r.Body))
			methods = jsonrpcMethods(body)
		}
		sw := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r)
		sid := r.Header.Get(mcpstub.SessionHeader)
		if sid == "" {
			sid = sw.Header().Get(mcpstub.SessionHeader)
		}
		if len(sid) > 8 {
			sid = sid[:8] + "…"
		}
		log.Printf("%-6s session=%-9s %-40s %d %v", r.Method, sid, strings.Join(methods, ","), sw.status, time.Since(start).Round(time.Microsecond))
	})
}

func jsonrpcMethods(body []byte) []string {
	var one struct {
		Method string `json:"method"`
	}
	var many []struct {
		Method string `json:"method"`
	}
	if json.Unmarshal(body, &one) == nil {
		return []string{orResponse(one.Method)}
	}
	if json.Unmarshal(body, &many) != nil {
		return []string{"(unparsable)"}
	}
	out := make([]string, len(many))
	for i, m := range many {
		out[i] = orResponse(m.Method)
	}
	return out
}

func orResponse(method string) string {
	if method == "" {
		return "(response)"
	}
	return method
}

// statusRecorder keeps the status for the log line, and Flush and Unwrap so
// event streams still flush through it.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (w *statusRecorder) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusRecorder) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusRecorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }
