package caddymodule

import (
	"io"
	"mime"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
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
