package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// stateResult is what the state phase measured: two more Caddys, C and D,
// configured like B plus `state redis` on one redis-server.
type stateResult struct {
	// Sequential, one request at a time: initialize through B and through
	// C (the creation write is the difference), and a session's first
	// request on D after C created and opened it (the first-sight lookup)
	// beside its next request on C (known locally).
	initB, initC, firstD, nextC []time.Duration
	off, on                     pairSeries // session traffic: A vs B, A vs C, the same rounds of A
	compare                     pairSeries // with -state-compare: A vs E, the same rounds of A
	redisPID                    int
	perSession                  int // requests of a session beside initialize, initialized and DELETE
	errors                      int
}

// redisUse is what Redis served over a window: commands (a script's own
// included) and reads of client data (round trips).
type redisUse struct {
	commands, reads int64
}

// sampleRedis reads Redis's counters; zero without an address or on
// failure.
func sampleRedis(addr string) redisUse {
	if addr == "" {
		return redisUse{}
	}
	stats, err := redisStats(addr)
	if err != nil {
		return redisUse{}
	}
	return redisUse{stats["total_commands_processed"], stats["total_reads_processed"]}
}

// since is u less an earlier sample, less the INFO call that took u.
func (u redisUse) since(earlier redisUse) redisUse {
	if u.reads == 0 {
		return redisUse{}
	}
	return redisUse{u.commands - earlier.commands - 1, u.reads - earlier.reads - 1}
}

// stateDirective is B's mcp_serializer line with the shared state in Redis.
func stateDirective(redisAddr string) string {
	return "\tmcp_serializer {\n\t\tstate redis {\n\t\t\taddress " + redisAddr + "\n\t\t}\n\t}\n"
}

