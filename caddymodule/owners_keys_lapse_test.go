package caddymodule_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/wait"
	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// leaseOf reads the lease Redis keeps for the instance reached at url:
// its ID, expiry (unix ms), epoch and address.
func (in *ownerInstances) leaseOf(t *testing.T, url string) (id string, exp int64, epoch, addr string) {
	t.Helper()
	all, err := in.redis.HGetAll(context.Background(), "mcp_serializer:members").Result()
	if err != nil {
		t.Fatal(err)
	}
	want := strings.TrimPrefix(url, "http://")
	for field, v := range all {
		parts := strings.SplitN(v, " ", 3)
		if len(parts) == 3 && parts[2] == want {
			exp, _ := strconv.ParseInt(parts[0], 10, 64)
			return field, exp, strings.TrimPrefix(parts[1], "d"), parts[2]
		}
	}
	return "", 0, "", ""
}

// A key's owner (a) frozen past its lease: b takes the key over (its
// record names b). a wakes and renews, learning from the epoch that its
// lease lapsed. A tools/list of the key reaching a then goes through
// Confirm and is sent to b; an initialize of the key does not: since
// Confirm moved from previousOwnerDone into serveInTurn, the keyed
// initialize path (serveKeyedInitialize) never confirms, and a serves it
// upstream beside b.
func TestAKeyedInitializeAtAnOwnerWhoseLeaseLapsedIsNotServedThere(t *testing.T) {
	ctx := context.Background()
	_, addr := newUpstream(t, mcpAnswer("keyed-session", nil))
	in := startOwnerInstances(t, addr, "key {http.request.header.X-User}")
	send := func(url, user, body string) answer {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("X-User", user)
		resp, err := do(http.DefaultClient, req)
		if err != nil {
			return answer{err: err}
		}
		defer resp.Body.Close()
		var b strings.Builder
		buf := make([]byte, 4096)
		for {
			n, err := resp.Body.Read(buf)
			b.WriteString(string(buf[:n]))
			if err != nil {
				break
			}
		}
		return answer{status: resp.StatusCode, header: resp.Header, body: []byte(b.String())}
	}
	// b serves something, so that it holds a lease at its address.
	if a := send(in.b, "bob", rpcRequest("1", "tools/list")); a.status != http.StatusOK {
		t.Fatalf("bob at b: %d %s", a.status, a.body)
	}
	// a meets alice's key and the upstream answers: a owns it.
	if a := send(in.a, "alice", rpcRequest("1", "tools/list")); a.status != http.StatusOK {
		t.Fatalf("alice at a: %d %s", a.status, a.body)
	}
	record := "mcp_serializer:" + serializer.StoreKey(keyLine("alice"))
	var aID, bID, bAddr string
	wait.Until(t, "both leases and a's claim on alice", func() bool {
		aID, _, _, _ = in.leaseOf(t, in.a)
		bID, _, _, bAddr = in.leaseOf(t, in.b)
		o, _ := in.redis.HGet(ctx, record, "owner").Result()
		return aID != "" && bID != "" && strings.HasPrefix(o, aID+" ")
	})

	// a is frozen past its lease; b takes alice's key over.
	epoch, now := in.lapseTo(t, aID, record, bID+" "+bAddr)
	// a wakes: its renewal finds the lease lapsed (a new epoch), and the
	// renewal after it shows that a has taken that answer in.
	var bumpedExp int64
	wait.Until(t, "a's renewal finds its lease lapsed", func() bool {
		_, exp, e, _ := in.leaseOf(t, in.a)
		bumpedExp = exp
		return e != epoch && exp > now.UnixMilli()
	})
	wait.Until(t, "a renews once more", func() bool {
		_, exp, _, _ := in.leaseOf(t, in.a)
		return exp != bumpedExp
	})

	const forwarded = `caddy_mcp_serializer_forwards_total{result="forwarded"}`
	before := scrapeMetric(t, in.a, forwarded)
	a := send(in.a, "alice", initializeBody)
	if a.status == http.StatusOK && scrapeMetric(t, in.a, forwarded) == before {
		o, _ := in.redis.HGet(ctx, record, "owner").Result()
		t.Fatalf("alice's initialize was served at a, whose lease lapsed, while the key's record names %q (b): both serve the key", o)
	}
}

