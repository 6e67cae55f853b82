package stateengine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/warnlimit"
	"github.com/mcpserializer/caddy-mcp-serializer/owner"
	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// maxStateCallsInFlight bounds the engine calls one adapter has running.
// A healthy engine answers in about a millisecond, so this is far more
// than an instance's traffic keeps busy; an engine that ignores its
// context (Caddy storage on a hung network file system) keeps a goroutine
// per call, and this caps them at a few MB of stacks instead of one per
// request for as long as it hangs.
const maxStateCallsInFlight = 256

// errStateBusy is the answer, without calling the engine, while
// maxStateCallsInFlight calls have not returned.
var errStateBusy = fmt.Errorf("%d calls to the engine have not returned; not calling it again until one does", maxStateCallsInFlight)

// Adapter is the serializer.Store the table calls: it turns ids into
// keys, bounds every call by the engine's timeout and the calls in flight
// by maxStateCallsInFlight, sends the writes of concurrent calls together
// to an engine that takes batches (batches.go), remembers "not found"
// answers briefly, and on failure counts the op in errors and logs a
// rate-limited WARN. The table treats an error as "unknown" and carries
// on locally.
type Adapter struct {
	engine  Engine
	ttl     time.Duration
	timeout time.Duration
	logger  *zap.Logger
	now     func() time.Time

	slots    chan struct{} // one per engine call not yet returned
	notFound *notFoundCache

	batch       func(context.Context, []*Write, time.Duration)                               // Abilities.Batch
	writes      writeQueue                                                                   // with batch: the writes not sent yet
	takeOver    func(ctx context.Context, key, from, to string) (string, bool, error)        // Abilities.TakeOver
	claimOwner  func(ctx context.Context, key, me string, ttl time.Duration) (string, error) // Abilities.ClaimOwner
	markRunning func(ctx context.Context, key, me string, life time.Duration) error          // Abilities.MarkRunning
	runningFor  func(ctx context.Context, key string) (time.Duration, error)                 // Abilities.RunningFor
	abilities   Abilities

	errors [NumOps]prometheus.Counter
	warns  [NumOps]warnlimit.Limiter
}

// NewAdapter makes engine the Store of a table whose sessions live ttl;
// failures are counted in errors by op and logged to logger.
func NewAdapter(engine Engine, ttl time.Duration, logger *zap.Logger, errors *prometheus.CounterVec) *Adapter {
	s := &Adapter{
		engine:      engine,
		ttl:         ttl,
		timeout:     engine.CallTimeout(),
		logger:      logger,
		now:         time.Now,
		slots:       make(chan struct{}, maxStateCallsInFlight),
		notFound:    newNotFoundCache(),
		writes:      writeQueue{wake: make(chan struct{}, maxWriteBatches)},
		batch:       engine.Abilities().Batch,
		takeOver:    engine.Abilities().TakeOver,
		claimOwner:  engine.Abilities().ClaimOwner,
		markRunning: engine.Abilities().MarkRunning,
		runningFor:  engine.Abilities().RunningFor,
		abilities:   engine.Abilities(),
	}
	for op := range NumOps {
		s.errors[op] = errors.WithLabelValues(op.String())
	}
	return s
}

// Configure makes s cfg's Store, with what its engine can do: the
// session's later writes queued for its batches if it takes them.
func (s *Adapter) Configure(cfg *serializer.Config) {
	cfg.Store, cfg.StoreTimeout = s, s.timeout
	if s.batch != nil {
		cfg.Writes = s
	}
}

func (s *Adapter) Created(ctx context.Context, id string, initDeadline time.Time) error {
	return s.CreatedOwned(ctx, id, initDeadline, "")
}

// CreatedOwned is Created with the session's owner (serializer.OwnerStore),
// recorded by an engine that takes batches; others record none.
func (s *Adapter) CreatedOwned(ctx context.Context, id string, initDeadline time.Time, owner string) error {
	key := serializer.StoreKey(id)
	if s.batch != nil {
		return s.write(ctx, id, &Write{Op: OpCreated, Key: key, Deadline: initDeadline, Owner: owner, after: s.notFound.creating(key)})
	}
	_, err := bounded(s, ctx, OpCreated, id, key, func(ctx context.Context, key string) (struct{}, error) {
		defer s.notFound.creating(key)()
		return struct{}{}, s.engine.Created(ctx, key, initDeadline, s.ttl)
	})
	return err
}

