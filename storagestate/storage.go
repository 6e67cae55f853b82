package storagestate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/settings"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/warnlimit"
	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
	"github.com/mcpserializer/caddy-mcp-serializer/stateengine"
)

func init() {
	caddy.RegisterModule(Engine{})
}

const (
	defaultStorageTimeout       = time.Second
	defaultStorageSweepInterval = 10 * time.Minute

	// unreadableFactAge is how long a fact file that cannot be parsed
	// keeps its record from the sweeper, counted from its last change:
	// longer than any write in progress takes, and a record with such a
	// fact is unknown to every lookup already.
	unreadableFactAge = time.Hour

	storageSessions  = "mcp_serializer/sessions"
	storageLastSweep = "mcp_serializer/last_sweep"
	storageSweepLock = "mcp_serializer_sweep"
)

// A session's record is a directory of facts, each a small JSON file
// written once by whoever learns it: created (init deadline), ended
// (initialize exchange over), open, touched. Facts only accumulate, so
// instances writing at once never undo each other, with no lock per write.
const (
	factCreated = "created"
	factEnded   = "ended"
	factOpen    = "open"
	factTouched = "touched"
)

// Engine shares session records through Caddy's configured storage
// (the `storage` global option; the local file system by default): what a
// Caddy cluster already shares for its certificates, or a directory that
// instances on one host share.
type Engine struct {
	// Longest wait for one call (a lookup reads up to four keys); a call
	// that takes longer counts as failed and the handler carries on
	// locally. Default: 1s.
	Timeout caddy.Duration `json:"timeout,omitempty"`
	// How often expired records are removed, by one instance at a time
	// under the storage's lock. Default: 10m.
	SweepInterval caddy.Duration `json:"sweep_interval,omitempty"`

	storage certmagic.Storage
	logger  *zap.Logger
	now     func() time.Time

	stopSweeper context.CancelFunc
	sweeperDone chan struct{}
	// unreadableWarns spaces the WARN lines of records removed unread.
	unreadableWarns *warnlimit.Limiter
}

// CaddyModule returns the Caddy module information.
func (Engine) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.mcp_serializer.state.storage",
		New: func() caddy.Module { return new(Engine) },
	}
}

// Provision applies defaults, checks the settings (Validate), takes the
// config's storage and starts the sweeper.
func (s *Engine) Provision(ctx caddy.Context) error {
	if s.Timeout == 0 {
		s.Timeout = caddy.Duration(defaultStorageTimeout)
	}
	if s.SweepInterval == 0 {
		s.SweepInterval = caddy.Duration(defaultStorageSweepInterval)
	}
	// Checked before the sweeper starts; Caddy runs Validate again after.
	if err := s.Validate(); err != nil {
		return err
	}
	if ctx.Storage() == nil {
		return errors.New("no storage configured")
	}
	s.start(ctx.Storage(), ctx.Logger())
	return nil
}

// Validate refuses settings out of range, naming them.
func (s *Engine) Validate() error {
	switch {
	case s.Timeout < 0:
		return fmt.Errorf("timeout must be positive, got %s", time.Duration(s.Timeout))
	case s.SweepInterval < 0:
		return fmt.Errorf("sweep_interval must be positive, got %s", time.Duration(s.SweepInterval))
	}
	return nil
}

// start takes the storage and starts the sweeper.
func (s *Engine) start(storage certmagic.Storage, logger *zap.Logger) {
	s.storage, s.logger = storage, logger
	s.unreadableWarns = new(warnlimit.Limiter)
	if s.now == nil {
		s.now = time.Now
	}
	sweepCtx, stop := context.WithCancel(context.Background())
	s.stopSweeper, s.sweeperDone = stop, make(chan struct{})
	go s.sweepEvery(sweepCtx, time.Duration(s.SweepInterval))
}

// Cleanup stops the sweeper and waits for it, at most the call timeout: a
// sweep in progress stops at its next storage call, but a hung storage
// would hold a reload up for as long as it hangs.
func (s *Engine) Cleanup() error {
	if s.stopSweeper == nil {
		return nil
	}
	s.stopSweeper()
	wait := time.NewTimer(time.Duration(s.Timeout))
	defer wait.Stop()
	select {
	case <-s.sweeperDone:
	case <-wait.C:
		s.logger.Warn("the sweeper of shared session records did not stop: its storage call has not returned; left to finish on its own",
			zap.Duration("waited", time.Duration(s.Timeout)))
	}
	return nil
}

// Abilities: none beyond the calls; Caddy's storage has no atomic update
// to record an owner with.
func (s *Engine) Abilities() stateengine.Abilities { return stateengine.Abilities{} }

