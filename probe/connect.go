// Package probe connects to an MCP server over Streamable HTTP the way
// pipelining clients do (the MCP Inspector's proxy, VS Code, Claude Code)
// and counts what goes wrong: requests rejected as "not initialized", HTTP
// errors, replies carrying another request's id, transport errors, and
// sessions left broken. A multi-process backend without per-session
// ordering fails such connects; the same backend behind mcp_serializer
// does not.
//
// It is plain Go with no Caddy import: `caddy mcp-probe` (package
// caddymodule) and the tests share it.
package probe

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// DefaultTimeout bounds each request of a connect when Driver.Timeout is 0.
const DefaultTimeout = 10 * time.Second

// DefaultProtocolVersion is offered in initialize when
// Driver.ProtocolVersion is empty.
const DefaultProtocolVersion = "2025-06-18"

// maxResponse bounds what is read of one response body.
const maxResponse = 16 << 20

// Driver runs connects against one MCP endpoint. One Connect is what a
// pipelining client does:
//
//	POST initialize (id 1), read Mcp-Session-Id
//	POST notifications/initialized  ┐
//	POST logging/setLevel (id 2)    ├ sent without waiting for each other
//	POST tools/list (id 3)          ┘
//	POST tools/list (id 4)          the check: the session must still work
//	DELETE                          when Delete is set
type Driver struct {
	Client *http.Client // nil means http.DefaultClient
	URL    string
	// Delete ends each session with DELETE.
	Delete bool
	// Sequential waits for each of the three middle POSTs to be answered
	// before sending the next, as a non-pipelining client does. A correct
	// server never fails such a connect.
	Sequential bool
	// PreferEventStream lists text/event-stream first in Accept; both
	// media types are always accepted, as the transport requires.
	PreferEventStream bool
	// Timeout bounds each request, its response body included; 0 means
	// DefaultTimeout.
	Timeout time.Duration
	// ProtocolVersion is offered in initialize; "" means
	// DefaultProtocolVersion. Later requests carry the version the server
	// answered.
	ProtocolVersion string
	// OnConnect, when set, is called by Run with each connect's Result,
	// one call at a time.
	OnConnect func(Result)
}

// Result is the outcome of one Connect. The counts are of responses or
// replies, not of connects.
type Result struct {
	SessionID string
	// Rejected counts replies carrying error -32600: the server saw the
	// session as not initialized.
	Rejected int
	// HTTPErrors counts responses with a status outside 2xx (a 405 to
	// DELETE excepted: servers may refuse client-initiated session ends).
	HTTPErrors int
	// IDMismatches counts replies whose id is not the request's.
	IDMismatches int
	// TransportErrors counts requests that got no complete response:
	// connection refused or reset, timeout, unreadable body.
	TransportErrors int
	// OtherErrors counts missing replies, undecodable 2xx bodies, a
	// missing session id, and JSON-RPC errors other than -32600.
	OtherErrors int
	// Broken is set when the check (tools/list, id 4, sent after everything
	// else was answered) was answered with an error: the session was left
	// unusable.
	Broken bool
	// EventStreams counts responses that came as text/event-stream.
	EventStreams int
	// Errors describes every problem counted above, for diagnosis.
	Errors  []error
	Elapsed time.Duration
}

// Failed reports whether anything went wrong.
func (r Result) Failed() bool {
	return r.Rejected > 0 || r.HTTPErrors > 0 || r.IDMismatches > 0 ||
		r.TransportErrors > 0 || r.OtherErrors > 0 || r.Broken
}

// Err joins Errors into one error (nil when there are none).
func (r Result) Err() error { return errors.Join(r.Errors...) }

func (d Driver) timeout() time.Duration {
	if d.Timeout > 0 {
		return d.Timeout
	}
	return DefaultTimeout
}

func (d Driver) client() *http.Client {
	if d.Client != nil {
		return d.Client
	}
	return http.DefaultClient
}

func (d Driver) accept() string {
	if d.PreferEventStream {
		return "text/event-stream, application/json"
	}
	return "application/json, text/event-stream"
}

func (d Driver) offeredVersion() string {
	if d.ProtocolVersion != "" {
		return d.ProtocolVersion
	}
	return DefaultProtocolVersion
}

