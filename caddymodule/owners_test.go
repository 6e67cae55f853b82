package caddymodule_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/redis/go-redis/v9"

	"github.com/mcpserializer/caddy-mcp-serializer/integration/mcpstub"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/redistest"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/testnet"
	"github.com/mcpserializer/caddy-mcp-serializer/owner"
	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// ownerInstances runs, in this process, two instances with order owner on
// one Redis (two sites with session tables of their own, each its own
// owner) and a front that sends requests to them in turn.
type ownerInstances struct {
	a, b, front string // URLs
	redis       *redis.Client
}

func startOwnerInstances(t *testing.T, upstream string) *ownerInstances {
	return startInstances(t, upstream, "owner")
}

// startInstances is startOwnerInstances with another order.
func startInstances(t *testing.T, upstream, order string) *ownerInstances {
	t.Helper()
	redisAddr := redistest.Start(t)
	adminPort, pa, pb, pf := testnet.FreePort(t), testnet.FreePort(t), testnet.FreePort(t), testnet.FreePort(t)
	instance := func(name string, port int) string {
		return fmt.Sprintf(`http://127.0.0.1:%d {
	metrics /metrics
	mcp_serializer {
		name %s
		order %s
		state redis %s
	}
	reverse_proxy %s {
		flush_interval -1
	}
}
`, port, name, order, redisAddr, upstream)
	}
	caddyfile := fmt.Sprintf(`{
	admin 127.0.0.1:%d
	auto_https off
	persist_config off
	log {
		output discard
	}
}
`, adminPort) + instance("a", pa) + instance("b", pb) + fmt.Sprintf(`http://127.0.0.1:%d {
	reverse_proxy 127.0.0.1:%d 127.0.0.1:%d {
		lb_policy round_robin
		flush_interval -1
	}
}
`, pf, pa, pb)
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
	if err != nil {
		t.Fatal(err)
	}
	loadCaddy(t, cfg)
	client := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { client.Close() })
	return &ownerInstances{
		a: fmt.Sprintf("http://127.0.0.1:%d", pa), b: fmt.Sprintf("http://127.0.0.1:%d", pb),
		front: fmt.Sprintf("http://127.0.0.1:%d", pf), redis: client,
	}
}

// Pipelined connects behind round robin land each request on either
// instance; with order owner, every follow-up meets its initialize on the
// instance that created the session, so none fails.
func TestRoundRobinConnectsNeverFailWithOrderOwner(t *testing.T) {
	backend := &mcpstub.Backend{WorkMin: time.Millisecond, WorkMax: 5 * time.Millisecond, DisableRequestLog: true}
	srv := httptest.NewServer(backend)
	defer srv.Close()
	in := startOwnerInstances(t, strings.TrimPrefix(srv.URL, "http://"))
	before := scrapeMetric(t, in.a, `caddy_mcp_serializer_forwards_total{result="forwarded"}`)

	sum := mcpstub.RunPipelined(context.Background(), in.front+"/mcp", 200, 8)
	t.Logf("round robin over two instances, order owner: %s", sum)
	if sum.Connects != 200 || sum.Failed != 0 || sum.Broken != 0 {
		t.Fatalf("%s; samples: %v", sum, sum.Samples)
	}
	if n := scrapeMetric(t, in.a, `caddy_mcp_serializer_forwards_total{result="forwarded"}`) - before; n < 100 {
		t.Fatalf("%v requests forwarded to their owner, want about half of them", n)
	}
}

// An owner that does not answer is dialed once: the instance that
// noticed takes the session over in Redis and serves it from then on.
func TestASessionWhoseOwnerDoesNotAnswerIsTakenOverAndServedHere(t *testing.T) {
	up, addr := newUpstream(t, nil)
	in := startOwnerInstances(t, addr)
	ctx := context.Background()
	key := "mcp_serializer:" + serializer.StoreKey("orphan")
	dead := owner.Owner{ID: "dead", Addr: strings.TrimPrefix(testnet.RefusedURL(t), "http://")}
	dead.Addr, _, _ = strings.Cut(dead.Addr, "/")
	if err := in.redis.HSet(ctx, key, "open", "1", "deadline", "0", "inflight", "0", "owner", dead.String()).Err(); err != nil {
		t.Fatal(err)
	}
	in.redis.Expire(ctx, key, time.Hour)
	const unreachable = `caddy_mcp_serializer_forwards_total{result="unreachable"}`
	before := scrapeMetric(t, in.b, unreachable)

	for i := range 3 {
		resp := post(t, in.b, "orphan", fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/list"}`, i))
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %s", i, resp.Status)
		}
	}
	if n := len(up.requests()); n != 3 {
		t.Fatalf("upstream saw %d requests, want 3", n)
	}
	if n := scrapeMetric(t, in.b, unreachable) - before; n != 1 {
		t.Fatalf("the dead owner was dialed %v times, want once", n)
	}
	recorded, _ := in.redis.HGet(ctx, key, "owner").Result()
	if o, ok := owner.Parse(recorded); !ok || o.ID == dead.ID || o.Addr != strings.TrimPrefix(in.b, "http://") {
		t.Fatalf("recorded owner %q, want instance b at its address", recorded)
	}
}

// A request sent as to an owner that is not this instance (a client's
// header, or a forward to an instance restarted since) is answered 421
// and never forwarded, upstream or to another instance.
func TestARequestSentToAnotherOwnerIsAnswered421AndNotForwarded(t *testing.T) {
	up, addr := newUpstream(t, nil)
	in := startOwnerInstances(t, addr)
	req, _ := http.NewRequest(http.MethodPost, in.a, strings.NewReader(`{"jsonrpc":"2.0","id":7,"method":"tools/list"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Mcp-Session-Id", "s1")
	req.Header.Set("Mcp-Serializer-Owner", "someone-else")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Header.Get("Mcp-Serializer-Not-Owner") == "" {
		t.Fatal("421 without Mcp-Serializer-Not-Owner")
	}
	expectRPCError(t, resp, http.StatusMisdirectedRequest, "7")
	if n := len(up.requests()); n != 0 {
		t.Fatalf("upstream saw %d requests, want 0", n)
	}
}

// scrapeMetric reads one series from a site's metrics; 0 if it is not
// there yet (a counter never incremented).
func scrapeMetric(t *testing.T, site, series string) float64 {
	t.Helper()
	resp, err := http.Get(site + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, value, _ := strings.Cut(sc.Text(), " ")
		if name == series {
			v, err := strconv.ParseFloat(value, 64)
			if err != nil {
				t.Fatalf("%s: %v", series, err)
			}
			return v
		}
	}
	return 0
}
