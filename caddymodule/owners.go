package caddymodule

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/headers"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/warnlimit"
	"github.com/mcpserializer/caddy-mcp-serializer/owner"
	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// With order owner, a session's requests meet on the instance that
// created it (package owner): the others forward them there with Caddy's
// reverse proxy, and the owner queues and gates them as any other.

const (
	// ownerHeader names the owner a forwarded request was sent to. The
	// owner serves it only if that is itself, and never forwards it
	// again, whatever a client put there.
	ownerHeader = "Mcp-Serializer-Owner"
	// notOwnerHeader marks a 421 answer from an instance that is not the
	// owner a request was sent to, so that the forwarding instance reads
	// the session's owner again rather than pass the answer on.
	notOwnerHeader = "Mcp-Serializer-Not-Owner"
	// servedByHeader stamps every answer to a forwarded request with the
	// ID of the instance that served it: an answer without the ID the
	// request was sent to came from something else at that address (an
	// IP given to another program) and is never passed on.
	servedByHeader = "Mcp-Serializer-Served-By"

	placeholderOwner   = "http.mcp.owner"    // host:port a request was forwarded to
	placeholderOwnerID = "http.mcp.owner_id" // that owner's instance ID
)

// statusClientClosed is what Caddy's reverse proxy writes when the
// request's context ends before an answer.
const statusClientClosed = 499

// forwardDialTimeout bounds the dial to an owner; forwardRetryEvery is
// how often a request whose owner's lease stands but could not be reached
// tries again, within queue_timeout.
const (
	forwardDialTimeout = 2 * time.Second
	forwardRetryEvery  = 250 * time.Millisecond
	// forwardUnaskedNever is the transport's wait for the owner's ask
	// for a body, after which it would send the body unasked: longer
	// than any request waits.
	forwardUnaskedNever = 24 * time.Hour
)

// newForwarder provisions the reverse proxy that takes requests to their
// session's owner: the dial address and owner's ID come from this
// handler's placeholders, never from the request, and SSE responses flow
// back as they are written. A body is never sent before the owner asks
// for it (forwardUnaskedNever; the forward is cut at the request's
// deadline instead): an owner asks at once as it reads the body, and one
// frozen with the forward queued at its listener must never get it.
func newForwarder(ctx caddy.Context) (*reverseproxy.Handler, error) {
	// A new connection for each forward: a stopping owner closes its idle
	// ones, and a request sent on one just as it closes fails after it
	// may have been sent; a refused dial is retried safely instead.
	// TCP keep-alive probes every second (after Go's 15 s of idle, nine
	// of them) end a forward whose owner's host went silent, packets
	// dropped, in about 25 s rather than Caddy's default 5 minutes.
	keepAlive := false
	transport := &reverseproxy.HTTPTransport{
		DialTimeout:           caddy.Duration(forwardDialTimeout),
		KeepAlive:             &reverseproxy.KeepAlive{Enabled: &keepAlive, ProbeInterval: caddy.Duration(time.Second)},
		ExpectContinueTimeout: caddy.Duration(forwardUnaskedNever),
	}
	proxy := &reverseproxy.Handler{
		TransportRaw:  caddyconfig.JSONModuleObject(transport, "protocol", "http", nil),
		Upstreams:     reverseproxy.UpstreamPool{{Dial: "{" + placeholderOwner + "}"}},
		FlushInterval: caddy.Duration(-1),
		Headers: &headers.Handler{Request: &headers.HeaderOps{
			Set: http.Header{ownerHeader: []string{"{" + placeholderOwnerID + "}"}},
		}},
	}
	if err := proxy.Provision(ctx); err != nil {
		return nil, fmt.Errorf("order owner: the forwarding proxy: %w", err)
	}
	return proxy, nil
}

// ownerGateReadAfter is how long an owner's gate holds a request before it
// reads the session's record: while Redis was down, another instance may
// have served the session's notifications/initialized, not knowing the
// owner. Normally that message is forwarded here within milliseconds.
const ownerGateReadAfter = 500 * time.Millisecond

