package caddymodule_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// overtakeUpstream answers a tools/call with an event stream that lasts
// until streamEnd is closed, holds every notifications/cancelled until
// releaseCancel is closed, answers a reply carrying "gone" 404 (the
// session is unknown upstream) and anything else at once. It notes
// every request that reached it while another one, the stream aside, was
// still there.
type overtakeUpstream struct {
	*upstream
	streamEnd, releaseCancel chan struct{}
	endOnce, releaseOnce     sync.Once

	mu       sync.Mutex
	inFlight int
	overlaps []string
}

func newOvertakeUpstream(t *testing.T) (*overtakeUpstream, string) {
	o := &overtakeUpstream{streamEnd: make(chan struct{}), releaseCancel: make(chan struct{})}
	var addr string
	o.upstream, addr = newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if strings.Contains(string(body), `"tools/call"`) && strings.Contains(string(body), `"stream"`) {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-o.streamEnd
			io.WriteString(w, "data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n")
			return
		}
		o.mu.Lock()
		if o.inFlight > 0 {
			o.overlaps = append(o.overlaps, string(body))
		}
		o.inFlight++
		o.mu.Unlock()
		if strings.Contains(string(body), "notifications/cancelled") {
			<-o.releaseCancel
		}
		o.mu.Lock()
		o.inFlight-- // before the answer: the next request may come once it is out
		o.mu.Unlock()
		if strings.Contains(string(body), `"gone"`) {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		if strings.Contains(string(body), `"method"`) && !strings.Contains(string(body), "notifications/") {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"jsonrpc":"2.0","id":2,"result":{}}`)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	})
	t.Cleanup(func() {
		o.mu.Lock()
		defer o.mu.Unlock()
		if len(o.overlaps) > 0 {
			t.Errorf("requests of the session reached the upstream beside another: %q", o.overlaps)
		}
	})
	return o, addr
}

// releaseAll lets every held request end, as Caddy and the upstream must
// before they can stop; tests defer it.
func (o *overtakeUpstream) releaseAll() { o.endStream(); o.releaseCancellation() }

func (o *overtakeUpstream) endStream() { o.endOnce.Do(func() { close(o.streamEnd) }) }

func (o *overtakeUpstream) releaseCancellation() {
	o.releaseOnce.Do(func() { close(o.releaseCancel) })
}

// noArrival asserts that nothing reached the upstream that the test has
// not taken already.
func (o *overtakeUpstream) noArrival(t *testing.T, why string) {
	t.Helper()
	select {
	case got := <-o.arrived:
		t.Fatalf("%s: the upstream got %s", why, got.Body)
	default:
	}
}

// startStream begins session sid's streaming tools/call and returns its
// response once its header has reached the client, when replies may
// overtake it.
func startStream(t *testing.T, c *testCaddy, o *overtakeUpstream, sid string) *http.Response {
	t.Helper()
	resp := <-sendAsync(context.Background(), c.url, sid, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"stream"}}`)
	if resp == nil || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("streaming call: %v", resp)
	}
	o.next(t)
	return resp
}

const cancelledBody = `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}`

// Two messages that overtake a stream reach the upstream one at a time: a
// reply sent while a cancellation is still upstream waits for it, then
// overtakes the stream, which has not ended.
func TestOvertakersReachTheUpstreamOneAtATime(t *testing.T) {
	o, addr := newOvertakeUpstream(t)
	c := startCaddy(t, fmt.Sprintf("mcp_serializer\nreverse_proxy %s {\n\tflush_interval -1\n}", addr))
	defer o.releaseAll()
	stream := startStream(t, c, o, "s1")
	defer stream.Body.Close()

	cancel := sendAsync(context.Background(), c.url, "s1", cancelledBody)
	o.next(t) // held upstream until releaseCancel
	reply := sendAsync(context.Background(), c.url, "s1", `{"jsonrpc":"2.0","id":7,"result":{"action":"accept"}}`)
	c.awaitWaiting(t, 1)
	o.noArrival(t, "a reply while a cancellation that overtook the stream was upstream")

	o.releaseCancellation()
	if got := o.next(t); !strings.Contains(string(got.Body), `"result"`) {
		t.Fatalf("upstream got %s, want the reply", got.Body)
	}
	for name, ch := range map[string]<-chan *http.Response{"cancellation": cancel, "reply": reply} {
		if r := <-ch; r == nil || r.StatusCode != http.StatusAccepted {
			t.Fatalf("%s: %v, want 202", name, r)
		}
	}
	// The reply went while the stream still ran: it overtook it.
	o.endStream()
	if _, err := io.ReadAll(stream.Body); err != nil {
		t.Fatal(err)
	}
}

// A cancellation that overtook a stream holds the session's slot until it
// ends: the stream ending first does not let the session's next request
// reach the upstream while the cancellation is still there (the worker
// saving it writes the whole session record).
func TestTheRequestAfterAStreamWaitsForTheCancellationThatOvertookIt(t *testing.T) {
	o, addr := newOvertakeUpstream(t)
	c := startCaddy(t, fmt.Sprintf("mcp_serializer\nreverse_proxy %s {\n\tflush_interval -1\n}", addr))
	defer o.releaseAll()
	stream := startStream(t, c, o, "s1")

	cancel := sendAsync(context.Background(), c.url, "s1", cancelledBody)
	o.next(t) // held upstream until releaseCancel
	o.endStream()
	// The stream's last chunk comes once its exchange has ended here.
	if _, err := io.ReadAll(stream.Body); err != nil {
		t.Fatal(err)
	}
	stream.Body.Close()

	next := sendAsync(context.Background(), c.url, "s1", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"next"}}`)
	c.awaitWaiting(t, 1)
	o.noArrival(t, "the next request while the cancellation was upstream")

	o.releaseCancellation()
	if got := o.next(t); !strings.Contains(string(got.Body), `"next"`) {
		t.Fatalf("upstream got %s, want the next call", got.Body)
	}
	if r := <-cancel; r == nil || r.StatusCode != http.StatusAccepted {
		t.Fatalf("cancellation: %v, want 202", r)
	}
	if r := <-next; r == nil || r.StatusCode != http.StatusOK {
		t.Fatalf("next call: %v, want 200", r)
	}
}

// A 404 to a reply that overtook a stream ends the session, but the id's
// next request still waits for the stream rather than reach the upstream
// beside it.
func TestA404ToAnOvertakingReplyLeavesTheNextRequestBehindTheStream(t *testing.T) {
	o, addr := newOvertakeUpstream(t)
	c := startCaddy(t, fmt.Sprintf("mcp_serializer\nreverse_proxy %s {\n\tflush_interval -1\n}", addr))
	defer o.releaseAll()
	stream := startStream(t, c, o, "s1")
	defer stream.Body.Close()

	resp := post(t, c.url, "s1", `{"jsonrpc":"2.0","id":7,"result":{"gone":true}}`)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("reply: %s, want 404", resp.Status)
	}
	o.next(t)
	next := sendAsync(context.Background(), c.url, "s1", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"next"}}`)
	c.awaitWaiting(t, 1)
	o.noArrival(t, "the next request while the stream ran")

	o.endStream()
	if got := o.next(t); !strings.Contains(string(got.Body), `"next"`) {
		t.Fatalf("upstream got %s, want the next call", got.Body)
	}
	if r := <-next; r == nil || r.StatusCode != http.StatusOK {
		t.Fatalf("next call: %v, want 200", r)
	}
}
