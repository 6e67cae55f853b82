package caddymodule_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/wait"
)

// openBody starts a POST of session sid on a connection of its own that
// announces a body of length bytes with Expect: 100-continue, and returns
// once Caddy has asked for the body: the handler is reading it. The
// caller sends the body, or not, and closes the connection.
func openBody(t *testing.T, c *testCaddy, sid string, length int) (net.Conn, *bufio.Reader) {
	t.Helper()
	host := strings.TrimPrefix(c.url, "http://")
	conn, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"+
		"Mcp-Session-Id: %s\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n", host, sid, length)
	conn.SetReadDeadline(time.Now().Add(10 * time.Second)) // a bound, not a delay
	rd := bufio.NewReader(conn)
	resp, err := http.ReadResponse(rd, nil)
	if err != nil || resp.StatusCode != http.StatusContinue {
		t.Fatalf("POST announcing %d bytes: %v %v; want 100 Continue", length, resp, err)
	}
	conn.SetReadDeadline(time.Time{})
	return conn, rd
}

// Clients that announce bodies and send nothing hold no part of
// max_buffered: as many as their announced sizes would fill it with leave
// another session's POST served. A body holds what has arrived of it.
func TestBodiesAnnouncedButNotSentLockNoSessionOut(t *testing.T) {
	const idle = 8
	up, addr := newUpstream(t, nil)
	c := startCaddy(t, "mcp_serializer {\n\tmax_body 64KiB\n\tmax_buffered 512KiB\n}\nreverse_proxy "+addr)
	for i := range idle {
		openBody(t, c, fmt.Sprintf("idle-%d", i), 64<<10)
	}
	a := call(context.Background(), http.DefaultClient, http.MethodPost, c.url, "bystander", rpcRequest("1", "tools/list"))
	expectResult(t, a, "1")
	if n := len(up.requests()); n != 1 {
		t.Fatalf("upstream saw %d requests, want the bystander's only", n)
	}
}

// A reply larger than max_body (a sampling result carrying an image) is
// told a reply by its first bytes: it goes upstream beside the stream
// that waits for it, and the stream then ends with its result, rather than
// the reply waiting behind the stream until queue_timeout. The
// TypeScript SDK writes the id after the result, out of the first bytes.
func TestReplyLargerThanMaxBodySkipsTheStreamItAnswers(t *testing.T) {
	image := `{"role":"assistant","content":{"type":"image","mimeType":"image/png","data":"` + strings.Repeat("A", 8<<10) + `"}}`
	for name, reply := range map[string]string{
		"id first":                  `{"jsonrpc":"2.0","id":"sampling-1","result":` + image + `}`,
		"result first (TypeScript)": `{"result":` + image + `,"jsonrpc":"2.0","id":"sampling-1"}`,
	} {
		t.Run(name, func(t *testing.T) { replyLargerThanMaxBodySkipsTheStream(t, reply) })
	}
}

func replyLargerThanMaxBodySkipsTheStream(t *testing.T, reply string) {
	const sid = "big-reply"
	replied := make(chan struct{})
	up, addr := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if strings.Contains(string(body), `"result"`) {
			close(replied)
			w.WriteHeader(http.StatusAccepted)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"jsonrpc\":\"2.0\",\"id\":\"sampling-1\",\"method\":\"sampling/createMessage\",\"params\":{}}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-replied:
			io.WriteString(w, "data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"content\":[]}}\n\n")
		case <-r.Context().Done():
		case <-time.After(10 * time.Second): // a bound, should the reply never come
		}
	})
	c := startCaddy(t, "mcp_serializer {\n\tmax_body 1KiB\n\tqueue_timeout 2s\n}\nreverse_proxy "+addr+" {\n\tflush_interval -1\n}")

	resp := post(t, c.url, sid, rpcRequest("1", "tools/call"))
	defer resp.Body.Close()
	events := bufio.NewReader(resp.Body)
	if line, err := events.ReadString('\n'); err != nil || !strings.Contains(line, "sampling/createMessage") {
		t.Fatalf("first event %q, %v; want the server's sampling request", line, err)
	}
	a := call(context.Background(), http.DefaultClient, http.MethodPost, c.url, sid, reply)
	if a.err != nil || a.status != http.StatusAccepted {
		t.Fatalf("reply of %d bytes: status %d %v %s; want 202 from the upstream", len(reply), a.status, a.err, a.body)
	}
	rest, err := io.ReadAll(events)
	if err != nil || !strings.Contains(string(rest), `"id":1,"result"`) {
		t.Fatalf("the stream ended with %q, %v; want the call's result", rest, err)
	}
	var got seenRequest
	for _, r := range up.requests() {
		if strings.Contains(string(r.Body), `"sampling-1"`) && !strings.Contains(string(r.Body), "method") {
			got = r
		}
	}
	if string(got.Body) != reply {
		t.Fatalf("upstream got a reply of %d bytes, want the %d sent", len(got.Body), len(reply))
	}
}