// ownerWarns spaces the WARN lines about owners that do not answer.
var ownerWarns warnlimit.Limiter

// serveAtOwner forwards a session's request to the instance that owns it
// and reports whether it did (then the request is answered); false: it is
// served here. raw is the POST body read, to send again if a forward did
// not reach the owner; nil if there is none or it was too large to keep.
// While the owner's lease stands but it cannot be reached (it is
// stopping and handing over, or a network blip), the request waits and
// tries again within queue_timeout, then is answered 503: it is never
// served beside a live owner.
func (h *Handler) serveAtOwner(w http.ResponseWriter, r *http.Request, info *requestInfo, raw []byte, reqID []byte) (bool, error) {
	if h.owners == nil {
		if h.formerOwner != "" && r.Header.Get(ownerHeader) != "" {
			// Sent by an instance that still takes this one for the
			// session's owner, after a reload turned order owner off here
			// and handed the sessions over: served here, it would run
			// beside the session's next owner.
			w.Header().Set(servedByHeader, h.formerOwner)
			return true, h.rejectNotOwner(w, r, reqID)
		}
		return false, nil
	}
	id, keyed := info.owned()
	here := h.hereAddr(r)
	if sentTo := r.Header.Get(ownerHeader); sentTo != "" {
		// Both are the hop's own: the client's Expect was answered where
		// it arrived.
		r.Header.Del(ownerHeader)
		r.Header.Del("Expect")
		if h.pinned() && !keyed && sentTo == h.owners.Self() && info.idOwner == sentTo {
			// Only this instance's upstream can hold a session whose id
			// names it, whatever its record says, or if it has none.
			return false, nil
		}
		if h.owners.Serves(r.Context(), h.ownerStore, id, sentTo) {
			return false, nil
		}
		return true, h.rejectNotOwner(w, r, reqID)
	}
	// One queue_timeout in all: a request sent on from the queue of an
	// instance that lost its session (serveMoved) has waited there.
	deadline := time.Now().Add(h.settings.QueueTimeout - info.proofWaited - info.waited)
	unread := raw == nil && r.Body != nil && r.Body != http.NoBody
	sent := false // an unread body went out and is gone
	// through: this request is through its place in its session's
	// forward line here (forwardLines); nil until it joins.
	var through func()
	defer func() {
		if through != nil {
			through()
		}
	}()
	for {
		var o owner.Owner
		var forward, wait bool
		if keyed {
			o, forward, wait = h.owners.RouteKey(r.Context(), h.ownerStore, id, here)
		} else {
			o, forward, wait = h.owners.Route(r.Context(), h.ownerStore, id, info.idOwner, here)
		}
		if raw != nil {
			r.Body = io.NopCloser(bytes.NewReader(raw))
		}
		if sent {
			// Its body went to the instance that refused it: whatever
			// comes next, here or elsewhere, would get none of it.
			w.Header().Set("Retry-After", "1")
			return true, h.reject(w, r, "owner_moved", http.StatusServiceUnavailable, codeServerError,
				"this MCP session moved to another instance while its large request was on its way; retry", reqID)
		}
		if o == owner.Gone {
			return true, h.rejectGone(w, r, reqID)
		}
		if !forward && !wait {
			return false, nil
		}
		if forward && through == nil && !info.moved && r.Method != http.MethodGet && (h.table.Busy(id) || id != info.sessionID && h.table.Busy(info.sessionID)) {
			// Its session's earlier requests wait here, to be sent on
			// one at a time from their turns (this instance lost the
			// session while they waited): it queues behind them. A GET
			// stream takes no turn, and goes now.
			return false, nil
		}
		if through == nil {
			var before <-chan struct{}
			before, through = h.forwardLines.join(id)
			if before != nil {
				// Its turn comes after the request before it; the owner
				// may have changed meanwhile.
				select {
				case <-before:
					continue
				case <-time.After(time.Until(deadline)):
					return true, h.rejectOwnerUnreachable(w, r, reqID)
				case <-r.Context().Done():
					return true, nil
				}
			}
		}
		if forward {
			res, err := h.forward(w, r, o, raw, through, deadline)
			if res != forwardAnswered && res != forwardFailed && h.pinned() && !keyed && h.lapsed(o.ID) {
				// Nothing answers as the instance, whose lease lapsed: it
				// is gone, and its upstream held the session.
				return true, h.rejectGone(w, r, reqID)
			}
			switch res {
			case forwardAnswered:
				if r.Method == http.MethodDelete && !keyed {
					h.owners.Forget(id)
				}
				return true, err
			case forwardFailed, forwardForeign:
				return true, h.reject(w, r, "owner_failed", http.StatusBadGateway, codeServerError,
					"the instance serving this MCP session failed before it answered; the request may have reached the MCP server", reqID)
			case forwardNotOwner:
				sent = unread
				h.owners.NotOwner(id, o)
			default:
				h.owners.Unreachable(id, o)
			}
		}
		left := time.Until(deadline)
		if left <= 0 {
			return true, h.rejectOwnerUnreachable(w, r, reqID)
		}
		select {
		case <-time.After(min(left, forwardRetryEvery)):
		case <-r.Context().Done():
			return true, nil // the client left: nothing to answer
		}
	}
}

