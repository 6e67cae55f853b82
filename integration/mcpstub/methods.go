package mcpstub

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"time"
)

// DefaultProtocolVersion is answered to an initialize that names none.
const DefaultProtocolVersion = "2025-06-18"

// call is one POST being processed: the handler's own copy of the record
// (nil when sessionless) and, once started, its event stream.
type call struct {
	b   *Backend
	r   *http.Request
	rec *Record
	sse *sseWriter
}

// handle processes one message in body order and returns the reply, if the
// message needs one.
func (c *call) handle(m Message) (response, bool) {
	switch {
	case m.invalid:
		return errorReply(nil, CodeInvalidRequest, "Invalid Request"), true
	case m.IsResponse():
		// A client's answer to a server request; this server sends none.
		return response{}, false
	case m.IsNotification():
		if c.rec != nil {
			c.rec.Handled++
			if m.Method == "notifications/initialized" {
				c.rec.Initialized = true
			}
		}
		return response{}, false
	}

	if c.rec != nil {
		c.rec.Handled++
		if !c.rec.Initialized && m.Method != "initialize" {
			c.b.log.reject(c.rec.ID)
			return errorReply(m.ID, CodeInvalidRequest, NotInitializedMessage), true
		}
	}
	result, err := c.dispatch(m)
	if err != nil {
		return errorReply(m.ID, err.Code, err.Message), true
	}
	return resultReply(m.ID, result), true
}

func (c *call) dispatch(m Message) (any, *RPCError) {
	switch m.Method {
	case "initialize":
		// Sessionless, initialize only creates a session when sent alone
		// (servePost routes that case); inside a batch it is refused. With a
		// session id it re-initializes the record.
		if c.rec == nil {
			return nil, &RPCError{Code: CodeInvalidRequest, Message: "initialize must be sent alone"}
		}
		return initialize(c.rec, m.Params), nil
	case "ping":
		return struct{}{}, nil
	case "logging/setLevel":
		var p struct {
			Level string `json:"level"`
		}
		if json.Unmarshal(m.Params, &p) != nil || !slices.Contains(logLevels, p.Level) {
			return nil, &RPCError{Code: CodeInvalidParams, Message: "Invalid log level"}
		}
		if c.rec != nil {
			c.rec.LogLevel = p.Level
		}
		return struct{}{}, nil
	case "tools/list":
		return map[string]any{"tools": tools}, nil
	case "tools/call":
		return c.callTool(m)
	default:
		return nil, &RPCError{Code: CodeMethodNotFound, Message: "Method not found: " + m.Method}
	}
}

var logLevels = []string{"debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"}

// initialize records what the client announced and returns the
// InitializeResult, echoing the client's protocol version.
func initialize(rec *Record, params json.RawMessage) any {
	var p struct {
		ProtocolVersion string `json:"protocolVersion"`
		ClientInfo      struct {
			Name string `json:"name"`
		} `json:"clientInfo"`
	}
	_ = json.Unmarshal(params, &p)
	if p.ProtocolVersion == "" {
		p.ProtocolVersion = DefaultProtocolVersion
	}
	if rec != nil {
		rec.ProtocolVersion = p.ProtocolVersion
		rec.ClientName = p.ClientInfo.Name
	}
	return map[string]any{
		"protocolVersion": p.ProtocolVersion,
		"capabilities": map[string]any{
			"tools":   map[string]any{"listChanged": false},
			"logging": map[string]any{},
		},
		"serverInfo": map[string]any{"name": "mcpstub", "version": "1.0.0"},
	}
}

var tools = []map[string]any{
	{
		"name":        "echo",
		"description": "Returns its text argument.",
		"inputSchema": map[string]any{
			"type":       "object",
			"properties": map[string]any{"text": map[string]any{"type": "string"}},
		},
	},
	{
		"name":        "progress",
		"description": "Streams notifications/progress events, then returns.",
		"inputSchema": map[string]any{
			"type": "object",
			"properties": map[string]any{
				"steps":    map[string]any{"type": "integer", "minimum": 0},
				"pause_ms": map[string]any{"type": "integer", "minimum": 0},
			},
		},
	},
}

type toolCallParams struct {
	Name      string `json:"name"`
	Arguments struct {
		Text    string `json:"text"`
		Steps   *int   `json:"steps"`
		PauseMS *int   `json:"pause_ms"`
	} `json:"arguments"`
	Meta struct {
		ProgressToken json.RawMessage `json:"progressToken"`
	} `json:"_meta"`
}

func isProgressCall(m Message) bool {
	if !m.IsRequest() || m.Method != "tools/call" {
		return false
	}
	var p toolCallParams
	return json.Unmarshal(m.Params, &p) == nil && p.Name == "progress"
}

func textResult(text string) any {
	return map[string]any{
		"content": []map[string]any{{"type": "text", "text": text}},
		"isError": false,
	}
}

func (c *call) callTool(m Message) (any, *RPCError) {
	var p toolCallParams
	if err := json.Unmarshal(m.Params, &p); err != nil {
		return nil, &RPCError{Code: CodeInvalidParams, Message: "Invalid params"}
	}
	switch p.Name {
	case "echo":
		return textResult(p.Arguments.Text), nil
	case "progress":
		return c.progress(m, p), nil
	default:
		return nil, &RPCError{Code: CodeInvalidParams, Message: "Unknown tool: " + p.Name}
	}
}

// progress sends its notifications/progress events on the call's stream,
// each flushed after its pause, so that a client sees them before the result.
// The token is the client's progressToken, or the request id when it gave
// none.
func (c *call) progress(m Message, p toolCallParams) any {
	steps, pause := c.b.ProgressSteps, c.b.ProgressPause
	if steps <= 0 {
		steps = 3
	}
	if p.Arguments.Steps != nil {
		steps = max(*p.Arguments.Steps, 0)
	}
	if p.Arguments.PauseMS != nil {
		pause = time.Duration(max(*p.Arguments.PauseMS, 0)) * time.Millisecond
	}
	token := p.Meta.ProgressToken
	if len(token) == 0 {
		token = m.ID
	}
	for i := 1; i <= steps && c.sse != nil; i++ {
		if pause > 0 {
			select {
			case <-time.After(pause):
			case <-c.r.Context().Done():
				return textResult("cancelled")
			}
		}
		c.sse.message(map[string]any{
			"jsonrpc": "2.0",
			"method":  "notifications/progress",
			"params": map[string]any{
				"progressToken": token,
				"progress":      i,
				"total":         steps,
				"message":       fmt.Sprintf("step %d of %d", i, steps),
			},
		})
	}
	return textResult(fmt.Sprintf("done after %d steps", steps))
}
