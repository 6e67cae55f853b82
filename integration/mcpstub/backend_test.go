package mcpstub

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/probe"
)

func TestInitializeCreatesSession(t *testing.T) {
	b := &Backend{}
	url := serve(t, b)
	r := post(t, url, "", initializeBody)
	if r.status != http.StatusOK {
		t.Fatalf("status %d", r.status)
	}
	sid := r.header.Get(SessionHeader)
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(sid) {
		t.Fatalf("session id %q is not 32 hex digits", sid)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q", ct)
	}
	m := only(t, r)
	if string(m.ID) != "1" {
		t.Fatalf("id %s", m.ID)
	}
	res := wantResult(t, m)
	if res["protocolVersion"] != "2025-03-26" {
		t.Fatalf("protocolVersion %v, want the client's echoed", res["protocolVersion"])
	}
	caps, _ := res["capabilities"].(map[string]any)
	if caps["tools"] == nil || caps["logging"] == nil {
		t.Fatalf("capabilities %v", caps)
	}
	if info, _ := res["serverInfo"].(map[string]any); info["name"] == nil {
		t.Fatalf("serverInfo %v", res["serverInfo"])
	}
	rec, ok := b.Session(sid)
	if !ok || rec.Initialized || rec.ProtocolVersion != "2025-03-26" || rec.ClientName != "test" {
		t.Fatalf("record %+v, %v", rec, ok)
	}
}

func TestRequestBeforeInitializedIsRejected(t *testing.T) {
	b := &Backend{}
	url := serve(t, b)
	sid := newSession(t, url)
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":2,"method":"logging/setLevel","params":{"level":"debug"}}`,
		`{"jsonrpc":"2.0","id":3,"method":"tools/list"}`,
		`{"jsonrpc":"2.0","id":4,"method":"ping"}`,
	} {
		r := post(t, url, sid, body)
		if r.status != http.StatusOK {
			t.Fatalf("status %d, want 200 carrying the error", r.status)
		}
		m := only(t, r)
		wantError(t, m, CodeInvalidRequest)
		if m.Error.Message != NotInitializedMessage {
			t.Fatalf("message %q", m.Error.Message)
		}
	}
	if got := b.Stats(sid).Rejected; got != 3 {
		t.Fatalf("Stats.Rejected = %d, want 3", got)
	}
	if rec, _ := b.Session(sid); rec.LogLevel != "info" {
		t.Fatalf("a rejected setLevel changed the level to %q", rec.LogLevel)
	}
}

func TestInitializedNotificationOpensSession(t *testing.T) {
	b := &Backend{}
	url := serve(t, b)
	sid := readySession(t, url)
	if rec, _ := b.Session(sid); !rec.Initialized {
		t.Fatal("record not initialized")
	}
	r := post(t, url, sid, `{"jsonrpc":"2.0","id":2,"method":"logging/setLevel","params":{"level":"debug"}}`)
	wantResult(t, only(t, r))
	if rec, _ := b.Session(sid); rec.LogLevel != "debug" {
		t.Fatalf("level %q", rec.LogLevel)
	}
	r = post(t, url, sid, `{"jsonrpc":"2.0","id":"abc","method":"tools/list"}`)
	m := only(t, r)
	if string(m.ID) != `"abc"` {
		t.Fatalf("id %s not echoed", m.ID)
	}
	tools, _ := wantResult(t, m)["tools"].([]any)
	if len(tools) != 2 {
		t.Fatalf("tools %v", tools)
	}
}

func TestNotificationsAndResponsesOnlyAnswer202(t *testing.T) {
	url := serve(t, &Backend{})
	sid := readySession(t, url)
	for _, body := range []string{
		`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":9}}`,
		`{"jsonrpc":"2.0","id":7,"result":{}}`,
		`[{"jsonrpc":"2.0","method":"notifications/roots/list_changed"},{"jsonrpc":"2.0","id":8,"error":{"code":-1,"message":"no"}}]`,
	} {
		r := post(t, url, sid, body)
		if r.status != http.StatusAccepted || len(r.body) != 0 {
			t.Fatalf("%s: status %d body %q, want 202 empty", body, r.status, r.body)
		}
	}
}

