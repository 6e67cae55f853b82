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

// A reload that keeps site a but turns its order from owner to local
// (same name, same Redis) keeps a's table, and with it a's membership
// loop: a goes on renewing its lease and is never handed over, so b
// forwards a's sessions there, a runs them upstream without stamping the
// answer, and b answers the client 502 "may have reached the MCP server".
func TestAReloadThatTurnsOrderOwnerOffHandsTheSessionsOver(t *testing.T) {
	var minted, hits atomic.Int64
	_, addr := newUpstream(t, func() func(http.ResponseWriter, *http.Request, []byte) {
		echo := echoingAnswer(func() string { return fmt.Sprintf("up-%d", minted.Add(1)) })
		return func(w http.ResponseWriter, r *http.Request, b []byte) { hits.Add(1); echo(w, r, b) }
	}())
	in := startOwnerInstances(t, addr)
	ctx := context.Background()
	cid := call(ctx, http.DefaultClient, http.MethodPost, in.a, "", initializeBody).header.Get("Mcp-Session-Id")
	if _, _, ok := owner.SplitOwner(cid); !ok {
		t.Fatalf("a's session id %q names no owner", cid)
	}
	call(ctx, http.DefaultClient, http.MethodPost, in.a, cid, initializedBody)

	full := in.caddyfile("")
	start := strings.Index(full, in.a+" {")
	end := strings.Index(full[start:], "\n}\n") + start + 3
	site := strings.Replace(full[start:end], "order owner", "order local", 1)
	loadThroughAdmin(t, in.admin, full[:start]+site+full[end:])
	time.Sleep(owner.LeaseLife + time.Second)

	before := hits.Load()
	a := call(ctx, http.DefaultClient, http.MethodPost, in.b, cid, rpcRequest("2", "tools/list"))
	if a.status != http.StatusOK {
		t.Fatalf("after a's order owner was turned off, the session's request at b: %d (upstream ran it %d times) %s",
			a.status, hits.Load()-before, a.body)
	}
}
