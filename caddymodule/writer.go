package caddymodule

import (
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

	// Set for a session-less POST, to start a session from its response.
	begin sessionStart
}

// sessionStart is what a session-less POST needs to begin a session.
type sessionStart struct {
	h    *Handler
	r    *http.Request
	next caddyhttp.Handler
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
	if w.begin.h != nil {
		w.turn = w.begin.h.beginSession(w.status, header, w.begin.r, w.begin.next)
	}
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
