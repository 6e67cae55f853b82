package caddymodule_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/owner"
	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
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

// A session's record names an owner at an address now held by another
// program (the owner's pod is gone and its IP given to another service).
// Whatever answers there must not reach the client as the owner's answer,
// nor get the client's credentials.
func TestAnAnswerFromAnotherProgramAtARecordedOwnersAddressIsNotPassedOn(t *testing.T) {
	_, addr := newUpstream(t, nil)
	in := startOwnerInstances(t, addr)
	var sawAuth atomic.Value
	stranger := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sawAuth.Store(r.Header.Get("Authorization"))
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{"from":"stranger"}}`)
	}))
	defer stranger.Close()
	ctx := context.Background()
	key := "mcp_serializer:" + serializer.StoreKey("moved")
	gone := owner.Owner{ID: "0123456789abcdef", Addr: strings.TrimPrefix(stranger.URL, "http://")}
	if err := in.redis.HSet(ctx, key, "open", "1", "deadline", "0", "inflight", "0", "owner", gone.String()).Err(); err != nil {
		t.Fatal(err)
	}
	in.redis.Expire(ctx, key, time.Hour)
	req, _ := http.NewRequest(http.MethodPost, in.b, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", "moved")
	req.Header.Set("Authorization", "Bearer secret-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.Contains(string(body), "stranger") {
		t.Fatalf("the client got the other program's answer as its session's: %s %s", resp.Status, body)
	}
	if v, _ := sawAuth.Load().(string); v != "" {
		t.Fatalf("the other program got the client's Authorization %q", v)
	}
}
