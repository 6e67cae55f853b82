package caddymodule

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// An instance's "not the owner" answer never reaches the client, however
// the proxy writes it; any other answer goes through whole.
func TestAnAnswerMarkedNotOwnerIsKeptFromTheClient(t *testing.T) {
	for _, write := range []struct {
		name string
		body func(w http.ResponseWriter, s string)
	}{
		{"Write", func(w http.ResponseWriter, s string) { io.WriteString(w, s) }},
		{"ReadFrom", func(w http.ResponseWriter, s string) { w.(io.ReaderFrom).ReadFrom(strings.NewReader(s)) }},
	} {
		t.Run(write.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			ow := &ownerReplyWriter{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: rec}, header: http.Header{}}
			ow.Header().Set(notOwnerHeader, "1")
			ow.Header().Set("Content-Type", "application/json")
			ow.WriteHeader(http.StatusMisdirectedRequest)
			write.body(ow, `{"error":"not the owner"}`)
			ow.Flush()
			if !ow.notOwner || ow.wrote || rec.Body.Len() != 0 || len(rec.Header()) != 0 || rec.Flushed {
				t.Fatalf("passed on: notOwner %v, wrote %v, status %d, headers %v, body %q, flushed %v",
					ow.notOwner, ow.wrote, rec.Code, rec.Header(), rec.Body, rec.Flushed)
			}

			rec = httptest.NewRecorder()
			ow = &ownerReplyWriter{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: rec}, header: http.Header{}}
			ow.Header().Set("Content-Type", "text/event-stream")
			ow.WriteHeader(http.StatusMisdirectedRequest) // unmarked: an answer like any other
			write.body(ow, "data: x\n\n")
			if rec.Code != http.StatusMisdirectedRequest || rec.Header().Get("Content-Type") != "text/event-stream" || rec.Body.String() != "data: x\n\n" {
				t.Fatalf("an unmarked answer: status %d, headers %v, body %q", rec.Code, rec.Header(), rec.Body)
			}
		})
	}
}
