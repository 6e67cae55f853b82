package mcpstub

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// serve starts b on an httptest server closed with the test.
func serve(t *testing.T, b *Backend) string {
	t.Helper()
	srv := httptest.NewServer(b)
	t.Cleanup(srv.Close)
	return srv.URL
}

// reply is a decoded HTTP response.
type reply struct {
	status int
	header http.Header
	body   []byte
	msgs   []Message
}

func send(t *testing.T, method, url, sid, body string) reply {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if sid != "" {
		req.Header.Set(SessionHeader, sid)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := DecodeBody(resp.Header.Get("Content-Type"), data)
	if err != nil {
		t.Fatalf("decoding %q: %v", data, err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: data, msgs: msgs}
}

func post(t *testing.T, url, sid, body string) reply {
	t.Helper()
	return send(t, http.MethodPost, url, sid, body)
}

const initializeBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"test","version":"0"}}}`

// newSession initializes a session and returns its id.
func newSession(t *testing.T, url string) string {
	t.Helper()
	r := post(t, url, "", initializeBody)
	sid := r.header.Get(SessionHeader)
	if r.status != http.StatusOK || sid == "" {
		t.Fatalf("initialize: status %d, session %q, body %s", r.status, sid, r.body)
	}
	return sid
}

// readySession initializes a session and acknowledges it.
func readySession(t *testing.T, url string) string {
	t.Helper()
	sid := newSession(t, url)
	if r := post(t, url, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); r.status != http.StatusAccepted {
		t.Fatalf("notifications/initialized: status %d, body %s", r.status, r.body)
	}
	return sid
}

// only returns the single message of r.
func only(t *testing.T, r reply) Message {
	t.Helper()
	if len(r.msgs) != 1 {
		t.Fatalf("want one message, got %d: %s", len(r.msgs), r.body)
	}
	return r.msgs[0]
}

func wantError(t *testing.T, m Message, code int) {
	t.Helper()
	if m.Error == nil || m.Error.Code != code {
		t.Fatalf("want error %d, got %+v (result %s)", code, m.Error, m.Result)
	}
}

func wantResult(t *testing.T, m Message) map[string]any {
	t.Helper()
	if m.Error != nil {
		t.Fatalf("want a result, got %v", m.Error)
	}
	var out map[string]any
	if err := json.Unmarshal(m.Result, &out); err != nil {
		t.Fatalf("result %s: %v", m.Result, err)
	}
	return out
}