// lapsed reports whether instance id's lease has been seen lapsed.
func (h *Handler) lapsed(id string) bool {
	live, _ := h.owners.Members().Status(id)
	return live == owner.Lapsed
}

// rejectGone answers a request of a session whose instance, the only one
// whose upstream held it, is gone: 404, as the MCP SDKs answer a session
// they do not know, so that the client starts a new one at once.
func (h *Handler) rejectGone(w http.ResponseWriter, r *http.Request, reqID []byte) error {
	return h.reject(w, r, "owner_gone", http.StatusNotFound, codeSessionNotFound,
		"session not found: the instance whose MCP server held this session is gone; start a new session", reqID)
}

// rejectNotOwner answers 421 a request forwarded to this instance, which
// does not serve its session, so that the forwarding instance reads the
// owner again; the answer carries this instance's stamp (ServeHTTP).
func (h *Handler) rejectNotOwner(w http.ResponseWriter, r *http.Request, reqID []byte) error {
	w.Header().Set(notOwnerHeader, "1")
	return h.reject(w, r, "not_owner", http.StatusMisdirectedRequest, codeServerError,
		"this instance does not serve this MCP session: the instance that forwarded the request reads its owner again", reqID)
}

// rejectOwnerUnreachable answers a request whose owner could not be
// reached within queue_timeout.
func (h *Handler) rejectOwnerUnreachable(w http.ResponseWriter, r *http.Request, reqID []byte) error {
	w.Header().Set("Retry-After", "1")
	return h.reject(w, r, "owner_unreachable", http.StatusServiceUnavailable, codeServerError,
		"the instance serving this MCP session could not be reached within queue_timeout, and it still holds its lease; retry", reqID)
}

// hereAddr is where a request reached this instance: the address
// recorded for a session it creates or takes over, unless advertise
// names another. It never comes from anything the client sent. "" over
// TLS without advertise: the hop to an owner is plain HTTP, so such a
// session gets no owner and each instance serves what reaches it.
func (h *Handler) hereAddr(r *http.Request) string {
	if h.advertise != "" {
		return h.advertise
	}
	if r.TLS != nil {
		return ""
	}
	if c, _ := r.Context().Value(connKey{}).(net.Conn); c != nil {
		// The socket's own address: a listener wrapper such as
		// proxy_protocol reports the one a PROXY header claims.
		if tcp := socketOf(c); tcp != nil {
			return tcp.LocalAddr().String()
		}
		return "" // a wrapper it cannot see through, or a unix socket
	}
	// A unix socket has no address another instance could dial.
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr); ok {
		return a.String()
	}
	return ""
}

