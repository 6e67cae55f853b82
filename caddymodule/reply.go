package caddymodule

import (
	"encoding/json"
	"net/http"
	"strconv"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// JSON-RPC error codes used in local replies.
const (
	codeInvalidRequest = -32600
	codeServerError    = -32000
	// codeSessionNotFound is what the MCP SDKs answer, with 404, to an
	// id whose session is gone.
	codeSessionNotFound = -32001
)

// reject answers a request locally with a JSON-RPC error, counts it by
// reason and forwards nothing. id is the raw id of the request being
// answered, or nil when it is unknown.
func (h *Handler) reject(w http.ResponseWriter, r *http.Request, reason string, status, code int, message string, id []byte) error {
	metrics.rejections.WithLabelValues(reason).Inc()
	if c := h.logger.Check(zapcore.DebugLevel, "request answered locally"); c != nil {
		fields := []zap.Field{zap.String("reason", reason), zap.Int("status", status), zap.String("method", r.Method)}
		if sid := r.Header.Get(sessionHeader); sid != "" {
			_, sid = h.splitSessionID(sid) // hashed as everywhere else: the upstream's id
			fields = append(fields, zap.String("session", serializer.SessionHash(sid)))
		}
		c.Write(fields...)
	}
	body := jsonRPCError(code, "mcp_serializer: "+message, id)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, err := w.Write(body)
	return err
}

// jsonRPCError encodes an error response; a nil id is written as null, as
// JSON-RPC requires when the request's id is unknown.
func jsonRPCError(code int, message string, id []byte) []byte {
	if len(id) == 0 {
		id = []byte("null")
	}
	var reply errorReply
	reply.JSONRPC, reply.ID = "2.0", id
	reply.Error.Code, reply.Error.Message = code, message
	body, _ := json.Marshal(reply)
	return body
}

type errorReply struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Error   struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}
