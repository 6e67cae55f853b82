package caddymodule_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/wait"
	"github.com/mcpserializer/caddy-mcp-serializer/owner"
	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// With upstream_sessions instance, each instance's upstream keeps its own
// sessions in memory: a session stays with the instance that created it.

// The series the tests read, as deltas: metrics are the process's.
const (
	takeoversSeries = "caddy_mcp_serializer_takeovers_total"
	forwardedSeries = `caddy_mcp_serializer_forwards_total{result="forwarded"}`
)

// startPinnedInstances starts instances a and b with upstream_sessions
// instance and a session created on a, which b forwards to a, and returns
// the session's id and the config without a's site (a stopped, as a
// reload dropping it does).
func startPinnedInstances(t *testing.T, settings ...string) (*upstream, *ownerInstances, string, string) {
	t.Helper()
	var minted atomic.Int64
	up, addr := newUpstream(t, echoingAnswer(func() string { return fmt.Sprintf("up-%d", minted.Add(1)) }))
	in := startOwnerInstances(t, addr, append([]string{"upstream_sessions instance", "instance_name replica-{instance}"}, settings...)...)
	ctx := context.Background()
	cid := call(ctx, http.DefaultClient, http.MethodPost, in.a, "", initializeBody).header.Get("Mcp-Session-Id")
	if _, _, ok := owner.SplitOwner(cid); !ok {
		t.Fatalf("a's session id %q names no owner", cid)
	}
	call(ctx, http.DefaultClient, http.MethodPost, in.a, cid, initializedBody)
	// b routes by the id once its listing shows a's lease.
	wait.Until(t, "b forwarding the session's requests to a", func() bool {
		sent := scrapeMetric(t, in.b, forwardedSeries)
		expectResult(t, call(ctx, http.DefaultClient, http.MethodPost, in.b, cid, rpcRequest("2", "tools/list")), "2")
		return scrapeMetric(t, in.b, forwardedSeries) > sent
	})
	full := in.caddyfile("")
	start := strings.Index(full, in.a+" {")
	end := strings.Index(full[start:], "\n}\n") + start + 3
	return up, in, cid, full[:start] + full[end:]
}

// leaseByID is instance id's lease as Redis holds it: when it lapses,
// and whether its instance dropped it.
func (in *ownerInstances) leaseByID(t *testing.T, id string) (lapses time.Time, dropped bool) {
	t.Helper()
	lease, err := in.redis.HGet(context.Background(), "mcp_serializer:members", id).Result()
	if err != nil {
		t.Fatalf("instance %s's lease: %v", id, err)
	}
	f := strings.Fields(lease)
	ms, _ := strconv.ParseInt(f[0], 10, 64)
	return time.UnixMilli(ms), strings.HasPrefix(f[1], "d")
}

// A stopped instance (a reload dropping its site, as SIGTERM does) does
// not hand its sessions over: it keeps its lease, another instance's
// request for its session waits for it, and once it is back under the
// same instance_name the request is served there, by the upstream that
// holds the session.
func TestWithInstanceSessionsAStoppedInstancesSessionWaitsForItAndIsServedThereAgain(t *testing.T) {
	up, in, cid, withoutA := startPinnedInstances(t, "queue_timeout 30s")
	named, upstreamID, _ := owner.SplitOwner(cid)
	if want := owner.IDFor("replica-a"); named != want {
		t.Fatalf("a's session id names instance %s, want %s, named for its instance_name", named, want)
	}
	loadThroughAdmin(t, in.admin, withoutA)
	kept, dropped := in.leaseByID(t, named)
	if dropped || !kept.After(time.Now()) {
		t.Fatalf("a's lease after it stopped: lapses %v, dropped %v; want kept for its restart", kept, dropped)
	}
	if o := in.recordField(upstreamID, "owner"); !strings.HasPrefix(o, named+" ") {
		t.Fatalf("after a stopped its session's record names %q, want a still", o)
	}
	before := len(up.requests())
	took, sent := scrapeMetric(t, in.b, takeoversSeries), scrapeMetric(t, in.b, forwardedSeries)
	ctx := context.Background()
	const unreachable = `caddy_mcp_serializer_forwards_total{result="unreachable"}`
	tried := scrapeMetric(t, in.b, unreachable)
	answered := callAsync(ctx, http.MethodPost, in.b, cid, rpcRequest("3", "tools/list"))
	wait.Until(t, "b's request waiting for a", func() bool { return scrapeMetric(t, in.b, unreachable) > tried })
	loadThroughAdmin(t, in.admin, in.caddyfile(""))
	expectResult(t, await(t, answered, time.Minute, "the session's request at b"), "3")
	if n := len(up.requests()) - before; n != 1 {
		t.Fatalf("the upstream ran the request %d times, want once", n)
	}
	if n := scrapeMetric(t, in.b, takeoversSeries) - took; n != 0 {
		t.Fatalf("b took over %v sessions, want none: only a's upstream holds them", n)
	}
	if n := scrapeMetric(t, in.b, forwardedSeries) - sent; n != 1 {
		t.Fatalf("b forwarded %v requests to a once it was back, want the one", n)
	}
	// Back, a renews its lease though it has met only forwarded requests.
	wait.Until(t, "a renewing its lease again", func() bool {
		lapses, _ := in.leaseByID(t, named)
		return !lapses.Equal(kept)
	})
}

