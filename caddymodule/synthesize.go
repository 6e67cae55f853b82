package caddymodule

import (
	"bytes"
	"context"
	"maps"
	"net/http"
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

var initializedNotification = []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)

// synthesizer returns the function the on_init_timeout synthesize action
// calls: it sends notifications/initialized through the rest of the route,
// as the client would have, with the initialize request's headers. What it
// needs of the initialize request is copied now, while that request is
// still being served.
func (h *Handler) synthesizer(r *http.Request, next caddyhttp.Handler, id string) func(context.Context) bool {
	if h.onInitTimeout != serializer.Synthesize {
		return nil
	}
	server, _ := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	orig, _ := r.Context().Value(caddyhttp.OriginalRequestCtxKey).(http.Request)
	if server == nil || orig.URL == nil {
		return nil
	}
	target := orig.URL.String()
	header := r.Header.Clone()
	vars, _ := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
	vars = maps.Clone(vars)
	remoteAddr, host := r.RemoteAddr, r.Host

	return func(ctx context.Context) bool {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(initializedNotification))
		if err != nil {
			return false
		}
		req.Header = header.Clone()
		req.Header.Set(sessionHeader, id)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Content-Length", strconv.Itoa(len(initializedNotification)))
		req.Header.Del("Transfer-Encoding")
		req.ContentLength = int64(len(initializedNotification))
		req.RemoteAddr, req.Host, req.RequestURI = remoteAddr, host, orig.RequestURI

		rec := &statusRecorder{header: http.Header{}}
		req = caddyhttp.PrepareRequest(req, caddy.NewReplacer(), rec, server)
		// Variables set before this handler ran (root, for php_fastcgi).
		fresh, _ := req.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
		for k, v := range vars {
			if _, set := fresh[k]; !set {
				fresh[k] = v
			}
		}

		turn, err := h.table.Acquire(ctx, id, serializer.CarriesInitialized)
		if err != nil {
			return false
		}
		if !turn.Gated() {
			// The client's own initialized was acknowledged while this
			// one waited for its turn: sending it again is not needed.
			turn.Done(0)
			return true
		}
		err = next.ServeHTTP(rec, req)
		status := statusOf(rec.status, err)
		turn.Done(status)
		h.logger.Warn("sent notifications/initialized on the client's behalf (on_init_timeout synthesize)",
			zap.String("session", sessionHash(id)), zap.Int("status", status), zap.Error(err))
		return status >= 200 && status < 300
	}
}

// statusRecorder is the response writer of a synthesized request: the
// client never sees the answer, only its status matters.
type statusRecorder struct {
	header http.Header
	status int
}

func (w *statusRecorder) Header() http.Header { return w.header }

func (w *statusRecorder) WriteHeader(status int) {
	if w.status == 0 && status >= 200 {
		w.status = status
	}
}

func (w *statusRecorder) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return len(b), nil
}

func (w *statusRecorder) Flush() {}