// With key basic_user, a stranger who knows only a user's name sends one
// request with a wrong password to instance a: a claims the user's key
// for 30 s (the upstream answers 401, so the claim is never extended) but
// keeps the key as its own in memory for session_ttl. Once Redis lets the
// 30 s claim go, the user's next request reaching b makes b the owner,
// and a still serves the user's requests that reach it: behind round
// robin, the user's requests run at two instances at once.
func TestAUsersKeyClaimedAfterAStrangersWrongPasswordLapsedIsServedByItsNewClaimerOnly(t *testing.T) {
	ctx := context.Background()
	_, addr := startCredentialUpstream(t)
	in := startOwnerInstances(t, addr, "key basic_user")
	send := func(url, auth string) int {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(rpcRequest("1", "tools/list")))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", auth)
		resp, err := do(http.DefaultClient, req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if s := send(in.a, basic("alice", "wrong")); s != http.StatusUnauthorized {
		t.Fatalf("the stranger at a: %d", s)
	}
	record := "mcp_serializer:" + serializer.StoreKey(keyLine("basic_user alice"))
	ttl, err := in.redis.PTTL(ctx, record).Result()
	if err != nil || ttl <= 0 || ttl > 30*time.Second {
		t.Fatalf("the stranger's claim lives %v (%v), want at most 30 s", ttl, err)
	}
	// What Redis does 30 s later.
	in.redis.Del(ctx, record)

	// Alice herself, through b: b claims her key, the upstream answers.
	if s := send(in.b, basic("alice", "pw-1")); s != http.StatusOK {
		t.Fatalf("alice at b: %d", s)
	}
	wait.Until(t, "b's claim on alice's key", func() bool {
		o, _ := in.redis.HGet(ctx, record, "owner").Result()
		return o != ""
	})
	if o, _ := in.redis.HGet(ctx, record, "owner").Result(); !strings.HasSuffix(o, " "+strings.TrimPrefix(in.b, "http://")) {
		t.Fatalf("alice's key claimed by %q, want b (%s)", o, in.b)
	}
	const forwarded = `caddy_mcp_serializer_forwards_total{result="forwarded"}`
	before := scrapeMetric(t, in.a, forwarded)
	if s := send(in.a, basic("alice", "pw-1")); s == http.StatusOK && scrapeMetric(t, in.a, forwarded) == before {
		o, _ := in.redis.HGet(ctx, record, "owner").Result()
		t.Fatalf("alice's request at a was served there, while her key's record names %q: a stranger's one wrong password split her line over two instances", o)
	}
}

func init() {
	caddy.RegisterModule(heldRequests{})
	httpcaddyfile.RegisterHandlerDirective("mcp_test_hold", func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		h.Next()
		return heldRequests{}, nil
	})
}

// heldRequests holds each request carrying an X-Hold header, between
// mcp_serializer and the upstream, until the test releases it: where an
// instance paused (SIGSTOP) after its checks would hold it.
type heldRequests struct{}

var (
	holdArrived = make(chan struct{}, 1)
	holdRelease = make(chan struct{})
)

func (heldRequests) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.mcp_test_hold", New: func() caddy.Module { return heldRequests{} }}
}

func (heldRequests) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if r.Header.Get("X-Hold") != "" {
		holdArrived <- struct{}{}
		<-holdRelease
	}
	return next.ServeHTTP(w, r)
}

