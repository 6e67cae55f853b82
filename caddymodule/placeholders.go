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
	// The MCP-Protocol-Version header, shown as the method is.
	placeholderProtocolVersion = "http.mcp.protocol_version"
)

// Headers of MCP 2026-07-28 requests that name what the body holds.
const (
	methodHeader          = "Mcp-Method"
	protocolVersionHeader = "Mcp-Protocol-Version"
)

// requestInfo is what the handler learned of a request in a session or a
// key's queue, or of a session-less request that names its method in a
// header. It answers the placeholders and adds mcp_session_hash,
// mcp_method, mcp_protocol_version and mcp_queue_wait to the access log,
// all computed only when read.
type requestInfo struct {
	sessionID       string // the session (the upstream's id), or the key's queue when keyed
	idOwner         string // the instance the client's Mcp-Session-Id names (order owner), "" for none
	line            string // a session's request with a key: the key's queue, which it also waits in
	linePending     bool   // its key is known only once its credential is proven (learned at admission)
	method          serializer.Method
	protocolVersion string // as the client sent it
	waited          time.Duration
	proofWaited     time.Duration // a keyed request's wait for its credential's proof, before its queue
	keyed           bool
	held            bool
	unread          bool // a POST whose body is not read whole: its client's leaving goes unseen
	bySession       bool // a session's request routed by its session, its key's line notwithstanding
	moved           bool // sent on from its turn here, its session moved meanwhile (serveMoved)
}

// newRequestInfo starts the info of a request in session (or key) id.
func newRequestInfo(r *http.Request, id string) *requestInfo {
	return &requestInfo{sessionID: id, protocolVersion: r.Header.Get(protocolVersionHeader)}
}

// owned is what decides where the request is served with order owner:
// its key's queue if it has one, else its session; always its session
// with upstream_sessions instance (bySession), whose upstream alone holds
// it.
func (info *requestInfo) owned() (id string, keyed bool) {
	if info.line != "" && !info.bySession {
		return info.line, true
	}
	return info.sessionID, info.keyed
}

// waitsIn names, for an answer, what the request waits in.
func (info *requestInfo) waitsIn() string {
	switch {
	case info.keyed:
		return "this key's queue"
	case info.line != "":
		return "this MCP session and its key's queue"
	}
	return "this MCP session"
}

// session is the session the request belongs to, if any.
func (info *requestInfo) session() string {
	if info.keyed {
		return ""
	}
	return info.sessionID
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
		if info.session() == "" {
			return "", true
		}
		return serializer.SessionHash(info.sessionID), true
	case placeholderMethod:
		return info.method.String(), true
	case placeholderProtocolVersion:
		return serializer.ShowHeader(info.protocolVersion), true
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
	if info.session() != "" {
		enc.AddString("mcp_session_hash", serializer.SessionHash(info.sessionID))
	}
	enc.AddString("mcp_method", info.method.String())
	if info.protocolVersion != "" {
		enc.AddString("mcp_protocol_version", serializer.ShowHeader(info.protocolVersion))
	}
	if info.sessionID != "" {
		enc.AddDuration("mcp_queue_wait", info.waited)
	}
	return nil
}

// noSessionPlaceholders answers the placeholders of a request without a
// session: known, so that header and matchers see them, and empty. A
// plain function, so that setting it allocates nothing.
func noSessionPlaceholders(key string) (any, bool) {
	switch key {
	case placeholderSessionHash, placeholderMethod, placeholderProtocolVersion:
		return "", true
	case placeholderQueueWait:
		return time.Duration(0), true
	case placeholderHeld:
		return false, true
	}
	return nil, false
}

// publishNoSession answers the placeholders of a request without a
// session. One that names its method or protocol version in headers (MCP
// 2026-07-28) gets them in the placeholders and the access log, read from
// the headers, the body unread; it returns that info, for publishCreated.
func publishNoSession(r *http.Request) *requestInfo {
	method, version := r.Header.Get(methodHeader), r.Header.Get(protocolVersionHeader)
	if method == "" && version == "" {
		if repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
			repl.Map(noSessionPlaceholders)
		}
		return nil
	}
	info := &requestInfo{method: serializer.HeaderMethod(method), protocolVersion: version}
	info.publish(r)
	return info
}

// publishCreated names the session a session-less POST has just created
// (its initialize), in the info publishNoSession made for it if any:
// static values come before the providers, so this overrides
// noSessionPlaceholders.
func publishCreated(r *http.Request, id string, info *requestInfo) {
	ctx := r.Context()
	if repl, ok := ctx.Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
		repl.Set(placeholderSessionHash, serializer.SessionHash(id))
	}
	if info != nil {
		info.sessionID = id // read when the access log is written
		return
	}
	if extra := accessLogFields(ctx); extra != nil {
		extra.Add(zap.Inline(&requestInfo{sessionID: id}))
	}
}
