package caddymodule_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/testnet"
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
	in := startOwnerInstances(t, addr, append([]string{"upstream_sessions instance", "instance_name replica-{instance}", "advertise 127.0.0.1:{port}"}, settings...)...)
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
	return up, in, cid, withoutSite(in.caddyfile(""), in.a)
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
	if want := owner.IDFor("replica-a", "a"); named != want {
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
	// Counted once the forward has ended, which may be after its client
	// has the answer.
	wait.Until(t, "b counting its forward to a", func() bool { return scrapeMetric(t, in.b, forwardedSeries) > sent })
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
	wait.Until(t, "b counting its forward to a", func() bool { return scrapeMetric(t, in.b, forwardedSeries) > sent })
}

// withoutSite is the config without the site at url: that instance
// stopped, as a reload dropping its site does.
func withoutSite(full, url string) string {
	return siteWith(full, url, func(string) string { return "" })
}

// orderLocal turns a site's order owner into order local.
func orderLocal(site string) string { return strings.Replace(site, "order owner", "order local", 1) }

// siteWith is the config with the site at url changed by edit.
func siteWith(full, url string, edit func(site string) string) string {
	start := strings.Index(full, url+" {")
	end := strings.Index(full[start:], "\n}\n") + start + 3
	return full[:start] + edit(full[start:end]) + full[end:]
}

// cutOffFromRedis is the config with the site at url on a Redis address
// nothing answers at.
func cutOffFromRedis(t *testing.T, full, url string) string {
	dead := "127.0.0.1:" + strconv.Itoa(testnet.FreePort(t))
	return siteWith(full, url, func(site string) string {
		return regexp.MustCompile(`state redis \S+`).ReplaceAllString(site, "state redis "+dead)
	})
}

