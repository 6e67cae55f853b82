package probe_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/integration/mcpstub"
	"github.com/mcpserializer/caddy-mcp-serializer/probe"
)

// Straight to a backend whose workers each save the whole session record,
// pipelined connects fail, and the probe names the failures: rejections and
// broken sessions, nothing else.
func TestPipelinedConnectsToTheStubFail(t *testing.T) {
	for _, mode := range []struct {
		name   string
		stream bool
	}{{"json", false}, {"sse", true}} {
		t.Run(mode.name, func(t *testing.T) {
			b := &mcpstub.Backend{WorkMin: time.Millisecond, WorkMax: 5 * time.Millisecond, StreamResponses: mode.stream, DisableRequestLog: true}
			client := probe.NewClient(16)
			defer client.CloseIdleConnections()
			d := probe.Driver{Client: client, URL: serve(t, b), Delete: true, PreferEventStream: mode.stream}
			sum := d.Run(t.Context(), 200, 16)
			t.Log(sum)
			if sum.Connects != 200 || sum.Failed == 0 || sum.Rejected == 0 || sum.Broken == 0 {
				t.Fatalf("want rejections and broken sessions: %v", sum)
			}
			if sum.HTTPErrors != 0 || sum.IDMismatches != 0 || sum.TransportErrors != 0 || sum.OtherErrors != 0 {
				t.Fatalf("failures that are not the race's: %v", sum)
			}
			if mode.stream && sum.EventStreams == 0 || !mode.stream && sum.EventStreams != 0 {
				t.Fatalf("%d event-stream responses in %s mode", sum.EventStreams, mode.name)
			}
			if b.Sessions() != 0 {
				t.Fatalf("%d sessions left after DELETE", b.Sessions())
			}
		})
	}
}

// notifications/initialized, logging/setLevel and the first tools/list are
// all at the server at once; the check and DELETE come after all three
// were answered, with the negotiated protocol version.
func TestConnectSendsTheFollowUpsWithoutWaiting(t *testing.T) {
	var mu sync.Mutex
	loaded := 0
	all := make(chan struct{})
	b := &mcpstub.Backend{}
	b.AfterLoad = func(_ string, methods []string) {
		mu.Lock()
		loaded++
		if loaded == 3 {
			close(all)
		}
		n := loaded
		mu.Unlock()
		if n <= 3 {
			select { // each of the first three waits for the other two
			case <-all:
			case <-time.After(10 * time.Second):
			}
		}
	}
	url := serve(t, b)
	r := probe.Driver{URL: url, Delete: true, ProtocolVersion: "2025-03-26"}.Connect(t.Context())
	select {
	case <-all:
	default:
		t.Fatalf("the three follow-ups were not at the server at once: %+v", r)
	}
	reqs := b.Requests()
	var got []string
	for _, s := range reqs {
		got = append(got, s.HTTPMethod+" "+strings.Join(s.Methods(), ","))
	}
	if len(reqs) != 6 || got[0] != "POST initialize" || got[4] != "POST tools/list" || got[5] != "DELETE " {
		t.Fatalf("requests %q", got)
	}
	middle := strings.Join(got[1:4], " ")
	for _, m := range []string{"notifications/initialized", "logging/setLevel", "tools/list"} {
		if !strings.Contains(middle, m) {
			t.Fatalf("%s missing among the follow-ups %q", m, got[1:4])
		}
	}
	for _, s := range reqs[1:4] {
		if s.Done.After(reqs[4].At) {
			t.Fatalf("the check was sent before %v was answered", s.Methods())
		}
	}
	if r.SessionID == "" {
		t.Fatalf("result %+v", r)
	}
	if rec, ok := b.Session(r.SessionID); ok {
		t.Fatalf("session not deleted: %+v", rec)
	}
}