// Connect runs one connect; see Driver.
func (d Driver) Connect(ctx context.Context) Result {
	c := &connect{d: d, start: time.Now(), version: d.offeredVersion()}

	init := c.call(ctx, "", 1, "initialize", c.initializeParams())
	if !init.ok {
		return c.result()
	}
	sid := init.header.Get(SessionHeader)
	if sid == "" {
		c.problem(&c.res.OtherErrors, errors.New("initialize: no Mcp-Session-Id in the response"))
		return c.result()
	}
	c.res.SessionID = sid
	var ir struct {
		ProtocolVersion string `json:"protocolVersion"`
	}
	if json.Unmarshal(init.result, &ir) == nil && ir.ProtocolVersion != "" {
		c.version = ir.ProtocolVersion
	}

	steps := []func(){
		func() { c.notify(ctx, sid, "notifications/initialized") },
		func() { c.call(ctx, sid, 2, "logging/setLevel", map[string]any{"level": "info"}) },
		func() { c.call(ctx, sid, 3, "tools/list", nil) },
	}
	if d.Sequential {
		for _, step := range steps {
			step()
		}
	} else {
		var wg sync.WaitGroup
		for _, step := range steps {
			wg.Go(step)
		}
		wg.Wait()
	}
	if check := c.call(ctx, sid, 4, "tools/list", nil); check.answered && check.rpcError {
		c.mu.Lock()
		c.res.Broken = true
		c.mu.Unlock()
	}
	if d.Delete {
		c.delete(ctx, sid)
	}
	return c.result()
}

// connect is one Connect in progress; its concurrent POSTs share res.
type connect struct {
	d       Driver
	start   time.Time
	version string // negotiated protocol version, sent as MCP-Protocol-Version
	mu      sync.Mutex
	res     Result
}

func (c *connect) initializeParams() map[string]any {
	return map[string]any{
		"protocolVersion": c.version,
		"capabilities":    map[string]any{},
		"clientInfo":      map[string]any{"name": "mcp-probe", "version": "1.0.0"},
	}
}

func (c *connect) result() Result {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.res
	r.Errors = append([]error(nil), c.res.Errors...)
	r.Elapsed = time.Since(c.start)
	return r
}

// problem counts one problem under field (nil: counted elsewhere) and
// keeps its description.
func (c *connect) problem(field *int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if field != nil {
		*field++
	}
	c.res.Errors = append(c.res.Errors, err)
}

// outcome is what became of one request.
type outcome struct {
	header   http.Header
	answered bool            // an HTTP response arrived and was read
	ok       bool            // 2xx and, for a request, its own result
	rpcError bool            // the request's reply was an error, or the status was not 2xx
	result   json.RawMessage // the request's result
}

// call POSTs one JSON-RPC request and checks its reply.
func (c *connect) call(ctx context.Context, sid string, id int, method string, params any) outcome {
	msg := map[string]any{"jsonrpc": "2.0", "id": id, "method": method}
	if params != nil {
		msg["params"] = params
	}
	what := fmt.Sprintf("%s (id %d)", method, id)
	want := fmt.Sprint(id)
	resp, replies, ok := c.post(ctx, sid, what, want, msg)
	out := outcome{header: resp.header, answered: resp.answered}
	if !ok {
		out.rpcError = resp.answered
		return out
	}
	var mine *message
	for i := range replies {
		m := &replies[i]
		if !m.isResponse() {
			continue // progress and other notifications on a stream
		}
		if m.id() != want {
			c.problem(&c.res.IDMismatches, fmt.Errorf("%s: a reply with id %.40s", what, m.id()))
			continue
		}
		mine = m
	}
	switch {
	case mine == nil:
		c.problem(&c.res.OtherErrors, fmt.Errorf("%s: no reply", what))
	case mine.Error != nil && mine.Error.Code == codeInvalidRequest:
		out.rpcError = true
		c.problem(&c.res.Rejected, fmt.Errorf("%s: rejected: %w", what, mine.Error))
	case mine.Error != nil:
		out.rpcError = true
		c.problem(&c.res.OtherErrors, fmt.Errorf("%s: %w", what, mine.Error))
	default:
		out.ok, out.result = true, mine.Result
	}
	return out
}

// notify POSTs one notification; a server answers 202 with no body, and
// an error in a body still counts.
func (c *connect) notify(ctx context.Context, sid, method string) {
	_, replies, ok := c.post(ctx, sid, method, "", map[string]any{"jsonrpc": "2.0", "method": method})
	if !ok {
		return
	}
	for _, m := range replies {
		switch {
		case m.Error != nil && m.Error.Code == codeInvalidRequest:
			c.problem(&c.res.Rejected, fmt.Errorf("%s: rejected: %w", method, m.Error))
		case m.Error != nil:
			c.problem(&c.res.OtherErrors, fmt.Errorf("%s: %w", method, m.Error))
		}
	}
}