// A key is a user's line, which no upstream holds: with upstream_sessions
// instance, one whose instance is gone is taken over as before, and its
// user starts a session elsewhere.
func TestWithInstanceSessionsAKeyWhoseInstanceIsGoneIsTakenOver(t *testing.T) {
	_, addr := newUpstream(t, mcpAnswer("keyed-session", nil))
	in := startOwnerInstances(t, addr, "upstream_sessions instance", "instance_name replica-{instance}",
		"advertise 127.0.0.1:{port}", "key {http.request.header.X-User}", "queue_timeout 2s")
	ctx := context.Background()
	send := func(site, body string) answer {
		req, _ := http.NewRequest(http.MethodPost, site, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("X-User", "alice")
		resp, err := do(http.DefaultClient, req)
		if err != nil {
			return answer{err: err}
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return answer{status: resp.StatusCode, body: b}
	}
	if a := send(in.a, rpcRequest("1", "tools/list")); a.status != http.StatusOK {
		t.Fatalf("alice at a: %d %s", a.status, a.body)
	}
	aID := owner.IDFor("replica-a", "a")
	record := "mcp_serializer:" + serializer.StoreKey(keyLine("alice"))
	wait.Until(t, "a's claim on alice's key", func() bool {
		o, _ := in.redis.HGet(ctx, record, "owner").Result()
		return strings.HasPrefix(o, aID+" ")
	})
	loadThroughAdmin(t, in.admin, withoutSite(in.caddyfile(""), in.a))
	lease, _ := in.redis.HGet(ctx, "mcp_serializer:members", aID).Result()
	_, rest, _ := strings.Cut(lease, " ")
	in.redis.HSet(ctx, "mcp_serializer:members", aID, "1 "+rest) // lapsed long ago
	var last answer
	wait.Until(t, "alice's initialize served at b", func() bool {
		last = send(in.b, initializeBody)
		if last.status != http.StatusOK && last.status != http.StatusServiceUnavailable {
			t.Fatalf("alice's initialize at b, a gone: %d %s; want it served once a's lease is seen lapsed", last.status, last.body)
		}
		return last.status == http.StatusOK
	})
}

// An instance started again renews its lease before any request reaches
// it: its clients may be idle, and the others would otherwise see its
// kept lease lapse and answer its live sessions 404.
func TestWithInstanceSessionsAnInstanceStartedAgainRenewsItsLeaseBeforeAnyRequest(t *testing.T) {
	_, in, cid, withoutA := startPinnedInstances(t)
	named, _, _ := owner.SplitOwner(cid)
	loadThroughAdmin(t, in.admin, withoutA)
	kept, _ := in.leaseByID(t, named)
	loadThroughAdmin(t, in.admin, in.caddyfile(""))
	wait.Until(t, "a renewing its lease with no request", func() bool {
		lapses, _ := in.leaseByID(t, named)
		return !lapses.Equal(kept)
	})
}

// An instance that cannot reach Redis, and so has never listed the
// instance a session's id names, never serves that session at its own
// upstream, which never had it: it waits, then answers 503.
func TestWithInstanceSessionsAnInstanceCutOffFromRedisNeverServesAnotherInstancesSession(t *testing.T) {
	up, in, cid, _ := startPinnedInstances(t, "queue_timeout 1s")
	full := in.caddyfile("")
	// b starts again, cut off from Redis: it lists nobody.
	loadThroughAdmin(t, in.admin, withoutSite(full, in.b))
	loadThroughAdmin(t, in.admin, cutOffFromRedis(t, full, in.b))
	before := len(up.requests())
	a := call(context.Background(), http.DefaultClient, http.MethodPost, in.b, cid, rpcRequest("3", "tools/list"))
	if a.status != http.StatusServiceUnavailable {
		t.Fatalf("a's session at b, cut off from Redis: %d %s; want 503", a.status, a.body)
	}
	if n := len(up.requests()) - before; n != 0 {
		t.Fatalf("the upstream ran a's session's request %d times at b, want never", n)
	}
}

// An instance cut off from Redis alone lives on and serves its sessions;
// once its lease is seen lapsed, the others still forward its sessions'
// requests to it, and answer 404 only if nothing answers there as it.
func TestWithInstanceSessionsALiveInstanceCutOffFromRedisIsStillForwardedTo(t *testing.T) {
	_, in, cid, _ := startPinnedInstances(t)
	named, _, _ := owner.SplitOwner(cid)
	loadThroughAdmin(t, in.admin, cutOffFromRedis(t, in.caddyfile(""), in.a))
	in.waitLapsedForOthers(t, named)
	ctx := context.Background()
	expectResult(t, call(ctx, http.DefaultClient, http.MethodPost, in.a, cid, rpcRequest("4", "tools/list")), "4")
	expectResult(t, call(ctx, http.DefaultClient, http.MethodPost, in.b, cid, rpcRequest("3", "tools/list")), "3")
}

// A client that names, in the forwarding header, the instance its request
// reaches does not have another instance's session served there: only a
// session whose id names an instance is served by it unseen.
func TestWithInstanceSessionsAClientsOwnerHeaderDoesNotServeAnotherInstancesSession(t *testing.T) {
	up, in, cid, _ := startPinnedInstances(t)
	before := len(up.requests())
	req, _ := http.NewRequest(http.MethodPost, in.b, strings.NewReader(rpcRequest("3", "tools/list")))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", cid)
	req.Header.Set("Mcp-Serializer-Owner", owner.IDFor("replica-b", "b"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMisdirectedRequest {
		t.Fatalf("a's session at b with b named in the forwarding header: %d; want 421", resp.StatusCode)
	}
	if n := len(up.requests()) - before; n != 0 {
		t.Fatalf("the upstream ran it %d times, want never", n)
	}
}

// startPinnedBlocking is startPinnedInstances with an upstream whose
// requests naming "block" run until release is closed.
func startPinnedBlocking(t *testing.T, release <-chan struct{}, settings ...string) (*upstream, *ownerInstances, string) {
	t.Helper()
	var minted atomic.Int64
	echo := echoingAnswer(func() string { return fmt.Sprintf("up-%d", minted.Add(1)) })
	up, addr := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if strings.Contains(string(body), "block") {
			<-release
		}
		echo(w, r, body)
	})
	in := startOwnerInstances(t, addr, append([]string{"upstream_sessions instance", "instance_name replica-{instance}", "advertise 127.0.0.1:{port}"}, settings...)...)
	ctx := context.Background()
	cid := call(ctx, http.DefaultClient, http.MethodPost, in.a, "", initializeBody).header.Get("Mcp-Session-Id")
	call(ctx, http.DefaultClient, http.MethodPost, in.a, cid, initializedBody)
	wait.Until(t, "b forwarding the session's requests to a", func() bool {
		sent := scrapeMetric(t, in.b, forwardedSeries)
		expectResult(t, call(ctx, http.DefaultClient, http.MethodPost, in.b, cid, rpcRequest("2", "tools/list")), "2")
		return scrapeMetric(t, in.b, forwardedSeries) > sent
	})
	return up, in, cid
}

// waitLapsedForOthers waits until instance id's lease has lapsed and
// stayed so past the lock delay and the others' next listings.
func (in *ownerInstances) waitLapsedForOthers(t *testing.T, id string) {
	t.Helper()
	lapses, _ := in.leaseByID(t, id)
	wait.Until(t, "the lease lapsed past the lock delay and the next listings", func() bool {
		return time.Now().After(lapses.Add(owner.LeaseLife + 2*time.Second))
	})
}

// An instance cut off from Redis alone, whose lease lapsed, answers its
// sessions' requests its own way, a 503 too (max_buffered full): that
// answer is its own, stamped, and passed on, not taken for another
// program's and turned into a 404 that would end a live session.
func TestWithInstanceSessionsALapsedLiveInstancesOwn503IsPassedOn(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	up, in, cid := startPinnedBlocking(t, release, "max_body 1KiB", "max_buffered 1100", "queue_timeout 5s")
	named, _, _ := owner.SplitOwner(cid)
	loadThroughAdmin(t, in.admin, cutOffFromRedis(t, in.caddyfile(""), in.a))
	in.waitLapsedForOthers(t, named)
	ctx := context.Background()
	// A long call at a holds about 1000 bytes of a's max_buffered.
	callAsync(ctx, http.MethodPost, in.a, cid, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"block","pad":"`+strings.Repeat("x", 900)+`"}}`)
	wait.Until(t, "the long call upstream", func() bool {
		for _, r := range up.requests() {
			if strings.Contains(string(r.Body), "block") {
				return true
			}
		}
		return false
	})
	a := call(ctx, http.DefaultClient, http.MethodPost, in.b, cid, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"pad":"`+strings.Repeat("y", 200)+`"}}`)
	if a.status != http.StatusServiceUnavailable || !strings.Contains(string(a.body), "max_buffered") {
		t.Fatalf("at b, while a's max_buffered is full: %d %s; want a's own 503", a.status, a.body)
	}
}