// Each kind of failure is counted once, under its own name, and described.
func TestConnectCountsEachFailure(t *testing.T) {
	hang := func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }
	for _, tc := range []struct {
		name   string
		answer func(w http.ResponseWriter, r *http.Request, method string, id json.RawMessage) bool
		want   func(r probe.Result) bool
		text   string
	}{
		{
			name: "rejection",
			answer: func(w http.ResponseWriter, r *http.Request, method string, id json.RawMessage) bool {
				if method != "logging/setLevel" {
					return false
				}
				replyError(w, http.StatusOK, id, -32600, "Client session not initialized.")
				return true
			},
			want: func(r probe.Result) bool { return r.Rejected == 1 && !r.Broken },
			text: "logging/setLevel (id 2): rejected: JSON-RPC error -32600: Client session not initialized.",
		},
		{
			name: "broken session",
			answer: func(w http.ResponseWriter, r *http.Request, method string, id json.RawMessage) bool {
				if method != "tools/list" || string(id) != "4" {
					return false
				}
				replyError(w, http.StatusOK, id, -32600, "Client session not initialized.")
				return true
			},
			want: func(r probe.Result) bool { return r.Rejected == 1 && r.Broken },
			text: "tools/list (id 4): rejected",
		},
		{
			name: "HTTP error",
			answer: func(w http.ResponseWriter, r *http.Request, method string, id json.RawMessage) bool {
				if method != "tools/list" || string(id) != "3" {
					return false
				}
				http.Error(w, "<html>oops</html>", http.StatusInternalServerError)
				return true
			},
			want: func(r probe.Result) bool { return r.HTTPErrors == 1 && !r.Broken },
			text: "tools/list (id 3): HTTP 500",
		},
		{
			name: "wrong id",
			answer: func(w http.ResponseWriter, r *http.Request, method string, id json.RawMessage) bool {
				if method != "tools/list" || string(id) != "3" {
					return false
				}
				reply(w, json.RawMessage("2"), `{"tools":[]}`)
				return true
			},
			want: func(r probe.Result) bool { return r.IDMismatches == 1 && r.OtherErrors == 1 },
			text: "tools/list (id 3): a reply with id 2",
		},
		{
			name: "connection closed",
			answer: func(w http.ResponseWriter, r *http.Request, method string, id json.RawMessage) bool {
				if method != "logging/setLevel" {
					return false
				}
				conn, _, err := http.NewResponseController(w).Hijack()
				if err == nil {
					conn.Close()
				}
				return true
			},
			want: func(r probe.Result) bool { return r.TransportErrors == 1 },
			text: "logging/setLevel (id 2): ",
		},
		{
			name: "timeout",
			answer: func(w http.ResponseWriter, r *http.Request, method string, id json.RawMessage) bool {
				if method != "notifications/initialized" {
					return false
				}
				hang(w, r)
				return true
			},
			want: func(r probe.Result) bool { return r.TransportErrors == 1 },
			text: "notifications/initialized: no complete answer within 300ms",
		},
		{
			name: "other JSON-RPC error",
			answer: func(w http.ResponseWriter, r *http.Request, method string, id json.RawMessage) bool {
				if method != "logging/setLevel" {
					return false
				}
				replyError(w, http.StatusOK, id, -32601, "Method not found")
				return true
			},
			want: func(r probe.Result) bool { return r.OtherErrors == 1 && r.Rejected == 0 },
			text: "logging/setLevel (id 2): JSON-RPC error -32601: Method not found",
		},
		{
			name: "DELETE refused",
			answer: func(w http.ResponseWriter, r *http.Request, method string, id json.RawMessage) bool {
				return false
			},
			want: func(r probe.Result) bool { return !r.Failed() },
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeServer{answer: tc.answer}
			h := http.Handler(f)
			if tc.name == "DELETE refused" {
				h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.Method == http.MethodDelete {
						w.WriteHeader(http.StatusMethodNotAllowed) // allowed by the spec
						return
					}
					f.ServeHTTP(w, r)
				})
			}
			r := probe.Driver{URL: serve(t, h), Delete: true, Timeout: 300 * time.Millisecond}.Connect(t.Context())
			t.Logf("%+v", r)
			if !tc.want(r) {
				t.Fatalf("counts %+v", r)
			}
			if tc.text == "" {
				return
			}
			if !r.Failed() || !strings.Contains(fmt.Sprint(r.Errors), tc.text) {
				t.Fatalf("want a failure described %q, got %v", tc.text, r.Errors)
			}
			total := r.Rejected + r.HTTPErrors + r.IDMismatches + r.TransportErrors + r.OtherErrors
			if len(r.Errors) != total {
				t.Fatalf("%d descriptions for %d problems: %v", len(r.Errors), total, r.Errors)
			}
		})
	}
}

// A reply on an event stream ends the request even when the server keeps
// the stream open afterwards; notifications before it are skipped.
func TestEventStreamReplyEndsTheRequest(t *testing.T) {
	var accepts sync.Map
	f := &fakeServer{answer: func(w http.ResponseWriter, r *http.Request, method string, id json.RawMessage) bool {
		accepts.Store(r.Header.Get("Accept"), true)
		if len(id) == 0 || method == "initialize" {
			return false
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, ": keep-alive\n\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\n")
		_, _ = io.WriteString(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":"+string(id)+",\n")
		_, _ = io.WriteString(w, "data: \"result\":{\"tools\":[]}}\n\n")
		http.NewResponseController(w).Flush()
		select { // the stream stays open until the client leaves
		case <-r.Context().Done():
		case <-time.After(30 * time.Second):
		}
		return true
	}}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	r := probe.Driver{URL: serve(t, f), Delete: true, PreferEventStream: true, Timeout: 5 * time.Second}.Connect(ctx)
	if r.Failed() || r.EventStreams != 3 {
		t.Fatalf("result %+v", r)
	}
	if _, ok := accepts.Load("text/event-stream, application/json"); !ok {
		t.Fatal("--sse did not put text/event-stream first in Accept")
	}
}

// Run stops at the context's end and counts no connect it cut short.
func TestRunStopsWhenInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	var once sync.Once
	f := &fakeServer{answer: func(w http.ResponseWriter, r *http.Request, method string, id json.RawMessage) bool {
		if string(id) != "4" {
			return false
		}
		once.Do(cancel)
		<-r.Context().Done()
		return true
	}}
	sum := probe.Driver{URL: serve(t, f), Delete: true}.Run(ctx, 50, 4)
	if !sum.Interrupted || sum.Connects != 0 || sum.Failed != 0 {
		t.Fatalf("summary %v", sum)
	}
}