func TestBatchIsProcessedInOrder(t *testing.T) {
	b := &Backend{}
	url := serve(t, b)
	sid := newSession(t, url)
	// initialized first in the batch opens the session for what follows.
	r := post(t, url, sid, `[
		{"jsonrpc":"2.0","method":"notifications/initialized"},
		{"jsonrpc":"2.0","id":2,"method":"logging/setLevel","params":{"level":"error"}},
		{"jsonrpc":"2.0","id":3,"method":"tools/list"},
		{"jsonrpc":"2.0","id":4,"method":"nope"},
		42
	]`)
	if r.status != http.StatusOK || !strings.HasPrefix(strings.TrimSpace(string(r.body)), "[") {
		t.Fatalf("status %d body %s, want a JSON array", r.status, r.body)
	}
	if len(r.msgs) != 4 {
		t.Fatalf("want 4 replies, got %s", r.body)
	}
	for i, id := range []string{"2", "3", "4", "null"} {
		if string(r.msgs[i].ID) != id {
			t.Fatalf("reply %d id %s, want %s", i, r.msgs[i].ID, id)
		}
	}
	wantResult(t, r.msgs[0])
	wantResult(t, r.msgs[1])
	wantError(t, r.msgs[2], CodeMethodNotFound)
	wantError(t, r.msgs[3], CodeInvalidRequest)
	if rec, _ := b.Session(sid); !rec.Initialized || rec.LogLevel != "error" {
		t.Fatalf("record %+v", rec)
	}

	// A batch before initialized: every request rejected, one by one.
	sid = newSession(t, url)
	r = post(t, url, sid, `[{"jsonrpc":"2.0","id":5,"method":"ping"},{"jsonrpc":"2.0","id":6,"method":"tools/list"}]`)
	if len(r.msgs) != 2 {
		t.Fatalf("body %s", r.body)
	}
	for _, m := range r.msgs {
		wantError(t, m, CodeInvalidRequest)
	}
}

