package storagestate

import (
	"context"
	"encoding/json"
	"path"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/enginetest"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/testclock"
	"github.com/mcpserializer/caddy-mcp-serializer/stateengine"
)

func TestStorageStateConformance(t *testing.T) {
	enginetest.Conformance(t, func(t *testing.T, ttl time.Duration) enginetest.Under {
		clock := testclock.New()
		eng := enginetest.Load(t, enginetest.FileStorage(t.TempDir()), "storage", nil).(*Engine)
		eng.now = clock.Now
		return enginetest.Under{Store: enginetest.NewAdapter(eng, ttl, zap.NewNop()), Advance: clock.Advance}
	})
}

func TestStorageInstancesOnOneDirectorySeeEachOthersRecords(t *testing.T) {
	dir := t.TempDir()
	a := enginetest.NewAdapter(enginetest.Load(t, enginetest.FileStorage(dir), "storage", nil).(stateengine.Engine), time.Hour, zap.NewNop())
	b := enginetest.NewAdapter(enginetest.Load(t, enginetest.FileStorage(dir), "storage", nil).(stateengine.Engine), time.Hour, zap.NewNop())
	ctx := context.Background()
	if err := a.Created(ctx, "s", time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if rec, found, err := b.Lookup(ctx, "s"); err != nil || !found || !rec.InitializeInFlight {
		t.Fatalf("b.Lookup = %+v, %v, %v; want a's initializing record", rec, found, err)
	}
	if err := b.Opened(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if err := a.InitializeEnded(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if rec, found, err := a.Lookup(ctx, "s"); err != nil || !found || !rec.Open {
		t.Fatalf("a.Lookup = %+v, %v, %v; want b's open", rec, found, err)
	}
	if err := b.Forget(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if _, found, err := a.Lookup(ctx, "s"); err != nil || found {
		t.Fatalf("a.Lookup after b forgot = %v, %v; want not found", found, err)
	}
}

func TestStorageSweeperRemovesExpiredRecordsOneInstanceAtATime(t *testing.T) {
	dir := t.TempDir()
	clock := testclock.New()
	a := enginetest.Load(t, enginetest.FileStorage(dir), "storage", map[string]any{"timeout": "200ms"}).(*Engine)
	b := enginetest.Load(t, enginetest.FileStorage(dir), "storage", map[string]any{"timeout": "200ms"}).(*Engine)
	a.now, b.now = clock.Now, clock.Now
	ctx := context.Background()
	const ttl, interval = time.Minute, time.Hour
	for _, key := range []string{"expired", "live"} {
		if err := a.Created(ctx, key, clock.Now(), ttl); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(ttl / 2)
	if err := a.Touch(ctx, "live", ttl); err != nil {
		t.Fatal(err)
	}
	clock.Advance(ttl/2 + time.Second)
	exists := func(key string) bool { return a.storage.Exists(ctx, recordDir(key)) }

	// While another instance holds the lock, a sweeper skips its round.
	if err := b.storage.Lock(ctx, storageSweepLock); err != nil {
		t.Fatal(err)
	}
	if removed, err := a.sweep(ctx, interval); err != nil || removed != 0 {
		t.Fatalf("sweep under another's lock = %d, %v; want a skipped round", removed, err)
	}
	if !exists("expired") {
		t.Fatal("a record was removed while another instance held the lock")
	}
	if err := b.storage.Unlock(ctx, storageSweepLock); err != nil {
		t.Fatal(err)
	}

	if removed, err := a.sweep(ctx, interval); err != nil || removed != 1 {
		t.Fatalf("sweep = %d, %v; want the one expired record removed", removed, err)
	}
	if exists("expired") || !exists("live") {
		t.Fatalf("after the sweep: expired there %v, live there %v", exists("expired"), exists("live"))
	}

	// Another instance right after skips: the round was just done.
	if err := a.Created(ctx, "expired2", clock.Now(), time.Second); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Second)
	if removed, err := b.sweep(ctx, interval); err != nil || removed != 0 {
		t.Fatalf("a second sweep right after = %d, %v; want a skipped round", removed, err)
	}
	clock.Advance(interval)
	if removed, err := b.sweep(ctx, interval); err != nil || removed != 2 {
		t.Fatalf("the next round = %d, %v; want expired2 and the now expired live record removed", removed, err)
	}
}

// hookedStorage is Caddy's file storage with hooks on List and Load.
type hookedStorage struct {
	certmagic.Storage
	onList func()
	onLoad func(key string) // after the load, before its answer returns
}

func (h *hookedStorage) List(ctx context.Context, prefix string, recursive bool) ([]string, error) {
	if h.onList != nil {
		h.onList()
	}
	return h.Storage.List(ctx, prefix, recursive)
}

func (h *hookedStorage) Load(ctx context.Context, key string) ([]byte, error) {
	data, err := h.Storage.Load(ctx, key)
	if h.onLoad != nil {
		h.onLoad(key)
	}
	return data, err
}

// newEngine starts a storage engine on storage, without Caddy, on
// clock (nil: the system's), stopped when the test ends.
func newEngine(t *testing.T, storage certmagic.Storage, logger *zap.Logger, clock *testclock.Clock) *Engine {
	t.Helper()
	s := &Engine{Timeout: caddy.Duration(5 * time.Second), SweepInterval: caddy.Duration(time.Hour)}
	if clock != nil {
		s.now = clock.Now
	}
	s.start(storage, logger)
	t.Cleanup(func() { s.Cleanup() })
	return s
}

// A storage that hangs, ignoring its context, must not hold a reload up:
// Cleanup gives up on the sweeper after the call timeout, and says so.
func TestStorageCleanupDoesNotWaitForASweeperHungOnTheStorage(t *testing.T) {
	listing, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	storage := &hookedStorage{
		Storage: &certmagic.FileStorage{Path: t.TempDir()},
		onList: func() {
			once.Do(func() { close(listing) })
			<-release
		},
	}
	core, logs := observer.New(zap.WarnLevel)
	s := &Engine{Timeout: caddy.Duration(50 * time.Millisecond), SweepInterval: caddy.Duration(time.Millisecond)}
	s.start(storage, zap.New(core))
	defer func() {
		close(release)
		<-s.sweeperDone
	}()
	select {
	case <-listing:
	case <-time.After(10 * time.Second):
		t.Fatal("the sweeper did not list the records within 10s")
	}
	cleaned := make(chan error, 1)
	go func() { cleaned <- s.Cleanup() }()
	select {
	case <-cleaned:
	case <-time.After(10 * time.Second):
		t.Fatal("Cleanup still waiting 10s for a sweeper hung on the storage (timeout 50ms)")
	}
	if logs.FilterMessageSnippet("sweeper").Len() != 1 {
		t.Fatalf("no WARN line tells of the sweeper left running: %v", logs.All())
	}
}

// An instance touching a record after the sweeper read it as expired
// keeps it: the sweeper reads it again before deleting.
func TestStorageSweeperKeepsARecordTouchedAfterItWasRead(t *testing.T) {
	clock := testclock.New()
	storage := &hookedStorage{Storage: &certmagic.FileStorage{Path: t.TempDir()}}
	s := newEngine(t, storage, zap.NewNop(), clock)
	ctx := context.Background()
	const ttl = time.Minute
	if err := s.Created(ctx, "s", clock.Now(), ttl); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * ttl)
	touched := false
	storage.onLoad = func(key string) {
		if !touched && key == path.Join(recordDir("s"), factTouched) {
			touched = true // once: Touch reads too
			if err := s.Touch(ctx, "s", ttl); err != nil {
				t.Error(err)
			}
		}
	}
	if removed, err := s.sweep(ctx, time.Hour); err != nil || removed != 0 {
		t.Fatalf("sweep = %d, %v; want the touched record kept", removed, err)
	}
	if !touched {
		t.Fatal("the sweeper never read the touched fact")
	}
	if _, found, err := s.Lookup(ctx, "s"); err != nil || !found {
		t.Fatalf("Lookup after the sweep = %v, %v; want the touched record", found, err)
	}
}

// A fact file that cannot be parsed keeps its record for
// unreadableFactAge after it last changed, then the record goes, with a
// WARN.
func TestStorageSweeperRemovesRecordsWithUnparsableFactsOnceTheyAreOld(t *testing.T) {
	clock := testclock.New()
	storage := &certmagic.FileStorage{Path: t.TempDir()}
	core, logs := observer.New(zap.WarnLevel)
	s := newEngine(t, storage, zap.New(core), clock)
	ctx := context.Background()
	const ttl, interval = time.Minute, time.Minute
	write := func(key, fact, content string) {
		t.Helper()
		if err := storage.Store(ctx, path.Join(recordDir(key), fact), []byte(content)); err != nil {
			t.Fatal(err)
		}
	}
	write("unreadable", factCreated, "{not json")
	if err := s.Created(ctx, "half", clock.Now(), ttl); err != nil {
		t.Fatal(err)
	}
	write("half", factTouched, "")
	if err := s.Created(ctx, "live", clock.Now(), 2*unreadableFactAge); err != nil {
		t.Fatal(err)
	}
	exists := func(key string) bool { return storage.Exists(ctx, recordDir(key)) }

	clock.Advance(2 * ttl) // half's readable fact has expired; its file is new
	if removed, err := s.sweep(ctx, interval); err != nil || removed != 0 {
		t.Fatalf("sweep with new unparsable facts = %d, %v; want none removed", removed, err)
	}
	if !exists("unreadable") || !exists("half") {
		t.Fatal("a record with a fact changed just now was removed")
	}
	if logs.Len() != 0 {
		t.Fatalf("WARN with nothing removed: %v", logs.All())
	}

	clock.Advance(unreadableFactAge)
	if removed, err := s.sweep(ctx, interval); err != nil || removed != 2 {
		t.Fatalf("sweep = %d, %v; want the two records with old unparsable facts removed", removed, err)
	}
	if exists("unreadable") || exists("half") || !exists("live") {
		t.Fatalf("after the sweep: unreadable there %v, half there %v, live there %v",
			exists("unreadable"), exists("half"), exists("live"))
	}
	warns := logs.All()
	if len(warns) != 1 || warns[0].ContextMap()["removed"] != int64(2) {
		t.Fatalf("WARN lines = %v; want one telling of 2 records removed", warns)
	}
}

func TestStorageSweeperRunsOnItsIntervalAndStopsOnCleanup(t *testing.T) {
	ctx, cancel := caddy.NewContext(*enginetest.FileStorage(t.TempDir()))
	defer cancel()
	mod, err := ctx.LoadModuleByID("http.handlers.mcp_serializer.state.storage",
		json.RawMessage(`{"sweep_interval": "20ms"}`))
	if err != nil {
		t.Fatal(err)
	}
	eng := mod.(*Engine)
	if err := eng.Created(context.Background(), "gone", time.Now().Add(-time.Second), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for eng.storage.Exists(context.Background(), recordDir("gone")) {
		if time.Now().After(deadline) {
			t.Fatal("the sweeper did not remove an expired record within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel() // the config goes: Caddy calls Cleanup
	select {
	case <-eng.sweeperDone:
	default:
		t.Fatal("the sweeper still runs after Cleanup")
	}
}

func TestStorageRefusesBadSettingsNamingThem(t *testing.T) {
	for _, tc := range []struct {
		cfg  map[string]any
		want string
	}{
		{map[string]any{"timeout": "-1s"}, "timeout"},
		{map[string]any{"sweep_interval": "-1s"}, "sweep_interval"},
	} {
		enginetest.Refuses(t, "storage", tc.cfg, tc.want)
	}
}
