// Command bench measures what the mcp_serializer module costs, side by
// side with plain Caddy in one run.
//
// It starts one Caddy binary twice with the same settings in front of the
// same upstream (mcpstub.Backend, in a separate process): A is
// reverse_proxy alone, B is mcp_serializer + reverse_proxy. It then drives
// the same load at A and B, one at a time, alternating in short rounds
// (A B, then B A, ...) so that drift and machine noise hit both alike:
//
//   - session traffic: sessions connect (initialize, then
//     notifications/initialized), send tools/list and tools/call one at a
//     time, and end with DELETE; -c of them at once, flat out (throughput),
//     then paced at a share of A's throughput (latency). A session left
//     unfinished at the end of a round goes on in the next round against
//     the same target, so short rounds see the same mix of requests;
//   - session-less traffic: tools/list and tools/call with no
//     Mcp-Session-Id, as MCP 2026-07-28 clients send them;
//   - one session with -depth requests in flight against an upstream with a
//     fixed service time: the module runs them one at a time, and the time
//     per request beyond the upstream's own is the handoff cost;
//   - state: two more Caddys, C and D, like B plus `state redis` on a
//     redis-server of its own: initialize one at a time through B and C
//     (the creation write), a session's first request on D after C
//     created it (the first-sight lookup), and session throughput of A, B
//     and C in turn (C/A beside B/A, and C/B: what the state costs).
//
// It reads the CPU time of every process from /proc during each round: a
// pair of rounds during which processes outside the benchmark used more
// than -max-foreign cores is left out and run again.
//
// In this process it also measures the Go heap a serializer.Table holds per
// idle session, the module's own CPU cost per request (Handler.ServeHTTP in
// front of a handler that answers at once), and the queue's handoff alone.
// The last line of output sums the run up for machines:
//
//	throughput_ratio_session=X throughput_ratio_sessionless=Y p50_added_us=Z p99_added_us=W handoff_us=H bytes_per_session=M cpu_added_us_session=C cpu_added_us_sessionless=D queue_handoff_us=Q
//
// cpu_added_us_* is B's Caddy CPU per request minus A's (from /proc, over
// all rounds of the scenario); queue_handoff_us is the in-process queue's
// handoff alone (the "queue alone" row). A figure whose phase did not run
// prints as NaN.
//
// Run it with `make bench`, or after `make caddy`:
//
//	go run ./integration/bench -caddy bin/caddy
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"log"
	"math"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