func TestUnknownSessionIs404(t *testing.T) {
	b := &Backend{}
	url := serve(t, b)
	const ghost = "0123456789abcdef0123456789abcdef"
	for _, method := range []string{http.MethodPost, http.MethodGet, http.MethodDelete} {
		r := send(t, method, url, ghost, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
		if r.status != http.StatusNotFound {
			t.Fatalf("%s: status %d", method, r.status)
		}
		wantError(t, only(t, r), CodeSessionNotFound)
	}
	if b.Sessions() != 0 {
		t.Fatal("a 404 created a session")
	}
}

func TestMalformedJSONIs400(t *testing.T) {
	url := serve(t, &Backend{})
	sid := readySession(t, url)
	for _, s := range []string{"", sid} {
		r := post(t, url, s, `{"jsonrpc":"2.0","id":1,"method":`)
		if r.status != http.StatusBadRequest {
			t.Fatalf("status %d", r.status)
		}
		wantError(t, only(t, r), CodeParseError)
	}
	r := post(t, url, sid, `[]`)
	if r.status != http.StatusBadRequest {
		t.Fatalf("empty batch: status %d", r.status)
	}
	wantError(t, only(t, r), CodeInvalidRequest)
}

func TestUnknownMethodIs32601(t *testing.T) {
	url := serve(t, &Backend{})
	sid := readySession(t, url)
	r := post(t, url, sid, `{"jsonrpc":"2.0","id":9,"method":"resources/list"}`)
	if r.status != http.StatusOK {
		t.Fatalf("status %d", r.status)
	}
	wantError(t, only(t, r), CodeMethodNotFound)
}

func TestEchoTool(t *testing.T) {
	url := serve(t, &Backend{})
	sid := readySession(t, url)
	r := post(t, url, sid, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"}}}`)
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q", ct)
	}
	content, _ := wantResult(t, only(t, r))["content"].([]any)
	if len(content) != 1 || content[0].(map[string]any)["text"] != "hi" {
		t.Fatalf("content %v", content)
	}
	r = post(t, url, sid, `{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"nope"}}`)
	wantError(t, only(t, r), CodeInvalidParams)
}

func TestSessionlessRequestsAreAnsweredWithoutRecord(t *testing.T) {
	b := &Backend{}
	url := serve(t, b)
	r := post(t, url, "", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
	if r.status != http.StatusOK || r.header.Get(SessionHeader) != "" {
		t.Fatalf("status %d, session %q", r.status, r.header.Get(SessionHeader))
	}
	wantResult(t, only(t, r))
	r = post(t, url, "", `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	if r.status != http.StatusAccepted {
		t.Fatalf("notification: status %d", r.status)
	}
	r = post(t, url, "", `[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2,"method":"initialize"}]`)
	wantResult(t, r.msgs[0])
	wantError(t, r.msgs[1], CodeInvalidRequest)
	if b.Sessions() != 0 {
		t.Fatalf("%d sessions stored", b.Sessions())
	}
}

func TestDeleteDropsSession(t *testing.T) {
	b := &Backend{}
	url := serve(t, b)
	sid := readySession(t, url)
	if r := send(t, http.MethodDelete, url, sid, ""); r.status != http.StatusOK {
		t.Fatalf("DELETE: status %d", r.status)
	}
	if _, ok := b.Session(sid); ok {
		t.Fatal("record still stored")
	}
	if r := post(t, url, sid, `{"jsonrpc":"2.0","id":2,"method":"ping"}`); r.status != http.StatusNotFound {
		t.Fatalf("POST after DELETE: status %d", r.status)
	}
	if r := send(t, http.MethodDelete, url, sid, ""); r.status != http.StatusNotFound {
		t.Fatalf("second DELETE: status %d", r.status)
	}
}

func TestOtherHTTPMethodIs405(t *testing.T) {
	url := serve(t, &Backend{})
	r := send(t, http.MethodPut, url, "", "{}")
	if r.status != http.StatusMethodNotAllowed || r.header.Get("Allow") == "" {
		t.Fatalf("status %d, Allow %q", r.status, r.header.Get("Allow"))
	}
}

func TestProgressEventsArriveFlushedBeforeResult(t *testing.T) {
	url := serve(t, &Backend{})
	sid := readySession(t, url)
	const steps, pause = 3, 80 * time.Millisecond
	body := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"progress","arguments":{"steps":3,"pause_ms":80},"_meta":{"progressToken":"tok"}}}`
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set(SessionHeader, sid)
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	er := probe.NewEventReader(resp.Body)
	var arrived []time.Duration
	var msgs []Message
	for {
		ev, err := er.Next()
		if err != nil {
			break
		}
		arrived = append(arrived, time.Since(start))
		got, err := DecodeBody("application/json", []byte(ev.Data))
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, got...)
	}
	if len(msgs) != steps+1 {
		t.Fatalf("want %d events, got %d", steps+1, len(msgs))
	}
	for i, m := range msgs[:steps] {
		if m.Method != "notifications/progress" || !strings.Contains(string(m.Params), `"progressToken":"tok"`) {
			t.Fatalf("event %d: %+v %s", i, m, m.Params)
		}
	}
	if last := msgs[steps]; string(last.ID) != "7" || last.Result == nil {
		t.Fatalf("last event %+v, want the result", last)
	}
	// The events are spread over the pauses (two between the first and the
	// last), not delivered in one burst with the result.
	if spread := arrived[steps-1] - arrived[0]; spread < pause {
		t.Fatalf("progress events arrived within %v: not flushed one by one (%v)", spread, arrived)
	}
	if lead := arrived[steps] - arrived[0]; lead < pause {
		t.Fatalf("first progress event only %v before the result (%v)", lead, arrived)
	}
}

func TestStreamResponsesAnswersEventStream(t *testing.T) {
	b := &Backend{StreamResponses: true}
	url := serve(t, b)
	r := post(t, url, "", initializeBody)
	sid := r.header.Get(SessionHeader)
	if ct := r.header.Get("Content-Type"); ct != "text/event-stream" || sid == "" {
		t.Fatalf("initialize: Content-Type %q, session %q", ct, sid)
	}
	wantResult(t, only(t, r))
	if r := post(t, url, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); r.status != http.StatusAccepted {
		t.Fatalf("notification: status %d", r.status)
	}
	r = post(t, url, sid, `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`)
	if ct := r.header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("tools/list: Content-Type %q", ct)
	}
	wantResult(t, only(t, r))
}

