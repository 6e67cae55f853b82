package caddymodule

import (
	"bytes"
	"encoding/json"
	"hash/crc32"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/mcpserializer/caddy-mcp-serializer/redisstate"
	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
	"github.com/mcpserializer/caddy-mcp-serializer/stateengine"
	"github.com/mcpserializer/caddy-mcp-serializer/storagestate"
)

// newBareHandler is a provisioned-enough Handler for calling ServeHTTP
// directly, without Caddy.
func newBareHandler(t testing.TB, maxBody int64) *Handler {
	t.Helper()
	cfg := serializer.Defaults()
	cfg.MaxSessions = 1000
	tab := serializer.NewTable(cfg)
	t.Cleanup(tab.Close)
	return &Handler{
		MaxBody:       maxBody,
		MaxBuffered:   defaultMaxBuffered,
		budget:        &bodyBudget{limit: defaultMaxBuffered},
		GetStream:     getStreamForward,
		onInitTimeout: cfg.OnInitTimeout,
		table:         tab,
		applied:       &appliedSettings{},
		logger:        zap.NewNop(),
	}
}

// patternBody yields n bytes of a JSON-RPC request without holding them:
// reading it allocates nothing, so what a test measures is the handler's.
type patternBody struct {
	n, off int64
}

var bodyPrefix = []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"s":"`)

func (b *patternBody) Read(p []byte) (int, error) {
	if b.off >= b.n {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), b.n-b.off)]
	for i := range p {
		if o := b.off + int64(i); o < int64(len(bodyPrefix)) {
			p[i] = bodyPrefix[o]
		} else {
			p[i] = 'x'
		}
	}
	b.off += int64(len(p))
	return len(p), nil
}

func (b *patternBody) Close() error { return nil }

// drainingNext is the rest of the route: it reads the whole body with a
// fixed buffer and checksums it.
type drainingNext struct {
	buf   []byte
	n     int64
	sum   uint32
	calls int
}

func (d *drainingNext) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	d.calls++
	d.n, d.sum = 0, 0
	for {
		n, err := r.Body.Read(d.buf)
		d.n += int64(n)
		d.sum = crc32.Update(d.sum, crc32.IEEETable, d.buf[:n])
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	w.WriteHeader(http.StatusAccepted)
	return nil
}

func patternChecksum(n int64) uint32 {
	var sum uint32
	buf := make([]byte, 32<<10)
	b := &patternBody{n: n}
	for {
		k, err := b.Read(buf)
		sum = crc32.Update(sum, crc32.IEEETable, buf[:k])
		if err != nil {
			return sum
		}
	}
}

// bytesAllocated runs f a few times and returns the fewest bytes one run
// allocated (other goroutines may add to a run, never take away).
func bytesAllocated(f func()) uint64 {
	least := ^uint64(0)
	var before, after runtime.MemStats
	for range 5 {
		runtime.GC()
		runtime.ReadMemStats(&before)
		f()
		runtime.ReadMemStats(&after)
		least = min(least, after.TotalAlloc-before.TotalAlloc)
	}
	return least
}

