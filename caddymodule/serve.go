package caddymodule

import (
	"bytes"
	"context"
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/mcpserializer/caddy-mcp-serializer/owner"
	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

const sessionHeader = "Mcp-Session-Id"

// ServeHTTP schedules requests that carry a session id and watches
// session-less POSTs for the response that creates a session.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	h.applySettings()
	if h.owners != nil && r.Header.Get(ownerHeader) != "" {
		// Forwarded here: every answer this instance gives it, one
		// before its owner is looked at (a body over max_buffered) too,
		// is its own, and must say so to be passed on.
		w.Header().Set(servedByHeader, h.owners.Self())
	}
	ids := r.Header.Values(sessionHeader)
	if len(ids) == 0 {
		if r.Method != http.MethodPost {
			// Not MCP (plain HTTP): untouched, not even placeholders.
			metrics.sessionless.Inc()
			return next.ServeHTTP(w, r)
		}
		if h.Key != "" {
			if key := h.keyOf(r); key != "" {
				return h.serveKeyed(w, r, next, key)
			}
		}
		return h.serveSessionless(w, r, next)
	}
	if len(ids) > 1 || !serializer.ValidSessionID(ids[0]) {
		publishNoSession(r)
		return h.reject(w, r, "invalid_session_id", http.StatusBadRequest, codeInvalidRequest,
			"invalid Mcp-Session-Id: want one value of 1 to 256 visible ASCII characters", nil)
	}
	// Everything past the edge sees the upstream's id; the instance the
	// client's id names stays with the request, for routing.
	idOwner, id := h.splitSessionID(ids[0])
	info := newRequestInfo(r, id)
	info.idOwner, info.bySession = idOwner, h.pinned()
	info.publish(r)
	if h.Key != "" && r.Method != http.MethodGet {
		// A user signing in by e-mail, whose login this instance has not
		// learned, is routed by its session; its line is known once it
		// is proven, after its session's turn (admission).
		if info.linePending = h.loginPending(r); !info.linePending {
			info.line = h.keyOf(r)
		}
	}
	// A GET refused here would be refused by the owner too.
	if r.Method != http.MethodPost && (r.Method != http.MethodGet || h.GetStream != getStreamReject) {
		if forwarded, err := h.serveAtOwner(w, r, info, nil, nil); forwarded {
			return err
		}
	}
	switch r.Method {
	case http.MethodGet:
		return h.serveGetStream(w, r, next, info)
	case http.MethodDelete:
		return h.serveInTurn(w, r, next, info, serializer.EndsSession, nil, nil)
	case http.MethodPost:
		body, err := h.readBody(r)
		defer h.budget.release(body.held) // the body lives until the request ends
		if err != nil {
			return h.rejectBody(w, r, err)
		}
		info.method, info.unread = body.method, body.unread(r)
		if forwarded, err := h.serveAtOwner(w, r, info, body.raw, body.id); forwarded {
			return err
		}
		return h.serveInTurn(w, r, next, info, body.traits, body.id, body.raw)
	}
	return h.serveInTurn(w, r, next, info, 0, nil, nil)
}

// serveSessionless forwards a POST without a session untouched, body
// unread, watching for a response that creates a session. Only while the
// table is saturated is the body read: an initialize is then answered
// 503, since the session it would create has no room; any other POST
// goes on (MCP without sessions is never refused).
func (h *Handler) serveSessionless(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	_, err := h.sessionlessExchange(w, r, next)
	return err
}

// sessionlessExchange is serveSessionless, also returning the answer's
// status (0 if none was sent).
func (h *Handler) sessionlessExchange(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) (status int, err error) {
	info := publishNoSession(r)
	if h.table.Saturated() {
		body, err := h.readBody(r)
		defer h.budget.release(body.held)
		switch {
		case errors.Is(err, errBodyBudget):
			// Unread, it goes on as it came, as with room in the table.
		case err != nil:
			return 0, h.rejectBody(w, r, err)
		case body.id != nil && body.method.Is("initialize"):
			w.Header().Set("Retry-After", "1")
			return 0, h.reject(w, r, "table_full", http.StatusServiceUnavailable, codeServerError,
				"no room for a new MCP session: each of max_sessions sessions has a request in progress; retry shortly", body.id)
		}
	}
	ew := &exchangeWriter{
		ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w},
		h:                     h, r: r, sessionless: true, info: info,
	}
	// Deferred so that a panic downstream still frees the new session's slot.
	defer func() { ew.turn.Done(ew.status) }()
	err = next.ServeHTTP(ew, r)
	ew.settleStatus(err)
	if ew.turn == (serializer.Turn{}) {
		metrics.sessionless.Inc()
	}
	return ew.status, err
}