// startRedis runs redis-server without persistence on a free loopback port.
func startRedis(ctx context.Context, dir string) (*proc, string, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, "", fmt.Errorf("state phase: redis-server not found (apt-get install -y redis-server): %w", err)
	}
	ports, err := freePorts(1)
	if err != nil {
		return nil, "", err
	}
	addr := "127.0.0.1:" + strconv.Itoa(ports[0])
	cmd := exec.Command(bin, "--bind", "127.0.0.1", "--port", strconv.Itoa(ports[0]),
		"--save", "", "--appendonly", "no", "--dir", dir, "--daemonize", "no")
	p, err := startProc("redis-server", cmd, filepath.Join(dir, "redis.log"))
	if err != nil {
		return nil, "", err
	}
	deadline := time.Now().Add(20 * time.Second)
	for !redisPing(addr) {
		if !p.running() || time.Now().After(deadline) || ctx.Err() != nil {
			p.stop()
			return nil, "", fmt.Errorf("redis-server did not answer on %s:\n%s", addr, p.tail())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return p, addr, nil
}

// redisStats reads the numeric fields of INFO stats.
func redisStats(addr string) (map[string]int64, error) {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte("*2\r\n$4\r\nINFO\r\n$5\r\nstats\r\n")); err != nil {
		return nil, err
	}
	rd := bufio.NewReader(conn)
	head, err := rd.ReadString('\n')
	if err != nil || !strings.HasPrefix(head, "$") {
		return nil, fmt.Errorf("INFO stats: answer %q: %v", head, err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(head[1:]))
	if err != nil {
		return nil, fmt.Errorf("INFO stats: answer %q", head)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(rd, body); err != nil {
		return nil, err
	}
	stats := map[string]int64{}
	for _, line := range strings.Split(string(body), "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if x, err := strconv.ParseInt(v, 10, 64); err == nil {
			stats[k] = x
		}
	}
	return stats, nil
}

func redisPing(addr string) bool {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	return err == nil && strings.HasPrefix(line, "+PONG")
}

// statePhase starts Redis, C and D, measures the sequential costs, then
// session throughput of A, B (state off) and C (state on) in sets of
// rounds, one round against each.
func (r *report) statePhase(ctx context.Context, bin, dir string, up *upstreamProc, base load, targets [2]*caddyProc, caddyCPU, loadCPU int) error {
	o := r.o
	redis, addr, err := startRedis(ctx, dir)
	if err != nil {
		return err
	}
	defer redis.stop()
	var cd [2]*caddyProc
	for i, label := range []string{"C", "D"} {
		p, err := startCaddyWith(ctx, bin, dir, label, stateDirective(addr), o.profileDir != "", up.addrs)
		if err != nil {
			return fmt.Errorf("state phase (needs the state redis module in %s): %w", bin, err)
		}
		defer p.stop()
		cd[i] = p
	}
	if o.pin {
		for _, pid := range []int{cd[0].cmd.Process.Pid, cd[1].cmd.Process.Pid} {
			if err := pinProcess(pid, caddyCPU); err != nil {
				return fmt.Errorf("pin: %w", err)
			}
		}
		if err := pinProcess(redis.cmd.Process.Pid, loadCPU); err != nil {
			return fmt.Errorf("pin: %w", err)
		}
	}
	s := &stateResult{redisPID: redis.cmd.Process.Pid, perSession: o.perSession}
	r.state = s
	b, c, d := targets[1], cd[0], cd[1]
	client := base.client

	log.Printf("state: %d sequential samples (initialize through B and C; first request on D, next on C)", o.stateSamples)
	warm := min(50, o.stateSamples)
	for i := range o.stateSamples + warm {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		keep := i >= warm
		// Alternate which Caddy goes first, so drift hits both.
		steps := []func() error{
			func() error {
				dt, sid, err := timedPost(client, b.fast, "", bodyInitialize)
				if err != nil {
					return err
				}
				// The gate holds a DELETE too: open the session first.
				defer func() { _ = endSession(client, b.fast, sid) }()
				if _, _, err := timedPost(client, b.fast, sid, bodyInitialized); err != nil {
					return err
				}
				if keep {
					s.initB = append(s.initB, dt)
				}
				return nil
			},
			func() error {
				dt, sid, err := timedPost(client, c.fast, "", bodyInitialize)
				if err != nil {
					return err
				}
				defer func() { _ = endSession(client, c.fast, sid) }()
				if _, _, err := timedPost(client, c.fast, sid, bodyInitialized); err != nil {
					return err
				}
				first, _, err := timedPost(client, d.fast, sid, bodyToolsList)
				if err != nil {
					return err
				}
				next, _, err := timedPost(client, c.fast, sid, bodyToolsList)
				if err != nil {
					return err
				}
				if keep {
					s.initC = append(s.initC, dt)
					s.firstD = append(s.firstD, first)
					s.nextC = append(s.nextC, next)
				}
				return nil
			},
		}
		if i%2 == 1 {
			slices.Reverse(steps)
		}
		for _, step := range steps {
			if err := step(); err != nil {
				s.errors++
				r.count(1, "state: "+err.Error())
			}
		}
	}
	log.Printf("state: creation write %+.0f µs, first-sight lookup %+.0f µs (p50 differences)", s.creationUS(), s.lookupUS())

	// A, B and C (and E) in turn, so that state off (B) and on (C) are
	// measured against the same rounds of A, under the same machine
	// conditions.
	l := base
	l.perSession = o.perSession
	l.pids = append(slices.Clone(base.pids), redis.cmd.Process.Pid, c.cmd.Process.Pid, d.cmd.Process.Pid)
	l.redisAddr = addr
	set := []*caddyProc{targets[0], targets[1], c}
	if o.stateCompare != "" {
		other, err := filepath.Abs(o.stateCompare)
		if err != nil {
			return err
		}
		e, err := startCaddyWith(ctx, other, dir, "E", stateDirective(addr), o.profileDir != "", up.addrs)
		if err != nil {
			return fmt.Errorf("state phase, -state-compare: %w", err)
		}
		defer e.stop()
		if o.pin {
			if err := pinProcess(e.cmd.Process.Pid, caddyCPU); err != nil {
				return fmt.Errorf("pin: %w", err)
			}
		}
		l.pids = append(l.pids, e.cmd.Process.Pid)
		set = append(set, e)
		log.Printf("state: E is %s", other)
	}
	rs := r.rounds(ctx, "state", set, l, o.statePairs)
	s.off = pairSeries{a: rs[0], b: rs[1]}
	s.on = pairSeries{a: rs[0], b: rs[2]}
	if len(rs) > 3 {
		s.compare = pairSeries{a: rs[0], b: rs[3]}
	}
	offRatio, offSpread := s.off.ratio()
	onRatio, onSpread := s.on.ratio()
	log.Printf("state       %d sets: A %.0f req/s, B %.0f req/s, C %.0f req/s; B/A %.3f ±%.3f, C/A %.3f ±%.3f",
		len(rs[0]), mean(rpsOf(rs[0])), mean(rpsOf(rs[1])), mean(rpsOf(rs[2])), offRatio, offSpread, onRatio, onSpread)
	return ctx.Err()
}

// timedPost sends one JSON-RPC POST and returns its latency and the
// response's Mcp-Session-Id; a status outside 2xx is an error.
func timedPost(client *http.Client, url, sid string, body []byte) (time.Duration, string, error) {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	dt := time.Since(start)
	if err != nil {
		return dt, "", err
	}
	if resp.StatusCode/100 != 2 {
		return dt, "", fmt.Errorf("POST %s: HTTP %d", url, resp.StatusCode)
	}
	return dt, resp.Header.Get("Mcp-Session-Id"), nil
}

func endSession(client *http.Client, url, sid string) error {
	req, err := http.NewRequest(http.MethodDelete, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Mcp-Session-Id", sid)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return errors.New("DELETE: HTTP " + strconv.Itoa(resp.StatusCode))
	}
	return nil
}

// pidCPUPerRequest is the CPU time of process pid per request over the
// rounds (µs).
func pidCPUPerRequest(rs []result, pid int) float64 {
	var cpu time.Duration
	n := 0
	for _, r := range rs {
		cpu += r.cpu.byPID[pid]
		n += r.requests
	}
	if n == 0 {
		return math.NaN()
	}
	return us(cpu) / float64(n)
}

// redisPerSession is what Redis served over the rounds, per session of
// initialize, initialized, perSession requests and DELETE.
func redisPerSession(rs []result, perSession int) string {
	var u redisUse
	n := 0
	for _, res := range rs {
		u.commands += res.redis.commands
		u.reads += res.redis.reads
		n += res.requests
	}
	if n == 0 || u.reads == 0 {
		return "n/a"
	}
	per := float64(perSession+3) / float64(n)
	return fmt.Sprintf("%.2f, %.2f", per*float64(u.reads), per*float64(u.commands))
}

// creationUS is initialize through C minus through B, at the median (µs).
func (s *stateResult) creationUS() float64 {
	return us(percentile(s.initC, 0.5) - percentile(s.initB, 0.5))
}

// lookupUS is the first request on D minus the next one on C, at the
// median (µs).
func (s *stateResult) lookupUS() float64 {
	return us(percentile(s.firstD, 0.5) - percentile(s.nextC, 0.5))
}

// rows returns the state phase's lines of the report table.
func (s *stateResult) rows() [][]string {
	if s == nil {
		return nil
	}
	var rows [][]string
	row := func(cells ...string) { rows = append(rows, cells) }
	if len(s.initC) > 0 {
		row(fmt.Sprintf("state redis: initialize, one at a time, p50 (µs), %d samples", len(s.initC)),
			"", f0(us(percentile(s.initB, 0.5))), "", "")
		row("  … through C (state redis): creation write added (µs)", "", f0(us(percentile(s.initC, 0.5))), signed(s.creationUS()), "")
		row("  first request on D, session created on C: p50 (µs)", "", f0(us(percentile(s.firstD, 0.5))), "", "")
		row("  next request on C, session known: p50 (µs); lookup added", "", f0(us(percentile(s.nextC, 0.5))), signed(s.lookupUS()), "")
	}
	if len(s.off.a) > 0 {
		ratio, spread := s.off.ratio()
		row("session throughput, state off: B/A", f0(mean(rpsOf(s.off.a))), f0(mean(rpsOf(s.off.b))), fmt.Sprintf("%.3f ±%.3f", ratio, spread), "")
	}
	if len(s.on.a) > 0 {
		ratio, spread := s.on.ratio()
		row("session throughput, state redis: C/A", f0(mean(rpsOf(s.on.a))), f0(mean(rpsOf(s.on.b))), fmt.Sprintf("%.3f ±%.3f", ratio, spread), "≥ 0.95")
		ratio, spread = pairSeries{a: s.off.b, b: s.on.b}.ratio()
		row("  state redis vs state off: C/B", f0(mean(rpsOf(s.off.b))), f0(mean(rpsOf(s.on.b))), fmt.Sprintf("%.3f ±%.3f", ratio, spread), "")
	}
	if len(s.off.a) > 0 {
		ca, cb := cpuPerRequest(s.off.a), cpuPerRequest(s.off.b)
		row("  Caddy CPU per request: A, B (µs)", f1(ca), f1(cb), signed(cb-ca), "")
	}
	if len(s.on.a) > 0 {
		ca, cc := cpuPerRequest(s.on.a), cpuPerRequest(s.on.b)
		row("  Caddy CPU per request: A, C (µs)", f1(ca), f1(cc), signed(cc-ca), "")
		row("  redis-server CPU per request of C (µs)", "", f1(pidCPUPerRequest(s.on.b, s.redisPID)), "", "")
		row("  Redis round trips, commands per session of C", "", redisPerSession(s.on.b, s.perSession), "", "")
	}
	if len(s.compare.a) > 0 {
		ratio, spread := s.compare.ratio()
		row("session throughput, state redis, -state-compare binary: E/A", f0(mean(rpsOf(s.compare.a))), f0(mean(rpsOf(s.compare.b))), fmt.Sprintf("%.3f ±%.3f", ratio, spread), "")
		ratio, spread = pairSeries{a: s.compare.b, b: s.on.b}.ratio()
		row("  C vs E: C/E", f0(mean(rpsOf(s.compare.b))), f0(mean(rpsOf(s.on.b))), fmt.Sprintf("%.3f ±%.3f", ratio, spread), "")
		ce, cc := cpuPerRequest(s.compare.b), cpuPerRequest(s.on.b)
		row("  Caddy CPU per request: E, C (µs)", f1(ce), f1(cc), signed(cc-ce), "")
		row("  redis-server CPU per request of E (µs)", "", f1(pidCPUPerRequest(s.compare.b, s.redisPID)), "", "")
		row("  Redis round trips, commands per session of E", "", redisPerSession(s.compare.b, s.perSession), "", "")
	}
	return rows
}
