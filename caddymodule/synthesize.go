package caddymodule

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/warnlimit"
	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

var initializedNotification = []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)

// synthesizedKey marks, in its context, the notification the synthesize
// action sends, so that the handler that serves it takes its turn by that
// action's rule (acquire).
type synthesizedKey struct{}

// synthesizer returns the function the on_init_timeout synthesize action
// calls: it sends notifications/initialized as the client would have,
// with the initialize request's headers, to the same URL, through the
// routes of the config running when it fires. A reload in between has
// cleaned up the routes that served initialize (their upstreams, their
// php_fastcgi transport), so they are looked up afresh: the server of the
// running config that listens where the initialize request came in.
// What it needs of the initialize request is copied now, while that
// request is still being served.
func (h *Handler) synthesizer(r *http.Request, id string) func(context.Context) bool {
	if h.onInitTimeout != serializer.Synthesize {
		return nil
	}
	server, _ := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	orig, _ := r.Context().Value(caddyhttp.OriginalRequestCtxKey).(http.Request)
	if server == nil || orig.URL == nil {
		return nil
	}
	listen := slices.Clone(server.Listen)
	target := orig.URL.String()
	header := r.Header.Clone()
	remoteAddr, host := r.RemoteAddr, r.Host
	// reverse_proxy's X-Forwarded-Proto and php_fastcgi's HTTPS, REQUEST_SCHEME
	// and SERVER_ADDR come from these: without them an app that requires
	// HTTPS redirects the notification instead of acknowledging it.
	var tlsState *tls.ConnectionState
	if r.TLS != nil {
		state := *r.TLS
		tlsState = &state
	}
	localAddr := r.Context().Value(http.LocalAddrContextKey)

	return func(ctx context.Context) bool {
		srv := runningServer(server, listen)
		if srv == nil {
			if ok, suppressed := h.synthWarns.noServer.Allow(time.Now()); ok {
				h.logger.Warn("on_init_timeout synthesize: no server of the running config listens where the session was created; the gate opens without it",
					zap.String("session", serializer.SessionHash(id)), zap.Strings("listen", listen), zap.Int("suppressed", suppressed))
			}
			return false
		}
		ctx = context.WithValue(ctx, synthesizedKey{}, true)
		if localAddr != nil {
			ctx = context.WithValue(ctx, http.LocalAddrContextKey, localAddr)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(initializedNotification))
		if err != nil {
			return false
		}
		req.Header = header.Clone()
		// As the client would send it: the handler takes the owner off.
		req.Header.Set(sessionHeader, h.clientSessionID(id))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Content-Length", strconv.Itoa(len(initializedNotification)))
		req.Header.Del("Transfer-Encoding")
		req.ContentLength = int64(len(initializedNotification))
		req.RemoteAddr, req.Host, req.RequestURI = remoteAddr, host, orig.RequestURI
		req.TLS = tlsState

		rec := &statusRecorder{header: http.Header{}}
		req = caddyhttp.PrepareRequest(req, caddy.NewReplacer(), rec, srv)
		err = srv.Routes.Compile(routeEnd).ServeHTTP(rec, req)
		if errors.Is(err, serializer.ErrAlreadyInitialized) {
			return true // the client's own was acknowledged while it waited
		}
		status := statusOf(rec.status, err)
		if ok, suppressed := h.synthWarns.sent.Allow(time.Now()); ok {
			h.logger.Warn("sent notifications/initialized on the client's behalf (on_init_timeout synthesize)",
				zap.String("session", serializer.SessionHash(id)), zap.Int("status", status), zap.Error(err), zap.Int("suppressed", suppressed))
		}
		return status >= 200 && status < 300
	}
}

// acquire waits for a request's turn in its session, then in line, its
// key's queue, unless it has none (AcquireInLine). The notification
// the synthesize action sends is not needed once the client's own has
// been acknowledged, which may happen while it waits for its turn: it
// is then not forwarded, and the error (serializer.ErrAlreadyInitialized)
// goes back up the route to its sender.
func (h *Handler) acquire(r *http.Request, id string, line serializer.Line, traits serializer.Traits, src serializer.SynthSource) (serializer.Turn, error) {
	if traits.Has(serializer.CarriesInitialized) && r.Context().Value(synthesizedKey{}) != nil {
		return h.table.AcquireSynthesized(r.Context(), id, line)
	}
	return h.table.AcquireInLine(r.Context(), id, line, traits, src)
}

// runningServer is the server of the running config that listens on one
// of listen's addresses: created itself when no reload happened since.
func runningServer(created *caddyhttp.Server, listen []string) *caddyhttp.Server {
	app, err := caddy.ActiveContext().AppIfConfigured("http")
	if err != nil {
		return nil
	}
	httpApp, ok := app.(*caddyhttp.App)
	if !ok {
		return nil
	}
	for _, srv := range httpApp.Servers {
		if srv == created {
			return srv
		}
	}
	for _, srv := range httpApp.Servers {
		if slices.ContainsFunc(srv.Listen, func(addr string) bool { return slices.Contains(listen, addr) }) {
			return srv
		}
	}
	return nil
}

// routeEnd ends a synthesized request's route as Caddy ends a server's.
var routeEnd = caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })

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

// synthWarnings spaces each kind of synthesize WARN on its own, so that
// the rarer one (no server listens after a reload) is never held back by
// the other.
type synthWarnings struct{ sent, noServer warnlimit.Limiter }
