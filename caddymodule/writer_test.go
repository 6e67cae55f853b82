package caddymodule_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	caddy.RegisterModule(scriptedAnswer{})
	httpcaddyfile.RegisterHandlerDirective("mcp_test_answer", func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		h.Next()
		if !h.NextArg() {
			return nil, h.ArgErr()
		}
		return &scriptedAnswer{Name: h.Val()}, nil
	})
}

// scriptedAnswer is a terminal handler that answers as the function
// stored under its name in scriptedAnswers: a handler after mcp_serializer
// may write its answer in ways reverse_proxy never does (a flush or
// ReadFrom before WriteHeader). Its directive, mcp_test_answer <name>, goes
// in a route block.
type scriptedAnswer struct {
	Name string `json:"name"`
}

var scriptedAnswers sync.Map // name → func(http.ResponseWriter, *http.Request, []byte)

func (scriptedAnswer) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.mcp_test_answer",
		New: func() caddy.Module { return new(scriptedAnswer) },
	}
}

func (a *scriptedAnswer) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	f, ok := scriptedAnswers.Load(a.Name)
	if !ok {
		return caddyhttp.Error(http.StatusInternalServerError, fmt.Errorf("no scripted answer %q", a.Name))
	}
	body, _ := io.ReadAll(r.Body)
	f.(func(http.ResponseWriter, *http.Request, []byte))(w, r, body)
	return nil
}

// startScripted runs mcp_serializer in front of answer, in this process's
// Caddy.
func startScripted(t *testing.T, answer func(http.ResponseWriter, *http.Request, []byte)) *testCaddy {
	t.Helper()
	scriptedAnswers.Store(t.Name(), answer)
	t.Cleanup(func() { scriptedAnswers.Delete(t.Name()) })
	return startCaddy(t, "route {\n\tmcp_serializer\n\tmcp_test_answer "+t.Name()+"\n}")
}

// initializingSessions counts, over every session table, the sessions
// whose gate waits for notifications/initialized.
func (c *testCaddy) initializingSessions(t *testing.T) int {
	t.Helper()
	_, _, v := adminRequest(t, http.MethodGet, c.admin+"/mcp_serializer/sessions")
	tables, _ := v["tables"].([]any)
	n := 0
	for _, tb := range tables {
		counts, _ := tb.(map[string]any)["counts"].(map[string]any)
		i, _ := counts["initializing"].(float64)
		n += int(i)
	}
	return n
}

// expectGated checks that session sid, just created, holds a follow-up
// until its notifications/initialized is acknowledged.
func expectGated(t *testing.T, c *testCaddy, sid string) {
	t.Helper()
	held := callAsync(context.Background(), http.MethodPost, c.url, sid, rpcRequest("2", "tools/list"))
	c.awaitWaiting(t, 1)
	if a := call(context.Background(), http.DefaultClient, http.MethodPost, c.url, sid, initializedBody); a.status != http.StatusAccepted {
		t.Fatalf("initialized: %d %v %s", a.status, a.err, a.body)
	}
	expectResult(t, await(t, held, 5*time.Second, "held request"), "2")
}

// An answer that flushes its header before any write or WriteHeader (an
// event stream opened at once) starts the session it creates before the
// client can see its id: the follow-up the client sends while the
// initialize stream is still open waits at the new session's gate.
func TestSessionBegunByAFlushBeforeWriteHeaderIsGated(t *testing.T) {
	const sid = "flushed-first"
	release := make(chan struct{})
	c := startScripted(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		m := parseRPC(body)
		if m.Method != "initialize" {
			mcpAnswer(sid, nil)(w, r, body)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Mcp-Session-Id", sid)
		http.NewResponseController(w).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		fmt.Fprintf(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{}}\n\n", m.ID)
	})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.url, strings.NewReader(initializeBody))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if got := resp.Header.Get("Mcp-Session-Id"); resp.StatusCode != http.StatusOK || got != sid {
		t.Fatalf("initialize: %d, session %q", resp.StatusCode, got)
	}
	if n := c.initializingSessions(t); n != 1 {
		t.Fatalf("the client has the session id, and %d sessions are initializing, want 1", n)
	}
	held := callAsync(ctx, http.MethodPost, c.url, sid, rpcRequest("2", "tools/list"))
	c.awaitWaiting(t, 1)
	close(release)
	if _, err := io.ReadAll(resp.Body); err != nil {
		t.Fatal(err)
	}
	if a := call(ctx, http.DefaultClient, http.MethodPost, c.url, sid, initializedBody); a.status != http.StatusAccepted {
		t.Fatalf("initialized: %d %v %s", a.status, a.err, a.body)
	}
	expectResult(t, await(t, held, 5*time.Second, "held request"), "2")
}

// An answer copied in with io.Copy (the writer's ReadFrom) before any
// WriteHeader starts the session it creates, gated, as a written one does.
func TestSessionBegunThroughReadFromIsGated(t *testing.T) {
	const sid = "read-from"
	c := startScripted(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		m := parseRPC(body)
		if m.Method != "initialize" {
			mcpAnswer(sid, nil)(w, r, body)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Mcp-Session-Id", sid)
		// Hidden behind a plain Reader, so that io.Copy calls w's ReadFrom.
		result := struct{ io.Reader }{strings.NewReader(fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":{}}`, m.ID))}
		if _, ok := w.(io.ReaderFrom); !ok {
			t.Error("the writer after mcp_serializer has no ReadFrom")
		}
		io.Copy(w, result)
	})
	initialize(t, c, sid)
	if n := c.initializingSessions(t); n != 1 {
		t.Fatalf("after initialize, %d sessions are initializing, want 1", n)
	}
	expectGated(t, c, sid)
}