func (s *Adapter) InitializeEnded(ctx context.Context, id string) error {
	if s.batch != nil {
		return s.write(ctx, id, &Write{Op: OpInitializeEnded, Key: serializer.StoreKey(id)})
	}
	_, err := bounded(s, ctx, OpInitializeEnded, id, serializer.StoreKey(id), func(ctx context.Context, key string) (struct{}, error) {
		return struct{}{}, s.engine.InitializeEnded(ctx, key, s.ttl)
	})
	return err
}

func (s *Adapter) Opened(ctx context.Context, id string) error {
	if s.batch != nil {
		return s.write(ctx, id, &Write{Op: OpOpened, Key: serializer.StoreKey(id)})
	}
	_, err := bounded(s, ctx, OpOpened, id, serializer.StoreKey(id), func(ctx context.Context, key string) (struct{}, error) {
		return struct{}{}, s.engine.Opened(ctx, key, s.ttl)
	})
	return err
}

func (s *Adapter) Touch(ctx context.Context, id string) error {
	if s.batch != nil {
		return s.write(ctx, id, &Write{Op: OpTouch, Key: serializer.StoreKey(id)})
	}
	_, err := bounded(s, ctx, OpTouch, id, serializer.StoreKey(id), func(ctx context.Context, key string) (struct{}, error) {
		return struct{}{}, s.engine.Touch(ctx, key, s.ttl)
	})
	return err
}

// Forget replaces the key's "not found" entry by a fresh one once the
// engine removed the record: the table forgets a session its upstream
// answered 404 for, and the client's next request for it must not cost a
// lookup.
func (s *Adapter) Forget(ctx context.Context, id string) error {
	key := serializer.StoreKey(id)
	s.notFound.drop(key)
	version := s.notFound.version(key)
	var err error
	if s.batch != nil {
		err = s.write(ctx, id, &Write{Op: OpForget, Key: key})
	} else {
		_, err = bounded(s, ctx, OpForget, id, key, func(ctx context.Context, key string) (struct{}, error) {
			return struct{}{}, s.engine.Forget(ctx, key)
		})
	}
	if err == nil {
		s.notFound.add(key, version, s.now())
	}
	return err
}

// Owner reads the owner recorded with session id's record (owner.Store).
func (s *Adapter) Owner(ctx context.Context, id string) (string, bool, error) {
	rec, found, err := s.Lookup(ctx, id)
	return rec.Owner, found, err
}

// TakeOver records to as session id's owner if from still is
// (owner.Store); an engine that cannot answers an error.
func (s *Adapter) TakeOver(ctx context.Context, id, from, to string) (string, bool, error) {
	if s.takeOver == nil {
		return "", false, errNoOwners
	}
	res, err := bounded(s, ctx, OpTakeOver, id, serializer.StoreKey(id), func(ctx context.Context, key string) (lookupResult, error) {
		owner, found, err := s.takeOver(ctx, key, from, to)
		return lookupResult{serializer.Record{Owner: owner}, found}, err
	})
	return res.rec.Owner, res.found, err
}

// Claim records me as the owner of id unless one is, and returns the
// owner recorded then (owner.Claimer): for a key's queue, which has no
// record until its first claim. The record lives life more, or as long
// as a session's for 0.
func (s *Adapter) Claim(ctx context.Context, id, me string, life time.Duration) (string, error) {
	if s.claimOwner == nil {
		return "", errNoOwners
	}
	key := serializer.StoreKey(id)
	s.notFound.drop(key)
	return bounded(s, ctx, OpClaimOwner, id, key, func(ctx context.Context, key string) (string, error) {
		if life == 0 {
			life = s.ttl
		}
		return s.claimOwner(ctx, key, me, life)
	})
}

// MarkRunning records that me's exchange of session id runs for life
// more, or clears the mark when life is 0 (owner.RunningStore).
func (s *Adapter) MarkRunning(ctx context.Context, id, me string, life time.Duration) error {
	if s.markRunning == nil {
		return errNoOwners
	}
	_, err := bounded(s, ctx, OpMarkRunning, id, serializer.StoreKey(id), func(ctx context.Context, key string) (struct{}, error) {
		return struct{}{}, s.markRunning(ctx, key, me, life)
	})
	return err
}

// RunningFor reads how long session id's record says an exchange still
// runs (owner.RunningStore).
func (s *Adapter) RunningFor(ctx context.Context, id string) (time.Duration, error) {
	if s.runningFor == nil {
		return 0, errNoOwners
	}
	return bounded(s, ctx, OpRunningFor, id, serializer.StoreKey(id), func(ctx context.Context, key string) (time.Duration, error) {
		return s.runningFor(ctx, key)
	})
}

