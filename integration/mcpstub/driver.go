package mcpstub

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Driver connects to an MCP server the way pipelining clients do (the MCP
// Inspector's proxy, VS Code, Claude Code): it does not wait for
// notifications/initialized to be answered before sending its first request.
//
// One Connect is:
//
//	POST initialize (id 1), read Mcp-Session-Id
//	POST notifications/initialized  ┐ concurrently
//	POST logging/setLevel (id 2)    ┘
//	POST tools/list (id 3)
//	POST tools/list (id 4)          the session must still work
//	DELETE                          when Delete is set
type Driver struct {
	Client *http.Client // nil means http.DefaultClient
	URL    string
	// Delete ends each session with DELETE.
	Delete bool
	// Sequential waits for notifications/initialized to be answered before
	// sending logging/setLevel, as a non-pipelining client does. A correct
	// server never fails such a connect.
	Sequential bool
	// ProtocolVersion is sent in initialize; "" means
	// DefaultProtocolVersion.
	ProtocolVersion string
}

// Result is the outcome of one Connect.
type Result struct {
	SessionID string
	// Rejected counts replies carrying error -32600 (the server saw the
	// session as not initialized).
	Rejected int
	// HTTPErrors counts responses with a status outside 2xx.
	HTTPErrors int
	// IDMismatches counts replies whose id is not the request's.
	IDMismatches int
	// Broken is set when the final tools/list (id 4), sent after everything
	// else was answered, failed: the session was left unusable.
	Broken bool
	// Errors holds transport errors, unreadable bodies, missing replies and
	// JSON-RPC errors other than -32600.
	Errors  []error
	Elapsed time.Duration
}

// Failed reports whether anything went wrong.
func (r Result) Failed() bool {
	return r.Rejected > 0 || r.HTTPErrors > 0 || r.IDMismatches > 0 || r.Broken || len(r.Errors) > 0
}

// Err joins Errors into one error (nil when there are none).
func (r Result) Err() error { return errors.Join(r.Errors...) }

// PipelinedConnect runs one pipelined connect against url with client and
// ends the session with DELETE.
func PipelinedConnect(ctx context.Context, client *http.Client, url string) Result {
	return Driver{Client: client, URL: url, Delete: true}.Connect(ctx)
}

// Connect runs one connect; see Driver.
func (d Driver) Connect(ctx context.Context) Result {
	c := &connect{d: d, start: time.Now()}
	if c.d.Client == nil {
		c.d.Client = http.DefaultClient
	}
	if c.d.ProtocolVersion == "" {
		c.d.ProtocolVersion = DefaultProtocolVersion
	}

	init := map[string]any{
		"protocolVersion": c.d.ProtocolVersion,
		"capabilities":    map[string]any{},
		"clientInfo":      map[string]any{"name": "mcpstub-driver", "version": "1.0.0"},
	}
	header, ok := c.request(ctx, "", 1, "initialize", init)
	if !ok {
		return c.result()
	}
	sid := header.Get(SessionHeader)
	if sid == "" {
		c.fail(errors.New("initialize: no Mcp-Session-Id in the response"))
		return c.result()
	}
	c.mu.Lock()
	c.res.SessionID = sid
	c.mu.Unlock()

	setLevel := map[string]any{"level": "info"}
	if d.Sequential {
		c.notify(ctx, sid, "notifications/initialized")
		c.request(ctx, sid, 2, "logging/setLevel", setLevel)
	} else {
		var wg sync.WaitGroup
		wg.Go(func() { c.notify(ctx, sid, "notifications/initialized") })
		wg.Go(func() { c.request(ctx, sid, 2, "logging/setLevel", setLevel) })
		wg.Wait()
	}
	c.request(ctx, sid, 3, "tools/list", nil)
	if _, ok := c.request(ctx, sid, 4, "tools/list", nil); !ok {
		c.mu.Lock()
		c.res.Broken = true
		c.mu.Unlock()
	}
	if d.Delete {
		c.delete(ctx, sid)
	}
	return c.result()
}

// connect is one Connect in progress; its two concurrent POSTs share res.
type connect struct {
	d     Driver
	start time.Time
	mu    sync.Mutex
	res   Result
}

func (c *connect) result() Result {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.res
	r.Errors = append([]error(nil), c.res.Errors...)
	r.Elapsed = time.Since(c.start)
	return r
}

func (c *connect) fail(err error) {
	c.mu.Lock()
	c.res.Errors = append(c.res.Errors, err)
	c.mu.Unlock()
}

func (c *connect) count(field *int) {
	c.mu.Lock()
	*field++
	c.mu.Unlock()
}

// request POSTs one JSON-RPC request and reports whether it got a result.
func (c *connect) request(ctx context.Context, sid string, id int, method string, params any) (http.Header, bool) {
	msg := map[string]any{"jsonrpc": "2.0", "id": id, "method": method}
	if params != nil {
		msg["params"] = params
	}
	header, replies, ok := c.post(ctx, sid, method, msg)
	if !ok {
		return header, false
	}
	want := fmt.Sprint(id)
	var mine *Message
	for i := range replies {
		m := &replies[i]
		if !m.IsResponse() {
			continue // progress and other notifications on a stream
		}
		if string(bytes.TrimSpace(m.ID)) != want {
			c.count(&c.res.IDMismatches)
			continue
		}
		mine = m
	}
	if mine == nil {
		c.fail(fmt.Errorf("%s (id %d): no reply", method, id))
		return header, false
	}
	if mine.Error != nil {
		if mine.Error.Code == CodeInvalidRequest {
			c.count(&c.res.Rejected)
		} else {
			c.fail(fmt.Errorf("%s (id %d): %w", method, id, mine.Error))
		}
		return header, false
	}
	return header, true
}

// notify POSTs one notification; a server answers 202 with no body.
func (c *connect) notify(ctx context.Context, sid, method string) {
	c.post(ctx, sid, method, map[string]any{"jsonrpc": "2.0", "method": method})
}

// post sends msg and returns the messages of the response body. It counts
// non-2xx statuses and JSON-RPC errors it finds in any body.
func (c *connect) post(ctx context.Context, sid, what string, msg any) (http.Header, []Message, bool) {
	body, err := json.Marshal(msg)
	if err != nil {
		c.fail(fmt.Errorf("%s: %w", what, err))
		return nil, nil, false
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.d.URL, bytes.NewReader(body))
	if err != nil {
		c.fail(fmt.Errorf("%s: %w", what, err))
		return nil, nil, false
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if sid != "" {
		req.Header.Set(SessionHeader, sid)
		req.Header.Set("MCP-Protocol-Version", c.d.ProtocolVersion)
	}
	status, header, replies, err := c.do(req)
	if err != nil {
		c.fail(fmt.Errorf("%s: %w", what, err))
		return header, nil, false
	}
	if status < 200 || status > 299 {
		c.count(&c.res.HTTPErrors)
		for _, m := range replies {
			if m.Error != nil && m.Error.Code == CodeInvalidRequest {
				c.count(&c.res.Rejected)
			}
		}
		return header, replies, false
	}
	if _, hasID := msg.(map[string]any)["id"]; !hasID {
		// A notification has no reply; an error in its body still counts.
		for _, m := range replies {
			switch {
			case m.Error != nil && m.Error.Code == CodeInvalidRequest:
				c.count(&c.res.Rejected)
			case m.Error != nil:
				c.fail(fmt.Errorf("%s: %w", what, m.Error))
			}
		}
	}
	return header, replies, true
}

func (c *connect) delete(ctx context.Context, sid string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, c.d.URL, nil)
	if err != nil {
		c.fail(fmt.Errorf("DELETE: %w", err))
		return
	}
	req.Header.Set(SessionHeader, sid)
	req.Header.Set("MCP-Protocol-Version", c.d.ProtocolVersion)
	status, _, _, err := c.do(req)
	switch {
	case err != nil:
		c.fail(fmt.Errorf("DELETE: %w", err))
	case status == http.StatusMethodNotAllowed:
		// The spec lets a server refuse client-initiated session ends.
	case status < 200 || status > 299:
		c.count(&c.res.HTTPErrors)
	}
}

// do sends req and decodes the whole body, JSON or event stream.
func (c *connect) do(req *http.Request) (int, http.Header, []Message, error) {
	resp, err := c.d.Client.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return resp.StatusCode, resp.Header, nil, fmt.Errorf("reading the %d response: %w", resp.StatusCode, err)
	}
	msgs, err := DecodeBody(resp.Header.Get("Content-Type"), body)
	if err != nil && resp.StatusCode >= 200 && resp.StatusCode <= 299 {
		return resp.StatusCode, resp.Header, nil, fmt.Errorf("decoding the %d response: %w", resp.StatusCode, err)
	}
	// An undecodable error body (a proxy's HTML page) is reported by status.
	return resp.StatusCode, resp.Header, msgs, nil
}