type options struct {
	caddy        string
	concurrency  int
	perSession   int
	pairs        int
	round        time.Duration
	warmup       time.Duration
	paceShare    float64
	depth        int
	serviceTime  time.Duration
	pipeRounds   int
	pipeRound    time.Duration
	memSessions  int
	profileDir   string
	keep         bool
	maxForeign   float64
	retries      int
	phases       string
	statePairs   int
	stateCompare string
	stateSamples int
	verbose      bool
	control      bool
	pin          bool
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == upstreamRole {
		runUpstream(os.Args[2:])
		return
	}
	var o options
	flag.StringVar(&o.caddy, "caddy", cmp.Or(os.Getenv("MCP_SERIALIZER_CADDY"), "bin/caddy"), "Caddy binary built with the module (make caddy); $MCP_SERIALIZER_CADDY sets the default")
	flag.IntVar(&o.concurrency, "c", 64, "concurrent sessions (or session-less clients)")
	flag.IntVar(&o.perSession, "requests", 8, "tools/list and tools/call requests per session")
	flag.IntVar(&o.pairs, "pairs", 100, "pairs of rounds per scenario, one round against A and one against B")
	flag.DurationVar(&o.round, "round", 200*time.Millisecond, "length of one round, warm-up included")
	flag.DurationVar(&o.warmup, "warmup", 30*time.Millisecond, "start of each round left out of the figures")
	flag.Float64Var(&o.paceShare, "pace", 0.5, "latency rounds: offered load as a share of A's session throughput")
	flag.IntVar(&o.depth, "depth", 16, "pipelined requests in flight on the one session")
	flag.DurationVar(&o.serviceTime, "service-time", 2*time.Millisecond, "fixed upstream work per request of the pipelined session")
	flag.IntVar(&o.pipeRounds, "pipe-pairs", 3, "rounds per variant of the pipelined session (B with -depth in flight, A and B one at a time)")
	flag.DurationVar(&o.pipeRound, "pipe-round", 2*time.Second, "length of one pipelined round")
	flag.IntVar(&o.memSessions, "mem-sessions", 100_000, "idle sessions put in a table to measure its memory")
	flag.StringVar(&o.profileDir, "profile", "", "directory for CPU profiles: of both Caddys in each scenario (enables their admin endpoint) and of the in-process handler runs")
	flag.Float64Var(&o.maxForeign, "max-foreign", 0.25, "repeat a pair of rounds during which other processes used more CPU than this (cores)")
	flag.IntVar(&o.retries, "retries", 50, "most pairs dropped and run again per scenario")
	flag.BoolVar(&o.verbose, "v", false, "log every round")
	flag.BoolVar(&o.control, "control", false, "check the method: run B without mcp_serializer too (B/A should come out 1)")
	flag.BoolVar(&o.pin, "pin", runtime.NumCPU() >= 2, "load generator and upstream on one CPU, both Caddys on another")
	flag.BoolVar(&o.keep, "keep", false, "keep the working directory (Caddyfiles, logs)")
	flag.StringVar(&o.phases, "phases", "memory,handler,session,sessionless,latency,pipeline,state", "phases to run")
	flag.IntVar(&o.statePairs, "state-pairs", 40, "state phase: sets of session rounds, one round each against A, B (state off) and C (state redis)")
	flag.StringVar(&o.stateCompare, "state-compare", "", "state phase: another Caddy binary run as E, configured like C, in the same sets of rounds (E/A beside C/A, and C/E)")
	flag.IntVar(&o.stateSamples, "state-samples", 500, "state phase: sequential samples of the creation write and the first-sight lookup")
	flag.Parse()
	// Importing caddy sends the standard logger to zap; take it back.
	log.SetOutput(os.Stderr)
	log.SetFlags(0)
	log.SetPrefix("bench: ")

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		log.Fatal(err)
	}
}

func (o options) has(phase string) bool {
	return slices.Contains(strings.Split(o.phases, ","), phase)
}

// report collects the figures of a run.
type report struct {
	o       options
	machine string

	mem                   memoryResult
	handler               []handlerCost
	session, sessionless  pairSeries
	latency               pairSeries
	paceRate              float64
	pipeB, pipeA1, pipeB1 []pipelineResult
	svcB, svcA1, svcB1    []serviceStats
	queue                 []queueResult
	state                 *stateResult // the state phase, with redis-server
	errors                int
	dropped               int // pairs left out because other processes were busy
	disturbedKept         int // pairs kept although other processes were busy (retries used up)
	errSamples            []string
}

// pairSeries holds the rounds of one scenario, A's and B's in pair order.
type pairSeries struct {
	a, b []result
}