// serveKeyed runs a session-less POST in its key's queue (the key
// setting), as a session's POST runs in the session's. An initialize
// holds the queue until its answer has ended, and may start a session
// whose requests wait in the same queue. With key basic_user, a request
// whose credential the MCP server refuses goes on in no queue.
func (h *Handler) serveKeyed(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, key string) error {
	body, err := h.readBody(r)
	defer h.budget.release(body.held)
	if err != nil {
		publishNoSession(r)
		return h.rejectBody(w, r, err)
	}
	info := newRequestInfo(r, key)
	info.keyed, info.method, info.unread = true, body.method, body.unread(r)
	initialize := body.method.Is("initialize")
	if !initialize {
		info.publish(r)
	}
	start := h.table.Now()
	if h.loginPending(r) {
		// Its key, the user's line, is known once the credential is
		// proven: before the key's owner can be found.
		ctx, cancel := context.WithTimeout(r.Context(), h.settings.QueueTimeout)
		_, err := h.prove(ctx, r, next, key)
		cancel()
		if err != nil {
			publishNoSession(r)
			return h.rejectWait(w, r, info, err, body.id)
		}
		info.sessionID = h.keyOf(r)
	}
	info.proofWaited = h.table.Now().Sub(start)
	if forwarded, err := h.serveAtOwner(w, r, info, body.raw, body.id); forwarded {
		return err
	}
	if admit := h.admission(r, next, info.sessionID, false).Admit; admit != nil {
		ctx, cancel := context.WithTimeout(r.Context(), h.settings.QueueTimeout-info.proofWaited)
		line, err := admit(ctx)
		cancel()
		info.proofWaited = h.table.Now().Sub(start)
		if err != nil {
			publishNoSession(r)
			return h.rejectWait(w, r, info, err, body.id)
		}
		if line == "" {
			return h.serveSessionless(w, r, next)
		}
	}
	if initialize {
		return h.serveKeyedInitialize(w, r, next, info, body)
	}
	return h.serveInTurn(w, r, next, info, body.traits, body.id, body.raw)
}

// serveKeyedInitialize serves an initialize in its key's queue: at the
// key's owner, which then owns the session it creates, and one at a time
// with the key's other requests, since the backend may record every
// session of a credential in one place.
func (h *Handler) serveKeyedInitialize(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, info *requestInfo, body classifiedBody) error {
	turn, err := h.table.AcquireKeyedAfter(r.Context(), info.sessionID, body.traits, info.proofWaited)
	if err != nil {
		publishNoSession(r)
		return h.rejectWait(w, r, info, err, body.id)
	}
	defer turn.Done(0) // a key's queue takes no effect from the answer
	info.waited = turn.Waited()
	if !h.stillOwner(r, info) {
		// Its turn held, as in serveInTurn.
		publishNoSession(r)
		return h.serveMoved(w, r, info, body.id, body.raw)
	}
	ended, err := h.previousOwnerDone(w, r, info, turn.Waited(), body.id)
	if ended == nil {
		publishNoSession(r)
		return err
	}
	defer ended()
	status, err := h.sessionlessExchange(w, h.leaseChecked(r, info), next)
	h.keyAnswered(r, info, status)
	return err
}