// A request that passed its owner's checks just before the owner was
// paused past its lease, and whose session another instance took over
// meanwhile, has its body held at the upstream's first read until the
// owner learns its lease lapsed: nothing of it reaches the upstream.
func TestARequestHeldPastItsOwnersLapseDoesNotReachTheUpstream(t *testing.T) {
	var minted atomic.Int64
	up, addr := newUpstream(t, echoingAnswer(func() string { return fmt.Sprintf("held-%d", minted.Add(1)) }))
	p := startPausedOwner(t, addr)
	before := len(up.requests())
	answered := p.sendHeld(t, "5")
	// Meanwhile a's lease lapses and b takes the session over.
	p.lapseAndRenew(t)
	holdRelease <- struct{}{}
	a := await(t, answered, time.Minute, "the held request")
	for _, r := range up.requests()[before:] {
		if strings.Contains(string(r.Body), "tools/call") {
			t.Fatalf("the held request reached the upstream from a, whose lease lapsed while b took the session over (answer %d %s)", a.status, a.body)
		}
	}
	if a.status < 500 {
		t.Fatalf("the held request was answered %d %s; want a failure", a.status, a.body)
	}
}

// pausedOwner is two instances, a with mcp_test_hold before its upstream,
// and a session of a's (cid, its record in Redis), b holding a lease too.
type pausedOwner struct {
	in              *ownerInstances
	cid, record     string
	aID, bID, bAddr string
}

// startPausedOwner starts the two instances on upstream addr with
// settings, and opens the session at a.
func startPausedOwner(t *testing.T, addr string, settings ...string) *pausedOwner {
	t.Helper()
	ctx := context.Background()
	in := startOwnerInstances(t, addr, settings...)
	full := in.caddyfile("")
	start := strings.Index(full, in.a+" {")
	site := strings.Replace(full[start:], "\treverse_proxy", "\tmcp_test_hold\n\treverse_proxy", 1)
	global := strings.Replace(full[:start], "{\n", "{\n\torder mcp_test_hold after mcp_serializer\n", 1)
	loadThroughAdmin(t, in.admin, global+site)

	p := &pausedOwner{in: in}
	p.cid = call(ctx, http.DefaultClient, http.MethodPost, in.a, "", initializeBody).header.Get("Mcp-Session-Id")
	call(ctx, http.DefaultClient, http.MethodPost, in.a, p.cid, initializedBody)
	// b holds a lease, so that a session's record can name it.
	call(ctx, http.DefaultClient, http.MethodPost, in.b, "", initializeBody)
	_, upstreamID, _ := strings.Cut(strings.TrimPrefix(p.cid, "mcps1."), ".")
	p.record = "mcp_serializer:" + serializer.StoreKey(upstreamID)
	wait.Until(t, "both leases and a's record", func() bool {
		p.aID, _, _, _ = in.leaseOf(t, in.a)
		p.bID, _, _, p.bAddr = in.leaseOf(t, in.b)
		o, _ := in.redis.HGet(ctx, p.record, "owner").Result()
		return p.aID != "" && p.bID != "" && strings.HasPrefix(o, p.aID+" ")
	})
	return p
}

// sendHeld sends a tools/call of the session with JSON-RPC id to a, held
// by mcp_test_hold once past a's checks (as a paused instance holds it),
// and returns once it is held; its answer comes on the channel.
func (p *pausedOwner) sendHeld(t *testing.T, id string) <-chan answer {
	t.Helper()
	answered := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, p.in.a, strings.NewReader(rpcRequest(id, "tools/call")))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Session-Id", p.cid)
		req.Header.Set("X-Hold", "1")
		resp, err := do(http.DefaultClient, req)
		if err != nil {
			answered <- answer{err: err}
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		answered <- answer{status: resp.StatusCode, body: body}
	}()
	select {
	case <-holdArrived:
	case <-time.After(time.Minute):
		t.Fatal("the request was not held within a minute")
	}
	return answered
}

// lapseAndRenew lapses a's lease and gives the session to b, as if a had
// been frozen past its lease, and returns once a has taken in the
// renewal that found the lapse (it has renewed again since: renewals run
// one at a time).
func (p *pausedOwner) lapseAndRenew(t *testing.T) {
	t.Helper()
	epoch, _ := p.in.lapseTo(t, p.aID, p.record, p.bID+" "+p.bAddr)
	var renewed int64
	wait.Until(t, "a's renewal finds its lease lapsed", func() bool {
		_, exp, e, _ := p.in.leaseOf(t, p.in.a)
		renewed = exp
		return e != epoch
	})
	wait.Until(t, "a's next renewal", func() bool {
		_, exp, _, _ := p.in.leaseOf(t, p.in.a)
		return exp > renewed
	})
}

