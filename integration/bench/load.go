package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/integration/mcpstub"
)

// Request bodies, made once.
var (
	bodyInitialize  = []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"1.0.0"}}}`)
	bodyInitialized = []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	bodyToolsList   = []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
	bodyToolsCall   = []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello from the benchmark"}}}`)
)

// sessionBodies returns the follow-up requests of one session, ids 2 and
// up: tools/list and tools/call (echo) alternating.
func sessionBodies(n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		id := strconv.Itoa(i + 2)
		if i%2 == 0 {
			out[i] = []byte(`{"jsonrpc":"2.0","id":` + id + `,"method":"tools/list"}`)
		} else {
			out[i] = []byte(`{"jsonrpc":"2.0","id":` + id + `,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello from the benchmark"}}}`)
		}
	}
	return out
}

// newClient returns the one HTTP client of the load generator: HTTP/1.1
// keep-alive with enough idle connections per Caddy for every worker.
func newClient(concurrency int) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 2*concurrency + 16
	t.MaxIdleConns = 8 * t.MaxIdleConnsPerHost
	t.MaxConnsPerHost = 0
	t.DisableCompression = true
	t.ForceAttemptHTTP2 = false
	return &http.Client{Transport: t, Timeout: time.Minute}
}

// load is one round's traffic against one URL.
type load struct {
	client      *http.Client
	url         string
	concurrency int
	duration    time.Duration // of the whole round
	warmup      time.Duration // at its start, not measured
	// pace is each worker's interval between request starts; 0 sends the
	// next request as soon as the previous one is answered.
	pace time.Duration
	// perSession is the number of tools/list and tools/call requests of a
	// session; 0 means session-less traffic.
	perSession int

	// pids are the benchmark's processes and caddyPID the Caddy under load,
	// for CPU accounting over the measurement window.
	pids     []int
	caddyPID int
	// redisAddr, if set, is the redis-server whose counters are read over
	// the window too.
	redisAddr string
}

// result is what a round measured inside its window (after the warm-up).
type result struct {
	requests  int
	sessions  int // sessions completed (DELETE answered)
	window    time.Duration
	latencies []time.Duration
	errors    int
	errSample string
	cpu       cpuUse
	redis     redisUse
}

func (r *result) rps() float64 { return float64(r.requests) / r.window.Seconds() }

func (r *result) merge(o *result) {
	r.requests += o.requests
	r.sessions += o.sessions
	r.latencies = append(r.latencies, o.latencies...)
	r.errors += o.errors
	if r.errSample == "" {
		r.errSample = o.errSample
	}
}

// cursor is where one client is in its sequence of requests. It outlives
// a round, so that the next round against the same target picks the
// session up where it was left: short rounds then see the same mix of
// requests as long ones.
type cursor struct {
	sid  string
	step int
}

// Steps of a session: initialize, notifications/initialized, the requests,
// then DELETE.
const (
	stepInitialize  = 0
	stepInitialized = 1
	stepFirst       = 2
)

// worker is one connection's worth of client: it sends one request at a
// time.
type worker struct {
	l         *load
	from, end time.Time // measurement window
	next      time.Time // when pacing: the next request's start
	buf       bytes.Buffer
	res       result
	cur       *cursor
	bodies    [][]byte
}

func (l *load) run(ctx context.Context, cursors []cursor) result {
	start := time.Now()
	from, end := start.Add(l.warmup), start.Add(l.duration)
	workers := make([]*worker, l.concurrency)
	var wg sync.WaitGroup
	var cpu cpuUse
	var redis redisUse
	wg.Go(func() {
		time.Sleep(time.Until(from))
		a := sampleCPU(l.pids)
		ra := sampleRedis(l.redisAddr)
		time.Sleep(time.Until(end))
		cpu = cpuBetween(a, sampleCPU(l.pids), l.caddyPID, end.Sub(from))
		redis = sampleRedis(l.redisAddr).since(ra)
	})
	bodies := sessionBodies(l.perSession)
	for i := range workers {
		w := &worker{l: l, from: from, end: end, cur: &cursors[i], bodies: bodies}
		if l.pace > 0 {
			// Spread the workers' starts over one interval.
			w.next = start.Add(time.Duration(int64(l.pace) * int64(i) / int64(l.concurrency)))
		}
		workers[i] = w
		wg.Go(func() {
			for ctx.Err() == nil && time.Now().Before(end) {
				w.step(ctx)
			}
		})
	}
	wg.Wait()
	res := result{window: end.Sub(from), cpu: cpu, redis: redis}
	for _, w := range workers {
		res.merge(&w.res)
	}
	return res
}

