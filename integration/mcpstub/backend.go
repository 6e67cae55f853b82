package mcpstub

import (
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Backend is a Streamable HTTP MCP server modelled on a multi-process PHP
// backend (php-mcp under PHP-FPM with a shared cache table). It serves every
// path. Set its fields before serving; the zero value is ready to use, with
// no simulated work.
//
// Every POST and DELETE carrying a session id runs load → work → save on the
// shared store with its own copy of the Record, and nothing orders one
// handler's cycle against another's: that is the race the package exists to
// reproduce. A request other than initialize on a record that is not
// initialized is answered with HTTP 200 and the JSON-RPC error
// {"code":-32600,"message":"Client session not initialized."}, as php-mcp
// does, and the record is saved anyway.
type Backend struct {
	// WorkMin and WorkMax bound the random work each POST and DELETE does
	// between loading and saving the record (uniform in [WorkMin, WorkMax]).
	// Both zero: no sleep and no random number is drawn.
	WorkMin, WorkMax time.Duration
	// ServiceTime is a fixed work time added to the random one, for
	// benchmarks that need a predictable upstream.
	ServiceTime time.Duration
	// StreamResponses answers every POST that carries a request with
	// text/event-stream instead of application/json (php-mcp's SSE mode).
	StreamResponses bool
	// ProgressSteps is the number of notifications/progress events the
	// "progress" tool sends when the call does not say; 0 means 3.
	ProgressSteps int
	// ProgressPause is the pause before each progress event when the call
	// does not say; 0 means none.
	ProgressPause time.Duration
	// StreamMax bounds how long a GET stream stays open; 0 means 30 s.
	StreamMax time.Duration
	// KeepAlive is the period of a GET stream's keep-alive comment and of
	// its reload and resave of the record; 0 means 1 s.
	KeepAlive time.Duration
	// DisableRequestLog stops keeping a Seen entry per request (Requests
	// returns nothing), for long benchmarks. Count and Stats still work.
	DisableRequestLog bool
	// AfterLoad, when set, runs after a POST has loaded its session's record
	// and before its work, with the JSON-RPC methods of the body. Tests use
	// it to hold one handler with a stale copy and so order the race
	// deterministically.
	AfterLoad func(sessionID string, methods []string)
	// StoreDir, when set, keeps the session records as files in this
	// directory instead of in memory, so that several Backend processes
	// on one host share their sessions like app servers sharing a
	// database. The directory must exist.
	StoreDir string

	once  sync.Once
	store *store
	log   *requestLog
}

// maxBody bounds a POST body; php-fpm has post_max_size for the same reason.
const maxBody = 4 << 20

func (b *Backend) init() {
	b.once.Do(func() {
		if b.StoreDir != "" {
			b.store = newDirStore(b.StoreDir)
		} else {
			b.store = newStore()
		}
		b.log = newRequestLog(!b.DisableRequestLog)
	})
}

func (b *Backend) observer() *requestLog { b.init(); return b.log }

// Session returns a copy of the stored record of a session.
func (b *Backend) Session(id string) (Record, bool) {
	b.init()
	return b.store.load(id)
}

// Sessions returns the number of stored sessions.
func (b *Backend) Sessions() int {
	b.init()
	return b.store.len()
}

// ServeHTTP implements the Streamable HTTP transport: POST for messages,
// GET for the server-to-client stream, DELETE to end a session.
func (b *Backend) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	b.init()
	sid := r.Header.Get(SessionHeader)
	w := &statusWriter{ResponseWriter: rw}
	t := b.log.begin(r.Method, sid)
	defer func() { b.log.end(t, w.status) }()

	switch r.Method {
	case http.MethodPost:
		b.servePost(w, r, sid, t)
	case http.MethodGet:
		b.serveGet(w, r, sid)
	case http.MethodDelete:
		b.serveDelete(w, sid)
	default:
		w.Header().Set("Allow", "GET, POST, DELETE")
		writeJSON(w, http.StatusMethodNotAllowed, errorReply(nil, CodeInvalidRequest, "Method not allowed"))
	}
}

// work simulates what a worker does between loading and saving: boot the
// framework, run the handler, talk to the database.
func (b *Backend) work() {
	d := b.ServiceTime + b.WorkMin
	if b.WorkMax > b.WorkMin {
		d += time.Duration(rand.Int64N(int64(b.WorkMax-b.WorkMin) + 1))
	}
	if d > 0 {
		time.Sleep(d)
	}
}