// beginSession starts a gated session if the response to a session-less
// POST carries a new Mcp-Session-Id (only an InitializeResult may), before
// the client can see the id. The returned turn holds the session's slot
// until the initialize response ends.
func (h *Handler) beginSession(status int, header http.Header, r *http.Request, info *requestInfo) serializer.Turn {
	id := header.Get(sessionHeader)
	if status < 200 || status > 299 || !serializer.ValidSessionID(id) {
		return serializer.Turn{}
	}
	var recorded string
	if h.owners != nil {
		if here := h.hereAddr(r); here != "" {
			h.owners.Created(id, here)
			recorded = owner.Owner{ID: h.owners.Self(), Addr: here}.String()
		} else {
			h.warnNoOwner(r)
		}
	}
	turn, ok := h.table.BeginOwned(id, recorded, h.synthesizer(r, id))
	if ok {
		publishCreated(r, id, info)
		if c := h.logger.Check(zapcore.DebugLevel, "session created, held until initialized"); c != nil {
			c.Write(zap.String("session", serializer.SessionHash(id)))
		}
	}
	return turn
}

// serveInTurn forwards the request once it is the session's turn. raw is
// the body read, as for serveAtOwner.
func (h *Handler) serveInTurn(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, info *requestInfo, traits serializer.Traits, reqID, raw []byte) error {
	// Made before the turn: the table may ask it for a synthesizer.
	ew := &exchangeWriter{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w}, h: h, r: r}
	var turn serializer.Turn
	var err error
	if info.keyed {
		turn, err = h.table.AcquireKeyedAfter(r.Context(), info.sessionID, traits, info.proofWaited)
	} else {
		turn, err = h.acquire(r, info.sessionID, h.admission(r, next, info.line, info.linePending), traits, ew)
	}
	info.waited, info.held = turn.Waited(), turn.Held()
	if err != nil {
		return h.rejectWait(w, r, info, err, reqID)
	}
	if turn.Overtook() {
		metrics.overtakes.Inc()
	}
	ew.turn = turn
	// Deferred so that a panic downstream still frees the slot.
	defer func() { ew.turn.Done(ew.status) }()
	if !h.stillOwner(r, info) {
		// Sent on with its turn held here, so that the session's later
		// requests queued here follow it to the new owner one at a time,
		// in their order.
		return h.serveMoved(w, r, info, reqID, raw)
	}
	ended, err := h.previousOwnerDone(w, r, info, turn.Waited(), reqID)
	if ended == nil {
		ew.status = http.StatusServiceUnavailable
		return err
	}
	defer ended()
	if info.unread && clientGone(r) {
		// The client left while its request waited: the upstream would
		// get part of its body.
		return h.rejectWait(w, r, info, context.Canceled, reqID)
	}
	err = next.ServeHTTP(ew, h.leaseChecked(upstreamRequest(r, info), info))
	ew.settleStatus(err)
	h.keyAnswered(r, info, ew.status)
	return err
}

// stillOwner reports whether this instance may send the request upstream
// now that it has its turn: false with order owner if its lease lapsed
// while the request waited (it was paused) and its session or key moved
// to another instance.
func (h *Handler) stillOwner(r *http.Request, info *requestInfo) bool {
	if h.owners == nil {
		return true
	}
	owned, _ := info.owned()
	return h.owners.Confirm(r.Context(), h.ownerStore, owned, h.hereAddr(r))
}

// serveMoved sends a request whose session moved to another instance
// while it waited here on to that instance, or answers 503 if it cannot
// (its body went unread, or the owner cannot be learned).
func (h *Handler) serveMoved(w http.ResponseWriter, r *http.Request, info *requestInfo, reqID, raw []byte) error {
	info.moved = true
	if raw != nil || r.Body == nil || r.Body == http.NoBody {
		if forwarded, err := h.serveAtOwner(w, r, info, raw, reqID); forwarded {
			return err
		}
	}
	w.Header().Set("Retry-After", "1")
	return h.reject(w, r, "owner_moved", http.StatusServiceUnavailable, codeServerError,
		"this instance's lease lapsed (it was paused or cut off) and "+info.waitsIn()+" moved to another instance; retry", reqID)
}