// With key, a session's request follows its session, to the instance
// whose upstream holds it, not its key's line: once that instance is seen
// lapsed (cut off from Redis alone, alive), another instance that takes
// the user's line over still forwards the session there.
func TestWithInstanceSessionsAKeyedSessionFollowsItsSessionNotItsKeysLine(t *testing.T) {
	var minted atomic.Int64
	_, addr := newUpstream(t, echoingAnswer(func() string { return fmt.Sprintf("up-%d", minted.Add(1)) }))
	in := startOwnerInstances(t, addr, "upstream_sessions instance", "instance_name replica-{instance}",
		"advertise 127.0.0.1:{port}", "key {http.request.header.X-User}", "queue_timeout 2s")
	send := func(site, sid, body string) answer {
		req, _ := http.NewRequest(http.MethodPost, site, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("X-User", "alice")
		if sid != "" {
			req.Header.Set("Mcp-Session-Id", sid)
		}
		resp, err := do(http.DefaultClient, req)
		if err != nil {
			return answer{err: err}
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return answer{status: resp.StatusCode, header: resp.Header, body: b}
	}
	cid := send(in.a, "", initializeBody).header.Get("Mcp-Session-Id")
	named, _, ok := owner.SplitOwner(cid)
	if !ok || named != owner.IDFor("replica-a", "a") {
		t.Fatalf("alice's session %q: want one naming a", cid)
	}
	send(in.a, cid, initializedBody)
	wait.Until(t, "b forwarding alice's session to a", func() bool {
		sent := scrapeMetric(t, in.b, forwardedSeries)
		send(in.b, cid, rpcRequest("2", "tools/list"))
		return scrapeMetric(t, in.b, forwardedSeries) > sent
	})
	loadThroughAdmin(t, in.admin, cutOffFromRedis(t, in.caddyfile(""), in.a))
	in.waitLapsedForOthers(t, named)
	sent := scrapeMetric(t, in.b, forwardedSeries)
	expectResult(t, send(in.b, cid, rpcRequest("3", "tools/list")), "3")
	wait.Until(t, "b forwarding alice's session to a, alive", func() bool { return scrapeMetric(t, in.b, forwardedSeries) > sent })
}
