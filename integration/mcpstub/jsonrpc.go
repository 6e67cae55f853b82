package mcpstub

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"

	"github.com/mcpserializer/caddy-mcp-serializer/probe"
)

// SessionHeader is the HTTP header that carries the MCP session id.
const SessionHeader = "Mcp-Session-Id"

// JSON-RPC error codes the Backend answers with.
const (
	CodeParseError      = -32700
	CodeInvalidRequest  = -32600 // also "Client session not initialized."
	CodeMethodNotFound  = -32601
	CodeInvalidParams   = -32602
	CodeSessionNotFound = -32001 // unknown or deleted Mcp-Session-Id (HTTP 404)
)

// NotInitializedMessage is the error message, with CodeInvalidRequest, that
// answers any request other than initialize on a session whose record does
// not say initialized; php-mcp uses the same code and text.
const NotInitializedMessage = "Client session not initialized."

// Message is one JSON-RPC 2.0 message: a request (Method and ID), a
// notification (Method, no ID) or a response (ID and Result or Error).
// ID is kept raw so that it is echoed byte for byte.
type Message struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method,omitempty"`
	Params  json.RawMessage `json:"params,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *RPCError       `json:"error,omitempty"`

	// invalid marks a batch element that is not a JSON-RPC message; the
	// Backend answers it with CodeInvalidRequest.
	invalid bool
}

// IsRequest reports whether m expects a response.
func (m Message) IsRequest() bool { return m.Method != "" && len(m.ID) > 0 }

// IsNotification reports whether m is a method call without an id.
func (m Message) IsNotification() bool { return m.Method != "" && len(m.ID) == 0 }

// IsResponse reports whether m answers a request.
func (m Message) IsResponse() bool { return m.Method == "" && (m.Result != nil || m.Error != nil) }

// RPCError is the error object of a JSON-RPC response.
type RPCError struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

func (e *RPCError) Error() string { return fmt.Sprintf("JSON-RPC error %d: %s", e.Code, e.Message) }

// response is what the Backend writes for one request.
type response struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  any             `json:"result,omitempty"`
	Error   *RPCError       `json:"error,omitempty"`
}

var nullID = json.RawMessage("null")

func errorReply(id json.RawMessage, code int, msg string) response {
	if len(id) == 0 {
		id = nullID
	}
	return response{JSONRPC: "2.0", ID: id, Error: &RPCError{Code: code, Message: msg}}
}

func resultReply(id json.RawMessage, result any) response {
	return response{JSONRPC: "2.0", ID: id, Result: result}
}

// bodyError is a POST body that cannot be processed at all; it is answered
// with status and a single JSON-RPC error.
type bodyError struct {
	status int
	code   int
	msg    string
}

// parseBody splits a POST body into messages. batch reports a JSON array.
// Elements of a batch that are not messages come back marked invalid rather
// than failing the whole body, as JSON-RPC 2.0 asks.
func parseBody(body []byte) (msgs []Message, batch bool, berr *bodyError) {
	body = bytes.TrimSpace(body)
	if len(body) == 0 || !json.Valid(body) {
		return nil, false, &bodyError{http.StatusBadRequest, CodeParseError, "Parse error"}
	}
	switch body[0] {
	case '{':
		m := decodeMessage(body)
		if m.invalid {
			return nil, false, &bodyError{http.StatusBadRequest, CodeInvalidRequest, "Invalid Request"}
		}
		return []Message{m}, false, nil
	case '[':
		var raws []json.RawMessage
		if err := json.Unmarshal(body, &raws); err != nil || len(raws) == 0 {
			return nil, true, &bodyError{http.StatusBadRequest, CodeInvalidRequest, "Invalid Request"}
		}
		msgs = make([]Message, len(raws))
		for i, raw := range raws {
			msgs[i] = decodeMessage(raw)
		}
		return msgs, true, nil
	default:
		return nil, false, &bodyError{http.StatusBadRequest, CodeInvalidRequest, "Invalid Request"}
	}
}

func decodeMessage(raw []byte) Message {
	var m Message
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' || json.Unmarshal(raw, &m) != nil {
		return Message{invalid: true}
	}
	if !m.IsRequest() && !m.IsNotification() && !m.IsResponse() {
		m.invalid = true
	}
	return m
}

// DecodeBody returns the JSON-RPC messages in a response body: a single
// object or a batch array for application/json, and the data of every event
// for text/event-stream (notifications such as progress included). An empty
// body yields no messages.
func DecodeBody(contentType string, body []byte) ([]Message, error) {
	mt, _, _ := mime.ParseMediaType(contentType)
	if mt == "text/event-stream" {
		var out []Message
		er := probe.NewEventReader(bytes.NewReader(body))
		for {
			ev, err := er.Next()
			if err != nil {
				if errors.Is(err, io.EOF) {
					return out, nil
				}
				return out, err
			}
			msgs, err := decodeJSON([]byte(ev.Data))
			if err != nil {
				return out, fmt.Errorf("event data: %w", err)
			}
			out = append(out, msgs...)
		}
	}
	return decodeJSON(body)
}

func decodeJSON(body []byte) ([]Message, error) {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return nil, nil
	}
	if body[0] == '[' {
		var msgs []Message
		if err := json.Unmarshal(body, &msgs); err != nil {
			return nil, err
		}
		return msgs, nil
	}
	var m Message
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	return []Message{m}, nil
}
