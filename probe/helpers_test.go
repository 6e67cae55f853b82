package probe_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// fakeServer is a scriptable MCP endpoint that answers everything correctly
// unless answer takes over a request. It never races: every failure a test
// sees is the one it scripted.
type fakeServer struct {
	// answer, when set, may answer a POST itself; it reports whether it did.
	answer  func(w http.ResponseWriter, r *http.Request, method string, id json.RawMessage) bool
	session atomic.Int64
}

func (f *fakeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodDelete {
		w.WriteHeader(http.StatusOK)
		return
	}
	body, _ := io.ReadAll(r.Body)
	var m struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
	}
	if err := json.Unmarshal(body, &m); err != nil {
		http.Error(w, "bad body", http.StatusBadRequest)
		return
	}
	if f.answer != nil && f.answer(w, r, m.Method, m.ID) {
		return
	}
	switch {
	case m.Method == "initialize":
		w.Header().Set("Mcp-Session-Id", "fake-"+strings.Repeat("x", int(f.session.Add(1)%3)+1))
		reply(w, m.ID, `{"protocolVersion":"2025-06-18","capabilities":{"tools":{},"logging":{}},"serverInfo":{"name":"fake","version":"0.1"}}`)
	case len(m.ID) == 0:
		w.WriteHeader(http.StatusAccepted)
	case m.Method == "tools/list":
		reply(w, m.ID, `{"tools":[]}`)
	default:
		reply(w, m.ID, `{}`)
	}
}

func reply(w http.ResponseWriter, id json.RawMessage, result string) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":`+string(id)+`,"result":`+result+`}`)
}

func replyError(w http.ResponseWriter, status int, id json.RawMessage, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	data, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "error": map[string]any{"code": code, "message": msg}})
	_, _ = w.Write(data)
}

func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL + "/mcp"
}
