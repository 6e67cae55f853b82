package probe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"
)

// Server is what answered initialize.
type Server struct {
	Name            string `json:"name,omitempty"`
	Version         string `json:"version,omitempty"`
	ProtocolVersion string `json:"protocol_version"`
	// EventStream is set when initialize was answered as text/event-stream.
	EventStream bool `json:"event_stream"`
}

func (s Server) String() string {
	name := strings.TrimSpace(s.Name + " " + s.Version)
	if name == "" {
		name = "(unnamed)"
	}
	return name + " (" + s.ProtocolVersion + ")"
}

// InputError says why a target cannot be probed at all: it is not an
// http(s) URL, nothing answers there, or what answers is not an MCP server
// with sessions.
type InputError struct {
	URL    string
	Reason string
	Err    error // the underlying error, if any
}

func (e *InputError) Error() string { return e.URL + ": " + e.Reason }
func (e *InputError) Unwrap() error { return e.Err }

// CheckURL accepts absolute http and https URLs only.
func CheckURL(raw string) error {
	const want = "not an http:// or https:// URL (for example http://127.0.0.1:8080/mcp)"
	if !strings.Contains(raw, "://") {
		return &InputError{URL: raw, Reason: want} // "host:port/mcp" would parse oddly
	}
	u, err := url.Parse(raw)
	if err != nil {
		return &InputError{URL: raw, Reason: "not a URL: " + strings.TrimPrefix(err.Error(), "parse "), Err: err}
	}
	if s := strings.ToLower(u.Scheme); (s != "http" && s != "https") || u.Host == "" {
		return &InputError{URL: raw, Reason: want}
	}
	return nil
}

// Check finds out whether d.URL is an MCP endpoint that creates sessions:
// it initializes one session, sends notifications/initialized and deletes
// it again (sequentially, so a correct server never fails). The error is an
// *InputError naming the reason when the answer to initialize shows the
// target cannot be probed.
func (d Driver) Check(ctx context.Context) (Server, error) {
	if err := CheckURL(d.URL); err != nil {
		return Server{}, err
	}
	bad := func(err error, format string, args ...any) (Server, error) {
		return Server{}, &InputError{URL: d.URL, Reason: fmt.Sprintf(format, args...), Err: err}
	}
	c := &connect{d: d, start: time.Now(), version: d.offeredVersion()}
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": c.initializeParams()})
	if err != nil {
		return Server{}, err
	}
	resp, err := c.send(ctx, http.MethodPost, "", "1", body)
	if err != nil && !resp.answered {
		return bad(err, "%s", unreachable(err, d.URL))
	}
	kind := describeContentType(resp.header.Get("Content-Type"))
	if resp.status < 200 || resp.status > 299 {
		var detail string
		for _, m := range resp.msgs {
			if m.Error != nil {
				detail = " (" + m.Error.Error() + ")"
				break
			}
		}
		return bad(nil, "initialize was answered with HTTP %d %s, %s%s: not an MCP endpoint",
			resp.status, http.StatusText(resp.status), kind, detail)
	}
	if resp.empty {
		return bad(err, "initialize was answered with an empty %d: not an MCP endpoint%s", resp.status, emptyAnswerHint(d.URL, resp.header))
	}
	if err != nil {
		return bad(err, "initialize was answered with %s that is not JSON-RPC: not an MCP endpoint", kind)
	}
	var reply *message
	for i := range resp.msgs {
		if resp.msgs[i].isResponse() && resp.msgs[i].id() == "1" {
			reply = &resp.msgs[i]
		}
	}
	if reply == nil {
		return bad(nil, "the answer to initialize (%s) holds no reply to it: not an MCP endpoint", kind)
	}
	if reply.Error != nil {
		return bad(reply.Error, "initialize was refused: %v", reply.Error)
	}
	var ir struct {
		ProtocolVersion string `json:"protocolVersion"`
		ServerInfo      struct {
			Name    string `json:"name"`
			Version string `json:"version"`
		} `json:"serverInfo"`
	}
	if json.Unmarshal(reply.Result, &ir) != nil || ir.ProtocolVersion == "" {
		return bad(nil, "the answer to initialize is not an InitializeResult (no protocolVersion): not an MCP server")
	}
	srv := Server{Name: ir.ServerInfo.Name, Version: ir.ServerInfo.Version, ProtocolVersion: ir.ProtocolVersion, EventStream: resp.stream}
	sid := resp.header.Get(SessionHeader)
	if sid == "" {
		return srv, &InputError{URL: d.URL, Reason: "the server created no session (no Mcp-Session-Id in the answer to initialize); " +
			"mcp-probe tests the ordering of a session's requests, which needs sessions"}
	}
	// Leave nothing behind; what these two answer is the run's business.
	c.version = ir.ProtocolVersion
	_, _ = c.send(ctx, http.MethodPost, sid, "", []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`))
	_, _ = c.send(ctx, http.MethodDelete, sid, "", nil)
	return srv, nil
}

// unreachable says in words why a request got no response.
func unreachable(err error, rawURL string) string {
	host := rawURL
	if u, perr := url.Parse(rawURL); perr == nil {
		host = u.Host
	}
	var dnsErr *net.DNSError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused: nothing listens on " + host
	case errors.As(err, &dnsErr):
		return "cannot resolve the host name " + dnsErr.Name
	case errors.Is(err, context.DeadlineExceeded):
		return "no answer to initialize: " + err.Error()
	default:
		return "cannot reach it: " + err.Error()
	}
}

// emptyAnswerHint says what an empty 2xx usually means: Caddy answers
// so when no site's address matches the host the request named (a site
// at http://localhost:8080 asked for as http://127.0.0.1:8080).
func emptyAnswerHint(target string, h http.Header) string {
	host := target
	if u, err := url.Parse(target); err == nil {
		host = u.Host
	}
	server := "the server"
	if strings.HasPrefix(h.Get("Server"), "Caddy") {
		server = "Caddy"
	}
	return fmt.Sprintf(" (%s answers so when no site matches the host asked for; make the site's address name %s, "+
		"or leave the host out, as in http://:8080)", server, host)
}

func describeContentType(ct string) string {
	mt, _, _ := strings.Cut(ct, ";")
	switch mt = strings.TrimSpace(mt); {
	case mt == "":
		return "no Content-Type"
	case strings.Contains(mt, "html"):
		return "an HTML page"
	default:
		return mt
	}
}