func (b *Backend) servePost(w http.ResponseWriter, r *http.Request, sid string, t *track) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, errorReply(nil, CodeParseError, "Parse error: "+err.Error()))
		return
	}
	if len(body) > maxBody {
		writeJSON(w, http.StatusRequestEntityTooLarge, errorReply(nil, CodeInvalidRequest, "Request body too large"))
		return
	}
	msgs, batch, berr := parseBody(body)
	b.log.messages(t, msgs)
	if berr != nil {
		writeJSON(w, berr.status, errorReply(nil, berr.code, berr.msg))
		return
	}

	if sid == "" {
		if !batch && msgs[0].IsRequest() && msgs[0].Method == "initialize" {
			b.createSession(w, msgs[0], t)
			return
		}
		// Sessionless (MCP 2026-07-28 style): answered from nothing.
		b.work()
		b.exchange(w, r, nil, msgs, batch)
		return
	}

	rec, ok := b.store.load(sid)
	if !ok {
		writeJSON(w, http.StatusNotFound, errorReply(nil, CodeSessionNotFound, "Session not found"))
		return
	}
	if b.AfterLoad != nil {
		b.AfterLoad(sid, methodsOf(msgs))
	}
	b.work()
	b.exchange(w, r, &rec, msgs, batch)
}

// createSession answers an initialize without a session id: a new record,
// saved before the response (and its Mcp-Session-Id) leaves.
func (b *Backend) createSession(w http.ResponseWriter, m Message, t *track) {
	rec := Record{ID: newSessionID(), LogLevel: "info"}
	b.log.created(t, rec.ID)
	b.work()
	result := initialize(&rec, m.Params)
	rec.Handled = 1
	b.store.create(rec)
	w.Header().Set(SessionHeader, rec.ID)
	reply := resultReply(m.ID, result)
	if b.StreamResponses {
		startSSE(w).message(reply)
		return
	}
	writeJSON(w, http.StatusOK, reply)
}

// exchange processes the messages of one POST in body order against rec
// (nil when sessionless), saves the whole record, then answers: 202 when
// nothing needs an answer, otherwise JSON (object or batch array) or an
// event stream with one event per response.
func (b *Backend) exchange(w http.ResponseWriter, r *http.Request, rec *Record, msgs []Message, batch bool) {
	needsReply, progress := false, false
	for _, m := range msgs {
		needsReply = needsReply || m.IsRequest() || m.invalid
		progress = progress || isProgressCall(m)
	}
	ex := &call{b: b, r: r, rec: rec}
	if needsReply && (b.StreamResponses || progress) {
		ex.sse = startSSE(w)
	}

	var replies []response
	for _, m := range msgs {
		if reply, ok := ex.handle(m); ok {
			replies = append(replies, reply)
		}
	}
	if rec != nil {
		// The whole record goes back, rejected or not: this is the write
		// that loses a concurrent notifications/initialized.
		b.store.save(*rec)
	}

	switch {
	case ex.sse != nil:
		for _, reply := range replies {
			ex.sse.message(reply)
		}
	case len(replies) == 0:
		w.WriteHeader(http.StatusAccepted)
	case batch:
		writeJSON(w, http.StatusOK, replies)
	default:
		writeJSON(w, http.StatusOK, replies[0])
	}
}

func (b *Backend) serveDelete(w http.ResponseWriter, sid string) {
	if sid == "" {
		writeJSON(w, http.StatusBadRequest, errorReply(nil, CodeInvalidRequest, "Mcp-Session-Id header required"))
		return
	}
	b.work()
	if !b.store.remove(sid) {
		writeJSON(w, http.StatusNotFound, errorReply(nil, CodeSessionNotFound, "Session not found"))
		return
	}
	w.WriteHeader(http.StatusOK)
}

// serveGet holds the server-to-client stream open. Like php-mcp's GET it
// polls the session every KeepAlive: load the record (to look for queued
// messages), save it back, send a keep-alive comment. Those saves run beside
// the session's POSTs, outside any ordering a proxy gives them.
func (b *Backend) serveGet(w http.ResponseWriter, r *http.Request, sid string) {
	if sid == "" {
		writeJSON(w, http.StatusBadRequest, errorReply(nil, CodeInvalidRequest, "Mcp-Session-Id header required"))
		return
	}
	if _, ok := b.store.load(sid); !ok {
		writeJSON(w, http.StatusNotFound, errorReply(nil, CodeSessionNotFound, "Session not found"))
		return
	}
	limit, period := b.StreamMax, b.KeepAlive
	if limit <= 0 {
		limit = 30 * time.Second
	}
	if period <= 0 {
		period = time.Second
	}
	s := startSSE(w)
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	tick := time.NewTicker(period)
	defer tick.Stop()
	for s.err == nil {
		select {
		case <-r.Context().Done():
			return
		case <-deadline.C:
			return
		case <-tick.C:
			rec, ok := b.store.load(sid)
			if !ok {
				return // deleted meanwhile: the stream ends with the session
			}
			b.store.save(rec)
			s.comment("keep-alive")
		}
	}
}

func methodsOf(msgs []Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.Method
	}
	return out
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err) // only the Backend's own values are written
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(data)))
	w.WriteHeader(status)
	_, _ = w.Write(data)
}

// statusWriter remembers the status for the request log. It keeps Flush and
// Unwrap so that event streams are still flushed through it.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

func (w *statusWriter) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