// Once a stopped instance's lease has lapsed for good (it did not come
// back, or was killed), its sessions' requests are answered 404 where
// they land, so that their clients start new sessions at once; none is
// served by another instance's upstream, which never had it.
func TestWithInstanceSessionsASessionWhoseInstanceIsGoneIsAnswered404(t *testing.T) {
	up, in, cid, withoutA := startPinnedInstances(t, "queue_timeout 1s")
	named, _, _ := owner.SplitOwner(cid)
	loadThroughAdmin(t, in.admin, withoutA)
	lease, err := in.redis.HGet(context.Background(), "mcp_serializer:members", named).Result()
	if err != nil {
		t.Fatal(err)
	}
	// Lapsed long ago, as a killed instance's lease ends up.
	_, rest, _ := strings.Cut(lease, " ")
	in.redis.HSet(context.Background(), "mcp_serializer:members", named, "1 "+rest)
	before := len(up.requests())
	took := scrapeMetric(t, in.b, takeoversSeries)
	var last answer
	wait.Until(t, "b answering 404 for the gone instance's session", func() bool {
		last = call(context.Background(), http.DefaultClient, http.MethodPost, in.b, cid, rpcRequest("3", "tools/list"))
		if last.status != http.StatusServiceUnavailable && last.status != http.StatusNotFound {
			t.Fatalf("while a's lease lapses: %d %s; want 503 (waiting for a) or 404", last.status, last.body)
		}
		return last.status == http.StatusNotFound
	})
	var got struct {
		ID    json.RawMessage    `json:"id"`
		Error struct{ Code int } `json:"error"`
	}
	if err := json.Unmarshal(last.body, &got); err != nil || got.Error.Code != -32001 || string(got.ID) != "3" {
		t.Fatalf("the 404's body %s: want JSON-RPC error -32001 for request 3", last.body)
	}
	if n := len(up.requests()) - before; n != 0 {
		t.Fatalf("the upstream got %d of the gone session's requests, want none", n)
	}
	if n := scrapeMetric(t, in.b, takeoversSeries) - took; n != 0 {
		t.Fatalf("b took over %v sessions, want none", n)
	}
}

// A GET stream refused here (get_stream reject) is refused by its owner
// too: it is answered 405 where it lands, never forwarded.
func TestARefusedGetStreamIsAnswered405WhereItLandsNotForwarded(t *testing.T) {
	_, in, cid, _ := startPinnedInstances(t)
	before := scrapeMetric(t, in.b, forwardedSeries)
	a := call(context.Background(), http.DefaultClient, http.MethodGet, in.b, cid, "")
	if a.status != http.StatusMethodNotAllowed {
		t.Fatalf("GET at b for a's session: %d %s; want 405", a.status, a.body)
	}
	if n := scrapeMetric(t, in.b, forwardedSeries) - before; n != 0 {
		t.Fatalf("b forwarded the GET %v times, want never", n)
	}
}

// An instance started again serves its sessions whatever their records
// say, none included (Redis restarted empty meanwhile): only its upstream
// can hold a session whose id names it.
func TestWithInstanceSessionsAnInstanceStartedAgainServesItsSessionWithoutItsRecord(t *testing.T) {
	up, in, cid, withoutA := startPinnedInstances(t)
	_, upstreamID, _ := owner.SplitOwner(cid)
	loadThroughAdmin(t, in.admin, withoutA)
	if err := in.redis.Del(context.Background(), "mcp_serializer:"+serializer.StoreKey(upstreamID)).Err(); err != nil {
		t.Fatal(err)
	}
	loadThroughAdmin(t, in.admin, in.caddyfile(""))
	before := len(up.requests())
	took, sent := scrapeMetric(t, in.b, takeoversSeries), scrapeMetric(t, in.b, forwardedSeries)
	expectResult(t, call(context.Background(), http.DefaultClient, http.MethodPost, in.b, cid, rpcRequest("3", "tools/list")), "3")
	if n := len(up.requests()) - before; n != 1 {
		t.Fatalf("the upstream ran the request %d times, want once", n)
	}
	if n := scrapeMetric(t, in.b, takeoversSeries) - took; n != 0 {
		t.Fatalf("b took over %v sessions, want none: only a's upstream holds them", n)
	}
	if n := scrapeMetric(t, in.b, forwardedSeries) - sent; n != 1 {
		t.Fatalf("b forwarded %v requests to a, want the one", n)
	}
}