// socketOf is the TCP socket under a connection and the listener
// wrappers' layers over it (proxy_protocol's Raw, tls.Conn's NetConn);
// nil if it is not TCP or a layer hides it.
func socketOf(c net.Conn) *net.TCPConn {
	for range 8 {
		switch v := c.(type) {
		case *net.TCPConn:
			return v
		case interface{ Raw() net.Conn }:
			c = v.Raw()
		case interface{ NetConn() net.Conn }:
			c = v.NetConn()
		default:
			return nil
		}
	}
	return nil
}

// noOwnerWarns spaces the WARN lines about sessions created without an
// owner.
var noOwnerWarns warnlimit.Limiter

// warnNoOwner says, at most once per interval, that a session was created
// where no other instance could reach it (over TLS, or on a unix socket),
// so that its requests go in the order of each instance they reach.
func (h *Handler) warnNoOwner(r *http.Request) {
	if ok, suppressed := noOwnerWarns.Allow(time.Now()); ok {
		h.logger.Warn("order owner: this session records no owner, so its requests reaching other instances are not ordered with it: "+
			"it came over TLS, a unix socket or a listener wrapper this instance cannot see through, and the hop to an owner is plain HTTP; "+
			"set advertise to a plain-HTTP host:port of this instance, or use a front that hashes Mcp-Session-Id",
			zap.Bool("tls", r.TLS != nil), zap.Int("suppressed", suppressed))
	}
}

// What a forward came to.
type forwardResult uint8

const (
	forwardAnswered    forwardResult = iota // the owner's answer went to the client
	forwardUnreachable                      // the owner could not be dialed, or broke before it took the body: not served
	forwardNotOwner                         // the instance there does not serve the session
	forwardFailed                           // sent, then failed before any answer: not sent again
	forwardForeign                          // something other than the owner answered: not passed on
)