// lapseTo makes a's lease (instance aID) lapsed in Redis, as if a had been
// frozen past it, and record name owner, as if owner took it over; it
// returns a's lease's epoch before and Redis' time then.
func (in *ownerInstances) lapseTo(t *testing.T, aID, record, owner string) (epoch string, now time.Time) {
	t.Helper()
	ctx := context.Background()
	_, _, epoch, aAddr := in.leaseOf(t, in.a)
	now, err := in.redis.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	in.redis.HSet(ctx, "mcp_serializer:members", aID, strconv.FormatInt(now.UnixMilli()-10_000, 10)+" "+epoch+" "+aAddr)
	in.redis.HSet(ctx, record, "owner", owner)
	return epoch, now
}

// An owner paused past its lease (a) with a session's requests queued
// behind one that had passed its checks (held, as a paused instance holds
// it): b took the session over meanwhile. On waking, each queued request
// gets its turn at a, finds the session moved and is sent on to b, its
// turn held until b answered it, so that b runs them in their arrival
// order.
func TestAResumedOwnerSendsItsQueuedRequestsOnInArrivalOrder(t *testing.T) {
	ctx := context.Background()
	var minted atomic.Int64
	up, addr := newUpstream(t, echoingAnswer(func() string { return fmt.Sprintf("order-%d", minted.Add(1)) }))
	p := startPausedOwner(t, addr, "queue_timeout 30s")
	held := p.sendHeld(t, `"held"`)
	const n = 30
	var queued []<-chan answer
	admin := &testCaddy{admin: p.in.admin}
	for i := range n {
		queued = append(queued, callAsync(ctx, http.MethodPost, p.in.a, p.cid, rpcRequest(fmt.Sprintf(`"q%02d"`, i), "tools/list")))
		admin.awaitWaiting(t, i+1) // in the session's queue at a before the next
	}
	p.lapseAndRenew(t)
	before := len(up.requests())
	holdRelease <- struct{}{}
	await(t, held, time.Minute, "the held request")
	for i, ch := range queued {
		if a := await(t, ch, time.Minute, "a queued request"); a.status != http.StatusOK {
			t.Fatalf("queued request q%02d: %d %s; want served by b", i, a.status, a.body)
		}
	}
	var order []string
	for _, r := range up.requests()[before:] {
		for i := range n {
			if strings.Contains(string(r.Body), fmt.Sprintf(`"q%02d"`, i)) {
				order = append(order, fmt.Sprintf("q%02d", i))
			}
		}
	}
	for i := 1; i < len(order); i++ {
		if order[i] < order[i-1] {
			t.Fatalf("the session's queued requests reached the upstream out of arrival order: %v", order)
		}
	}
	if len(order) != n {
		t.Fatalf("the upstream ran %d of the %d queued requests: %v", len(order), n, order)
	}
}

