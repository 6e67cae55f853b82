package probe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"
)

// Exit statuses of Main.
const (
	ExitOK       = 0 // every connect succeeded
	ExitFailed   = 1 // some connect failed, or the run was interrupted
	ExitBadInput = 2 // bad options, or a target that cannot be probed
)

// Defaults of the command's options.
const (
	DefaultConnects    = 200
	DefaultConcurrency = 16
)

// Options are the command's settings.
type Options struct {
	URL     string // required
	Compare string // a second URL, probed after URL and shown beside it
	// Connects per URL and how many run at a time.
	Connects    int
	Concurrency int
	// PreferEventStream asks for text/event-stream replies first.
	PreferEventStream bool
	Timeout           time.Duration // per request
	JSON              bool          // one JSON object instead of the table
	Stdout            io.Writer
	// Progress, when set, gets a progress line, redrawn in place, while
	// connects run: set it for a terminal only.
	Progress io.Writer
}

// Main probes the URL (and Compare) the way `caddy mcp-probe` does, writes
// the table or the JSON object to Stdout, and returns the exit status with
// an error that says why it is not ExitOK.
func Main(ctx context.Context, o Options) (int, error) {
	rep := report{Connects: o.Connects, Concurrency: o.Concurrency, PreferEventStream: o.PreferEventStream, Timeout: o.Timeout.String()}
	fail := func(code int, err error) (int, error) {
		if o.JSON {
			rep.Failed, rep.Error = true, err.Error()
			_ = rep.writeJSON(o.Stdout)
		}
		return code, err
	}
	if err := o.validate(); err != nil {
		return fail(ExitBadInput, err)
	}
	urls := []string{o.URL}
	if o.Compare != "" {
		urls = append(urls, o.Compare)
	}
	drivers := make([]Driver, len(urls))
	for i, u := range urls {
		drivers[i] = Driver{URL: u, Delete: true, PreferEventStream: o.PreferEventStream, Timeout: o.Timeout}
	}

	// Every target is checked before any is probed: a typo in the second
	// URL should not cost the time of the first run.
	servers := make([]Server, len(urls))
	for i, d := range drivers {
		srv, err := d.Check(ctx)
		if ctx.Err() != nil {
			return fail(ExitFailed, errors.New("interrupted"))
		}
		if err != nil {
			return fail(ExitBadInput, err)
		}
		servers[i] = srv
	}

	var failures []string
	for i, d := range drivers {
		client := NewClient(o.Concurrency)
		d.Client = client
		stop := o.showProgress(&d)
		sum := d.Run(ctx, o.Connects, o.Concurrency)
		stop()
		client.CloseIdleConnections()
		rep.Targets = append(rep.Targets, newTargetReport(d.URL, servers[i], sum))
		switch {
		case sum.Interrupted:
			failures = append(failures, fmt.Sprintf("interrupted after %d of %d connects to %s", sum.Connects, o.Connects, d.URL))
		case sum.Failed > 0:
			failures = append(failures, fmt.Sprintf("%d of %d connects to %s failed", sum.Failed, sum.Connects, d.URL))
		}
		if sum.Interrupted {
			break
		}
	}

	rep.Failed = len(failures) > 0
	var err error
	if o.JSON {
		err = rep.writeJSON(o.Stdout)
	} else {
		err = rep.writeTable(o.Stdout)
	}
	if err != nil {
		return ExitFailed, fmt.Errorf("writing the report: %w", err)
	}
	if rep.Failed {
		return ExitFailed, errors.New(strings.Join(failures, "; "))
	}
	return ExitOK, nil
}

func (o Options) validate() error {
	switch {
	case o.URL == "":
		return errors.New("--url is required: the MCP endpoint to probe, for example http://127.0.0.1:9081/mcp")
	case o.Connects < 1:
		return fmt.Errorf("-n must be at least 1, not %d", o.Connects)
	case o.Concurrency < 1:
		return fmt.Errorf("--concurrency must be at least 1, not %d", o.Concurrency)
	case o.Timeout <= 0:
		return fmt.Errorf("--timeout must be positive, not %v", o.Timeout)
	}
	if err := CheckURL(o.URL); err != nil {
		return err
	}
	if o.Compare != "" {
		return CheckURL(o.Compare)
	}
	return nil
}

// showProgress redraws one line on o.Progress while d runs; the returned
// function clears it.
func (o Options) showProgress(d *Driver) (stop func()) {
	if o.Progress == nil {
		return func() {}
	}
	var done, failed atomic.Int64
	d.OnConnect = func(r Result) {
		done.Add(1)
		if r.Failed() {
			failed.Add(1)
		}
	}
	draw := func() {
		fmt.Fprintf(o.Progress, "\r\033[Kprobing %s: %d/%d connects, %d failed", d.URL, done.Load(), o.Connects, failed.Load())
	}
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			draw()
			select {
			case <-quit:
				return
			case <-tick.C:
			}
		}
	})
	return func() {
		close(quit)
		wg.Wait()
		fmt.Fprint(o.Progress, "\r\033[K")
	}
}