// forward sends r to o and passes its answer on as it comes. A body
// (raw if held in full) goes out only once the owner asks for it (100
// Continue), which an owner does as it reads the body, before anything of
// the request reaches its upstream: a forward broken before then, as when
// a stopping owner's kernel resets connections still queued at its closed
// listener, was never served and may be sent again. A request without a
// body (DELETE, a GET stream) has nothing to wait with, and one broken
// before its answer counts as failed. taken is called once the owner has
// the request: it took the body, or, without one, a connection to it was
// made.
func (h *Handler) forward(w http.ResponseWriter, r *http.Request, o owner.Owner, raw []byte, taken func(), deadline time.Time) (forwardResult, error) {
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if repl == nil {
		return forwardUnreachable, nil
	}
	repl.Set(placeholderOwner, o.Addr)
	repl.Set(placeholderOwnerID, o.ID)
	ow := &ownerReplyWriter{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w}, header: http.Header{}, sent: time.Now(),
		ownerID: o.ID}
	// cancelForward ends a forward whose owner never answers (frozen, or
	// its host gone silent): once its lease lapses, or at the request's
	// deadline if the owner has not asked for the body by then.
	parent := r.Context()
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	r = r.WithContext(ctx)
	r.Header = r.Header.Clone()
	// A client's own Expect was answered here, as its body was read.
	r.Header.Del("Expect")
	var body *watchedBody
	if r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
		// A body over max_body, not held, is still unread past what was
		// classified: untaken, it can go again as well.
		body = &watchedBody{Reader: r.Body, onTaken: taken}
		if len(raw) > 0 {
			body.Reader, r.ContentLength = bytes.NewReader(raw), int64(len(raw))
		}
		r.Body = body
		r.Header.Set("Expect", "100-continue")
	} else {
		r = r.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
			GotConn: func(httptrace.GotConnInfo) { taken() },
		}))
	}
	// A pinned session's owner is cut only while it has not taken the
	// request: nobody else can serve the session, and an owner cut off
	// from the engine alone still answers.
	untaken := func() bool { return body != nil && !body.taken.Load() }
	mayCut := func() bool { return !h.pinned() || untaken() }
	go h.cancelForward(ctx, cancel, o.ID, mayCut, untaken, deadline)
	defer func() {
		// The proxy panics with http.ErrAbortHandler when the answer breaks
		// off after its status went out (the client left mid-stream, as
		// with reverse_proxy itself); the forward is counted all the same.
		if p := recover(); p != nil {
			if ow.wrote {
				metrics.forwards.WithLabelValues("forwarded").Inc()
			} else {
				metrics.forwards.WithLabelValues("failed").Inc()
			}
			panic(p)
		}
	}()
	err := h.forwarder.ServeHTTP(ow, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil }))
	var dial reverseproxy.DialError
	switch {
	case ow.foreign:
		metrics.forwards.WithLabelValues("foreign").Inc()
		if ok, suppressed := ownerWarns.Allow(time.Now()); ok {
			h.logger.Warn("something other than the instance owning a session answered at its address; its answer was not passed on",
				zap.String("owner", o.Addr), zap.Int("suppressed", suppressed))
		}
		return forwardForeign, nil
	case ow.notOwner:
		metrics.forwards.WithLabelValues("not_owner").Inc()
		return forwardNotOwner, nil
	case !ow.wrote && errors.As(err, &dial):
		metrics.forwards.WithLabelValues("unreachable").Inc()
		if ok, suppressed := ownerWarns.Allow(time.Now()); ok {
			h.logger.Warn("the instance owning a session did not answer; its requests wait until it does, hands its sessions over, or its lease lapses",
				zap.String("owner", o.Addr), zap.Error(err), zap.Int("suppressed", suppressed))
		}
		return forwardUnreachable, nil
	case !ow.wrote && parent.Err() != nil:
		metrics.forwards.WithLabelValues("failed").Inc()
		return forwardAnswered, nil // the client left: nothing to answer
	case !ow.wrote && body != nil && !body.taken.Load():
		metrics.forwards.WithLabelValues("unreachable").Inc()
		if ok, suppressed := ownerWarns.Allow(time.Now()); ok {
			h.logger.Warn("the instance owning a session broke a forward off before it asked for the body (it is stopping, or frozen); the request is sent again while its lease stands",
				zap.String("owner", o.Addr), zap.Error(err), zap.Int("suppressed", suppressed))
		}
		return forwardUnreachable, nil
	case !ow.wrote:
		// Cut, or failed, before any answer was passed on.
		metrics.forwards.WithLabelValues("failed").Inc()
		return forwardFailed, nil
	}
	metrics.forwards.WithLabelValues("forwarded").Inc()
	return forwardAnswered, err
}

// watchedBody is a forward's body, which tells whether the transport took
// any of it. Closing it leaves the body open: one not taken goes again.
type watchedBody struct {
	io.Reader
	onTaken func()
	taken   atomic.Bool
}

func (b *watchedBody) Read(p []byte) (int, error) {
	if !b.taken.Swap(true) {
		b.onTaken()
	}
	return b.Reader.Read(p)
}

func (b *watchedBody) Close() error { return nil }

// ownerReplyWriter passes an owner's answer on, except a 421 marked with
// notOwnerHeader, which it keeps from the client: headers are held until
// the status shows which it is.
type ownerReplyWriter struct {
	caddyhttp.ResponseWriterWrapper
	header   http.Header
	wrote    bool // the status went to the client
	notOwner bool
	sent     time.Time // when the request went to the owner
	ownerID  string    // the owner it went to
	// foreign: the answer does not carry ownerID, and is held back; cut:
	// the forward was cut before any answer.
	foreign, cut bool
}

func (w *ownerReplyWriter) Header() http.Header {
	if w.wrote {
		return w.ResponseWriter.Header()
	}
	return w.header
}

