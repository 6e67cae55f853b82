package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/integration/mcpstub"
)

// upstreamRole is the first argument that makes the binary serve the
// upstreams instead of running the benchmark.
const upstreamRole = "upstream"

// upstreamAddrs is what the upstream process prints once it listens.
type upstreamAddrs struct {
	Fast    string `json:"fast"`    // mcpstub.Backend with no work
	Slow    string `json:"slow"`    // mcpstub.Backend with ServiceTime
	Control string `json:"control"` // GET /stats, POST /reset
}

// serviceStats is what the slow upstream measured: how long its handler
// ran for the session POSTs it served.
type serviceStats struct {
	Requests  int64 `json:"requests"`
	ServiceNS int64 `json:"service_ns"`
}

func (s serviceStats) mean() time.Duration {
	if s.Requests == 0 {
		return 0
	}
	return time.Duration(s.ServiceNS / s.Requests)
}

// runUpstream serves the two Backends on loopback ports chosen by the
// kernel, prints their addresses as one JSON line, and exits when its
// standard input closes (the benchmark ended, however it ended).
func runUpstream(args []string) {
	fs := flag.NewFlagSet(upstreamRole, flag.ExitOnError)
	serviceTime := fs.Duration("service-time", 2*time.Millisecond, "fixed work of the slow upstream per request")
	_ = fs.Parse(args)
	log.SetPrefix("bench upstream: ")

	fast := &mcpstub.Backend{DisableRequestLog: true}
	slow := &mcpstub.Backend{DisableRequestLog: true, ServiceTime: *serviceTime}

	var requests, serviceNS atomic.Int64
	timed := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		slow.ServeHTTP(w, r)
		if r.Method == http.MethodPost && r.Header.Get(mcpstub.SessionHeader) != "" {
			serviceNS.Add(int64(time.Since(start)))
			requests.Add(1)
		}
	})
	control := http.NewServeMux()
	control.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(serviceStats{Requests: requests.Load(), ServiceNS: serviceNS.Load()})
	})
	control.HandleFunc("POST /reset", func(w http.ResponseWriter, _ *http.Request) {
		requests.Store(0)
		serviceNS.Store(0)
	})

	var addrs upstreamAddrs
	for _, s := range []struct {
		addr    *string
		handler http.Handler
	}{{&addrs.Fast, fast}, {&addrs.Slow, timed}, {&addrs.Control, control}} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			log.Fatal(err)
		}
		*s.addr = ln.Addr().String()
		srv := &http.Server{Handler: s.handler, ReadHeaderTimeout: 10 * time.Second}
		go func() { log.Fatal(srv.Serve(ln)) }()
	}
	line, _ := json.Marshal(addrs)
	fmt.Println(string(line))
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// readUpstreamAddrs reads the line runUpstream prints.
func readUpstreamAddrs(r io.Reader) (upstreamAddrs, error) {
	var a upstreamAddrs
	line, err := bufio.NewReader(r).ReadBytes('\n')
	if err != nil {
		return a, fmt.Errorf("upstream did not start: %w", err)
	}
	err = json.Unmarshal(line, &a)
	return a, err
}