// A client that sends part of a body over max_body to a queued session
// and leaves is never forwarded, not even in part: net/http does not see
// an HTTP/1 client leave before its body is read, so the module asks the
// connection before the request's turn. The session goes on as usual.
func TestLargePOSTWhoseClientLeftWhileQueuedIsNeverForwarded(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the connection is asked through Linux's POLLRDHUP")
	}
	const sid = "left-large"
	up, addr, release := blockingUpstream(t)
	c := startCaddy(t, "metrics /metrics\nmcp_serializer {\n\tmax_body 1KiB\n}\nreverse_proxy "+addr)
	gone := func() float64 {
		return scrapeCounter(t, c, `caddy_mcp_serializer_rejections_total{reason="client_gone"}`)
	}
	goneBefore := gone()
	first := sendAsync(context.Background(), c.url, sid, `{"jsonrpc":"2.0","id":1,"method":"block"}`)
	up.next(t)

	body := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"data":"` + strings.Repeat("x", 16<<10) + `"}}`
	host := strings.TrimPrefix(c.url, "http://")
	conn, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nMcp-Session-Id: %s\r\nContent-Length: %d\r\n\r\n%s",
		host, sid, len(body), body[:6<<10])
	c.awaitWaiting(t, 1)
	clientPort := conn.LocalAddr().(*net.TCPAddr).Port
	conn.Close()
	wait.Until(t, "Caddy's side of the connection sees the client close", func() bool {
		return tcpState(t, c.port, clientPort) == tcpCloseWait
	})

	close(release)
	if resp := <-first; resp == nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the exchange the large POST waited behind: %v", resp)
	}
	forwarded := func() bool {
		for _, r := range up.requests() {
			if strings.Contains(string(r.Body), "tools/call") {
				return true
			}
		}
		return false
	}
	wait.Until(t, "the large POST dropped or forwarded", func() bool { return gone() > goneBefore || forwarded() })
	if forwarded() {
		t.Fatal("the upstream got part of a body whose client had left while it waited")
	}
	expectResult(t, call(context.Background(), http.DefaultClient, http.MethodPost, c.url, sid, rpcRequest("1", "ping")), "1")
	if forwarded() {
		t.Fatal("the upstream got part of a body whose client had left while it waited")
	}
}

// scrapeCounter reads one series from Caddy's metrics (0 if absent).
func scrapeCounter(t *testing.T, c *testCaddy, series string) float64 {
	t.Helper()
	resp, err := http.Get(c.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if value, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			v, _ := strconv.ParseFloat(value, 64)
			return v
		}
	}
	return 0
}

const tcpCloseWait = "08" // the peer's FIN came; the socket is still open here

// tcpState is the state, as /proc/net shows it, of the server's side of
// the loopback connection between serverPort and clientPort, or "". Caddy
// listens on every address, so IPv4 connections may show as IPv6 ones.
func tcpState(t *testing.T, serverPort, clientPort int) string {
	t.Helper()
	for file, loopback := range map[string]string{"/proc/net/tcp": "0100007F", "/proc/net/tcp6": "0000000000000000FFFF00000100007F"} {
		table, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		local := fmt.Sprintf("%s:%04X", loopback, serverPort)
		remote := fmt.Sprintf("%s:%04X", loopback, clientPort)
		for _, line := range strings.Split(string(table), "\n") {
			if f := strings.Fields(line); len(f) > 3 && f[1] == local && f[2] == remote {
				return f[3]
			}
		}
	}
	return ""
}