func (w *ownerReplyWriter) WriteHeader(status int) {
	switch {
	case w.wrote:
		w.ResponseWriter.WriteHeader(status)
		return
	case w.notOwner || w.foreign || w.cut:
		return
	case status == http.StatusContinue:
		// The owner asking for the body, unstamped; the client's own 100
		// Continue was this instance's to send.
		return
	case status == statusClientClosed && w.header.Get(servedByHeader) == "":
		// The proxy's own record of a cut forward (the client left, or
		// the owner's lease lapsed), not an answer.
		w.cut = true
		return
	case status == http.StatusMisdirectedRequest && w.header.Get(notOwnerHeader) != "" && w.header.Get(servedByHeader) != "":
		// An instance of this module that is not the owner (one
		// restarted at its address, under a new ID) makes the request
		// route again.
		w.notOwner = true
		return
	case w.header.Get(servedByHeader) != w.ownerID:
		w.foreign = true
		return
	}
	w.header.Del(servedByHeader)
	maps.Copy(w.ResponseWriter.Header(), w.header)
	if status >= 200 {
		w.wrote = true
		metrics.forwardTime.Observe(time.Since(w.sent).Seconds())
	} else {
		clear(w.header) // an informational answer's headers are its own
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *ownerReplyWriter) Write(b []byte) (int, error) {
	if w.notOwner || w.foreign || w.cut {
		return len(b), nil
	}
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

// ReadFrom copies through Write: the wrapper's own ReadFrom would pass
// the body to the client even when it is held back.
func (w *ownerReplyWriter) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(writeOnly{w}, r)
}

// writeOnly hides every method but Write, so that io.Copy uses it.
type writeOnly struct{ io.Writer }

// Flush sends what was written; before the status, there is nothing to.
func (w *ownerReplyWriter) Flush() {
	if w.wrote {
		_ = http.NewResponseController(w.ResponseWriter).Flush()
	}
}

// cancelForward cancels a forward to owner id, until ctx ends, once the
// owner's lease is seen lapsed if mayCut then says so, or at the
// request's deadline while untaken: a body the owner has not asked for
// by then is never sent.
func (h *Handler) cancelForward(ctx context.Context, cancel context.CancelFunc, id string, mayCut, untaken func() bool, deadline time.Time) {
	t := time.NewTicker(forwardRetryEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			switch {
			case h.lapsed(id) && mayCut():
				cancel()
				return
			case time.Now().After(deadline) && untaken():
				cancel()
				return
			}
		}
	}
}

// ownerStore is what order owner asks of the state engine.
type ownerStore interface {
	owner.Claimer
	owner.Leases
	serializer.OwnerStore
}

// errSessionMoved ends a request body whose session another instance took
// over while this one was paused on its way upstream.
var errSessionMoved = errors.New("order owner: this instance was paused past its lease and the session moved; nothing of the body was sent")

// leaseChecked is up with its body held back, at the upstream's first
// read of it, until this instance has confirmed again that it serves the
// session: an instance paused (SIGSTOP, a paused VM) after Confirm and
// before the request left would otherwise send it on waking, beside the
// instance that took the session over meanwhile. Confirm costs nothing
// while the lease was renewed within the last two seconds.
func (h *Handler) leaseChecked(up *http.Request, info *requestInfo) *http.Request {
	if h.owners == nil || up.Body == nil || up.Body == http.NoBody {
		return up
	}
	checked := up.WithContext(up.Context())
	checked.Body = &leaseCheckedBody{ReadCloser: up.Body, confirm: func() bool { return h.stillOwner(up, info) }}
	return checked
}

// leaseCheckedBody asks confirm at its first read and, if it answers
// false, reads nothing and fails.
type leaseCheckedBody struct {
	io.ReadCloser
	confirm func() bool
	asked   bool
	moved   bool
}

func (b *leaseCheckedBody) Read(p []byte) (int, error) {
	if !b.asked {
		b.asked, b.moved = true, !b.confirm()
	}
	if b.moved {
		return 0, errSessionMoved
	}
	return b.ReadCloser.Read(p)
}