func run(ctx context.Context, o options) error {
	started := time.Now()
	bin, err := filepath.Abs(o.caddy)
	if err != nil {
		return err
	}
	r := &report{o: o, machine: machine(bin)}
	fmt.Println(r.machine)

	if o.has("memory") {
		log.Printf("memory: %d idle sessions in a serializer.Table", o.memSessions)
		r.mem = measureMemory(o.memSessions)
	}

	if o.has("handler") {
		log.Printf("handler: the module's own cost per request, in-process")
		if r.handler, err = measureHandler(o.profileDir); err != nil {
			return err
		}
	}

	if o.has("pipeline") {
		// Before any pinning: the queue with the process's usual threads.
		for i := range o.pipeRounds {
			q := measureQueue(o.depth, o.serviceTime, o.pipeRound)
			r.queue = append(r.queue, q)
			log.Printf("queue alone, round %d/%d, depth %d: %.1f µs per turn, %.1f µs service, handoff %.1f µs",
				i+1, o.pipeRounds, o.depth, us(q.perRequest), us(q.service), us(q.handoff()))
		}
	}

	if !o.has("session") && !o.has("sessionless") && !o.has("latency") && !o.has("pipeline") && !o.has("state") {
		r.print(os.Stdout, time.Since(started))
		return nil
	}
	dir, err := os.MkdirTemp("", "mcp-serializer-bench-")
	if err != nil {
		return err
	}
	if o.keep {
		log.Printf("working directory: %s", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	// With -pin, the load generator and the upstream share one CPU and both
	// Caddys another: A and B then run on the same CPU, one at a time.
	var loadCPU, caddyCPU int
	if o.pin {
		cpus, err := allowedCPUs()
		if err != nil || len(cpus) < 2 {
			return fmt.Errorf("pin: need two CPUs, have %v (%v); run with -pin=false", cpus, err)
		}
		loadCPU, caddyCPU = cpus[0], cpus[1]
		if err := pinProcess(os.Getpid(), loadCPU); err != nil {
			return fmt.Errorf("pin: %w", err)
		}
		runtime.GOMAXPROCS(1)
		log.Printf("load generator and upstream on CPU %d, Caddy A and B on CPU %d", loadCPU, caddyCPU)
	}
	up, err := startUpstream(dir, o.serviceTime)
	if err != nil {
		return err
	}
	defer up.stop()
	profile := o.profileDir != ""
	if profile {
		if err := os.MkdirAll(o.profileDir, 0o755); err != nil {
			return err
		}
	}
	a, err := startCaddy(ctx, bin, dir, "A", false, profile, up.addrs)
	if err != nil {
		return err
	}
	defer a.stop()
	b, err := startCaddy(ctx, bin, dir, "B", !o.control, profile, up.addrs)
	if err != nil {
		return err
	}
	defer b.stop()
	targets := [2]*caddyProc{a, b}
	if o.pin {
		for _, t := range targets {
			if err := pinProcess(t.cmd.Process.Pid, caddyCPU); err != nil {
				return fmt.Errorf("pin: %w", err)
			}
		}
	}

	client := newClient(o.concurrency)
	defer client.CloseIdleConnections()
	base := load{client: client, concurrency: o.concurrency, duration: o.round, warmup: o.warmup,
		pids: []int{os.Getpid(), up.cmd.Process.Pid, a.cmd.Process.Pid, b.cmd.Process.Pid}}

	// Warm both up: connections, Caddy's and the upstream's heaps.
	for _, t := range targets {
		for _, per := range []int{o.perSession, 0} {
			l := base
			l.url, l.perSession, l.duration, l.warmup = t.fast, per, time.Second, 0
			cursors := make([]cursor, l.concurrency)
			l.run(ctx, cursors)
			l.endSessions(ctx, cursors)
		}
	}

	if o.has("session") {
		l := base
		l.perSession = o.perSession
		r.session = r.pairs(ctx, "session", targets, l, o.pairs)
	}
	if o.has("sessionless") {
		r.sessionless = r.pairs(ctx, "sessionless", targets, base, o.pairs)
	}
	if o.has("latency") && ctx.Err() == nil {
		rate := 2000.0
		if len(r.session.a) > 0 {
			rate = o.paceShare * mean(rpsOf(r.session.a))
		}
		r.paceRate = rate
		l := base
		l.perSession = o.perSession
		l.pace = time.Duration(float64(time.Second) * float64(o.concurrency) / rate)
		r.latency = r.pairs(ctx, "latency", targets, l, o.pairs)
	}
	if o.has("pipeline") && ctx.Err() == nil {
		if err := r.pipelines(ctx, targets, client, up); err != nil {
			return err
		}
	}
	if o.has("state") && ctx.Err() == nil {
		if err := r.statePhase(ctx, bin, dir, up, base, targets, caddyCPU, loadCPU); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, t := range targets {
		if !t.running() {
			return fmt.Errorf("caddy %s exited during the run:\n%s", t.label, t.tail())
		}
	}
	r.print(os.Stdout, time.Since(started))
	return nil
}

// pairs runs n pairs of rounds of l, one round against each target, A
// and B alternating: A B, B A, A B, ... so that a trend over the run
// favours neither. A pair during which other processes used more than
// -max-foreign cores is left out and run again (at most -retries times
// per scenario; after that, such pairs are kept and counted).
func (r *report) pairs(ctx context.Context, name string, targets [2]*caddyProc, l load, n int) pairSeries {
	rs := r.rounds(ctx, name, targets[:], l, n)
	s := pairSeries{a: rs[0], b: rs[1]}
	ratio, spread := s.ratio()
	la, lb := s.added(0.5)
	log.Printf("%-11s %d pairs: A %.0f req/s, B %.0f req/s, B/A %.3f ±%.3f; p50 A %.0f µs, B %.0f µs",
		name, len(s.a), mean(rpsOf(s.a)), mean(rpsOf(s.b)), ratio, spread, us(la), us(lb))
	return s
}

// rounds runs n sets of rounds of l, one round against each target, in
// an order that changes from set to set so that each target takes each
// place equally often (two targets: A B, B A, ...; three: every order in
// turn), and a trend over the run favours none. A set during which other
// processes used more than -max-foreign cores is left out and run again
// (at most -retries times per scenario; after that, such sets are kept
// and counted). It returns each target's rounds, in set order.
func (r *report) rounds(ctx context.Context, name string, targets []*caddyProc, l load, n int) [][]result {
	out := make([][]result, len(targets))
	cursors := make([][]cursor, len(targets))
	for ti := range targets {
		cursors[ti] = make([]cursor, l.concurrency)
	}
	orders := roundOrders(len(targets))
	if r.o.profileDir != "" {
		// One profile per Caddy over the whole scenario; it samples only
		// while that Caddy runs.
		var wg sync.WaitGroup
		defer wg.Wait()
		for _, t := range targets {
			path := filepath.Join(r.o.profileDir, fmt.Sprintf("caddy-%s-%s.pprof", t.label, name))
			wg.Go(func() {
				if err := t.cpuProfile(path, time.Duration(len(targets)*n)*l.duration); err != nil {
					log.Printf("profile %s: %v", path, err)
				}
			})
		}
	}
	retries := r.o.retries
	for i := 0; i < n; i++ {
		set := make([]result, len(targets))
		disturbed := 0.0
		for _, ti := range orders[i%len(orders)] {
			if ctx.Err() != nil {
				return out
			}
			t := targets[ti]
			l.url, l.caddyPID = t.fast, t.cmd.Process.Pid
			res := l.run(ctx, cursors[ti])
			set[ti] = res
			disturbed = max(disturbed, cores(res.cpu.foreign, res.cpu.wall))
		}
		if r.o.verbose {
			for ti, res := range set {
				log.Printf("%-11s set %d/%d %s: %6.0f req/s  p50 %6.0f µs  p99 %6.0f µs  CPU cores: Caddy %.2f, load %.2f, upstream %.2f, others %.2f; Caddy %5.1f µs/req  %d errors",
					name, i+1, n, targets[ti].label, res.rps(), us(percentile(res.latencies, 0.50)),
					us(percentile(res.latencies, 0.99)), cores(res.cpu.caddy, res.cpu.wall), cores(res.cpu.self, res.cpu.wall),
					cores(res.cpu.others, res.cpu.wall), cores(res.cpu.foreign, res.cpu.wall), us(res.cpuPerRequest()), res.errors)
			}
		}
		if disturbed > r.o.maxForeign && retries == 0 {
			r.disturbedKept++
		}
		if disturbed > r.o.maxForeign && retries > 0 && ctx.Err() == nil {
			retries--
			r.dropped++
			if r.o.verbose {
				log.Printf("%-11s set %d/%d: other processes used %.2f cores; running it again", name, i+1, n, disturbed)
			}
			i--
			continue
		}
		for ti := range set {
			r.count(set[ti].errors, set[ti].errSample)
			out[ti] = append(out[ti], set[ti])
		}
	}
	for ti, t := range targets {
		l.url = t.fast
		l.endSessions(ctx, cursors[ti])
	}
	return out
}

// roundOrders lists the orders rounds take in turn: for two targets A B
// and B A, for more every permutation, each one next to its reverse.
func roundOrders(n int) [][]int {
	var orders [][]int
	var permute func(prefix, rest []int)
	permute = func(prefix, rest []int) {
		if len(rest) == 0 {
			orders = append(orders, slices.Clone(prefix))
			return
		}
		for i := range rest {
			next := append(slices.Clone(rest[:i]), rest[i+1:]...)
			permute(append(prefix, rest[i]), next)
		}
	}
	first := make([]int, n)
	for i := range first {
		first[i] = i
	}
	permute(nil, first)
	// Each order followed by its reverse, so that a linear trend cancels
	// within every two sets.
	var paired [][]int
	seen := map[string]bool{}
	for _, o := range orders {
		if seen[fmt.Sprint(o)] {
			continue
		}
		rev := slices.Clone(o)
		slices.Reverse(rev)
		seen[fmt.Sprint(o)], seen[fmt.Sprint(rev)] = true, true
		paired = append(paired, o, rev)
	}
	return paired
}

// pipelines runs scenario 3: B with depth requests in flight (the queue
// hands each turn to the next), and one request at a time through A and
// through B for reference.
func (r *report) pipelines(ctx context.Context, targets [2]*caddyProc, client *http.Client, up *upstreamProc) error {
	a, b := targets[0], targets[1]
	type variant struct {
		t     *caddyProc
		depth int
		res   *[]pipelineResult
		svc   *[]serviceStats
	}
	variants := []variant{{b, r.o.depth, &r.pipeB, &r.svcB}, {a, 1, &r.pipeA1, &r.svcA1}, {b, 1, &r.pipeB1, &r.svcB1}}
	for i := range r.o.pipeRounds {
		order := slices.Clone(variants)
		if i%2 == 1 {
			slices.Reverse(order)
		}
		for _, v := range order {
			p := &pipeline{client: client, url: v.t.slow, depth: v.depth, duration: r.o.pipeRound}
			sid, err := p.connect(ctx)
			if err != nil {
				return fmt.Errorf("pipeline %s: %w", v.t.label, err)
			}
			if err := up.resetStats(client); err != nil {
				return err
			}
			res := p.run(ctx, sid)
			svc, err := up.stats(client)
			if err != nil {
				return err
			}
			if err := p.end(ctx, sid); err != nil {
				return fmt.Errorf("pipeline %s: DELETE: %w", v.t.label, err)
			}
			r.count(res.errors, res.errSample)
			*v.res = append(*v.res, res)
			*v.svc = append(*v.svc, svc)
			log.Printf("pipeline    round %d/%d %s depth %2d: %6d requests, %7.1f µs each, upstream %7.1f µs each",
				i+1, r.o.pipeRounds, v.t.label, v.depth, res.requests, us(res.perRequest()), us(svc.mean()))
		}
	}
	return nil
}

func (r *report) count(errors int, sample string) {
	r.errors += errors
	if sample != "" && len(r.errSamples) < 5 {
		r.errSamples = append(r.errSamples, sample)
	}
}

// machine describes where the run happens.
func machine(caddyBin string) string {
	mem := "unknown"
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
				var kb float64
				fmt.Sscan(f[1], &kb)
				mem = fmt.Sprintf("%.1f GiB", kb/(1<<20))
			}
		}
	}
	return fmt.Sprintf("machine: %d CPUs (nproc), %s memory, %s/%s, %s, Caddy %s",
		runtime.NumCPU(), mem, runtime.GOOS, runtime.GOARCH, runtime.Version(), caddyVersion(caddyBin))
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func percentile(lat []time.Duration, p float64) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func rpsOf(rs []result) []float64 {
	out := make([]float64, len(rs))
	for i := range rs {
		out[i] = rs[i].rps()
	}
	return out
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

// stderr of the mean, 0 for fewer than two values.
func stderr(xs []float64) float64 {
	if len(xs) < 2 {
		return 0
	}
	m := mean(xs)
	ss := 0.0
	for _, x := range xs {
		ss += (x - m) * (x - m)
	}
	return math.Sqrt(ss/float64(len(xs)-1)) / math.Sqrt(float64(len(xs)))
}

func allLatencies(rs []result) []time.Duration {
	var out []time.Duration
	for i := range rs {
		out = append(out, rs[i].latencies...)
	}
	return out
}