// step sends the client's next request. Session-less, that is tools/list
// and tools/call in turn. In a session: initialize, then (once answered)
// notifications/initialized, the session's requests one at a time, and
// DELETE.
func (w *worker) step(ctx context.Context) {
	c := w.cur
	if w.l.perSession == 0 {
		body := bodyToolsList
		if c.step%2 == 1 {
			body = bodyToolsCall
		}
		c.step++
		_, _ = w.do(ctx, http.MethodPost, "", body, http.StatusOK)
		return
	}
	var err error
	switch {
	case c.step == stepInitialize:
		var header http.Header
		header, err = w.do(ctx, http.MethodPost, "", bodyInitialize, http.StatusOK)
		if err == nil {
			if c.sid = header.Get(mcpstub.SessionHeader); c.sid == "" {
				err = errors.New("initialize: no Mcp-Session-Id")
				w.fail(err)
			}
		}
	case c.step == stepInitialized:
		_, err = w.do(ctx, http.MethodPost, c.sid, bodyInitialized, http.StatusAccepted)
	case c.step < stepFirst+len(w.bodies):
		_, err = w.do(ctx, http.MethodPost, c.sid, w.bodies[c.step-stepFirst], http.StatusOK)
	default:
		if _, err = w.do(ctx, http.MethodDelete, c.sid, nil, http.StatusOK); err == nil {
			w.res.sessions++
			c.sid, c.step = "", stepInitialize
			return
		}
	}
	if err != nil {
		// Start over with a new session; the error is counted.
		if c.sid != "" && ctx.Err() == nil {
			_, _ = w.do(ctx, http.MethodDelete, c.sid, nil, http.StatusOK)
		}
		c.sid, c.step = "", stepInitialize
		return
	}
	c.step++
}

func (w *worker) fail(err error) {
	w.res.errors++
	if w.res.errSample == "" {
		w.res.errSample = err.Error()
	}
}

// do sends one request, reads the whole answer and checks it; it records
// the latency of a request that ends inside the measurement window.
func (w *worker) do(ctx context.Context, method, sid string, body []byte, want int) (http.Header, error) {
	if w.l.pace > 0 {
		now := time.Now()
		if w.next.After(now) {
			time.Sleep(w.next.Sub(now))
		} else if now.Sub(w.next) > w.l.pace {
			w.next = now // far behind: do not send a burst to catch up
		}
		w.next = w.next.Add(w.l.pace)
	}
	var req *http.Request
	var err error
	if body != nil {
		req, err = http.NewRequestWithContext(ctx, method, w.l.url, bytes.NewReader(body))
	} else {
		req, err = http.NewRequestWithContext(ctx, method, w.l.url, nil)
	}
	if err != nil {
		w.fail(err)
		return nil, err
	}
	h := req.Header
	h["Content-Type"] = []string{"application/json"}
	h["Accept"] = []string{"application/json, text/event-stream"}
	if sid != "" {
		h[mcpstub.SessionHeader] = []string{sid}
		h["Mcp-Protocol-Version"] = []string{"2025-06-18"}
	} else if w.l.perSession == 0 {
		// MCP 2026-07-28 traffic: the method (and a tool's name) in
		// headers, as every request of that era carries them.
		h["Mcp-Protocol-Version"] = []string{"2026-07-28"}
		if bytes.Equal(body, bodyToolsCall) {
			h["Mcp-Method"] = []string{"tools/call"}
			h["Mcp-Name"] = []string{"echo"}
		} else {
			h["Mcp-Method"] = []string{"tools/list"}
		}
	}

	start := time.Now()
	resp, err := w.l.client.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			w.fail(err)
		}
		return nil, err
	}
	w.buf.Reset()
	_, err = w.buf.ReadFrom(resp.Body)
	resp.Body.Close()
	end := time.Now()
	if err == nil {
		err = check(resp.StatusCode, want, w.buf.Bytes())
	}
	if err != nil {
		err = fmt.Errorf("%s %s: %w", method, firstLine(body), err)
		w.fail(err)
		return nil, err
	}
	if !start.Before(w.from) && !end.After(w.end) {
		w.res.requests++
		w.res.latencies = append(w.res.latencies, end.Sub(start))
	}
	return resp.Header, nil
}