// getStream opens a GET stream and returns a line reader and the response.
func getStream(t *testing.T, ctx context.Context, url, sid string) (*http.Response, *bufio.Reader) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set(SessionHeader, sid)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("GET: status %d, Content-Type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	return resp, bufio.NewReader(resp.Body)
}

func TestGetStreamSendsKeepAlivesAndResavesUntilBound(t *testing.T) {
	b := &Backend{KeepAlive: 20 * time.Millisecond, StreamMax: 150 * time.Millisecond}
	url := serve(t, b)
	sid := readySession(t, url)
	before, _ := b.Session(sid)
	start := time.Now()
	_, br := getStream(t, t.Context(), url, sid)
	comments := 0
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			break // the Backend closed the stream at StreamMax
		}
		if strings.HasPrefix(line, ": keep-alive") {
			comments++
		}
	}
	if el := time.Since(start); el < 150*time.Millisecond || el > 2*time.Second {
		t.Fatalf("stream lasted %v, want about StreamMax", el)
	}
	if comments < 3 {
		t.Fatalf("%d keep-alive comments", comments)
	}
	after, _ := b.Session(sid)
	if !after.Saved.After(before.Saved) {
		t.Fatal("the GET stream did not re-save the record")
	}
	if st := b.Stats(sid); st.Streams != 1 || st.MaxInFlight != 1 {
		t.Fatalf("stats %+v: a GET must count as a stream, not an exchange", st)
	}
}

func TestGetStreamEndsWhenClientLeaves(t *testing.T) {
	b := &Backend{KeepAlive: 10 * time.Millisecond}
	url := serve(t, b)
	sid := readySession(t, url)
	ctx, cancel := context.WithCancel(t.Context())
	_, br := getStream(t, ctx, url, sid)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	cancel()
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		reqs := b.Requests()
		if last := reqs[len(reqs)-1]; last.HTTPMethod == http.MethodGet && !last.Done.IsZero() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("GET handler still running after the client left")
}

