package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"
)

// ratio is B/A of the mean throughputs, with the spread of the per-pair
// ratios (two standard errors).
func (s pairSeries) ratio() (r, spread float64) {
	n := min(len(s.a), len(s.b))
	if n == 0 {
		return math.NaN(), 0
	}
	var per []float64
	for i := range n {
		if s.a[i].requests > 0 && s.b[i].requests > 0 {
			per = append(per, s.b[i].rps()/s.a[i].rps())
		}
	}
	return mean(rpsOf(s.b[:n])) / mean(rpsOf(s.a[:n])), 2 * stderr(per)
}

// added is B's latency percentile minus A's, over all rounds.
func (s pairSeries) added(p float64) (a, b time.Duration) {
	return percentile(allLatencies(s.a), p), percentile(allLatencies(s.b), p)
}

// cpuPerRequest is the Caddy's CPU time per request over all rounds.
func cpuPerRequest(rs []result) float64 {
	var cpu time.Duration
	n := 0
	for _, r := range rs {
		cpu += r.cpu.caddy
		n += r.requests
	}
	if n == 0 {
		return math.NaN()
	}
	return us(cpu) / float64(n)
}

// foreignCores is the mean CPU use of other processes during the rounds.
func foreignCores(s pairSeries) float64 {
	var xs []float64
	for _, r := range append(slices.Clone(s.a), s.b...) {
		xs = append(xs, cores(r.cpu.foreign, r.cpu.wall))
	}
	return mean(xs)
}

func sessionsDone(rs []result) int {
	n := 0
	for _, r := range rs {
		n += r.sessions
	}
	return n
}

// handoff is the mean over rounds of the wall time per request beyond the
// upstream's measured service time.
func handoff(rs []pipelineResult, svc []serviceStats) (wall, service, gap float64) {
	if len(rs) == 0 {
		return math.NaN(), math.NaN(), math.NaN()
	}
	for i := range rs {
		wall += us(rs[i].perRequest())
		service += us(svc[i].mean())
	}
	n := float64(len(rs))
	wall, service = wall/n, service/n
	return wall, service, wall - service
}