// check accepts the expected status and, for a JSON-RPC answer, a result.
func check(status, want int, body []byte) error {
	if status != want {
		return fmt.Errorf("HTTP %d (want %d): %.200s", status, want, body)
	}
	if status == http.StatusOK && len(body) > 0 && !bytes.Contains(body, []byte(`"result"`)) {
		return fmt.Errorf("no result: %.200s", body)
	}
	return nil
}

func firstLine(body []byte) string {
	if len(body) > 60 {
		return string(body[:60]) + "…"
	}
	return string(body)
}

// pipeline is scenario 3: one session, depth requests in flight, against
// the slow upstream. It returns the requests completed and the time from
// the first answer to the last.
type pipeline struct {
	client   *http.Client
	url      string
	depth    int
	duration time.Duration
}

type pipelineResult struct {
	requests  int
	wall      time.Duration // first answer to last answer
	errors    int
	errSample string
}

// perRequest is the wall time per request, measured between answers so
// that the start of the pipeline does not count.
func (r pipelineResult) perRequest() time.Duration {
	if r.requests < 2 {
		return 0
	}
	return r.wall / time.Duration(r.requests-1)
}

// connect opens a session on the pipeline's URL and returns its id.
func (p *pipeline) connect(ctx context.Context) (string, error) {
	l := &load{client: p.client, url: p.url}
	w := &worker{l: l, end: time.Now().Add(time.Hour)}
	header, err := w.do(ctx, http.MethodPost, "", bodyInitialize, http.StatusOK)
	if err != nil {
		return "", err
	}
	sid := header.Get(mcpstub.SessionHeader)
	if _, err := w.do(ctx, http.MethodPost, sid, bodyInitialized, http.StatusAccepted); err != nil {
		return "", err
	}
	return sid, nil
}

func (p *pipeline) end(ctx context.Context, sid string) error {
	w := &worker{l: &load{client: p.client, url: p.url}, end: time.Now().Add(time.Hour)}
	_, err := w.do(ctx, http.MethodDelete, sid, nil, http.StatusOK)
	return err
}

// run keeps depth requests of session sid in flight for the duration.
func (p *pipeline) run(ctx context.Context, sid string) pipelineResult {
	var (
		mu          sync.Mutex
		first, last time.Time
		n           atomic.Int64
		res         pipelineResult
		wg          sync.WaitGroup
	)
	stop := time.Now().Add(p.duration)
	for range p.depth {
		wg.Go(func() {
			w := &worker{l: &load{client: p.client, url: p.url}, end: time.Now().Add(time.Hour)}
			for ctx.Err() == nil && time.Now().Before(stop) {
				if _, err := w.do(ctx, http.MethodPost, sid, bodyToolsList, http.StatusOK); err != nil {
					break
				}
				now := time.Now()
				n.Add(1)
				mu.Lock()
				if first.IsZero() || now.Before(first) {
					first = now
				}
				if now.After(last) {
					last = now
				}
				mu.Unlock()
			}
			mu.Lock()
			res.errors += w.res.errors
			if res.errSample == "" {
				res.errSample = w.res.errSample
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	res.requests = int(n.Load())
	res.wall = last.Sub(first)
	return res
}

// cpuPerRequest is the Caddy's CPU time per request in the window.
func (r *result) cpuPerRequest() time.Duration {
	if r.requests == 0 {
		return 0
	}
	return r.cpu.caddy / time.Duration(r.requests)
}

// endSessions deletes the sessions the cursors left open, unmeasured.
func (l *load) endSessions(ctx context.Context, cursors []cursor) {
	nl := *l
	nl.pace = 0
	w := &worker{l: &nl, end: time.Now().Add(time.Hour)}
	for i := range cursors {
		if c := &cursors[i]; c.sid != "" {
			_, _ = w.do(ctx, http.MethodDelete, c.sid, nil, http.StatusOK)
			c.sid, c.step = "", stepInitialize
		}
	}
}