// Summary aggregates the Results of many connects. Each count is a number
// of connects, not of replies.
type Summary struct {
	Connects     int
	Failed       int // connects with any problem below
	Rejected     int // at least one -32600 reply
	Broken       int // the final tools/list failed
	HTTPErrors   int // at least one non-2xx response
	IDMismatches int // at least one reply with a foreign id
	Errors       int // at least one transport or protocol error
	// Samples holds the first few error texts, for diagnosis.
	Samples []string
	Elapsed time.Duration
}

const maxSamples = 5

// Add counts one Result.
func (s *Summary) Add(r Result) {
	s.Connects++
	if r.Failed() {
		s.Failed++
	}
	if r.Rejected > 0 {
		s.Rejected++
	}
	if r.Broken {
		s.Broken++
	}
	if r.HTTPErrors > 0 {
		s.HTTPErrors++
	}
	if r.IDMismatches > 0 {
		s.IDMismatches++
	}
	if len(r.Errors) > 0 {
		s.Errors++
		for _, err := range r.Errors {
			if len(s.Samples) < maxSamples {
				s.Samples = append(s.Samples, err.Error())
			}
		}
	}
}

// FailureRate is Failed/Connects (0 when nothing ran).
func (s Summary) FailureRate() float64 {
	if s.Connects == 0 {
		return 0
	}
	return float64(s.Failed) / float64(s.Connects)
}