// A request body costs the module at most twice max_body plus a small
// constant of memory, whatever its framing, and a small body costs little:
// a body is read into one small block, then into blocks that double as it
// arrives, up to its length or max_body. A body over the limit is
// forwarded without being held whole. The body reaches the next handler
// intact in every case.
func TestBodyCostsAtMostMaxBodyPlusAConstant(t *testing.T) {
	const maxBody = 256 << 10
	const slack = 32 << 10 // request, recorder, readers, table entry
	h := newBareHandler(t, maxBody)
	next := &drainingNext{buf: make([]byte, 32<<10)}
	for _, tc := range []struct {
		name    string
		size    int64
		chunked bool
	}{
		{"chunked, 4x over the limit", 4 * maxBody, true},
		{"chunked, one byte over the limit", maxBody + 1, true},
		{"chunked, at the limit", maxBody, true},
		{"chunked, half the limit", maxBody / 2, true},
		{"chunked, small", 300, true},
		{"Content-Length, at the limit", maxBody, false},
		{"Content-Length, over the limit", 2 * maxBody, false},
		{"Content-Length, small", 300, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var status int
			used := bytesAllocated(func() {
				r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
				r.Body = &patternBody{n: tc.size}
				r.ContentLength = tc.size
				if tc.chunked {
					r.ContentLength = -1
					r.TransferEncoding = []string{"chunked"}
				}
				// One id for every run: a fresh one would measure the table.
				r.Header.Set(sessionHeader, "limits")
				w := httptest.NewRecorder()
				if err := h.ServeHTTP(w, r, caddyhttp.Handler(next)); err != nil {
					t.Fatal(err)
				}
				status = w.Code
			})
			if status != http.StatusAccepted || next.n != tc.size || next.sum != patternChecksum(tc.size) {
				t.Fatalf("next handler got %d bytes (checksum ok: %v), status %d; want all %d bytes",
					next.n, next.sum == patternChecksum(tc.size), status, tc.size)
			}
			limit := uint64(2*maxBody + slack)
			switch {
			case tc.size <= firstBlock && !tc.chunked:
				limit = uint64(tc.size + slack)
			case tc.size <= firstBlock:
				limit = firstBlock + slack // the length was unknown
			}
			t.Logf("%d-byte body: %d bytes allocated (limit %d)", tc.size, used, limit)
			if used > limit {
				t.Fatalf("%d-byte body made the handler allocate %d bytes, want at most %d (max_body %d)",
					tc.size, used, limit, maxBody)
			}
		})
	}
}

// A client that announces a large body and sends little of it costs
// little: the buffer grows only with what arrives. Nothing is forwarded.
func TestAnnouncedButUnsentBodyCostsLittle(t *testing.T) {
	const maxBody = 1 << 20
	h := newBareHandler(t, maxBody)
	next := &drainingNext{buf: make([]byte, 1024)}
	var status int
	used := bytesAllocated(func() {
		r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(&patternBody{n: 100}, errReader{io.ErrUnexpectedEOF}), io.NopCloser(nil)}
		r.ContentLength = maxBody
		r.Header.Set(sessionHeader, "limits")
		w := httptest.NewRecorder()
		_ = h.ServeHTTP(w, r, caddyhttp.Handler(next))
		status = w.Code
	})
	if status != http.StatusBadRequest || next.calls != 0 {
		t.Fatalf("status %d, next called %d times; want 400 and never", status, next.calls)
	}
	if limit := uint64(firstBlock + 16<<10); used > limit {
		t.Fatalf("announcing %d bytes and sending 100 allocated %d bytes, want at most %d", maxBody, used, limit)
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// A chunked body within max_body is still classified: the handler sees the
// message it carries.
func TestChunkedBodyWithinLimitIsClassified(t *testing.T) {
	h := newBareHandler(t, 1<<20)
	id := "chunked-classify"
	initialize, ok := h.table.Begin(id, nil)
	if !ok {
		t.Fatal("Begin refused")
	}
	initialize.Done(200)
	body := append(bytes.Repeat([]byte(" "), 100<<10), `{"jsonrpc":"2.0","method":"notifications/initialized"}`...)
	r := httptest.NewRequest(http.MethodPost, "/mcp", struct{ io.Reader }{bytes.NewReader(body)})
	r.ContentLength = -1
	r.Header.Set(sessionHeader, id)
	var got []byte
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		got, _ = io.ReadAll(r.Body)
		if r.ContentLength != int64(len(body)) {
			t.Errorf("ContentLength = %d, want %d", r.ContentLength, len(body))
		}
		w.WriteHeader(http.StatusAccepted)
		return nil
	})
	// Held at the gate unless the body was seen to carry initialized.
	done := make(chan error, 1)
	go func() { done <- h.ServeHTTP(httptest.NewRecorder(), r, next) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a chunked notifications/initialized was held at the gate: it was not classified")
	}
	if !bytes.Equal(got, body) {
		t.Fatalf("next handler got %d bytes, want the %d sent", len(got), len(body))
	}
}