func TestGetStreamEndsWithSession(t *testing.T) {
	b := &Backend{KeepAlive: 10 * time.Millisecond}
	url := serve(t, b)
	sid := readySession(t, url)
	_, br := getStream(t, t.Context(), url, sid)
	if r := send(t, http.MethodDelete, url, sid, ""); r.status != http.StatusOK {
		t.Fatalf("DELETE: status %d", r.status)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, err := br.ReadString('\n'); err != nil {
				return
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("GET stream outlived its session")
	}
	if _, ok := b.Session(sid); ok {
		t.Fatal("the GET stream's save resurrected a deleted session")
	}
}

func TestRequestLogRecordsWhatArrived(t *testing.T) {
	b := &Backend{}
	url := serve(t, b)
	if b.Count() != 0 || len(b.Requests()) != 0 {
		t.Fatal("log not empty at start")
	}
	sid := readySession(t, url)
	post(t, url, sid, `[{"jsonrpc":"2.0","id":2,"method":"ping"},{"jsonrpc":"2.0","id":"x","result":{}}]`)
	send(t, http.MethodDelete, url, sid, "")

	reqs := b.Requests()
	if b.Count() != 4 || len(reqs) != 4 {
		t.Fatalf("Count %d, %d entries", b.Count(), len(reqs))
	}
	if r := reqs[0]; r.SessionID != "" || r.NewSessionID != sid || !r.Has("initialize") || r.Status != 200 {
		t.Fatalf("initialize entry %+v", r)
	}
	if r := reqs[1]; r.SessionID != sid || !r.Has("notifications/initialized") || r.Status != 202 || r.Messages[0].ID != "" {
		t.Fatalf("notification entry %+v", r)
	}
	r := reqs[2]
	if got := r.Methods(); len(got) != 2 || got[0] != "ping" || r.Messages[0].ID != "2" || !r.Messages[1].Response || r.Messages[1].ID != `"x"` {
		t.Fatalf("batch entry %+v", r)
	}
	if r := reqs[3]; r.HTTPMethod != http.MethodDelete || r.Status != 200 {
		t.Fatalf("DELETE entry %+v", r)
	}
	for i, r := range reqs {
		if r.Seq != i+1 || r.Done.Before(r.At) {
			t.Fatalf("entry %d: Seq %d, At %v, Done %v", i, r.Seq, r.At, r.Done)
		}
	}
	if st := b.Stats(sid); st.Requests != 4 || st.InFlight != 0 || st.MaxInFlight != 1 {
		t.Fatalf("stats %+v", st)
	}

	b.ResetLog()
	if b.Count() != 0 || len(b.Requests()) != 0 || b.Stats(sid).Requests != 0 {
		t.Fatal("ResetLog left entries")
	}
}

func TestMaxInFlightSeesOverlap(t *testing.T) {
	b := &Backend{WorkMin: 50 * time.Millisecond, WorkMax: 50 * time.Millisecond}
	url := serve(t, b)
	sid := readySession(t, url)
	done := make(chan struct{})
	for range 2 {
		go func() {
			defer func() { done <- struct{}{} }()
			req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"jsonrpc":"2.0","id":2,"method":"ping"}`))
			req.Header.Set(SessionHeader, sid)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	<-done
	<-done
	if got := b.Stats(sid).MaxInFlight; got != 2 {
		t.Fatalf("MaxInFlight %d, want 2 for two overlapping POSTs", got)
	}
	if b.MaxInFlight() != 2 {
		t.Fatalf("Backend.MaxInFlight %d", b.MaxInFlight())
	}
}

func TestDisableRequestLogKeepsCounting(t *testing.T) {
	b := &Backend{DisableRequestLog: true}
	url := serve(t, b)
	sid := readySession(t, url)
	if b.Count() != 2 || len(b.Requests()) != 0 || b.Stats(sid).Requests != 2 {
		t.Fatalf("Count %d, %d entries, stats %+v", b.Count(), len(b.Requests()), b.Stats(sid))
	}
}

func TestWorkTakesConfiguredTime(t *testing.T) {
	b := &Backend{ServiceTime: 30 * time.Millisecond, WorkMin: 10 * time.Millisecond, WorkMax: 20 * time.Millisecond}
	url := serve(t, b)
	start := time.Now()
	post(t, url, "", `{"jsonrpc":"2.0","id":1,"method":"ping"}`)
	if el := time.Since(start); el < 40*time.Millisecond {
		t.Fatalf("request took %v, want at least ServiceTime+WorkMin", el)
	}
}

// The stand-in's own cost with no simulated work, so that benchmarks of a
// proxy in front of it measure the proxy.
func BenchmarkBackendToolsList(b *testing.B) {
	backend := &Backend{DisableRequestLog: true}
	init := httptest.NewRecorder()
	backend.ServeHTTP(init, httptest.NewRequest(http.MethodPost, "/", strings.NewReader(initializeBody)))
	sid := init.Header().Get(SessionHeader)
	ready := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"jsonrpc":"2.0","method":"notifications/initialized"}`))
	ready.Header.Set(SessionHeader, sid)
	backend.ServeHTTP(httptest.NewRecorder(), ready)
	b.ReportAllocs()
	for b.Loop() {
		req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"jsonrpc":"2.0","id":3,"method":"tools/list"}`))
		req.Header.Set(SessionHeader, sid)
		w := httptest.NewRecorder()
		backend.ServeHTTP(w, req)
		if w.Code != http.StatusOK {
			b.Fatal(w.Code)
		}
	}
}
