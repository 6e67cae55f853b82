package probe_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/integration/mcpstub"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/testnet"
	"github.com/mcpserializer/caddy-mcp-serializer/probe"
)

// Check finds an MCP server with sessions, says what it is, and leaves no
// session behind.
func TestCheckAcceptsAnMCPServerAndLeavesNoSession(t *testing.T) {
	b := &mcpstub.Backend{}
	srv, err := probe.Driver{URL: serve(t, b)}.Check(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if srv.Name != "mcpstub" || srv.ProtocolVersion != probe.DefaultProtocolVersion || srv.EventStream {
		t.Fatalf("server %+v", srv)
	}
	if b.Sessions() != 0 {
		t.Fatalf("%d sessions left behind", b.Sessions())
	}
}

// A target that cannot be probed is named as such, with the reason.
func TestCheckRejectsWhatCannotBeProbed(t *testing.T) {
	refused := testnet.RefusedURL(t)

	html := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = io.WriteString(w, "<!doctype html><title>Welcome</title>")
	}))
	notFound := serve(t, http.NotFoundHandler())
	// What Caddy answers when no site's address matches the request's host.
	noSite := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Server", "Caddy")
	}))
	jsonNotRPC := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"status":"ok"}`)
	}))
	refusing := serve(t, &fakeServer{answer: func(w http.ResponseWriter, r *http.Request, method string, id json.RawMessage) bool {
		replyError(w, http.StatusOK, id, -32602, "Unsupported protocol version")
		return true
	}})
	sessionless := serve(t, &fakeServer{answer: func(w http.ResponseWriter, r *http.Request, method string, id json.RawMessage) bool {
		if method != "initialize" {
			return false
		}
		reply(w, id, `{"protocolVersion":"2025-06-18","capabilities":{},"serverInfo":{"name":"stateless","version":"1"}}`)
		return true
	}})
	silent := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // a server notices a client gone only after the body
		<-r.Context().Done()
	}))

	for _, tc := range []struct{ name, url, reason string }{
		{"no scheme", "localhost:8080/mcp", "not an http:// or https:// URL"},
		{"other scheme", "ftp://example.com/mcp", "not an http:// or https:// URL"},
		{"no host", "http:///mcp", "not an http:// or https:// URL"},
		{"not a URL", "http://[::1/mcp", "not a URL"},
		{"connection refused", refused, "connection refused: nothing listens on " + strings.TrimPrefix(strings.TrimSuffix(refused, "/mcp"), "http://")},
		{"HTML page", html, "initialize was answered with an HTML page that is not JSON-RPC: not an MCP endpoint"},
		{"404", notFound, "initialize was answered with HTTP 404 Not Found, text/plain: not an MCP endpoint"},
		{"empty 200 from Caddy", noSite, "initialize was answered with an empty 200: not an MCP endpoint (Caddy answers so when no site matches the host asked for; make the site's address name " +
			strings.TrimPrefix(strings.TrimSuffix(noSite, "/mcp"), "http://")},
		{"JSON, not JSON-RPC", jsonNotRPC, "holds no reply to it: not an MCP endpoint"},
		{"initialize refused", refusing, "initialize was refused: JSON-RPC error -32602: Unsupported protocol version"},
		{"no session", sessionless, "the server created no session"},
		{"no answer", silent, "no answer to initialize: no complete answer within 300ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := probe.Driver{URL: tc.url, Timeout: 300 * time.Millisecond}.Check(t.Context())
			var ie *probe.InputError
			if !errors.As(err, &ie) {
				t.Fatalf("want an InputError, got %v", err)
			}
			if !strings.HasPrefix(err.Error(), tc.url+": ") || !strings.Contains(ie.Reason, tc.reason) {
				t.Fatalf("want %q, got %q", tc.reason, err)
			}
		})
	}
}