// countingBody is a request body that records whether it was read.
type countingBody struct {
	io.Reader
	reads int
}

func (b *countingBody) Read(p []byte) (int, error) {
	b.reads++
	return b.Reader.Read(p)
}

func (b *countingBody) Close() error { return nil }

// Bodies held by requests waiting for their session's turn stay within
// max_buffered: once it is full, the next POST is answered 503 with
// Retry-After: 1 and a JSON-RPC error, its body read no further than its
// first byte and nothing forwarded; the bytes come back as the requests
// end.
func TestWaitingBodiesStayWithinMaxBuffered(t *testing.T) {
	const maxBody, size = 1000, 1000
	h := newBareHandler(t, maxBody)
	h.MaxBuffered = 4 * size // the exchange in flight and three waiting
	h.budget = &bodyBudget{limit: h.MaxBuffered}
	const sid = "budget"
	release, inFlight := make(chan struct{}), make(chan struct{}, 1)
	var forwarded atomic.Int32
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		forwarded.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		inFlight <- struct{}{}
		<-release
		w.WriteHeader(http.StatusAccepted)
		return nil
	})
	send := func(body io.ReadCloser, length int64) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
		r.Body, r.ContentLength = body, length
		r.Header.Set(sessionHeader, sid)
		w := httptest.NewRecorder()
		if err := h.ServeHTTP(w, r, next); err != nil {
			t.Error(err)
		}
		return w
	}
	var wg sync.WaitGroup
	codes := make(chan int, 4)
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes <- send(&patternBody{n: size}, size).Code
		}()
		if i == 0 {
			<-inFlight // the exchange the others wait behind
		}
	}
	for deadline := time.Now().Add(5 * time.Second); h.budget.held.Load() != 4*size; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes held, want %d: the waiting requests did not take their share", h.budget.held.Load(), 4*size)
		}
	}

	refusals := metrics.rejections.WithLabelValues("body_budget")
	before := testutil.ToFloat64(refusals)
	body := &countingBody{Reader: &patternBody{n: size}}
	answered := make(chan *httptest.ResponseRecorder, 1)
	go func() { answered <- send(body, size) }()
	var w *httptest.ResponseRecorder
	select {
	case w = <-answered:
	case <-time.After(5 * time.Second):
		close(release)
		t.Fatal("a POST beyond max_buffered was taken in to wait")
	}
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "1" {
		t.Fatalf("beyond max_buffered: status %d, Retry-After %q; want 503, 1", w.Code, w.Header().Get("Retry-After"))
	}
	var e errorReply
	if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.JSONRPC != "2.0" || string(e.ID) != "null" ||
		e.Error.Code != codeServerError || !strings.Contains(e.Error.Message, "max_buffered") {
		t.Fatalf("beyond max_buffered: answer %s, want a JSON-RPC error -32000 naming max_buffered (%v)", w.Body.Bytes(), err)
	}
	if body.reads != 1 || forwarded.Load() != 1 {
		t.Fatalf("beyond max_buffered: body read %d times, %d requests forwarded; want its first byte only, only the first", body.reads, forwarded.Load())
	}
	if got := testutil.ToFloat64(refusals) - before; got != 1 {
		t.Fatalf("rejections_total{reason=body_budget} rose by %v, want 1", got)
	}

	close(release)
	go func() {
		for range inFlight {
		}
	}()
	wg.Wait()
	close(codes)
	for code := range codes {
		if code != http.StatusAccepted {
			t.Errorf("a request within max_buffered was answered %d, want 202", code)
		}
	}
	if held := h.budget.held.Load(); held != 0 {
		t.Fatalf("%d bytes still held after every request ended, want 0", held)
	}
	if w := send(&patternBody{n: size}, size); w.Code != http.StatusAccepted {
		t.Fatalf("after the budget was given back: status %d, want 202", w.Code)
	}
	close(inFlight)
}

