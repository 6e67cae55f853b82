package redisstate

import (
	"bytes"
	"context"
	"os"
	"runtime"
	rtmetrics "runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/enginetest"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/redistest"
	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
	"github.com/mcpserializer/caddy-mcp-serializer/stateengine"
)

// BenchmarkSessionRecordsOnRedis is what the records of one session cost
// a table on a real redis-server, as Caddy drives it: initialize (Begin,
// whose Created is synchronous), notifications/initialized, 8 requests,
// DELETE. Sessions run one at a time, then 64 at once with a slice of CPU
// work per request, as on a busy instance. Beside ns/op it reports, per
// session, this process's and redis-server's CPU time, the goroutines
// this process started, and the commands and reads (round trips) Redis
// served.
func BenchmarkSessionRecordsOnRedis(b *testing.B) {
	addr := redistest.Start(b)
	eng := enginetest.Load(b, nil, "redis", map[string]any{"address": []string{addr}}).(*Engine)
	probe := redis.NewClient(&redis.Options{Addr: addr})
	b.Cleanup(func() { probe.Close() })
	for _, c := range []struct {
		name    string
		clients int
		work    time.Duration
		engine  stateengine.Engine
	}{
		{"sequential", 1, 0, eng},
		{"concurrent", 64, 25 * time.Microsecond, eng},
		// An engine that answers at once: the table's and the adapter's
		// part alone.
		{"concurrent-no-server", 64, 25 * time.Microsecond, answeringEngine{}},
		// No store: what the table and the work cost.
		{"concurrent-stateless", 64, 25 * time.Microsecond, nil},
	} {
		b.Run(c.name, func(b *testing.B) {
			cfg := serializer.Defaults()
			if c.engine != nil {
				enginetest.NewAdapter(c.engine, time.Hour, zap.NewNop()).Configure(&cfg)
			}
			table := serializer.NewTable(cfg)
			defer table.Close()
			var next atomic.Int64
			session := func() {
				ctx := context.Background()
				id := "bench-" + strconv.FormatInt(next.Add(1), 10)
				init, _ := table.Begin(id, nil)
				burn(c.work)
				init.Done(200)
				for i, traits := range append([]serializer.Traits{serializer.CarriesInitialized},
					append(make([]serializer.Traits, 8), serializer.EndsSession)...) {
					turn, err := table.Acquire(ctx, id, traits)
					if err != nil {
						b.Fatal(err)
					}
					burn(c.work)
					status := 200
					if i == 0 {
						status = 202
					}
					turn.Done(status)
				}
			}
			session() // the scripts loaded, a connection open
			waitForNoRecords(b, probe)

			before := takeCosts(b, probe)
			b.ResetTimer()
			var wg sync.WaitGroup
			var done atomic.Int64
			for range c.clients {
				wg.Go(func() {
					for done.Add(1) <= int64(b.N) {
						session()
					}
				})
			}
			wg.Wait()
			waitForNoRecords(b, probe) // the last Forgets sent
			b.StopTimer()
			takeCosts(b, probe).sub(before).report(b)
		})
	}
}

// answeringEngine takes batches of writes and answers them at once,
// reaching no server; it knows no records.
type answeringEngine struct{}

func (e answeringEngine) Abilities() stateengine.Abilities {
	return stateengine.Abilities{Batch: e.Writes}
}
func (answeringEngine) CallTimeout() time.Duration { return time.Second }

func (answeringEngine) Created(context.Context, string, time.Time, time.Duration) error {
	return nil
}

func (answeringEngine) InitializeEnded(context.Context, string, time.Duration) error { return nil }
func (answeringEngine) Opened(context.Context, string, time.Duration) error          { return nil }
func (answeringEngine) Touch(context.Context, string, time.Duration) error           { return nil }
func (answeringEngine) Forget(context.Context, string) error                         { return nil }

func (answeringEngine) Lookup(context.Context, string) (serializer.Record, bool, error) {
	return serializer.Record{}, false, nil
}

func (answeringEngine) Writes(_ context.Context, ws []*stateengine.Write, _ time.Duration) {
	for _, w := range ws {
		w.Err = nil
	}
}

// burn spends about d of CPU, yielding as a request that waits on the
// network would.
func burn(d time.Duration) {
	if d == 0 {
		return
	}
	for end := time.Now().Add(d); time.Now().Before(end); {
	}
	runtime.Gosched()
}

func waitForNoRecords(t testing.TB, c *redis.Client) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		n, err := c.DBSize(context.Background()).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d records left 10s after the last session ended", n)
		}
		time.Sleep(time.Millisecond)
	}
}

// costs are counters of this process and of redis-server.
type costs struct {
	selfCPU, redisCPU    time.Duration
	goroutines           uint64
	commands, roundTrips int64
}

func (c costs) sub(o costs) costs {
	return costs{c.selfCPU - o.selfCPU, c.redisCPU - o.redisCPU, c.goroutines - o.goroutines,
		c.commands - o.commands, c.roundTrips - o.roundTrips}
}

func (c costs) report(b *testing.B) {
	n := float64(b.N)
	b.ReportMetric(float64(c.selfCPU.Microseconds())/n, "client-µs/session")
	b.ReportMetric(float64(c.redisCPU.Microseconds())/n, "redis-µs/session")
	b.ReportMetric(float64(c.goroutines)/n, "goroutines/session")
	b.ReportMetric(float64(c.commands)/n, "commands/session")
	b.ReportMetric(float64(c.roundTrips)/n, "roundtrips/session")
}

func takeCosts(t testing.TB, c *redis.Client) costs {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	sample := []rtmetrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	rtmetrics.Read(sample)
	info := redisInfo(t, c)
	res := costs{
		selfCPU:    time.Duration(ru.Utime.Nano() + ru.Stime.Nano()),
		redisCPU:   processCPU(t, int(info["process_id"])),
		goroutines: sample[0].Value.Uint64(),
		commands:   info["total_commands_processed"],
		roundTrips: info["total_reads_processed"],
	}
	// Leave out the probe's own calls, one read each.
	probes := info["cmdstat_info"] + info["cmdstat_dbsize"]
	res.commands -= probes
	res.roundTrips -= probes
	return res
}

// redisInfo reads the numeric fields of INFO.
func redisInfo(t testing.TB, c *redis.Client) map[string]int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "server", "stats", "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if calls, found := strings.CutPrefix(v, "calls="); found {
			v, _, _ = strings.Cut(calls, ",") // cmdstat_NAME:calls=N,...
		}
		if n, err := strconv.ParseInt(v, 10, 64); ok && err == nil {
			out[k] = n
		}
	}
	return out
}

// processCPU is the user + system time of a process so far, from /proc
// (USER_HZ ticks of 10ms).
func processCPU(t testing.TB, pid int) time.Duration {
	t.Helper()
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}