// CallTimeout bounds each call.
func (s *Engine) CallTimeout() time.Duration { return time.Duration(s.Timeout) }

// storedFact is the content of every fact file. Expires is when the fact
// stops keeping the record alive; the record expires with its latest fact.
type storedFact struct {
	InitDeadline time.Time `json:"init_deadline,omitzero"`
	Expires      time.Time `json:"expires"`
}

func recordDir(key string) string { return path.Join(storageSessions, key) }

// Created writes the record of a new session.
func (s *Engine) Created(ctx context.Context, key string, initDeadline time.Time, ttl time.Duration) error {
	now := s.now()
	return s.store(ctx, key, factCreated, storedFact{
		InitDeadline: initDeadline,
		Expires:      now.Add(serializer.RecordTTL(ttl, false, initDeadline, now)),
	})
}

// InitializeEnded records that the initialize exchange ended.
func (s *Engine) InitializeEnded(ctx context.Context, key string, ttl time.Duration) error {
	return s.add(ctx, key, factEnded, ttl)
}

// Opened records that the gate opened.
func (s *Engine) Opened(ctx context.Context, key string, ttl time.Duration) error {
	return s.add(ctx, key, factOpen, ttl)
}

// Touch refreshes the record's expiry.
func (s *Engine) Touch(ctx context.Context, key string, ttl time.Duration) error {
	return s.add(ctx, key, factTouched, ttl)
}

