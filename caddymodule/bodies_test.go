package caddymodule_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
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
