package caddymodule

import (
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// An event stream is told by its media type as Caddy's reverse_proxy tells
// it: case-insensitive, parameters allowed, and a malformed value is not one.
func TestEventStreamIsToldByItsMediaTypeInAnyCase(t *testing.T) {
	for ct, want := range map[string]bool{
		"text/event-stream":                  true,
		"Text/Event-Stream; charset=utf-8":   true,
		"TEXT/EVENT-STREAM":                  true,
		" text/event-stream ; charset=utf-8": true,
		"text/event-stream;":                 true,
		"text/event-stream; charset":         false, // mime: invalid media parameter
		"text/event-streams":                 false,
		"text/event-stream-x":                false,
		"text/event-ſtream":                  false, // folds to s, but not a token
		"application/json":                   false,
		"":                                   false,
	} {
		h := http.Header{"Content-Type": {ct}}
		if got := isEventStream(h); got != want {
			t.Errorf("isEventStream(%q) = %v, want %v", ct, got, want)
		}
		parsed, _, err := mime.ParseMediaType(ct)
		if caddy := err == nil && parsed == "text/event-stream"; caddy != want {
			t.Errorf("%q: reverse_proxy's test says %v, this table %v", ct, caddy, want)
		}
	}
}

// A reply to the server's request (sampling, elicitation) goes upstream
// beside the exchange that is streaming, whatever the case of the stream's
// Content-Type; were the stream not seen as one, the reply would wait
// behind it until queue_timeout.
func TestReplyOvertakesAStreamWhateverTheCaseOfItsContentType(t *testing.T) {
	h := newBareHandler(t, 1<<20)
	const sid = "stream-case"
	streaming, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		body := readAll(t, r)
		if strings.Contains(body, `"result"`) {
			w.WriteHeader(http.StatusAccepted) // the reply
			return nil
		}
		w.Header().Set("Content-Type", "Text/Event-Stream; charset=utf-8")
		w.WriteHeader(http.StatusOK)
		close(streaming)
		<-release
		return nil
	})
	go func() {
		r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/call"}`))
		r.Header.Set(sessionHeader, sid)
		_ = h.ServeHTTP(httptest.NewRecorder(), r, next)
	}()
	<-streaming

	done := make(chan int, 1)
	go func() {
		r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":7,"result":{"action":"accept"}}`))
		r.Header.Set(sessionHeader, sid)
		w := httptest.NewRecorder()
		_ = h.ServeHTTP(w, r, next)
		done <- w.Code
	}()
	select {
	case code := <-done:
		if code != http.StatusAccepted {
			t.Fatalf("reply answered %d, want 202", code)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the reply waited behind a Text/Event-Stream response: the stream was not seen as one")
	}
}

func readAll(t *testing.T, r *http.Request) string {
	t.Helper()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Error(err)
	}
	return string(b)
}

// While every session the table may hold has a request in flight (none
// can be evicted), an initialize is answered 503 before anything reaches
// the upstream: the session it would create has no room. Any other POST
// without a session goes on, body intact; once a session is idle again,
// initialize goes through.
func TestInitializeIsRefusedWhileTheTableIsSaturated(t *testing.T) {
	h := newBareHandler(t, 1<<20)
	cfg := serializer.Defaults()
	cfg.MaxSessions = 2
	h.table = serializer.NewTable(cfg)
	t.Cleanup(h.table.Close)

	release, inFlight := make(chan struct{}), make(chan struct{}, 2)
	var upstream []string // bodies of the session-less POSTs forwarded
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		body := readAll(t, r)
		if r.Header.Get(sessionHeader) != "" {
			inFlight <- struct{}{}
			<-release
		} else {
			upstream = append(upstream, body)
		}
		w.WriteHeader(http.StatusOK)
		return nil
	})
	post := func(sid, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(body))
		if sid != "" {
			r.Header.Set(sessionHeader, sid)
		}
		w := httptest.NewRecorder()
		if err := h.ServeHTTP(w, r, next); err != nil {
			t.Error(err)
		}
		return w
	}
	var wg sync.WaitGroup
	for _, sid := range []string{"busy-1", "busy-2"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			post(sid, `{"jsonrpc":"2.0","id":1,"method":"tools/call"}`)
		}()
		<-inFlight
	}

	const initialize = `{"jsonrpc":"2.0","id":"init-9","method":"initialize","params":{}}`
	refusals := metrics.rejections.WithLabelValues("table_full")
	before := testutil.ToFloat64(refusals)
	w := post("", initialize)
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "1" {
		t.Fatalf("initialize with the table saturated: status %d, Retry-After %q; want 503, 1", w.Code, w.Header().Get("Retry-After"))
	}
	var e errorReply
	if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || string(e.ID) != `"init-9"` ||
		e.Error.Code != codeServerError || !strings.Contains(e.Error.Message, "max_sessions") {
		t.Fatalf("initialize with the table saturated: answer %s, want a JSON-RPC error -32000 to id \"init-9\" naming max_sessions (%v)", w.Body.Bytes(), err)
	}
	if got := testutil.ToFloat64(refusals) - before; got != 1 {
		t.Fatalf("rejections_total{reason=table_full} rose by %v, want 1", got)
	}
	const sessionless = `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`
	for _, body := range []string{sessionless, `[` + initialize + `]`, `{"jsonrpc":"2.0","method":"initialize"}`} {
		if w := post("", body); w.Code != http.StatusOK {
			t.Fatalf("session-less %s with the table saturated: status %d, want it forwarded", body, w.Code)
		}
	}
	if want := []string{sessionless, `[` + initialize + `]`, `{"jsonrpc":"2.0","method":"initialize"}`}; !slices.Equal(upstream, want) {
		t.Fatalf("upstream got %q, want %q: the refused initialize must not reach it, the others intact", upstream, want)
	}
	// With max_buffered used up the body cannot be read: it goes on unread.
	h.budget.held.Store(h.budget.limit)
	if w := post("", sessionless); w.Code != http.StatusOK || len(upstream) != 4 || upstream[3] != sessionless {
		t.Fatalf("session-less POST with max_buffered used up: status %d, upstream got %q; want it forwarded intact", w.Code, upstream)
	}
	h.budget.held.Store(0)

	close(release)
	wg.Wait()
	if w := post("", initialize); w.Code != http.StatusOK {
		t.Fatalf("initialize once sessions are idle: status %d, want it forwarded", w.Code)
	}
}