// add writes a fact to an existing record. A record forgotten between the
// check and the write leaves a fact without "created", which reads as no
// record and is swept once it expires: never a resurrected session.
func (s *Engine) add(ctx context.Context, key, fact string, ttl time.Duration) error {
	if _, err := s.storage.Stat(ctx, path.Join(recordDir(key), factCreated)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	return s.store(ctx, key, fact, storedFact{Expires: s.now().Add(ttl)})
}

func (s *Engine) store(ctx context.Context, key, fact string, f storedFact) error {
	data, err := json.Marshal(f)
	if err != nil {
		return err
	}
	return s.storage.Store(ctx, path.Join(recordDir(key), fact), data)
}

// Forget removes the record, every fact at once.
func (s *Engine) Forget(ctx context.Context, key string) error {
	return s.storage.Delete(ctx, recordDir(key))
}

// Lookup reads the record's facts; an expired record is not found.
func (s *Engine) Lookup(ctx context.Context, key string) (serializer.Record, bool, error) {
	facts, err := s.facts(ctx, recordDir(key))
	if err != nil {
		return serializer.Record{}, false, err
	}
	created, ok := facts[factCreated]
	if !ok || !facts.expires().After(s.now()) {
		return serializer.Record{}, false, nil
	}
	_, open := facts[factOpen]
	_, ended := facts[factEnded]
	return serializer.Record{
		Open:               open,
		InitDeadline:       created.InitDeadline,
		InitializeInFlight: !open && !ended,
	}, true, nil
}

type recordFacts map[string]storedFact

// expires is when the record expires: with its latest fact. Once open,
// the created fact no longer counts: its expiry may be the init deadline,
// which holds an initializing record only (serializer.RecordTTL), and the
// open fact, written later, outlives its session_ttl part.
func (f recordFacts) expires() time.Time {
	_, open := f[factOpen]
	var t time.Time
	for name, fact := range f {
		if open && name == factCreated {
			continue
		}
		if fact.Expires.After(t) {
			t = fact.Expires
		}
	}
	return t
}

// facts loads the facts present in a record's directory, stopping at a
// missing "created" (no record).
func (s *Engine) facts(ctx context.Context, dir string) (recordFacts, error) {
	facts := recordFacts{}
	for _, name := range []string{factCreated, factEnded, factOpen, factTouched} {
		data, err := s.storage.Load(ctx, path.Join(dir, name))
		if errors.Is(err, fs.ErrNotExist) {
			if name == factCreated {
				return facts, nil
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		var f storedFact
		if err := json.Unmarshal(data, &f); err != nil {
			return nil, fmt.Errorf("malformed %s fact: %v", name, err)
		}
		facts[name] = f
	}
	return facts, nil
}

func (s *Engine) sweepEvery(ctx context.Context, interval time.Duration) {
	defer close(s.sweeperDone)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			removed, err := s.sweep(ctx, interval)
			if err != nil && ctx.Err() == nil {
				s.logger.Warn("sweeping expired shared session records", zap.Error(err))
			} else if removed > 0 {
				s.logger.Debug("swept expired shared session records", zap.Int("removed", removed))
			}
		}
	}
}

// sweep removes expired records, one instance at a time: it takes the
// storage's lock, waiting no longer than the call timeout (another instance
// sweeping is reason enough to skip a round), and skips the round when
// another instance swept less than half an interval ago.
func (s *Engine) sweep(ctx context.Context, interval time.Duration) (removed int, err error) {
	lockCtx, cancel := context.WithTimeout(ctx, time.Duration(s.Timeout))
	err = s.storage.Lock(lockCtx, storageSweepLock)
	cancel()
	if err != nil {
		return 0, nil
	}
	defer func() {
		// Unlock even when ctx was cancelled: a left lock would stall
		// every instance's sweeper until it goes stale.
		if uerr := s.storage.Unlock(context.WithoutCancel(ctx), storageSweepLock); uerr != nil && err == nil {
			err = uerr
		}
	}()
	now := s.now()
	if data, err := s.storage.Load(ctx, storageLastSweep); err == nil {
		var last time.Time
		if last.UnmarshalText(data) == nil && now.Sub(last) < interval/2 {
			return 0, nil
		}
	}
	dirs, err := s.storage.List(ctx, storageSessions, false)
	if errors.Is(err, fs.ErrNotExist) {
		dirs, err = nil, nil
	}
	if err != nil {
		return 0, err
	}
	unread := 0
	defer func() {
		if unread == 0 {
			return
		}
		if ok, suppressed := s.unreadableWarns.Allow(s.now()); ok {
			s.logger.Warn("removed shared session records whose facts could not be parsed",
				zap.Int("removed", unread), zap.Duration("unchanged_for", unreadableFactAge),
				zap.Int("suppressed", suppressed))
		}
	}()
	for _, dir := range dirs {
		if ctx.Err() != nil {
			return removed, ctx.Err()
		}
		if expired, _ := s.expired(ctx, dir); !expired {
			continue
		}
		// Read again just before deleting: another instance may have
		// written a fact since. (A write between this and the delete is
		// still lost; the storage offers no lock per record.)
		expired, unreadable := s.expired(ctx, dir)
		if !expired {
			continue
		}
		if err := s.storage.Delete(ctx, dir); err != nil {
			return removed, err
		}
		removed++
		if unreadable {
			unread++
		}
	}
	stamp, _ := now.MarshalText()
	return removed, s.storage.Store(ctx, storageLastSweep, stamp)
}

// expired reports whether the record in dir has expired, and whether a
// fact of it could not be parsed: such a fact counts as expiring
// unreadableFactAge after the file last changed. A record that cannot be
// judged (a storage error, an unparsable fact of unknown age) is not
// expired.
func (s *Engine) expired(ctx context.Context, dir string) (expired, unreadable bool) {
	facts := recordFacts{}
	var latestUnreadable time.Time
	for _, name := range []string{factCreated, factEnded, factOpen, factTouched} {
		file := path.Join(dir, name)
		data, err := s.storage.Load(ctx, file)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			s.logger.Debug("reading a shared session record", zap.String("key", dir), zap.Error(err))
			return false, false
		}
		var f storedFact
		if json.Unmarshal(data, &f) == nil {
			facts[name] = f
			continue
		}
		unreadable = true
		info, err := s.storage.Stat(ctx, file)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil || info.Modified.IsZero() {
			s.logger.Debug("a shared session record has a malformed fact of unknown age",
				zap.String("key", dir), zap.String("fact", name), zap.Error(err))
			return false, true
		}
		latestUnreadable = latest(latestUnreadable, info.Modified.Add(unreadableFactAge))
	}
	return !latest(facts.expires(), latestUnreadable).After(s.now()), unreadable
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// UnmarshalCaddyfile sets up the engine from the tokens that follow
// `state` in an mcp_serializer block. Syntax:
//
//	storage {
//	    timeout        <duration>
//	    sweep_interval <duration>
//	}
//
// Every setting is optional; defaults are applied in Provision. The
// storage itself is Caddy's, set by the `storage` global option.
func (s *Engine) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return settings.Each(d, func(setting, val string) (err error) {
		switch setting {
		case "timeout":
			s.Timeout, err = settings.Duration(val)
		case "sweep_interval":
			s.SweepInterval, err = settings.Duration(val)
		default:
			return d.Errf("unrecognized storage state setting %q", setting)
		}
		return settings.End(d, setting, err)
	})
}

// Interface guards
var (
	_ stateengine.Engine    = (*Engine)(nil)
	_ caddy.Provisioner     = (*Engine)(nil)
	_ caddy.Validator       = (*Engine)(nil)
	_ caddy.CleanerUpper    = (*Engine)(nil)
	_ caddyfile.Unmarshaler = (*Engine)(nil)
)