// A body of unknown length holds what has arrived of it, not max_body:
// here one first block, which fits where max_body would not.
func TestBodyOfUnknownLengthCountsForWhatItHolds(t *testing.T) {
	const maxBody = 64 << 10
	h := newBareHandler(t, maxBody)
	h.budget = &bodyBudget{limit: maxBody + 1}
	var during int64
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		during = h.budget.held.Load()
		w.WriteHeader(http.StatusAccepted)
		return nil
	})
	post := func(length int64) int {
		r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
		r.Body, r.ContentLength = &patternBody{n: 300}, length
		r.Header.Set(sessionHeader, "unknown-length")
		w := httptest.NewRecorder()
		_ = h.ServeHTTP(w, r, next)
		return w.Code
	}
	if code := post(-1); code != http.StatusAccepted || during != firstBlock {
		t.Fatalf("chunked 300-byte body: status %d, %d bytes held while forwarded; want 202, %d", code, during, firstBlock)
	}
	h.budget.held.Store(maxBody + 1 - firstBlock) // max_body no longer fits, a first block does
	if code := post(-1); code != http.StatusAccepted || during != maxBody+1 {
		t.Fatalf("chunked body with a first block left: status %d, %d bytes held; want 202, all %d", code, during, maxBody+1)
	}
	h.budget.held.Store(1)
	if code := post(300); code != http.StatusAccepted || during != 301 {
		t.Fatalf("300-byte body of known length: status %d, %d bytes held; want 202, 301", code, during)
	}
	if held := h.budget.held.Load(); held != 1 {
		t.Fatalf("%d bytes held after the requests, want the 1 left there", held)
	}
}

func TestMaxBufferedDefaultsAndMustExceedMaxBody(t *testing.T) {
	for _, tc := range []struct {
		maxBody, maxBuffered, want int64 // want 0: refused
	}{
		{0, 0, defaultMaxBuffered},
		{100 << 20, 0, 100<<20 + 1},
		{0, 2 << 20, 2 << 20},
		{1 << 20, 1<<20 + 1, 1<<20 + 1},
		{1 << 20, 1 << 20, 0},
		{0, -1, 0},
	} {
		h := &Handler{MaxBody: tc.maxBody, MaxBuffered: tc.maxBuffered, Order: orderLocal}
		h.fillDefaults()
		err := h.Validate()
		switch {
		case tc.want == 0 && (err == nil || !strings.Contains(err.Error(), "max_buffered")):
			t.Errorf("max_body %d, max_buffered %d: err = %v, want one naming max_buffered", tc.maxBody, tc.maxBuffered, err)
		case tc.want != 0 && (err != nil || h.MaxBuffered != tc.want):
			t.Errorf("max_body %d, max_buffered %d: got %d, err %v; want %d", tc.maxBody, tc.maxBuffered, h.MaxBuffered, err, tc.want)
		}
	}
}

// Each module's Validate holds its checks, as Caddy's own modules do, and
// names the setting it refuses: run on settings as Provision leaves them.
func TestValidateRefusesEachBadSettingByName(t *testing.T) {
	handler := func(edit func(*Handler)) *Handler {
		h := &Handler{Order: orderLocal}
		edit(h)
		h.fillDefaults()
		return h
	}
	for _, tc := range []struct {
		module caddy.Validator
		want   string
	}{
		{handler(func(h *Handler) { h.OnInitTimeout = "later" }), "on_init_timeout"},
		{handler(func(h *Handler) { h.MaxQueue = -1 }), "max_queue"},
		{handler(func(h *Handler) { h.GetStream = "open" }), "get_stream"},
		{handler(func(h *Handler) { h.Order = "global" }), "order"},
		{handler(func(h *Handler) { h.Order = orderCluster }), "order cluster needs shared state"},
		{handler(func(h *Handler) { h.Order, h.engine = orderOwner, &storagestate.Engine{} }), "order owner needs shared state that records session owners"},
		{&redisstate.Engine{Sentinel: []string{"a:1"}, Address: []string{"b:1"}, MasterName: "m"}, "sentinel and address"},
		{&redisstate.Engine{Sentinel: []string{"a:1"}}, "master_name"},
		{&redisstate.Engine{Cluster: true}, "cluster needs address"},
		{&redisstate.Engine{Address: []string{"a:1"}, TLSCertFile: "c.pem"}, "tls_key_file"},
		{&redisstate.Engine{Address: []string{"a:1", "b:1"}, DB: 2}, "db"},
		{&redisstate.Engine{Address: []string{"a:1"}, Timeout: -1}, "timeout"},
		{&storagestate.Engine{SweepInterval: -1}, "sweep_interval"},
	} {
		err := tc.module.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%T %+v: Validate() = %v, want an error naming %q", tc.module, tc.module, err, tc.want)
		}
	}
	if err := handler(func(*Handler) {}).Validate(); err != nil {
		t.Errorf("the defaults: Validate() = %v", err)
	}
}

