package probe

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Summary adds up the Results of many connects. Failed and Broken count
// connects; the other counts are of responses and replies, summed over
// all connects.
type Summary struct {
	Connects        int
	Failed          int // connects with any problem
	Rejected        int // replies with -32600
	HTTPErrors      int // responses outside 2xx
	IDMismatches    int // replies with another request's id
	TransportErrors int // requests without a complete response
	OtherErrors     int // missing replies, undecodable bodies, other JSON-RPC errors
	Broken          int // connects whose check tools/list was answered with an error
	EventStreams    int // responses that came as text/event-stream
	// Samples holds the first few distinct problem descriptions.
	Samples []string
	Elapsed time.Duration
	// Interrupted is set when the context ended before all connects ran;
	// connects cut short by it are not counted.
	Interrupted bool

	durations []time.Duration
}

const maxSamples = 5

// Add counts one Result.
func (s *Summary) Add(r Result) {
	s.Connects++
	if r.Failed() {
		s.Failed++
	}
	if r.Broken {
		s.Broken++
	}
	s.Rejected += r.Rejected
	s.HTTPErrors += r.HTTPErrors
	s.IDMismatches += r.IDMismatches
	s.TransportErrors += r.TransportErrors
	s.OtherErrors += r.OtherErrors
	s.EventStreams += r.EventStreams
	for _, err := range r.Errors {
		if len(s.Samples) < maxSamples && !slices.Contains(s.Samples, err.Error()) {
			s.Samples = append(s.Samples, err.Error())
		}
	}
	s.durations = append(s.durations, r.Elapsed)
}

// FailureRate is Failed/Connects (0 when nothing ran).
func (s Summary) FailureRate() float64 {
	if s.Connects == 0 {
		return 0
	}
	return float64(s.Failed) / float64(s.Connects)
}

// Latency returns the q-quantile (0 < q ≤ 1, nearest rank) of the connects'
// durations, 0 when none ran.
func (s Summary) Latency(q float64) time.Duration {
	if len(s.durations) == 0 {
		return 0
	}
	d := slices.Clone(s.durations)
	slices.Sort(d)
	rank := int(math.Ceil(q * float64(len(d))))
	return d[min(max(rank, 1), len(d))-1]
}

func (s Summary) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d connects in %v: %d failed (%.1f%%), %d broken; %d rejections, %d HTTP errors, %d replies with the wrong id, %d transport errors, %d other errors",
		s.Connects, s.Elapsed.Round(time.Millisecond), s.Failed, 100*s.FailureRate(), s.Broken,
		s.Rejected, s.HTTPErrors, s.IDMismatches, s.TransportErrors, s.OtherErrors)
	if s.Interrupted {
		b.WriteString(" (interrupted)")
	}
	for _, e := range s.Samples {
		b.WriteString("\n  error: ")
		b.WriteString(e)
	}
	return b.String()
}

// Run performs n connects, at most concurrency at a time, and sums them up.
// Once ctx is done it starts no more connects and drops the ones it cut
// short.
func (d Driver) Run(ctx context.Context, n, concurrency int) Summary {
	concurrency = max(1, min(concurrency, n))
	start := time.Now()
	var (
		next atomic.Int64
		mu   sync.Mutex
		sum  Summary
		wg   sync.WaitGroup
	)
	for range concurrency {
		wg.Go(func() {
			for next.Add(1) <= int64(n) && ctx.Err() == nil {
				r := d.Connect(ctx)
				if ctx.Err() != nil {
					return
				}
				mu.Lock()
				sum.Add(r)
				if d.OnConnect != nil {
					d.OnConnect(r)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	sum.Elapsed = time.Since(start)
	sum.Interrupted = sum.Connects < n
	return sum
}

// RunPipelined performs n pipelined connects (with DELETE) against url, at
// most concurrency at a time, over its own connection pool.
func RunPipelined(ctx context.Context, url string, n, concurrency int) Summary {
	client := NewClient(concurrency)
	defer client.CloseIdleConnections()
	return Driver{Client: client, URL: url, Delete: true}.Run(ctx, n, concurrency)
}

// PipelinedConnect runs one pipelined connect against url with client and
// ends the session with DELETE.
func PipelinedConnect(ctx context.Context, client *http.Client, url string) Result {
	return Driver{Client: client, URL: url, Delete: true}.Connect(ctx)
}

// NewClient returns an HTTP client whose pool keeps enough idle connections
// for concurrency connects (three requests each at the pipelined step), so
// a run does not churn through ephemeral ports. Requests are bounded by
// Driver.Timeout, not by the client.
func NewClient(concurrency int) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 3*max(concurrency, 1) + 2
	t.MaxIdleConns = max(t.MaxIdleConns, t.MaxIdleConnsPerHost)
	return &http.Client{Transport: t}
}