func (r *report) print(w io.Writer, elapsed time.Duration) {
	o := r.o
	fmt.Fprintf(w, "load: %d concurrent clients, sessions of initialize + initialized + %d requests + DELETE; %d rounds of %v per target and scenario (first %v of each not measured), A and B alternating\n",
		o.concurrency, o.perSession, o.pairs, o.round, o.warmup)
	if o.pin {
		fmt.Fprintf(w, "CPUs: load generator and upstream pinned to one CPU, Caddy A and Caddy B to another\n\n")
	} else {
		fmt.Fprintf(w, "CPUs: not pinned\n\n")
	}
	var rows [][]string
	row := func(cells ...string) { rows = append(rows, cells) }
	row("figure", "A: reverse_proxy", "B: + mcp_serializer", "B vs A", "target")
	row("", "", "", "", "")

	if len(r.session.a) > 0 {
		ratio, spread := r.session.ratio()
		row("session traffic, throughput (req/s)", f0(mean(rpsOf(r.session.a))), f0(mean(rpsOf(r.session.b))),
			fmt.Sprintf("%.3f ±%.3f", ratio, spread), "≥ 0.95")
		row("  sessions completed (all rounds)", fmt.Sprint(sessionsDone(r.session.a)), fmt.Sprint(sessionsDone(r.session.b)), "", "≥ 200")
		ca, cb := cpuPerRequest(r.session.a), cpuPerRequest(r.session.b)
		row("  Caddy CPU per request (µs)", f1(ca), f1(cb), signed(cb-ca), "")
		for _, p := range []float64{0.5, 0.99} {
			la, lb := r.session.added(p)
			row(fmt.Sprintf("  latency p%.0f at saturation (µs)", p*100), f0(us(la)), f0(us(lb)), signed(us(lb-la)), "")
		}
	}
	if len(r.sessionless.a) > 0 {
		ratio, spread := r.sessionless.ratio()
		row("session-less (MCP 2026-07-28) traffic, throughput (req/s)", f0(mean(rpsOf(r.sessionless.a))), f0(mean(rpsOf(r.sessionless.b))),
			fmt.Sprintf("%.3f ±%.3f", ratio, spread), "≥ 0.99")
		ca, cb := cpuPerRequest(r.sessionless.a), cpuPerRequest(r.sessionless.b)
		row("  Caddy CPU per request (µs)", f1(ca), f1(cb), signed(cb-ca), "")
		for _, p := range []float64{0.5, 0.99} {
			la, lb := r.sessionless.added(p)
			row(fmt.Sprintf("  latency p%.0f at saturation (µs)", p*100), f0(us(la)), f0(us(lb)), signed(us(lb-la)), "")
		}
	}
	if len(r.latency.a) > 0 {
		row(fmt.Sprintf("session traffic at %.0f req/s (%.0f%% of A's max)", r.paceRate, 100*o.paceShare),
			f0(mean(rpsOf(r.latency.a))), f0(mean(rpsOf(r.latency.b))), "", "")
		for _, p := range []float64{0.5, 0.9, 0.99} {
			la, lb := r.latency.added(p)
			target := ""
			if p == 0.5 {
				target = "≤ +50"
			}
			row(fmt.Sprintf("  latency p%.0f (µs)", p*100), f1(us(la)), f1(us(lb)), signed(us(lb-la)), target)
		}
	}
	if len(r.pipeB) > 0 {
		wall, svc, gap := handoff(r.pipeB, r.svcB)
		row(fmt.Sprintf("one session, %d in flight, upstream %v: per request (µs)", o.depth, o.serviceTime), "", f1(wall), "", "")
		row("  upstream's measured service time (µs)", "", f1(svc), "", "")
		row("  handoff = per request - upstream's service time (µs)", "", f1(gap), "", "≤ 20")
		row("  per request - nominal service time (µs)", "", f1(wall-us(o.serviceTime)), "", "")
		if len(r.queue) > 0 {
			row("  the queue alone, in-process serializer.Table: handoff (µs)", "", f1(queueHandoff(r.queue)), "", "")
		}
		wa, sa, ga := handoff(r.pipeA1, r.svcA1)
		wb, sb, gb := handoff(r.pipeB1, r.svcB1)
		row("one request at a time: per request (µs)", f1(wa), f1(wb), signed(wb-wa), "")
		row("  upstream's measured service time (µs)", f1(sa), f1(sb), "", "")
		row("  per request - service time (µs)", f1(ga), f1(gb), signed(gb-ga), "")
	}
	if r.mem.sessions > 0 {
		row(fmt.Sprintf("table heap per idle session, %d sessions (bytes)", r.mem.sessions), "", fmt.Sprintf("%.0f", r.mem.initialized), "", "≤ 1024")
		row("  sessions first seen by id, FIFO only (bytes)", "", fmt.Sprintf("%.0f", r.mem.unknown), "", "")
	}
	for _, c := range r.handler {
		row(fmt.Sprintf("module's own CPU per request, in-process, %s (µs)", c.name), "", f1(us(c.added())), "", "")
		row("  allocations added (count / bytes)", "", fmt.Sprintf("%d / %d", c.allocs, c.bytes), "", "")
	}
	rows = append(rows, r.state.rows()...)
	// The figure column is left-aligned, the numbers right-aligned.
	width := 0
	for _, cells := range rows {
		width = max(width, utf8.RuneCountInString(cells[0]))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for _, cells := range rows {
		fmt.Fprintf(tw, "%-*s\t%s\t\n", width, cells[0], strings.Join(cells[1:], "\t"))
	}
	tw.Flush()

	var busy []string
	var state pairSeries
	if r.state != nil {
		state = r.state.on // A's and C's rounds
	}
	for _, x := range []struct {
		name string
		s    pairSeries
	}{{"session", r.session}, {"session-less", r.sessionless}, {"latency", r.latency}, {"state", state}} {
		if len(x.s.a) > 0 {
			busy = append(busy, fmt.Sprintf("%s %.2f", x.name, foreignCores(x.s)))
		}
	}
	if len(busy) > 0 {
		fmt.Fprintf(w, "\nother processes' CPU during the measured rounds (cores, mean): %s", strings.Join(busy, ", "))
		fmt.Fprintf(w, "\npairs (sets, in the state phase) left out and run again because other processes used more than %.2f cores: %d; such pairs kept once retries ran out: %d",
			o.maxForeign, r.dropped, r.disturbedKept)
	}
	fmt.Fprintf(w, "\nerrors: %d", r.errors)
	for _, s := range r.errSamples {
		fmt.Fprintf(w, "\n  %s", s)
	}
	fmt.Fprintf(w, "\nwall time: %v\n", elapsed.Round(time.Second))

	sessionRatio, _ := r.session.ratio()
	sessionlessRatio, _ := r.sessionless.ratio()
	added50, added99 := math.NaN(), math.NaN()
	if len(r.latency.a) > 0 {
		a50, b50 := r.latency.added(0.5)
		a99, b99 := r.latency.added(0.99)
		added50, added99 = us(b50-a50), us(b99-a99)
	}
	_, _, gap := handoff(r.pipeB, r.svcB)
	perSession := math.NaN()
	if r.mem.sessions > 0 {
		perSession = r.mem.initialized
	}
	fmt.Fprintf(w, "throughput_ratio_session=%.3f throughput_ratio_sessionless=%.3f p50_added_us=%.1f p99_added_us=%.1f handoff_us=%.1f bytes_per_session=%.0f cpu_added_us_session=%.1f cpu_added_us_sessionless=%.1f queue_handoff_us=%.1f\n",
		sessionRatio, sessionlessRatio, added50, added99, gap, perSession,
		r.session.cpuAdded(), r.sessionless.cpuAdded(), queueHandoff(r.queue))
}

// cpuAdded is B's Caddy CPU per request minus A's, over all rounds (µs);
// NaN when the scenario did not run.
func (s pairSeries) cpuAdded() float64 {
	if len(s.a) == 0 || len(s.b) == 0 {
		return math.NaN()
	}
	return cpuPerRequest(s.b) - cpuPerRequest(s.a)
}

// queueHandoff is the mean handoff of the in-process queue rounds (µs);
// NaN when none ran.
func queueHandoff(qs []queueResult) float64 {
	if len(qs) == 0 {
		return math.NaN()
	}
	var h []float64
	for _, q := range qs {
		h = append(h, us(q.handoff()))
	}
	return mean(h)
}

func f0(x float64) string { return fmt.Sprintf("%.0f", x) }
func f1(x float64) string { return fmt.Sprintf("%.1f", x) }

func signed(x float64) string { return fmt.Sprintf("%+.1f", x) }
