package caddymodule

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// Placeholders set while the handler serves a request, for later handlers,
// log_append, header (with defer) and matchers.
const (
	placeholderPrefix      = "http.mcp."
	placeholderSessionHash = "http.mcp.session_hash" // 12 hex digits, as in the logs
	placeholderMethod      = "http.mcp.method"       // JSON-RPC method (as serializer.Method.String shows it), "batch", "response" or ""
	placeholderQueueWait   = "http.mcp.queue_wait"   // time.Duration
	placeholderHeld        = "http.mcp.held"         // bool
)

// requestInfo is what the handler learned of a request in a session. It
// answers the placeholders and adds mcp_session_hash, mcp_method and
// mcp_queue_wait to the access log, both computed only when read.
type requestInfo struct {
	sessionID string
	method    serializer.Method
	waited    time.Duration
	held      bool
}

// publish makes info the answer to the request's placeholders and a part
// of its access log entry. Outside Caddy's server (no replacer, no extra
// log fields in the context) it does nothing.
func (info *requestInfo) publish(r *http.Request) {
	ctx := r.Context()
	if repl, ok := ctx.Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
		repl.Map(info.placeholder)
	}
	if extra := accessLogFields(ctx); extra != nil {
		extra.Add(zap.Inline(info))
	}
}

// accessLogFields returns the request's extra access log fields if its
// server writes an access log: adding a field costs Caddy three
// allocations, wasted when nothing logs it.
func accessLogFields(ctx context.Context) *caddyhttp.ExtraLogFields {
	if srv, _ := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); srv == nil || srv.Logs == nil {
		return nil
	}
	extra, _ := ctx.Value(caddyhttp.ExtraLogFieldsCtxKey).(*caddyhttp.ExtraLogFields)
	return extra
}

func (info *requestInfo) placeholder(key string) (any, bool) {
	if !strings.HasPrefix(key, placeholderPrefix) {
		return nil, false
	}
	switch key {
	case placeholderSessionHash:
		return sessionHash(info.sessionID), true
	case placeholderMethod:
		return info.method.String(), true
	case placeholderQueueWait:
		return info.waited, true
	case placeholderHeld:
		return info.held, true
	}
	return nil, false
}

// MarshalLogObject writes the access log's fields; zap.Inline puts them at
// the top level of the entry, beside Caddy's own.
func (info *requestInfo) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	enc.AddString("mcp_session_hash", sessionHash(info.sessionID))
	enc.AddString("mcp_method", info.method.String())
	enc.AddDuration("mcp_queue_wait", info.waited)
	return nil
}

// noSessionPlaceholders answers the placeholders of a request without a
// session: known, so that header and matchers see them, and empty. A
// plain function, so that setting it allocates nothing.
func noSessionPlaceholders(key string) (any, bool) {
	switch key {
	case placeholderSessionHash, placeholderMethod:
		return "", true
	case placeholderQueueWait:
		return time.Duration(0), true
	case placeholderHeld:
		return false, true
	}
	return nil, false
}

func publishNoSession(r *http.Request) {
	if repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
		repl.Map(noSessionPlaceholders)
	}
}

// publishCreated names the session a session-less POST has just created
// (its initialize): static values come before the providers, so this
// overrides noSessionPlaceholders.
func publishCreated(r *http.Request, id string) {
	ctx := r.Context()
	if repl, ok := ctx.Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
		repl.Set(placeholderSessionHash, sessionHash(id))
	}
	if extra := accessLogFields(ctx); extra != nil {
		extra.Add(zap.Inline(&requestInfo{sessionID: id}))
	}
}
