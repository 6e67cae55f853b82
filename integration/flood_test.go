package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/testnet"
	"github.com/mcpserializer/caddy-mcp-serializer/probe"
)

// A client opening sessions with initialize and never sending
// notifications/initialized costs the table one gated session each. A
// flood of them through the built binary must neither grow the table past
// max_sessions (plus the sessions with a request in flight) nor slow or
// break the sessions of other clients: 100 pipelined connects run alone,
// then again while 16 clients flood initialize, and fail none of their
// requests either time. The elapsed times and their ratio are reported,
// not asserted.
func TestInitializeFloodLeavesOtherSessionsUnharmed(t *testing.T) {
	const (
		maxSessions      = 1000
		flood            = 20_000 // initializes at least, and until the probe is done
		floodClients     = 16
		connects         = 100
		probeConcurrency = 4
		// Sessions with a request in flight are never evicted.
		bound = maxSessions + floodClients + probeConcurrency
	)
	stub := startFastStub(t)
	// init_timeout outlasts the test: every flood session stays gated.
	c := runCaddy(t, caddySite(fmt.Sprintf(`	mcp_serializer {
		max_sessions %d
		init_timeout 10m
	}
	reverse_proxy %s`, maxSessions, stub)))
	url := c.URL + "/mcp"

	s := startSessionSampler(t, c.Admin)

	alone := probe.RunPipelined(t.Context(), url, connects, probeConcurrency)
	t.Logf("without the flood: %v (p50 %v, p99 %v)", alone, alone.Latency(0.5), alone.Latency(0.99))
	aloneMax := s.peak()

	// Every wait has a bound; a table scanned whole per new session takes
	// minutes here, and the bound keeps such a run from hanging the suite.
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	var (
		sent, created, refused atomic.Int64
		probeDone              = make(chan struct{})
		tableFull              = make(chan struct{})
		fullOnce               sync.Once
		problemsMu             sync.Mutex
		floodProblems          []string
	)
	client := probe.NewClient(floodClients)
	defer client.CloseIdleConnections()
	floodStart := time.Now()
	var wg sync.WaitGroup
	for range floodClients {
		wg.Go(func() {
			for ctx.Err() == nil {
				if sent.Load() >= flood {
					select {
					case <-probeDone:
						return
					default:
					}
				}
				sent.Add(1)
				status, sid, err := initializeOnly(ctx, client, url)
				switch {
				case ctx.Err() != nil:
					return
				case err == nil && status == http.StatusOK && sid != "":
					if created.Add(1) == maxSessions+floodClients {
						fullOnce.Do(func() { close(tableFull) })
					}
				default:
					refused.Add(1)
					problemsMu.Lock()
					if len(floodProblems) < 5 {
						floodProblems = append(floodProblems, fmt.Sprintf("status %d, session id set %t: %v", status, sid != "", err))
					}
					problemsMu.Unlock()
				}
			}
		})
	}

	// The probe starts once the table is full of gated flood sessions.
	var flooded probe.Summary
	select {
	case <-tableFull:
		flooded = probe.RunPipelined(ctx, url, connects, probeConcurrency)
	case <-ctx.Done():
	}
	close(probeDone)
	probeEnd := time.Since(floodStart)
	wg.Wait()
	floodElapsed := time.Since(floodStart)
	cancel()
	floodMax, floodSamples, last := s.stop()

	t.Logf("with the flood: %v (p50 %v, p99 %v)", flooded, flooded.Latency(0.5), flooded.Latency(0.99))
	t.Logf("flood: %d initializes (%d sessions created, %d not) in %v, %.0f/s; the probe ran within its first %v",
		sent.Load(), created.Load(), refused.Load(), floodElapsed.Round(time.Millisecond),
		float64(sent.Load())/floodElapsed.Seconds(), probeEnd.Round(time.Millisecond))
	if alone.Elapsed > 0 && flooded.Elapsed > 0 {
		t.Logf("elapsed for %d pipelined connects: %v alone, %v under the flood: factor %.2f",
			connects, alone.Elapsed.Round(time.Millisecond), flooded.Elapsed.Round(time.Millisecond),
			flooded.Elapsed.Seconds()/alone.Elapsed.Seconds())
	}
	t.Logf("tracked sessions: at most %d without the flood, %d with it (%d samples), %d at the end (%+v); bound %d",
		aloneMax, floodMax, floodSamples, last.Sessions, last, bound)
	evictions := adminMetric(t, c.Admin, "caddy_mcp_serializer_evictions_total")
	rejections := adminMetric(t, c.Admin, "caddy_mcp_serializer_rejections_total")
	t.Logf("evictions by label set: %v; rejections by label set: %v", evictions, rejections)

	if alone.Connects != connects || alone.Failed != 0 {
		t.Errorf("without the flood: want %d connects and no failure: %v", connects, alone)
	}
	if flooded.Connects != connects || flooded.Failed != 0 {
		t.Errorf("with the flood: want %d connects and no failure: %v", connects, flooded)
	}
	if sent.Load() < flood || refused.Load() != 0 {
		t.Errorf("flood: %d of at least %d initializes sent, %d not answered 200 with a session id; first problems: %q",
			sent.Load(), flood, refused.Load(), floodProblems)
	}
	if floodMax > bound || last.Sessions > bound {
		t.Errorf("tracked sessions reached %d (%d at the end): more than max_sessions %d plus %d requests in flight",
			floodMax, last.Sessions, maxSessions, floodClients+probeConcurrency)
	}
	// Every flood session was gated, and all but max_sessions of them had
	// to go to make room.
	if gated, want := evictions[`{gate="initializing"}`], float64(created.Load()-maxSessions); gated < want {
		t.Errorf("evictions_total{gate=\"initializing\"} = %v, want at least %v", gated, want)
	}
}

