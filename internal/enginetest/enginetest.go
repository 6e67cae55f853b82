// Package enginetest is what the tests of the state engines share: the
// behaviour every engine must show through the adapter (Conformance),
// loading an engine as Caddy does, and a clock the test moves.
package enginetest

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	_ "github.com/caddyserver/caddy/v2/modules/filestorage" // FileStorage's module
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
	"github.com/mcpserializer/caddy-mcp-serializer/stateengine"
)

// Under is one engine behind the adapter the table calls.
type Under struct {
	Store *stateengine.Adapter
	// Advance moves the engine's clock on by d: a fake clock where the
	// engine takes its time from us, a real wait where the server keeps
	// its own.
	Advance func(d time.Duration)
	// Expiry, where the server keeps its own clock, reads when it will
	// drop the record of session id: a test of how long a record lives
	// then reads the expiry a write set instead of waiting most of a ttl
	// for it, which a stalled machine would overrun. Nil with a fake clock.
	Expiry func(t *testing.T, id string) time.Time
}

// Conformance pins what every engine must do, through the
// serializer.Store interface. newEngine makes a fresh engine whose records
// live ttl after their last write.
func Conformance(t *testing.T, newEngine func(t *testing.T, ttl time.Duration) Under) {
	ctx := context.Background()
	mustLookup := func(t *testing.T, s serializer.Store, id string) (serializer.Record, bool) {
		t.Helper()
		rec, found, err := s.Lookup(ctx, id)
		if err != nil {
			t.Fatalf("Lookup: %v", err)
		}
		return rec, found
	}
	must := func(t *testing.T, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}

	t.Run("CreatedIsInitializingWithItsExchangeInFlight", func(t *testing.T) {
		e := newEngine(t, time.Hour)
		deadline := time.Now().Add(10 * time.Second)
		must(t, e.Store.Created(ctx, "session-a", deadline))
		rec, found := mustLookup(t, e.Store, "session-a")
		if !found || rec.Open || !rec.InitializeInFlight || rec.InitDeadline.UnixMilli() != deadline.UnixMilli() {
			t.Fatalf("Lookup = %+v, %v; want initializing, in flight, deadline %v", rec, found, deadline)
		}
		if _, found := mustLookup(t, e.Store, "session-b"); found {
			t.Fatal("a session never created was found")
		}
	})

	t.Run("InitializeEndedClearsInFlight", func(t *testing.T) {
		e := newEngine(t, time.Hour)
		deadline := time.Now().Add(10 * time.Second)
		must(t, e.Store.Created(ctx, "s", deadline))
		must(t, e.Store.InitializeEnded(ctx, "s"))
		rec, found := mustLookup(t, e.Store, "s")
		if !found || rec.Open || rec.InitializeInFlight || rec.InitDeadline.UnixMilli() != deadline.UnixMilli() {
			t.Fatalf("Lookup = %+v, %v; want initializing, not in flight", rec, found)
		}
	})

	t.Run("OpenedIsNotUndoneByALateInitializeEnded", func(t *testing.T) {
		e := newEngine(t, time.Hour)
		must(t, e.Store.Created(ctx, "s", time.Now().Add(10*time.Second)))
		must(t, e.Store.Opened(ctx, "s"))
		if rec, found := mustLookup(t, e.Store, "s"); !found || !rec.Open || rec.InitializeInFlight {
			t.Fatalf("Lookup after Opened = %+v, %v; want open, nothing in flight", rec, found)
		}
		must(t, e.Store.InitializeEnded(ctx, "s"))
		must(t, e.Store.Touch(ctx, "s"))
		rec, found := mustLookup(t, e.Store, "s")
		if !found || !rec.Open || rec.InitializeInFlight {
			t.Fatalf("Lookup = %+v, %v; want open", rec, found)
		}
	})

	t.Run("UpdatesDoNotRecreateAMissingRecord", func(t *testing.T) {
		e := newEngine(t, time.Hour)
		must(t, e.Store.InitializeEnded(ctx, "s"))
		must(t, e.Store.Opened(ctx, "s"))
		must(t, e.Store.Touch(ctx, "s"))
		if rec, found := mustLookup(t, e.Store, "s"); found {
			t.Fatalf("updates of a missing record made %+v", rec)
		}
	})

	t.Run("ForgetRemovesTheRecord", func(t *testing.T) {
		e := newEngine(t, time.Hour)
		must(t, e.Store.Created(ctx, "s", time.Now().Add(10*time.Second)))
		must(t, e.Store.Opened(ctx, "s"))
		must(t, e.Store.Forget(ctx, "s"))
		if _, found := mustLookup(t, e.Store, "s"); found {
			t.Fatal("found after Forget")
		}
		must(t, e.Store.Forget(ctx, "s")) // forgetting twice is fine
		must(t, e.Store.Opened(ctx, "s"))
		if _, found := mustLookup(t, e.Store, "s"); found {
			t.Fatal("an update after Forget brought the record back")
		}
	})

	t.Run("RecordExpiresAfterSessionTTL", func(t *testing.T) {
		const ttl = 300 * time.Millisecond
		e := newEngine(t, ttl)
		must(t, e.Store.Created(ctx, "s", time.Now()))
		must(t, e.Store.Opened(ctx, "s"))
		if _, found := mustLookup(t, e.Store, "s"); !found {
			t.Fatal("not found before its ttl")
		}
		e.Advance(ttl + 200*time.Millisecond)
		if rec, found := mustLookup(t, e.Store, "s"); found {
			t.Fatalf("found %+v after its ttl", rec)
		}
	})

	t.Run("InitializingRecordLivesUntilItsDeadline", func(t *testing.T) {
		const ttl = 300 * time.Millisecond
		e := newEngine(t, ttl)
		must(t, e.Store.Created(ctx, "s", time.Now().Add(time.Hour)))
		must(t, e.Store.InitializeEnded(ctx, "s"))
		e.Advance(ttl + 300*time.Millisecond)
		if _, found := mustLookup(t, e.Store, "s"); !found {
			t.Fatal("an initializing record expired before its init deadline")
		}
	})

	// serializer.RecordTTL: the init deadline holds an initializing
	// record only; an open one lives session_ttl from its last write.
	t.Run("OpenRecordExpiresAfterSessionTTLBeforeItsInitDeadline", func(t *testing.T) {
		const ttl = 300 * time.Millisecond
		e := newEngine(t, ttl)
		must(t, e.Store.Created(ctx, "s", time.Now().Add(time.Hour)))
		must(t, e.Store.Opened(ctx, "s"))
		e.Advance(ttl + 200*time.Millisecond)
		if rec, found := mustLookup(t, e.Store, "s"); found {
			t.Fatalf("found %+v after its ttl: the init deadline kept an open record", rec)
		}
	})

	t.Run("TouchExtendsTheRecord", func(t *testing.T) {
		const ttl = time.Minute
		e := newEngine(t, ttl)
		must(t, e.Store.Created(ctx, "s", time.Now()))
		must(t, e.Store.Opened(ctx, "s"))
		if e.Expiry != nil {
			// On the server's clock: Touch sets the expiry a ttl after
			// itself, later than the one Opened set.
			opened := e.Expiry(t, "s")
			time.Sleep(10 * time.Millisecond)
			start := time.Now()
			must(t, e.Store.Touch(ctx, "s"))
			end := time.Now()
			touched := e.Expiry(t, "s")
			if !touched.After(opened) {
				t.Fatalf("Touch did not extend the record: it expires at %v after Touch, at %v after Opened", touched, opened)
			}
			// Expiries are to the millisecond.
			if touched.Before(start.Add(ttl).Truncate(time.Millisecond)) || touched.After(end.Add(ttl)) {
				t.Fatalf("after Touch the record expires at %v, want a ttl (%v) after the Touch, from %v to %v",
					touched, ttl, start.Add(ttl), end.Add(ttl))
			}
			if _, found := mustLookup(t, e.Store, "s"); !found {
				t.Fatal("not found after Touch")
			}
			return
		}
		e.Advance(ttl * 6 / 10)
		must(t, e.Store.Touch(ctx, "s"))
		if _, found := mustLookup(t, e.Store, "s"); !found {
			t.Fatal("not found before its ttl")
		}
		e.Advance(ttl * 6 / 10) // past the expiry Touch replaced
		if _, found := mustLookup(t, e.Store, "s"); !found {
			t.Fatal("Touch did not extend the record")
		}
	})
}

