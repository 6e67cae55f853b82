package mcpstub

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// Straight to the Backend, pipelined connects fail: that is the
// multi-process race a serializing proxy must remove.
func TestPipelinedConnectsFailWithoutSerialization(t *testing.T) {
	for _, mode := range []struct {
		name   string
		stream bool
	}{{"json", false}, {"sse", true}} {
		t.Run(mode.name, func(t *testing.T) {
			b := &Backend{WorkMin: time.Millisecond, WorkMax: 5 * time.Millisecond, StreamResponses: mode.stream}
			url := serve(t, b)
			sum := RunPipelined(t.Context(), url, 200, 16)
			t.Log(sum)
			if sum.Connects != 200 {
				t.Fatalf("%d connects ran", sum.Connects)
			}
			if sum.Rejected == 0 {
				t.Fatal("no connect was rejected: the stand-in does not reproduce the race")
			}
			if sum.Broken == 0 {
				t.Fatal("no session was left broken: the stand-in does not reproduce the lost update")
			}
			// The failures must be the race's, not the stand-in's or the
			// driver's.
			if sum.HTTPErrors != 0 || sum.IDMismatches != 0 || sum.TransportErrors != 0 || sum.OtherErrors != 0 {
				t.Fatalf("unexpected failures: %v", sum)
			}
			if b.Rejected() == 0 || b.MaxInFlight() < 2 {
				t.Fatalf("Backend saw %d rejections, max %d in flight", b.Rejected(), b.MaxInFlight())
			}
			if b.Sessions() != 0 {
				t.Fatalf("%d sessions left after DELETE", b.Sessions())
			}
		})
	}
}

// A client that waits for notifications/initialized before its next request
// never fails: the failures above are the pipelining's.
func TestSequentialConnectsSucceed(t *testing.T) {
	b := &Backend{WorkMin: time.Millisecond, WorkMax: 5 * time.Millisecond}
	url := serve(t, b)
	client := NewClient(8)
	defer client.CloseIdleConnections()
	sum := Driver{Client: client, URL: url, Delete: true, Sequential: true}.Run(t.Context(), 50, 8)
	t.Log(sum)
	if sum.Connects != 50 || sum.Failed != 0 {
		t.Fatalf("sequential connects failed: %v", sum)
	}
	if b.Rejected() != 0 {
		t.Fatalf("Backend rejected %d requests", b.Rejected())
	}
}

func TestPipelinedConnectReportsSession(t *testing.T) {
	b := &Backend{}
	url := serve(t, b)
	// No work: the concurrent POSTs rarely overlap, but whatever the
	// outcome the result must be coherent.
	r := PipelinedConnect(t.Context(), http.DefaultClient, url)
	if r.SessionID == "" || r.TransportErrors != 0 || r.OtherErrors != 0 || r.HTTPErrors != 0 || r.IDMismatches != 0 || r.Elapsed <= 0 {
		t.Fatalf("result %+v", r)
	}
	if r.Broken && r.Rejected == 0 {
		t.Fatalf("broken without a rejection: %+v", r)
	}
	if _, ok := b.Session(r.SessionID); ok {
		t.Fatal("session not deleted")
	}
	reqs := b.Requests()
	if len(reqs) != 6 || reqs[len(reqs)-1].HTTPMethod != http.MethodDelete {
		t.Fatalf("want initialize, 4 POSTs and DELETE; got %d requests", len(reqs))
	}
}

func TestPipelinedConnectReportsHTTPErrors(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	defer srv.Close()
	r := PipelinedConnect(t.Context(), http.DefaultClient, srv.URL)
	if r.HTTPErrors != 1 || !r.Failed() {
		t.Fatalf("result %+v", r)
	}
}

// The lost update, made deterministic: logging/setLevel loads the record
// before notifications/initialized is saved, is rejected, and saves its stale
// copy (initialized=false) over the notification's write. The session stays
// broken for every later request.
func TestRejectedRequestSaveOverwritesInitialized(t *testing.T) {
	loaded := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	b := &Backend{}
	b.AfterLoad = func(_ string, methods []string) {
		if len(methods) == 1 && methods[0] == "logging/setLevel" {
			once.Do(func() {
				close(loaded)
				<-release
			})
		}
	}
	url := serve(t, b)
	sid := newSession(t, url)

	setLevel := make(chan reply, 1)
	go func() {
		// post may not call t.Fatal off the test goroutine; decode here.
		setLevel <- sendNoFatal(url, sid, `{"jsonrpc":"2.0","id":2,"method":"logging/setLevel","params":{"level":"debug"}}`)
	}()
	<-loaded // setLevel holds a copy with initialized=false

	if r := post(t, url, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); r.status != http.StatusAccepted {
		t.Fatalf("notifications/initialized: status %d", r.status)
	}
	if rec, _ := b.Session(sid); !rec.Initialized {
		t.Fatal("notifications/initialized was not saved")
	}

	close(release)
	r := <-setLevel
	if len(r.msgs) != 1 || r.msgs[0].Error == nil || r.msgs[0].Error.Code != CodeInvalidRequest {
		t.Fatalf("setLevel: want the not-initialized rejection, got %s", r.body)
	}
	if rec, _ := b.Session(sid); rec.Initialized {
		t.Fatal("the rejected request's save did not overwrite initialized=true")
	}
	wantError(t, only(t, post(t, url, sid, `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`)), CodeInvalidRequest)
}

func sendNoFatal(url, sid, body string) reply {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(SessionHeader, sid)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return reply{}
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	msgs, _ := DecodeBody(resp.Header.Get("Content-Type"), data)
	return reply{status: resp.StatusCode, header: resp.Header, body: data, msgs: msgs}
}