// Renew keeps instance id's lease (owner.Leases).
func (s *Adapter) Renew(ctx context.Context, id, addr string, life time.Duration) (owner.Renewal, error) {
	if s.abilities.RenewLease == nil {
		return owner.Renewal{}, errNoOwners
	}
	r, err := bounded(s, ctx, OpRenewLease, "", "", func(ctx context.Context, _ string) (Renewal, error) {
		return s.abilities.RenewLease(ctx, id, addr, life)
	})
	return owner.Renewal{Epoch: r.Epoch, Existed: r.Existed, Holder: r.Holder}, err
}

// Drop ends instance id's lease as lapsed that long ago (owner.Leases).
func (s *Adapter) Drop(ctx context.Context, id string, lapsed time.Duration) error {
	if s.abilities.DropLease == nil {
		return errNoOwners
	}
	_, err := bounded(s, ctx, OpDropLease, "", "", func(ctx context.Context, _ string) (struct{}, error) {
		return struct{}{}, s.abilities.DropLease(ctx, id, lapsed)
	})
	return err
}

// Members lists the instances' leases (owner.Leases).
func (s *Adapter) Members(ctx context.Context) (map[string]owner.Lease, error) {
	if s.abilities.Members == nil {
		return nil, errNoOwners
	}
	return bounded(s, ctx, OpMembers, "", "", func(ctx context.Context, _ string) (map[string]owner.Lease, error) {
		listed, err := s.abilities.Members(ctx)
		m := make(map[string]owner.Lease, len(listed))
		for id, l := range listed {
			m[id] = owner.Lease{Addr: l.Addr, Lapsed: l.Lapsed, Dropped: l.Dropped}
		}
		return m, err
	})
}

// errNoOwners is TakeOver's answer on an engine that records no owners.
var errNoOwners = errors.New("this state engine records no session owners")

type lookupResult struct {
	rec   serializer.Record
	found bool
}

// Lookup answers "not found" without calling the engine for a key it
// answered so less than notFoundTTL ago.
func (s *Adapter) Lookup(ctx context.Context, id string) (serializer.Record, bool, error) {
	key := serializer.StoreKey(id)
	if s.notFound.has(key, s.now()) {
		return serializer.Record{}, false, nil
	}
	version := s.notFound.version(key)
	res, err := bounded(s, ctx, OpLookup, id, key, func(ctx context.Context, key string) (lookupResult, error) {
		rec, found, err := s.engine.Lookup(ctx, key)
		return lookupResult{rec, found}, err
	})
	if err == nil && !res.found {
		s.notFound.add(key, version, s.now())
	}
	return res.rec, res.found, err
}

// bounded runs one engine call in its own goroutine so that the caller
// waits no longer than the timeout, whatever the engine does with its
// context (a hung network file system ignores it); a late answer is
// dropped. The goroutine holds one of the adapter's slots until the engine
// returns; with none free the call fails at once, without the engine.
func bounded[T any](s *Adapter, ctx context.Context, op Op, id, key string, call func(context.Context, string) (T, error)) (T, error) {
	type answer struct {
		val T
		err error
	}
	var a answer
	select {
	case s.slots <- struct{}{}:
		callCtx, cancel := context.WithTimeout(ctx, s.timeout)
		defer cancel()
		done := make(chan answer, 1)
		go func() {
			defer func() { <-s.slots }()
			v, err := call(callCtx, key)
			done <- answer{v, err}
		}()
		select {
		case a = <-done:
		case <-callCtx.Done():
			a.err = fmt.Errorf("no answer within %s: %w", s.timeout, callCtx.Err())
		}
	default:
		a.err = errStateBusy
	}
	if a.err != nil && !errors.Is(ctx.Err(), context.Canceled) {
		// A caller that went away is not the engine's failure; a
		// caller's deadline (the table's own bound) passing is.
		s.failed(op, id, a.err)
	}
	return a.val, a.err
}

func (s *Adapter) failed(op Op, id string, err error) {
	s.errors[op].Inc()
	if ok, suppressed := s.warns[op].Allow(s.now()); ok {
		fields := []zap.Field{zap.Stringer("op", op), zap.Int("suppressed", suppressed), zap.Error(err)}
		if id != "" { // a lease's call concerns no session
			fields = append(fields, zap.String("session", serializer.SessionHash(id)))
		}
		s.logger.Warn("shared session state unavailable; this instance carries on with what it knows", fields...)
	}
}

var _ serializer.Store = (*Adapter)(nil)