// Load provisions a state engine module the way the handler does,
// cleaned up when the test ends. parent carries the storage; nil for none.
func Load(t testing.TB, parent *caddy.Context, name string, cfg map[string]any) caddy.Module {
	t.Helper()
	if parent == nil {
		parent = FileStorage(t.TempDir())
	}
	if cfg == nil {
		cfg = map[string]any{}
	}
	if _, set := cfg["timeout"]; !set {
		// The machine may be shared and slow: the tests that are not
		// about the timeout must not fail on it.
		cfg["timeout"] = "5s"
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(*parent)
	t.Cleanup(cancel)
	mod, err := ctx.LoadModuleByID("http.handlers.mcp_serializer.state."+name, raw)
	if err != nil {
		t.Fatalf("provisioning state %s %s: %v", name, raw, err)
	}
	return mod.(caddy.Module)
}

// FileStorage is a Caddy context whose storage is file_system at root.
func FileStorage(root string) *caddy.Context {
	storage, _ := json.Marshal(map[string]string{"module": "file_system", "root": root})
	ctx, err := caddy.ProvisionContext(&caddy.Config{StorageRaw: storage})
	if err != nil {
		panic(err)
	}
	return &ctx
}

// Errors counts the failures of the adapters NewAdapter makes, by op.
var Errors = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "state_errors_total"}, []string{"op"})

// NewAdapter makes engine a table's Store, its failures counted in Errors.
func NewAdapter(engine stateengine.Engine, ttl time.Duration, logger *zap.Logger) *stateengine.Adapter {
	return stateengine.NewAdapter(engine, ttl, logger, Errors)
}

// Refuses checks that the state engine named engine refuses cfg, its JSON
// config, when it loads, with an error that names want.
func Refuses(t *testing.T, engine string, cfg map[string]any, want string) {
	t.Helper()
	raw, _ := json.Marshal(cfg)
	ctx, cancel := caddy.NewContext(*FileStorage(t.TempDir()))
	defer cancel()
	_, err := ctx.LoadModuleByID("http.handlers.mcp_serializer.state."+engine, raw)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("%s %s: err = %v, want one naming %q", engine, raw, err, want)
	}
}
