package probe

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
)

// SessionHeader is the HTTP header that carries the MCP session id.
const SessionHeader = "Mcp-Session-Id"

// codeInvalidRequest is JSON-RPC's -32600, which php-mcp and the stand-in
// answer to a request on a session not (yet) initialized.
const codeInvalidRequest = -32600

// message is one JSON-RPC message of a response body; only what the probe
// looks at is decoded.
type message struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Result json.RawMessage `json:"result"`
	Error  *rpcError       `json:"error"`
}

// isResponse reports whether m answers a request (a stream may also carry
// the server's notifications and requests).
func (m message) isResponse() bool { return m.Method == "" && (m.Result != nil || m.Error != nil) }

// id is the reply's id as written, for comparison with the request's.
func (m message) id() string { return string(bytes.TrimSpace(m.ID)) }

type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (e *rpcError) Error() string { return fmt.Sprintf("JSON-RPC error %d: %s", e.Code, e.Message) }

// isEventStream reports whether a Content-Type is text/event-stream.
func isEventStream(contentType string) bool {
	mt, _, _ := mime.ParseMediaType(contentType)
	return mt == "text/event-stream"
}

// decodeJSON returns the messages of a JSON body: one object or a batch.
// An empty body (202 to a notification) has none.
func decodeJSON(body []byte) ([]message, error) {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return nil, nil
	}
	if body[0] == '[' {
		var msgs []message
		if err := json.Unmarshal(body, &msgs); err != nil {
			return nil, err
		}
		return msgs, nil
	}
	var m message
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	return []message{m}, nil
}

// readEvents decodes a text/event-stream body event by event and stops
// after a response whose id is wantID: a server should end the stream
// there, and one that keeps it open must not cost the probe its timeout.
// An empty wantID reads to the end.
func readEvents(r io.Reader, wantID string) ([]message, error) {
	events := NewEventReader(r)
	var out []message
	for {
		ev, err := events.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		msgs, err := decodeJSON([]byte(ev.Data))
		if err != nil {
			return out, fmt.Errorf("event data: %w", err)
		}
		out = append(out, msgs...)
		for _, m := range msgs {
			if wantID != "" && m.isResponse() && m.id() == wantID {
				return out, nil
			}
		}
	}
}
