package caddymodule

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/warnlimit"
	"github.com/mcpserializer/caddy-mcp-serializer/owner"
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
			ow.Header().Set(servedByHeader, "an instance restarted at the owner's address")
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

// A session created over TLS without advertise records no owner (the hop
// is plain HTTP), and the log says so, at most once per interval, with what
// to do; one created over plain HTTP records this instance.
func TestASessionCreatedOverTLSWithoutAdvertiseWarnsThatItHasNoOwner(t *testing.T) {
	noOwnerWarns = warnlimit.Limiter{}
	h := newBareHandler(t, defaultMaxBody)
	core, logs := observer.New(zap.WarnLevel)
	h.logger = zap.New(core)
	h.owners = owner.NewDirectory(owner.NewMembership(owner.NewID(), func() owner.Leases { return nil }, nil), 100, time.Hour, nil)
	create := func(id string, tlsState *tls.ConnectionState) {
		t.Helper()
		r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
		r.TLS = tlsState
		r = r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, &net.TCPAddr{IP: net.IPv4(10, 0, 0, 5), Port: 8443}))
		turn := h.beginSession(http.StatusOK, http.Header{"Mcp-Session-Id": {id}}, r, newRequestInfo(r, ""))
		turn.Done(http.StatusOK)
	}
	create("over-tls", &tls.ConnectionState{})
	create("over-tls-again", &tls.ConnectionState{})
	if logs.Len() != 1 || !strings.Contains(logs.All()[0].Message, "set advertise") {
		t.Fatalf("%d WARN lines for two sessions created over TLS, want 1 saying what to set: %v", logs.Len(), logs.All())
	}
	if h.owners.Known() != 0 {
		t.Fatalf("%d owners known for sessions created over TLS, want none", h.owners.Known())
	}
	create("plain", nil)
	if h.owners.Known() != 1 || logs.Len() != 1 {
		t.Fatalf("over plain HTTP: %d owners known, %d WARN lines; want 1 and still 1", h.owners.Known(), logs.Len())
	}
}

// A 421 marked as from an instance that is not the owner, but without any
// instance's stamp, came from another program at the owner's address: it
// is held back as foreign, and never makes the session's owner be read as
// refused.
func TestAnUnstampedNotOwnerAnswerIsForeign(t *testing.T) {
	rec := httptest.NewRecorder()
	ow := &ownerReplyWriter{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: rec}, header: http.Header{}, ownerID: "aaaa"}
	ow.Header().Set(notOwnerHeader, "1")
	ow.WriteHeader(http.StatusMisdirectedRequest)
	io.WriteString(ow, `{"error":"not the owner"}`)
	if ow.notOwner || !ow.foreign || ow.wrote || rec.Body.Len() != 0 {
		t.Fatalf("notOwner %v, foreign %v, wrote %v, body %q", ow.notOwner, ow.foreign, ow.wrote, rec.Body)
	}
}

// A body on its way upstream is held at the upstream's first read until
// the instance confirms it still serves the session: if another instance
// took the session over while this one was paused, nothing of it is read.
func TestABodyGoesUpstreamOnlyOnceTheOwnerConfirmedItStillServesTheSession(t *testing.T) {
	for _, serves := range []bool{true, false} {
		asked := 0
		src := strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/call"}`)
		body := &leaseCheckedBody{ReadCloser: io.NopCloser(src), confirm: func() bool { asked++; return serves }}
		got, err := io.ReadAll(body)
		if asked != 1 {
			t.Fatalf("serves %v: confirm asked %d times, want once", serves, asked)
		}
		if serves && (err != nil || !strings.Contains(string(got), "tools/call")) {
			t.Fatalf("a confirmed body read %q, %v; want it whole", got, err)
		}
		if !serves && (!errors.Is(err, errSessionMoved) || len(got) != 0 || src.Len() == 0) {
			t.Fatalf("a body whose session moved read %q, %v (%d bytes left); want nothing read and errSessionMoved", got, err, src.Len())
		}
	}
}