// A resumed owner (a) holds its session's turn while it sends the first
// of its queued requests (q00) on to the new owner (b). A request (zz)
// its client sends after q01..q04 reaches a, which now knows the session
// as b's: it queues at a behind them rather than going to b at once, so
// that b runs it last.
func TestALaterRequestDoesNotOvertakeTheRequestsAResumedOwnerSendsOn(t *testing.T) {
	ctx := context.Background()
	up, addr, q00Arrived, release := upstreamHoldingQ00(t)
	p := startPausedOwner(t, addr, "queue_timeout 30s")
	held := p.sendHeld(t, `"held"`)
	const n = 5
	var queued []<-chan answer
	admin := &testCaddy{admin: p.in.admin}
	for i := range n {
		queued = append(queued, callAsync(ctx, http.MethodPost, p.in.a, p.cid, rpcRequest(fmt.Sprintf(`"q%02d"`, i), "tools/list")))
		admin.awaitWaiting(t, i+1)
	}
	p.lapseAndRenew(t)
	before := len(up.requests())
	holdRelease <- struct{}{}
	await(t, held, time.Minute, "the held request")
	arrived(t, q00Arrived, "q00 at the upstream through b") // a's turn held
	zz := callAsync(ctx, http.MethodPost, p.in.a, p.cid, rpcRequest(`"zz"`, "tools/list"))
	admin.awaitWaiting(t, n) // q01..q04 at a, and zz
	release()
	for i, ch := range queued {
		if a := await(t, ch, time.Minute, "a queued request"); a.status != http.StatusOK {
			t.Fatalf("queued request q%02d: %d %s", i, a.status, a.body)
		}
	}
	if a := await(t, zz, time.Minute, "zz"); a.status != http.StatusOK {
		t.Fatalf("zz: %d %s", a.status, a.body)
	}
	var order []string
	for _, r := range up.requests()[before:] {
		for _, label := range []string{"q00", "q01", "q02", "q03", "q04", "zz"} {
			if strings.Contains(string(r.Body), `"`+label+`"`) {
				order = append(order, label)
			}
		}
	}
	if len(order) != n+1 || order[n] != "zz" {
		t.Fatalf("upstream order %v; want q00..q04 then zz (zz was sent after them)", order)
	}
}

// A resumed owner (a) that learned its session is b's now sends its
// queued requests on to b one at a time. A GET stream of the session
// reaching a meanwhile goes to b at once: a GET takes no turn, so it does
// not queue behind them, and served here it would come from a's upstream.
func TestAGetStreamReachingAnInstanceThatLostItsSessionGoesToTheOwner(t *testing.T) {
	ctx := context.Background()
	_, addr, q00Arrived, _ := upstreamHoldingQ00(t)
	p := startPausedOwner(t, addr, "queue_timeout 30s", "get_stream forward")
	held := p.sendHeld(t, `"held"`)
	admin := &testCaddy{admin: p.in.admin}
	_ = callAsync(ctx, http.MethodPost, p.in.a, p.cid, rpcRequest(`"q00"`, "tools/list"))
	admin.awaitWaiting(t, 1)
	p.lapseAndRenew(t)
	holdRelease <- struct{}{}
	await(t, held, time.Minute, "the held request")
	arrived(t, q00Arrived, "q00 at the upstream through b") // from a's turn: the session is busy at a
	get := await(t, callAsync(ctx, http.MethodGet, p.in.a, p.cid, ""), 20*time.Second, "the GET stream")
	if get.status != http.StatusOK {
		t.Fatalf("GET: %d %s", get.status, get.body)
	}
	if sid := get.header.Get("Mcp-Session-Id"); !strings.Contains(sid, p.bID) {
		t.Fatalf("the GET stream was served by a (its id %q does not name b %s): the session's owner is b", sid, p.bID)
	}
}

// upstreamHoldingQ00 is an upstream answering as echoingAnswer does,
// minting session ids of its own, that holds the request carrying the
// JSON-RPC id "q00" until release (called at the latest when the test
// ends); arrived is told when that request reached it.
func upstreamHoldingQ00(t *testing.T) (up *upstream, addr string, arrived <-chan struct{}, release func()) {
	t.Helper()
	var minted atomic.Int64
	q00Arrived, q00Release := make(chan struct{}, 1), make(chan struct{})
	echo := echoingAnswer(func() string { return fmt.Sprintf("q00-%d", minted.Add(1)) })
	up, addr = newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if strings.Contains(string(body), `"q00"`) {
			q00Arrived <- struct{}{}
			<-q00Release
		}
		echo(w, r, body)
	})
	release = sync.OnceFunc(func() { close(q00Release) })
	t.Cleanup(release) // before the upstream's own cleanup, which waits for its handlers
	return up, addr, q00Arrived, release
}

// arrived waits for c, failing the test after a minute.
func arrived(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(time.Minute):
		t.Fatalf("%s: not within a minute", what)
	}
}
