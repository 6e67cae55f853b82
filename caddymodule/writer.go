package caddymodule

import (
	"context"
	"errors"
	"io"
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// exchangeWriter passes a response through unbuffered and acts on its
// final header before that header reaches the client: it marks an event
// stream (so replies may overtake it) or, for a session-less POST, starts
// the session the response creates.
type exchangeWriter struct {
	caddyhttp.ResponseWriterWrapper
	status int // final status sent; 0 until then
	turn   serializer.Turn

	// The request being served: a session-less POST begins a session from
	// its response; a request of a session adopted from shared state may
	// be asked for the synthesize action's sender (Synthesizer).
	h           *Handler
	r           *http.Request
	sessionless bool
	info        *requestInfo // a session-less POST's, if it published one
}

// Synthesizer lets the table build, from this request, the sender of the
// synthesize action for a session it has just adopted gated; it is never
// called for a session already known here.
func (w *exchangeWriter) Synthesizer(id string) func(context.Context) bool {
	return w.h.synthesizer(w.r, id)
}

func (w *exchangeWriter) WriteHeader(status int) {
	if w.status == 0 && (status >= 200 || status == http.StatusSwitchingProtocols) {
		w.status = status
		w.onFinalHeader()
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *exchangeWriter) onFinalHeader() {
	header := w.Header()
	if w.sessionless {
		w.turn = w.h.beginSession(w.status, header, w.r, w.info)
	}
	w.h.nameOwnerInResponse(header)
	if isEventStream(header) {
		w.turn.Streaming()
	}
}

func (w *exchangeWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

// ReadFrom keeps the underlying writer's fast path once the header is out.
func (w *exchangeWriter) ReadFrom(r io.Reader) (int64, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriterWrapper.ReadFrom(r)
}

// Flush sends buffered data now: event streams must reach the client as
// they are written. Defined here, not left to Unwrap, so that a flush
// before any write still passes through WriteHeader.
func (w *exchangeWriter) Flush() {
	_ = w.FlushError()
}

func (w *exchangeWriter) FlushError() error {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// settleStatus records the status of an exchange that ended in an error
// before writing anything; Caddy's error handling answers it later.
func (w *exchangeWriter) settleStatus(err error) {
	w.status = statusOf(w.status, err)
}

// statusOf is the status an exchange ended with: the one written, else
// the handler error's, else 500 for an error, else 0 (nothing was sent).
func statusOf(written int, err error) int {
	if written != 0 || err == nil {
		return written
	}
	var he caddyhttp.HandlerError
	if errors.As(err, &he) && he.StatusCode != 0 {
		return he.StatusCode
	}
	return http.StatusInternalServerError
}