// report is the command's result, as JSON or as the table.
type report struct {
	Connects          int            `json:"connects"`
	Concurrency       int            `json:"concurrency"`
	PreferEventStream bool           `json:"prefer_event_stream"`
	Timeout           string         `json:"timeout"`
	Targets           []targetReport `json:"targets"`
	// Failed is true when any connect failed, the run was interrupted, or
	// (with Error set) nothing could be probed.
	Failed bool   `json:"failed"`
	Error  string `json:"error,omitempty"`
}

type targetReport struct {
	URL             string   `json:"url"`
	Server          Server   `json:"server"`
	Connects        int      `json:"connects"`
	Failed          int      `json:"failed"`
	FailureRate     float64  `json:"failure_rate"`
	Broken          int      `json:"broken_sessions"`
	Rejected        int      `json:"rejections"`
	HTTPErrors      int      `json:"http_errors"`
	IDMismatches    int      `json:"wrong_id_replies"`
	TransportErrors int      `json:"transport_errors"`
	OtherErrors     int      `json:"other_errors"`
	EventStreams    int      `json:"event_stream_responses"`
	P50             float64  `json:"connect_p50_ms"`
	P99             float64  `json:"connect_p99_ms"`
	Elapsed         float64  `json:"elapsed_ms"`
	Interrupted     bool     `json:"interrupted"`
	Samples         []string `json:"samples"`
}

func newTargetReport(url string, srv Server, s Summary) targetReport {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	samples := s.Samples
	if samples == nil {
		samples = []string{}
	}
	return targetReport{
		URL: url, Server: srv,
		Connects: s.Connects, Failed: s.Failed, FailureRate: s.FailureRate(), Broken: s.Broken,
		Rejected: s.Rejected, HTTPErrors: s.HTTPErrors, IDMismatches: s.IDMismatches,
		TransportErrors: s.TransportErrors, OtherErrors: s.OtherErrors, EventStreams: s.EventStreams,
		P50: ms(s.Latency(0.5)), P99: ms(s.Latency(0.99)), Elapsed: ms(s.Elapsed),
		Interrupted: s.Interrupted, Samples: samples,
	}
}

func (r report) writeJSON(w io.Writer) error {
	if r.Targets == nil {
		r.Targets = []targetReport{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func (r report) writeTable(w io.Writer) error {
	accept := "JSON replies preferred"
	if r.PreferEventStream {
		accept = "event streams preferred"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d pipelined connects per URL, %d at a time, timeout %s, %s\n\n", r.Connects, r.Concurrency, r.Timeout, accept)

	tw := tabwriter.NewWriter(&b, 0, 0, 3, ' ', 0)
	row := func(label string, cell func(t targetReport) string) {
		fmt.Fprint(tw, label)
		for _, t := range r.Targets {
			fmt.Fprint(tw, "\t", cell(t))
		}
		fmt.Fprintln(tw)
	}
	count := func(f func(t targetReport) int) func(targetReport) string {
		return func(t targetReport) string { return fmt.Sprint(f(t)) }
	}
	row("", func(t targetReport) string { return t.URL })
	row("server", func(t targetReport) string { return t.Server.String() })
	row("connects failed", func(t targetReport) string {
		s := fmt.Sprintf("%d of %d (%.1f%%)", t.Failed, t.Connects, 100*t.FailureRate)
		if t.Interrupted {
			s += ", interrupted"
		}
		return s
	})
	row("sessions left broken", count(func(t targetReport) int { return t.Broken }))
	row("rejections (-32600)", count(func(t targetReport) int { return t.Rejected }))
	row("HTTP errors", count(func(t targetReport) int { return t.HTTPErrors }))
	row("replies with wrong id", count(func(t targetReport) int { return t.IDMismatches }))
	row("transport errors", count(func(t targetReport) int { return t.TransportErrors }))
	row("other errors", count(func(t targetReport) int { return t.OtherErrors }))
	if r.PreferEventStream || anyTarget(r.Targets, func(t targetReport) bool { return t.EventStreams > 0 }) {
		row("event-stream responses", count(func(t targetReport) int { return t.EventStreams }))
	}
	row("connect p50 / p99", func(t targetReport) string { return fmtMS(t.P50) + " / " + fmtMS(t.P99) })
	row("took", func(t targetReport) string { return fmtMS(t.Elapsed) })
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, t := range r.Targets {
		if len(t.Samples) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\nfirst problems at %s:\n", t.URL)
		for _, s := range t.Samples {
			fmt.Fprintf(&b, "  %s\n", s)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func anyTarget(ts []targetReport, f func(targetReport) bool) bool {
	for _, t := range ts {
		if f(t) {
			return true
		}
	}
	return false
}

// fmtMS prints milliseconds with the precision that matters at their size.
func fmtMS(ms float64) string {
	switch {
	case ms >= 1000:
		return fmt.Sprintf("%.1fs", ms/1000)
	case ms >= 10:
		return fmt.Sprintf("%.0fms", ms)
	default:
		return fmt.Sprintf("%.1fms", ms)
	}
}