// previousOwnerDone waits, with order owner, until an instance that owned
// the request's session or key before this one has ended its last
// exchange, for what is left of queue_timeout after waited. ended, called
// when the request's own exchange ends, clears its running mark; nil if
// the previous exchange did not end in time and the request was answered
// 503 (err is that answer's).
func (h *Handler) previousOwnerDone(w http.ResponseWriter, r *http.Request, info *requestInfo, waited time.Duration, reqID []byte) (ended func(), err error) {
	if h.owners == nil {
		return func() {}, nil
	}
	owned, _ := info.owned()
	if !h.owners.AwaitPrevious(r.Context(), h.applied.runningStore, owned, time.Now().Add(h.settings.QueueTimeout-waited)) {
		w.Header().Set("Retry-After", "1")
		return nil, h.reject(w, r, "previous_owner", http.StatusServiceUnavailable, codeServerError,
			"the previous instance of "+info.waitsIn()+" is still running its last request at the MCP server; retry", reqID)
	}
	return h.owners.ExchangeBegan(h.applied.runningStore, owned), nil
}

// serveGetStream lets the server-to-client stream through once the gate is
// open; it never takes the session's slot.
func (h *Handler) serveGetStream(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, info *requestInfo) error {
	if h.GetStream == getStreamReject {
		w.Header().Set("Allow", "POST, DELETE")
		return h.reject(w, r, "get_stream", http.StatusMethodNotAllowed, codeServerError,
			"the GET event stream is disabled here (get_stream reject); use POST", nil)
	}
	// Only a gated session makes a GET wait, and a gate never closes again.
	var start time.Time
	if info.held = h.table.Gated(info.sessionID); info.held {
		start = time.Now()
	}
	err := h.table.WaitGate(r.Context(), info.sessionID)
	if info.held {
		info.waited = time.Since(start)
	}
	if err != nil {
		return h.rejectWait(w, r, info, err, nil)
	}
	if h.owners != nil {
		// The stream's header may carry the session's id too.
		w = &exchangeWriter{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w}, h: h, r: r}
	}
	return next.ServeHTTP(w, upstreamRequest(r, info))
}

// isEventStream reports a Server-Sent Events response as Caddy's
// reverse_proxy does (mime.ParseMediaType, so case-insensitive and with
// parameters). The cheap test first spares a JSON answer the parse and its
// allocations; it passes every value the parse would accept.
func isEventStream(h http.Header) bool {
	ct := h.Get("Content-Type")
	mediaType, _, _ := strings.Cut(ct, ";")
	if !strings.EqualFold(strings.TrimSpace(mediaType), eventStream) {
		return false
	}
	parsed, _, err := mime.ParseMediaType(ct)
	return err == nil && parsed == eventStream
}

const eventStream = "text/event-stream"

// errBodyTooLarge is raised by Caddy's request_body limit, if configured.
var errBodyTooLarge *http.MaxBytesError

// readBody reads the POST body (up to MaxBody) to classify it, then hands
// the upstream the same bytes with an exact Content-Length: php-fpm needs
// one. A larger body streams through as it came, classified by its first
// bytes only (a reply whatever its size, else ordinary). The
// bytes it holds count against max_buffered (held), taken as they arrive:
// the caller gives them back when the request ends, even on error. A body
// that does not fit is read no further (errBodyBudget); what was read of
// it goes on ahead of the rest.
func (h *Handler) readBody(r *http.Request) (classifiedBody, error) {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return classifiedBody{}, nil
	}
	if r.ContentLength > h.MaxBody {
		return h.readPrefix(r)
	}
	sized := r.ContentLength >= 0
	want := r.ContentLength
	if !sized {
		want = h.MaxBody
	}
	buf, held, err := h.budget.readUpTo(r.Body, want)
	body := classifiedBody{held: held}
	if err == nil && !sized {
		// max_body bytes came: one more tells an oversized body.
		var more [1]byte
		if n, _ := io.ReadFull(r.Body, more[:]); n == 1 {
			streamOn(r, buf, more[:])
			body.traits, body.method = serializer.ClassifyPrefix(buf[:min(len(buf), prefixLen)])
			return body, nil
		}
	}
	if !sized && (err == io.EOF || err == io.ErrUnexpectedEOF) {
		err = nil // the end of a body of unknown length
	}
	if errors.Is(err, errBodyBudget) {
		streamOn(r, buf)
		return body, err
	}
	if err != nil {
		return body, err
	}
	r.Body = io.NopCloser(bytes.NewReader(buf))
	body.raw = buf
	r.ContentLength = int64(len(buf))
	r.TransferEncoding = nil
	r.Header.Del("Transfer-Encoding")
	r.Header.Set("Content-Length", strconv.Itoa(len(buf)))
	body.traits, body.id, body.method = serializer.Classify(buf)
	return body, nil
}