func (s Summary) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d connects in %v: %d failed (%.1f%%): %d rejected, %d broken, %d with HTTP errors, %d with id mismatches, %d with errors",
		s.Connects, s.Elapsed.Round(time.Millisecond), s.Failed, 100*s.FailureRate(),
		s.Rejected, s.Broken, s.HTTPErrors, s.IDMismatches, s.Errors)
	for _, e := range s.Samples {
		b.WriteString("\n  error: ")
		b.WriteString(e)
	}
	return b.String()
}

// Run performs n connects, at most concurrency at a time, and sums them up.
// It stops starting new connects once ctx is done.
func (d Driver) Run(ctx context.Context, n, concurrency int) Summary {
	concurrency = max(1, min(concurrency, n))
	start := time.Now()
	var (
		next atomic.Int64
		mu   sync.Mutex
		sum  Summary
		wg   sync.WaitGroup
	)
	for range concurrency {
		wg.Go(func() {
			for next.Add(1) <= int64(n) && ctx.Err() == nil {
				r := d.Connect(ctx)
				mu.Lock()
				sum.Add(r)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	sum.Elapsed = time.Since(start)
	return sum
}

// RunPipelined performs n pipelined connects (with DELETE) against url, at
// most concurrency at a time, over its own connection pool.
func RunPipelined(ctx context.Context, url string, n, concurrency int) Summary {
	client := NewClient(concurrency)
	defer client.CloseIdleConnections()
	return Driver{Client: client, URL: url, Delete: true}.Run(ctx, n, concurrency)
}

// NewClient returns an HTTP client whose pool keeps enough idle connections
// for concurrency connects (two requests each at the pipelined step), so a
// run does not churn through ephemeral ports.
func NewClient(concurrency int) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 2*max(concurrency, 1) + 2
	t.MaxIdleConns = max(t.MaxIdleConns, t.MaxIdleConnsPerHost)
	return &http.Client{Transport: t, Timeout: time.Minute}
}
