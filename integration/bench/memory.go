package main

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"runtime"
	"sync"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// memoryResult is the Go heap a serializer.Table holds per idle session.
type memoryResult struct {
	sessions    int
	initialized float64 // bytes per session created by an initialize exchange
	unknown     float64 // bytes per session first seen with an id (FIFO only)
}

// measureMemory fills a table with n idle sessions twice: once the way
// Caddy creates them (initialize answered with a new id, then
// notifications/initialized and one request), once as unknown sessions
// (a request with an id the table never saw). Ids are 32 hex digits, as
// php-mcp and the stub make them, and are counted: the table keeps them.
func measureMemory(n int) memoryResult {
	res := memoryResult{sessions: n}
	res.initialized = heapPerSession(n, func(t *serializer.Table, id string) {
		ctx := context.Background()
		initialize, _ := t.Begin(id, nil)
		initialize.Done(200)
		turn, err := t.Acquire(ctx, id, serializer.CarriesInitialized)
		if err != nil {
			panic(err)
		}
		turn.Done(202)
		turn, err = t.Acquire(ctx, id, 0)
		if err != nil {
			panic(err)
		}
		turn.Done(200)
	})
	res.unknown = heapPerSession(n, func(t *serializer.Table, id string) {
		turn, err := t.Acquire(context.Background(), id, 0)
		if err != nil {
			panic(err)
		}
		turn.Done(200)
	})
	return res
}

func heapPerSession(n int, use func(*serializer.Table, string)) float64 {
	cfg := serializer.Defaults()
	cfg.MaxSessions = max(n, cfg.MaxSessions)
	var before, after runtime.MemStats
	settle()
	runtime.ReadMemStats(&before)

	t := serializer.NewTable(cfg)
	var raw [16]byte
	for i := range n {
		binary.BigEndian.PutUint64(raw[:8], uint64(i)*0x9e3779b97f4a7c15)
		binary.BigEndian.PutUint64(raw[8:], uint64(i))
		use(t, hex.EncodeToString(raw[:]))
	}
	if t.Len() != n {
		panic("sessions were evicted")
	}
	settle()
	runtime.ReadMemStats(&after)
	t.Close()
	runtime.KeepAlive(t)
	return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)
}

func settle() {
	runtime.GC()
	runtime.GC()
}

// queueResult is the queue alone, in this process: depth goroutines take
// turns on one session of a serializer.Table, each turn sleeping for the
// service time.
type queueResult struct {
	perRequest time.Duration // first release to last, per turn
	service    time.Duration // measured sleep per turn
}

func (q queueResult) handoff() time.Duration { return q.perRequest - q.service }

func measureQueue(depth int, service, d time.Duration) queueResult {
	t := serializer.NewTable(serializer.Defaults())
	defer t.Close()
	ctx := context.Background()
	var (
		mu          sync.Mutex
		first, last time.Time
		n           int
		slept       time.Duration
		wg          sync.WaitGroup
	)
	stop := time.Now().Add(d)
	for range depth {
		wg.Go(func() {
			for time.Now().Before(stop) {
				turn, err := t.Acquire(ctx, "session", 0)
				if err != nil {
					panic(err)
				}
				start := time.Now()
				time.Sleep(service)
				end := time.Now()
				turn.Done(200)
				mu.Lock()
				if first.IsZero() {
					first = end
				}
				last = end
				n++
				slept += end.Sub(start)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if n < 2 {
		return queueResult{}
	}
	return queueResult{perRequest: last.Sub(first) / time.Duration(n-1), service: slept / time.Duration(n)}
}