// prefixLen is how much of a body over max_body is read to classify it:
// a response names its id and result in its first bytes.
const prefixLen = 4 << 10

// readPrefix reads the first bytes of a body over max_body as they arrive
// and classifies it by them: a reply larger than max_body must still go
// beside the stream that waits for it. They go on ahead of the rest, which
// streams through unread.
func (h *Handler) readPrefix(r *http.Request) (classifiedBody, error) {
	prefix, held, err := h.budget.readUpTo(r.Body, min(r.ContentLength, prefixLen))
	body := classifiedBody{held: held}
	switch {
	case errors.Is(err, errBodyBudget):
		streamOn(r, prefix)
	case err == nil:
		streamOn(r, prefix)
		body.traits, body.method = serializer.ClassifyPrefix(prefix)
	}
	return body, err
}

// streamOn puts what was read of r's body back ahead of the rest, which
// streams through as it comes.
func streamOn(r *http.Request, read ...[]byte) {
	readers := make([]io.Reader, 0, len(read)+1)
	for _, b := range read {
		readers = append(readers, bytes.NewReader(b))
	}
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(append(readers, r.Body)...), r.Body}
}

// classifiedBody is what readBody learned of a body; id and method alias the
// body, which the request keeps.
type classifiedBody struct {
	traits serializer.Traits
	raw    []byte // the body, to send again; nil if it was not read whole
	id     []byte // of a single request, for a local error reply
	method serializer.Method
	held   int64 // bytes of max_buffered taken, to give back
}

// unread reports a body of r that was not read whole: it streams through.
func (b classifiedBody) unread(r *http.Request) bool {
	return b.raw == nil && r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody
}

// errBodyBudget refuses a body that would take more than what is left of
// max_buffered.
var errBodyBudget = errors.New("request bodies held here would exceed max_buffered")

// defaultMaxBuffered is max_buffered's default: 64 bodies of the default
// max_body.
const defaultMaxBuffered = 64 << 20

// bodyBudget bounds the bytes of request bodies a handler holds at once:
// each waiting request keeps the body it was classified by, and without a
// bound across sessions waiting requests pin memory without end.
type bodyBudget struct {
	limit int64
	held  atomic.Int64
}

// reserve takes n bytes if they fit, in O(1). Near the limit, concurrent
// reservations may refuse one another; the bytes they take together never
// exceed it.
func (b *bodyBudget) reserve(n int64) bool {
	if b.held.Add(n) > b.limit {
		b.held.Add(-n)
		return false
	}
	return true
}

func (b *bodyBudget) release(n int64) {
	if n != 0 {
		b.held.Add(-n)
	}
}

// firstBlock is what a body holds once its first byte has come, before it
// has shown that it is larger: less than its stream costs the server, so
// that bodies which send a byte and stall fill max_buffered only once the
// server holds more of them than it can serve anyway (131,072 at the
// default 64 MiB).
const firstBlock = 512

