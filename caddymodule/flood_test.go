package caddymodule_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// A flood of distinct, made-up session ids through Caddy. The volume test
// (500k ids against max_sessions 10k) is in package serializer, on the
// table itself; through HTTP under -race 5k ids against max_sessions 1k
// show the same through the module: the number of tracked sessions stays
// within max_sessions plus the busy ones, real sessions that are busy or
// still initializing keep their queue and gate, and a real session is
// served promptly throughout.
func TestFloodOfMadeUpSessionIDsThroughCaddy(t *testing.T) {
	const maxSessions, flood = 1000, 5000
	release := make(chan struct{})
	up, addr := newUpstream(t, mcpAnswer("flood-gated", func(m rpcMsg, w http.ResponseWriter, r *http.Request) bool {
		if m.Method == "block" {
			// Held until the test releases it; the bound only keeps a
			// failed test from hanging, and must outlast a slow flood.
			select {
			case <-release:
			case <-time.After(time.Minute):
			}
		}
		return false
	}))
	c := startCaddy(t, fmt.Sprintf(`metrics /metrics
mcp_serializer {
	max_sessions %d
	queue_timeout 1m
	init_timeout 1m
}
@flood header X-Flood *
respond @flood `+"`"+`{"jsonrpc":"2.0","id":1,"result":{}}`+"`"+` 200
reverse_proxy %s`, maxSessions, addr))
	ctx := context.Background()

	// Real sessions: one with an exchange hung upstream and one queued
	// behind it, one answered by initialize and not yet initialized.
	busy := callAsync(ctx, http.MethodPost, c.url, "flood-busy", rpcRequest("1", "block"))
	up.next(t)
	busyQueued := callAsync(ctx, http.MethodPost, c.url, "flood-busy", rpcRequest("2", "tools/list"))
	initialize(t, c, "flood-gated")
	up.drain()

	// The flood, and a real session working beside it.
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	defer client.CloseIdleConnections()
	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var floodFailures []string
	const workers = 8
	for w := range workers {
		wg.Go(func() {
			for i := w; i < flood; i += workers {
				req, _ := http.NewRequest(http.MethodPost, c.url, strings.NewReader(rpcRequest("1", "tools/list")))
				req.Header.Set("Mcp-Session-Id", fmt.Sprintf("made-up-%06d", i))
				req.Header.Set("X-Flood", "1")
				resp, err := client.Do(req)
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				if err != nil || resp.StatusCode != http.StatusOK {
					mu.Lock()
					floodFailures = append(floodFailures, fmt.Sprintf("%v %v", err, resp))
					mu.Unlock()
				}
			}
		})
	}
	floodDone := make(chan struct{})
	go func() { wg.Wait(); close(floodDone) }()
	var probes int
	var slowest time.Duration
	for probing := true; probing; probes++ {
		select {
		case <-floodDone:
			probing = false
		case <-time.After(20 * time.Millisecond):
		}
		t0 := time.Now()
		id := fmt.Sprintf(`"probe-%d"`, probes)
		expectResult(t, call(ctx, http.DefaultClient, http.MethodPost, c.url, "flood-probe", rpcRequest(id, "tools/list")), id)
		slowest = max(slowest, time.Since(t0))
	}
	t.Logf("%d made-up ids in %v; %d probes of a real session, slowest %v",
		flood, time.Since(start).Round(time.Millisecond), probes, slowest)
	if len(floodFailures) > 0 {
		t.Fatalf("%d flood requests failed, e.g. %s", len(floodFailures), floodFailures[0])
	}
	if slowest > 2*time.Second {
		t.Errorf("a real session's request took %v during the flood", slowest)
	}

	tracked, evicted := scrapeSessions(t, c)
	t.Logf("tracked sessions after the flood: %v; evictions: %v", tracked, evicted)
	if limit := float64(maxSessions + 2); tracked > limit { // + flood-busy, flood-gated
		t.Errorf("tracked %v sessions, want at most max_sessions + busy = %v", tracked, limit)
	}
	if evicted < flood-maxSessions {
		t.Errorf("evictions = %v, want at least %d", evicted, flood-maxSessions)
	}

	// flood-busy still has its queue: a newcomer waits behind the hung
	// exchange rather than going straight upstream.
	newcomer := callAsync(ctx, http.MethodPost, c.url, "flood-busy", rpcRequest("3", "tools/list"))
	// flood-gated still has its gate.
	held := callAsync(ctx, http.MethodPost, c.url, "flood-gated", rpcRequest("4", "tools/list"))
	time.Sleep(200 * time.Millisecond)
	for _, l := range up.labels() {
		if l == "tools/list#3" || l == "tools/list#4" {
			t.Fatalf("%s reached the upstream ahead of its turn: its session was forgotten", l)
		}
	}
	close(release)
	for id, ch := range map[string]<-chan answer{"1": busy, "2": busyQueued, "3": newcomer} {
		expectResult(t, await(t, ch, 5*time.Second, "busy session request "+id), id)
	}
	resp := post(t, c.url, "flood-gated", initializedBody)
	resp.Body.Close()
	expectResult(t, await(t, held, 5*time.Second, "held request"), "4")
	var order []string
	for _, r := range up.requests() {
		if sid := r.Header.Get("Mcp-Session-Id"); sid == "flood-busy" || sid == "flood-gated" {
			order = append(order, parseRPC(r.Body).label())
		}
	}
	if got, want := strings.Join(order, " "), "block#1 tools/list#2 tools/list#3 notifications/initialized tools/list#4"; got != want {
		t.Errorf("upstream order %q, want %q", got, want)
	}
}

// scrapeSessions reads the tracked-sessions gauge and the evictions
// counter, summed over its gate label, from Caddy's metrics.
func scrapeSessions(t *testing.T, c *testCaddy) (tracked, evicted float64) {
	t.Helper()
	resp, err := http.Get(c.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	tracked = -1
	evictionSeries := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, value, _ := strings.Cut(sc.Text(), " ")
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			continue
		}
		name, _, _ = strings.Cut(name, "{")
		switch name {
		case "caddy_mcp_serializer_sessions":
			tracked = v
		case "caddy_mcp_serializer_evictions_total":
			evicted += v
			evictionSeries++
		}
	}
	if tracked < 0 || evictionSeries == 0 {
		t.Fatal("metrics lack caddy_mcp_serializer_sessions or caddy_mcp_serializer_evictions_total")
	}
	return tracked, evicted
}