// With state redis, order defaults to owner; order cluster, written for an
// earlier release, keeps loading and runs as owner, with a WARN saying
// what to write instead.
func TestOrderDefaultsToOwnerAndClusterRunsAsOwnerWithAWarning(t *testing.T) {
	for _, tc := range []struct {
		order  string
		engine stateengine.Engine
		want   string
		warns  int
	}{
		{"", nil, orderLocal, 0},
		{"", &storagestate.Engine{}, orderLocal, 0},
		{"", &redisstate.Engine{}, orderOwner, 0},
		{orderLocal, &redisstate.Engine{}, orderLocal, 0},
		{orderCluster, &redisstate.Engine{}, orderOwner, 1},
	} {
		core, logs := observer.New(zap.WarnLevel)
		h := &Handler{Order: tc.order, engine: tc.engine, logger: zap.New(core)}
		h.defaultOrder()
		if h.Order != tc.want || logs.Len() != tc.warns {
			t.Errorf("order %q, engine %T: runs as %q with %d WARN lines, want %q with %d", tc.order, tc.engine, h.Order, logs.Len(), tc.want, tc.warns)
		}
		if tc.warns > 0 && !strings.Contains(logs.All()[0].Message, "write `order owner`") {
			t.Errorf("the WARN does not say what to write: %s", logs.All()[0].Message)
		}
	}
}

// A body holds of max_buffered what has arrived of it, not what it
// announced: nothing before its first byte, then never more than twice
// what came (or one first block), and nothing once its request ends.
func TestBodyHoldsAtMostTwiceWhatArrived(t *testing.T) {
	const maxBody = 1 << 20
	h := newBareHandler(t, maxBody)
	pr, pw := io.Pipe()
	r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
	r.Body, r.ContentLength = pr, maxBody
	r.Header.Set(sessionHeader, "arriving")
	answered := make(chan int, 1)
	go func() {
		w := httptest.NewRecorder()
		_ = h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
			t.Error("a body cut short was forwarded")
			return nil
		}))
		answered <- w.Code
	}()
	if held := h.budget.held.Load(); held != 0 {
		t.Fatalf("%d bytes held before the body's first byte, want 0", held)
	}
	sent := int64(0)
	for _, n := range []int64{1, 100, 5000, 20000, 100000, 300000} {
		// A write on a pipe returns once the handler has read it all.
		if _, err := io.CopyN(pw, &patternBody{n: n}, n); err != nil {
			t.Fatal(err)
		}
		sent += n
		// At most 512 bytes or twice what came (docs/guarantees.md): a
		// stalled body costs the budget no more than its stream costs the
		// server.
		if held := h.budget.held.Load(); held > max(2*sent, 512) {
			t.Fatalf("%d bytes held after %d arrived (%d announced), want at most %d", held, sent, int64(maxBody), max(2*sent, 512))
		}
	}
	pw.CloseWithError(io.ErrUnexpectedEOF)
	if code := <-answered; code != http.StatusBadRequest {
		t.Fatalf("body cut short: status %d, want 400", code)
	}
	if held := h.budget.held.Load(); held != 0 {
		t.Fatalf("%d bytes held after the request ended, want 0", held)
	}
}