// readUpTo reads up to want bytes, holding of b only what has arrived:
// nothing until the first byte, then a first block (firstBlock, or want if
// smaller), and then, each time the buffer is full, one twice its size
// (want at most). A client that announces a large body and stalls so
// holds at most twice what it sent, and nothing another client needs if it
// sent nothing. held is what the returned buffer takes of b, to give back
// when the body is no longer needed, even on error. Errors are
// io.ReadFull's (io.EOF or io.ErrUnexpectedEOF when the body ends first),
// or errBodyBudget when the next block does not fit: buf then holds what
// was read.
func (b *bodyBudget) readUpTo(r io.Reader, want int64) (buf []byte, held int64, err error) {
	var first [1]byte
	if _, err := io.ReadFull(r, first[:]); err != nil {
		return nil, 0, err
	}
	size := min(want, firstBlock)
	if !b.reserve(size) {
		return first[:], 0, errBodyBudget
	}
	buf, held = make([]byte, size), size
	buf[0] = first[0]
	n := 1
	for {
		m, err := io.ReadFull(r, buf[n:])
		n += m
		if err != nil || int64(n) == want {
			return buf[:n], held, err
		}
		// Only the growth is reserved: the old block is garbage once
		// copied, so a body fits the budget exactly as its final size does.
		next := min(want, 2*int64(n))
		if !b.reserve(next - held) {
			return buf[:n], held, errBodyBudget
		}
		grown := make([]byte, next)
		copy(grown, buf)
		buf, held = grown, next
	}
}

// rejectBody answers a body that could not be read; nothing was forwarded.
func (h *Handler) rejectBody(w http.ResponseWriter, r *http.Request, err error) error {
	if errors.Is(err, errBodyBudget) {
		w.Header().Set("Retry-After", "1")
		return h.reject(w, r, "body_budget", http.StatusServiceUnavailable, codeServerError,
			"too many request bodies held here waiting for their turn (max_buffered); retry shortly", nil)
	}
	if errors.As(err, &errBodyTooLarge) {
		return h.reject(w, r, "body_too_large", http.StatusRequestEntityTooLarge, codeInvalidRequest,
			"request body too large", nil)
	}
	return h.reject(w, r, "body_read", http.StatusBadRequest, codeInvalidRequest,
		"could not read the request body: "+err.Error(), nil)
}

// rejectWait answers a request that did not get its turn.
func (h *Handler) rejectWait(w http.ResponseWriter, r *http.Request, info *requestInfo, err error, reqID []byte) error {
	id := info.sessionID
	switch {
	case errors.Is(err, serializer.ErrQueueFull):
		return h.reject(w, r, "queue_full", http.StatusTooManyRequests, codeServerError,
			"too many requests waiting in "+info.waitsIn()+" (max_queue)", reqID)
	case errors.Is(err, serializer.ErrQueueTimeout):
		w.Header().Set("Retry-After", "1")
		return h.reject(w, r, "queue_timeout", http.StatusServiceUnavailable, codeServerError,
			"timed out waiting for the earlier requests of "+info.waitsIn()+" (queue_timeout)", reqID)
	case errors.Is(err, serializer.ErrSessionDropped):
		// Answered as a queue timeout is: the client may retry at once.
		w.Header().Set("Retry-After", "1")
		return h.reject(w, r, "session_dropped", http.StatusServiceUnavailable, codeServerError,
			"this MCP session was dropped on Caddy's admin endpoint while the request waited; retry it", reqID)
	case errors.Is(err, errProofFull):
		return h.reject(w, r, "proof_full", http.StatusTooManyRequests, codeServerError,
			"too many credentials of this user are waiting for their proof (max_queue); retry shortly", reqID)
	case errors.Is(err, errProofTimeout):
		w.Header().Set("Retry-After", "1")
		return h.reject(w, r, "proof_timeout", http.StatusServiceUnavailable, codeServerError,
			"timed out waiting for the MCP server to prove this request's credentials (queue_timeout)", reqID)
	case errors.Is(err, errProofUndecided):
		w.Header().Set("Retry-After", "1")
		return h.reject(w, r, "proof_undecided", http.StatusServiceUnavailable, codeServerError,
			"the MCP server neither accepted nor refused this request's credentials at key_proof; retry", reqID)
	case errors.Is(err, serializer.ErrNotInitialized):
		return h.reject(w, r, "not_initialized", http.StatusBadRequest, codeInvalidRequest,
			"Client session not initialized: notifications/initialized was not acknowledged within init_timeout", reqID)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		// The client left while waiting: nothing to answer, nothing forwarded.
		metrics.rejections.WithLabelValues("client_gone").Inc()
		if c := h.logger.Check(zapcore.DebugLevel, "client left while waiting for its turn"); c != nil {
			c.Write(zap.String("session", serializer.SessionHash(id)))
		}
		return nil
	}
	return err
}
