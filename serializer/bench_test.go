package serializer

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Bodies as MCP clients send them.
var (
	benchSingle = []byte(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"},"_meta":{"progressToken":7}}}`)
	benchBatch  = []byte(`[{"jsonrpc":"2.0","id":2,"method":"logging/setLevel","params":{"level":"info"}},` +
		`{"jsonrpc":"2.0","method":"notifications/initialized"},` +
		`{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{}}]`)
)

// toolCallBody returns a tools/call request of about size bytes, its
// argument a JSON string with some escapes, as a pasted document would be.
func toolCallBody(size int) []byte {
	const head = `{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"write_file","arguments":{"path":"notes.md","content":"`
	const tail = `"}}}`
	var b strings.Builder
	b.WriteString(head)
	line := `Lorem ipsum dolor sit amet, \"consectetur\" adipiscing elit.\n`
	for b.Len()+len(line)+len(tail) <= size {
		b.WriteString(line)
	}
	for b.Len()+len(tail) < size {
		b.WriteByte('x')
	}
	b.WriteString(tail)
	return []byte(b.String())
}

func benchClassify(b *testing.B, body []byte, want Traits) {
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if traits, _, _ := Classify(body); traits != want {
			b.Fatalf("traits %v, want %v", traits, want)
		}
	}
}

func BenchmarkClassify(b *testing.B) {
	b.Run("single", func(b *testing.B) { benchClassify(b, benchSingle, 0) })
	b.Run("initialized", func(b *testing.B) {
		benchClassify(b, []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`), CarriesInitialized)
	})
	b.Run("batch", func(b *testing.B) { benchClassify(b, benchBatch, CarriesInitialized) })
	b.Run("4KiB", func(b *testing.B) { benchClassify(b, toolCallBody(4<<10), 0) })
	b.Run("64KiB", func(b *testing.B) { benchClassify(b, toolCallBody(64<<10), 0) })
}

// escapedKeysBody returns a request of about size bytes whose top-level
// members all have escaped keys, as a hostile client may send them.
func escapedKeysBody(size int) []byte {
	var b strings.Builder
	b.WriteString(`{"jsonrpc":"2.0","id":1`)
	for i := 0; b.Len() < size; i++ {
		b.WriteString(`,"\u0078` + strconv.Itoa(i) + `":0`)
	}
	b.WriteString(`,"\u006dethod":"tools/call"}`)
	return []byte(b.String())
}

func BenchmarkClassifyEscapedKeys(b *testing.B) {
	b.Run("4KiB", func(b *testing.B) { benchClassify(b, escapedKeysBody(4<<10), 0) })
	b.Run("1MiB", func(b *testing.B) { benchClassify(b, escapedKeysBody(1<<20), 0) })
}

func newBenchTable(b *testing.B, sessions int) *Table {
	cfg := Defaults()
	cfg.MaxSessions = max(sessions, cfg.MaxSessions)
	t := NewTable(cfg)
	b.Cleanup(t.Close)
	return t
}

// One request at a time on one session: the cost the module adds to every
// request that carries a session id, minus body classification.
func BenchmarkAcquireRelease(b *testing.B) {
	t := newBenchTable(b, 0)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		turn, err := t.Acquire(ctx, "session", 0)
		if err != nil {
			b.Fatal(err)
		}
		turn.Done(200)
	}
}

// Requests of different sessions on every core: they share only the
// table's lock.
func BenchmarkAcquireReleaseParallel(b *testing.B) {
	t := newBenchTable(b, 0)
	ctx := context.Background()
	var n atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		id := "session-" + strconv.FormatInt(n.Add(1), 10)
		for pb.Next() {
			turn, err := t.Acquire(ctx, id, 0)
			if err != nil {
				b.Error(err)
				return
			}
			turn.Done(200)
		}
	})
}

// Several goroutines queue on one session: nearly every turn is handed from
// the goroutine finishing to one that was waiting. ns/op is the time per
// turn, handoff included.
func BenchmarkHandoff(b *testing.B) {
	for _, waiters := range []int{2, 16} {
		b.Run("goroutines="+strconv.Itoa(waiters), func(b *testing.B) {
			t := newBenchTable(b, 0)
			ctx := context.Background()
			var left atomic.Int64
			left.Store(int64(b.N))
			var wg sync.WaitGroup
			b.ReportAllocs()
			b.ResetTimer()
			for range waiters {
				wg.Go(func() {
					for left.Add(-1) >= 0 {
						turn, err := t.Acquire(ctx, "session", 0)
						if err != nil {
							b.Error(err)
							return
						}
						turn.Done(200)
					}
				})
			}
			wg.Wait()
		})
	}
}

// Looking up one of 100k tracked sessions (and moving it to the recent end
// of the LRU list) on each request.
func BenchmarkLookup100k(b *testing.B) {
	const sessions = 100_000
	t := newBenchTable(b, sessions)
	ctx := context.Background()
	ids := make([]string, sessions)
	var raw [16]byte
	for i := range ids {
		raw[0], raw[1], raw[2] = byte(i), byte(i>>8), byte(i>>16)
		ids[i] = hex.EncodeToString(raw[:])
		turn, _ := t.Acquire(ctx, ids[i], 0)
		turn.Done(200)
	}
	if t.Len() != sessions {
		b.Fatalf("table holds %d sessions, want %d", t.Len(), sessions)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		// A stride through the ids defeats the CPU cache as live traffic would.
		i = (i + 7919) % sessions
		turn, err := t.Acquire(ctx, ids[i], 0)
		if err != nil {
			b.Fatal(err)
		}
		turn.Done(200)
	}
}

func BenchmarkValid(b *testing.B) {
	for _, c := range []struct {
		name string
		body []byte
	}{{"single", benchSingle}, {"64KiB", toolCallBody(64 << 10)}} {
		b.Run(c.name+"/valid", func(b *testing.B) {
			b.SetBytes(int64(len(c.body)))
			for b.Loop() {
				if !valid(c.body) {
					b.Fatal("not valid")
				}
			}
		})
		b.Run(c.name+"/encoding-json", func(b *testing.B) {
			b.SetBytes(int64(len(c.body)))
			for b.Loop() {
				if !json.Valid(c.body) {
					b.Fatal("not valid")
				}
			}
		})
	}
}

// A flood of initializes that never send notifications/initialized, with
// max_sessions 1000: the cost of one more initialize (Begin, then its
// exchange's end) once gated initializes have come before it. It must
// not grow with their number: each evicts the oldest gated session.
func BenchmarkNewSessionWhileTableFullOfGated(b *testing.B) {
	for _, gated := range []int{1_000, 20_000, 100_000} {
		b.Run("gated="+strconv.Itoa(gated), func(b *testing.B) {
			cfg := Defaults()
			cfg.MaxSessions = gated + 1 // fill without evicting, then shrink
			t := NewTable(cfg)
			b.Cleanup(t.Close)
			for i := range gated {
				turn, _ := t.Begin("gated-"+strconv.Itoa(i), nil)
				turn.Done(200)
			}
			cfg.MaxSessions = 1000
			t.Configure(cfg)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				turn, ok := t.Begin("new-"+strconv.Itoa(i), nil)
				if !ok {
					b.Fatal("Begin refused a new id")
				}
				turn.Done(200)
				i++
			}
			b.ReportMetric(float64(t.Len()), "sessions")
		})
	}
}