// response is an HTTP response as far as the probe looks at it.
type response struct {
	answered bool
	status   int
	header   http.Header
	stream   bool // text/event-stream
	empty    bool // no body at all
	msgs     []message
}

// post sends msg and returns the messages of the response body; ok is
// false when the request failed (counted here) or was answered outside 2xx.
func (c *connect) post(ctx context.Context, sid, what, wantID string, msg any) (response, []message, bool) {
	body, err := json.Marshal(msg)
	if err != nil {
		c.problem(&c.res.OtherErrors, fmt.Errorf("%s: %w", what, err))
		return response{}, nil, false
	}
	resp, err := c.send(ctx, http.MethodPost, sid, wantID, body)
	if resp.stream {
		c.mu.Lock()
		c.res.EventStreams++
		c.mu.Unlock()
	}
	switch {
	case err != nil && !resp.answered:
		c.problem(&c.res.TransportErrors, fmt.Errorf("%s: %w", what, err))
		return resp, nil, false
	case resp.status < 200 || resp.status > 299:
		c.problem(&c.res.HTTPErrors, fmt.Errorf("%s: HTTP %d", what, resp.status))
		for _, m := range resp.msgs {
			if m.Error != nil && m.Error.Code == codeInvalidRequest {
				c.problem(&c.res.Rejected, fmt.Errorf("%s: rejected: %w", what, m.Error))
			}
		}
		return resp, resp.msgs, false
	case err != nil:
		c.problem(&c.res.OtherErrors, fmt.Errorf("%s: %w", what, err))
		resp.answered = false
		return resp, nil, false
	}
	return resp, resp.msgs, true
}

func (c *connect) delete(ctx context.Context, sid string) {
	resp, err := c.send(ctx, http.MethodDelete, sid, "", nil)
	switch {
	case err != nil && !resp.answered:
		c.problem(&c.res.TransportErrors, fmt.Errorf("DELETE: %w", err))
	case resp.status == http.StatusMethodNotAllowed:
		// The spec lets a server refuse client-initiated session ends.
	case resp.status < 200 || resp.status > 299:
		c.problem(&c.res.HTTPErrors, fmt.Errorf("DELETE: HTTP %d", resp.status))
	}
}

// send performs one request under the per-request timeout and decodes the
// body. An error with answered set is a 2xx body that could not be
// decoded; without it, the request got no complete response.
func (c *connect) send(ctx context.Context, method, sid, wantID string, body []byte) (response, error) {
	ctx, cancel := context.WithTimeout(ctx, c.d.timeout())
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.d.URL, rd)
	if err != nil {
		return response{}, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", c.d.accept())
	if sid != "" {
		req.Header.Set(SessionHeader, sid)
		req.Header.Set("MCP-Protocol-Version", c.version)
	}
	resp, err := c.d.client().Do(req)
	if err != nil {
		return response{}, c.explain(ctx, err)
	}
	defer resp.Body.Close()
	out := response{status: resp.StatusCode, header: resp.Header, stream: isEventStream(resp.Header.Get("Content-Type"))}
	success := resp.StatusCode >= 200 && resp.StatusCode <= 299
	if out.stream && success {
		out.msgs, err = readEvents(io.LimitReader(resp.Body, maxResponse), wantID)
		if err != nil {
			return out, c.explain(ctx, fmt.Errorf("reading the event stream: %w", err))
		}
		out.answered = true
		return out, nil
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return out, c.explain(ctx, fmt.Errorf("reading the %d response: %w", resp.StatusCode, err))
	}
	out.answered, out.empty = true, len(data) == 0
	msgs, err := decodeJSON(data)
	if !success {
		// An error page (a proxy's HTML) is reported by its status.
		out.msgs = msgs
		return out, nil
	}
	if err != nil {
		return out, fmt.Errorf("decoding the %d response (%s): %w", resp.StatusCode, resp.Header.Get("Content-Type"), err)
	}
	out.msgs = msgs
	return out, nil
}

// explain turns the per-request deadline into a message that names it.
func (c *connect) explain(ctx context.Context, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("no complete answer within %v: %w", c.d.timeout(), err)
	}
	return err
}
