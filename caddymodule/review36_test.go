package caddymodule_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/owner"
)

// Every client learns instance IDs from its session ids. A client that
// sends a session's request straight to another instance with
// Mcp-Serializer-Owner naming that instance must not get it served
// there, beside the session's owner.
func TestAClientsOwnerHeaderNamingAnotherInstanceDoesNotServeTheSessionThere(t *testing.T) {
	var minted, running, peak atomic.Int64
	release := make(chan struct{})
	echo := echoingAnswer(func() string { return fmt.Sprintf("up-%d", minted.Add(1)) })
	_, addr := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if r.Header.Get("Mcp-Session-Id") == "up-1" && strings.Contains(string(body), "tools/call") {
			n := running.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			select {
			case <-release:
			case <-time.After(3 * time.Second):
			}
			defer running.Add(-1)
		}
		echo(w, r, body)
	})
	in := startOwnerInstances(t, addr)
	ctx := context.Background()
	cid := call(ctx, http.DefaultClient, http.MethodPost, in.a, "", initializeBody).header.Get("Mcp-Session-Id")
	call(ctx, http.DefaultClient, http.MethodPost, in.a, cid, initializedBody)
	in.waitForOwnerRecord(t, "up-1")
	idb, _, ok := owner.SplitOwner(call(ctx, http.DefaultClient, http.MethodPost, in.b, "", initializeBody).header.Get("Mcp-Session-Id"))
	if !ok {
		t.Fatal("b's session id names no owner")
	}

	first := make(chan answer, 1)
	go func() {
		first <- call(ctx, http.DefaultClient, http.MethodPost, in.a, cid, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"slow"}}`)
	}()
	for running.Load() == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	req, _ := http.NewRequest(http.MethodPost, in.b, strings.NewReader(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"slow"}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", cid)
	req.Header.Set("Mcp-Serializer-Owner", idb)
	second := make(chan *http.Response, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		second <- resp
	}()
	time.Sleep(time.Second)
	close(release)
	<-first
	if resp := <-second; resp != nil {
		t.Logf("the request with the owner header: %s", resp.Status)
	}
	if p := peak.Load(); p > 1 {
		t.Fatalf("%d of the session's calls ran upstream at once: the one sent to b with its ID as owner ran beside the owner's", p)
	}
}