// startFastStub runs the Go stand-in (demo-backend) with no simulated
// work, so that it creates sessions as fast as it is asked to, in its own
// process: the test binary may run with -race, the backend need not.
func startFastStub(t testing.TB) string {
	t.Helper()
	addr := "127.0.0.1:" + strconv.Itoa(testnet.FreePort(t))
	logPath := filepath.Join(t.TempDir(), "stub.log")
	dumpOnFailure(t, "stub", logPath)
	cmd := exec.Command(demoBackendBinary(t), "-listen", addr, "-work-min", "0", "-work-max", "0")
	p := startProcess(t, "demo-backend "+addr, cmd, logPath, syscall.SIGTERM, 5*time.Second)
	waitTCP(t, p, addr, logPath)
	return addr
}

// initializeOnly opens a session and leaves it there: no
// notifications/initialized, no DELETE.
func initializeOnly(ctx context.Context, client *http.Client, url string) (status int, sid string, err error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(initializeBody))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("Mcp-Session-Id"), err
}

// tableCountsSample is the counts of the one table in
// GET /mcp_serializer/sessions.
type tableCountsSample struct {
	Sessions     int `json:"sessions"`
	Initializing int `json:"initializing"`
	Open         int `json:"open"`
	InFlight     int `json:"in_flight"`
	Waiting      int `json:"waiting"`
}

// sessionSampler reads the session counts from the admin endpoint every
// few milliseconds and keeps the largest number of sessions seen.
type sessionSampler struct {
	admin   string
	stopped chan struct{}
	done    chan struct{}

	mu      sync.Mutex
	max     int
	samples int
	last    tableCountsSample
	err     error
}

func startSessionSampler(t testing.TB, admin string) *sessionSampler {
	s := &sessionSampler{admin: admin, stopped: make(chan struct{}), done: make(chan struct{})}
	client := &http.Client{Timeout: 5 * time.Second}
	go func() {
		defer close(s.done)
		for {
			select {
			case <-s.stopped:
				s.sample(client) // the last, after every response
				return
			default:
			}
			s.sample(client)
			select {
			case <-s.stopped:
			case <-time.After(25 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() {
		select {
		case <-s.stopped:
		default:
			close(s.stopped)
		}
		<-s.done
		if s.err != nil {
			t.Errorf("sampling GET /mcp_serializer/sessions: %v", s.err)
		}
	})
	return s
}

// peak returns the most sessions seen since the last call, and starts over.
func (s *sessionSampler) peak() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.max
	s.max, s.samples = 0, 0
	return m
}

// sample reads the session counts once.
func (s *sessionSampler) sample(client *http.Client) {
	counts, err := sampleSessions(client, s.admin)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil && s.err == nil {
		s.err = err
	}
	if err == nil {
		s.max = max(s.max, counts.Sessions)
		s.samples++
		s.last = counts
	}
}

// stop ends sampling and returns the most sessions seen since the last
// peak, the number of samples, and the last counts.
func (s *sessionSampler) stop() (maxSeen, samples int, last tableCountsSample) {
	close(s.stopped)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.max, s.samples, s.last
}

func sampleSessions(client *http.Client, admin string) (tableCountsSample, error) {
	resp, err := client.Get("http://" + admin + "/mcp_serializer/sessions?limit=0")
	if err != nil {
		return tableCountsSample{}, err
	}
	defer resp.Body.Close()
	var rep struct {
		Tables []struct {
			Counts tableCountsSample `json:"counts"`
		} `json:"tables"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil || resp.StatusCode != http.StatusOK || len(rep.Tables) != 1 {
		return tableCountsSample{}, fmt.Errorf("%s, %d tables: %v", resp.Status, len(rep.Tables), err)
	}
	return rep.Tables[0].Counts, nil
}

// adminMetric returns the samples of a metric on Caddy's admin /metrics,
// by label set ("" when it has none).
func adminMetric(t testing.TB, admin, name string) map[string]float64 {
	t.Helper()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	out := map[string]float64{}
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `(\{[^}]*\})? (\S+)$`)
	for _, m := range re.FindAllStringSubmatch(string(body), -1) {
		if v, err := strconv.ParseFloat(m[2], 64); err == nil {
			out[m[1]] += v
		}
	}
	return out
}
