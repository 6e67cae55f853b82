package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// StateEngine is implemented by the modules of the namespace
// http.handlers.mcp_serializer.state (redis, storage): an engine the
// handler shares session records through, so that several Caddy instances
// gate the same session.
//
// Every call goes through one adapter (sharedState) that hashes the session
// id, bounds the call and counts failures, so an engine sees keys only: the
// hex SHA-256 of a session id, never the id. Writes carry ttl, the
// handler's session_ttl: a record lives that long after its last write,
// and an initializing record at least until its init deadline
// (serializer.RecordTTL). It comes
// with each call rather than at provision because the table, and so the
// ttl, is reconfigured in place on reload.
type StateEngine interface {
	// CallTimeout bounds each call; the adapter enforces it even on an
	// engine that does not honour its context.
	CallTimeout() time.Duration
	// Created writes a record: initializing, initialize exchange in
	// flight, gated until initDeadline.
	Created(ctx context.Context, key string, initDeadline time.Time, ttl time.Duration) error
	// InitializeEnded clears the in-flight mark. Updates never regress a
	// record (an open record stays open) and never recreate a missing one.
	InitializeEnded(ctx context.Context, key string, ttl time.Duration) error
	// Opened marks the record open.
	Opened(ctx context.Context, key string, ttl time.Duration) error
	// Touch refreshes the record's expiry.
	Touch(ctx context.Context, key string, ttl time.Duration) error
	// Forget removes the record.
	Forget(ctx context.Context, key string) error
	// Lookup reads the record; found is false when it is missing or
	// expired.
	Lookup(ctx context.Context, key string) (rec serializer.Record, found bool, err error)
}

// Store operations, the values of the op label.
type stateOp uint8

const (
	opCreated stateOp = iota
	opInitializeEnded
	opOpened
	opTouch
	opForget
	opLookup
	// Cluster turns (statecluster.go).
	opTake
	opClaim
	opRenew
	opRelease
	numStateOps
)

var stateOpNames = [numStateOps]string{"created", "initialize_ended", "opened", "touch", "forget", "lookup",
	"take", "claim", "renew", "release"}

func (o stateOp) String() string { return stateOpNames[o] }

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

// stateWarnInterval spaces the WARN lines of one operation: an engine that
// is down fails every call, and one line per call would flood the log.
const stateWarnInterval = 10 * time.Second

// sharedState is the serializer.Store the table calls: it turns ids into
// keys, bounds every call by the engine's timeout and the calls in flight
// by maxStateCallsInFlight, sends the writes of concurrent calls together
// to an engine that takes batches (statewrites.go), remembers "not found"
// answers briefly, and on failure counts
// caddy_mcp_serializer_state_errors_total{op} and logs a rate-limited
// WARN. The table treats an error as "unknown" and carries on locally.
type sharedState struct {
	engine  StateEngine
	ttl     time.Duration
	timeout time.Duration
	logger  *zap.Logger
	now     func() time.Time

	slots    chan struct{} // one per engine call not yet returned
	notFound *notFoundCache

	batch  batchEngine // the engine, when it takes writes in batches
	writes writeQueue  // with batch: the writes not sent yet
	// announceOpened makes an Opened also tell every instance, in the same
	// call (order cluster: requests held at the gate elsewhere go at once).
	announceOpened bool

	errors [numStateOps]prometheus.Counter
	warns  [numStateOps]warnLimiter
}

func newSharedState(engine StateEngine, ttl time.Duration, logger *zap.Logger) *sharedState {
	s := &sharedState{
		engine:   engine,
		ttl:      ttl,
		timeout:  engine.CallTimeout(),
		logger:   logger,
		now:      time.Now,
		slots:    make(chan struct{}, maxStateCallsInFlight),
		notFound: newNotFoundCache(),
		writes:   writeQueue{wake: make(chan struct{}, maxWriteBatches)},
	}
	for op := range numStateOps {
		s.errors[op] = metrics.stateErrors.WithLabelValues(op.String())
	}
	s.batch, _ = engine.(batchEngine)
	return s
}

func (s *sharedState) Created(ctx context.Context, id string, initDeadline time.Time) error {
	key := serializer.StoreKey(id)
	if s.batch != nil {
		return s.write(ctx, id, &stateWrite{op: opCreated, key: key, deadline: initDeadline, after: s.notFound.creating(key)})
	}
	_, err := bounded(s, ctx, opCreated, id, key, func(ctx context.Context, key string) (struct{}, error) {
		defer s.notFound.creating(key)()
		return struct{}{}, s.engine.Created(ctx, key, initDeadline, s.ttl)
	})
	return err
}

func (s *sharedState) InitializeEnded(ctx context.Context, id string) error {
	if s.batch != nil {
		return s.write(ctx, id, &stateWrite{op: opInitializeEnded, key: serializer.StoreKey(id)})
	}
	_, err := bounded(s, ctx, opInitializeEnded, id, serializer.StoreKey(id), func(ctx context.Context, key string) (struct{}, error) {
		return struct{}{}, s.engine.InitializeEnded(ctx, key, s.ttl)
	})
	return err
}

func (s *sharedState) Opened(ctx context.Context, id string) error {
	if s.batch != nil {
		return s.write(ctx, id, &stateWrite{op: opOpened, key: serializer.StoreKey(id), announce: s.announceOpened})
	}
	_, err := bounded(s, ctx, opOpened, id, serializer.StoreKey(id), func(ctx context.Context, key string) (struct{}, error) {
		return struct{}{}, s.engine.Opened(ctx, key, s.ttl)
	})
	return err
}

func (s *sharedState) Touch(ctx context.Context, id string) error {
	if s.batch != nil {
		return s.write(ctx, id, &stateWrite{op: opTouch, key: serializer.StoreKey(id)})
	}
	_, err := bounded(s, ctx, opTouch, id, serializer.StoreKey(id), func(ctx context.Context, key string) (struct{}, error) {
		return struct{}{}, s.engine.Touch(ctx, key, s.ttl)
	})
	return err
}

// Forget replaces the key's "not found" entry by a fresh one once the
// engine removed the record: the table forgets a session its upstream
// answered 404 for, and the client's next request for it must not cost a
// lookup.
func (s *sharedState) Forget(ctx context.Context, id string) error {
	key := serializer.StoreKey(id)
	s.notFound.drop(key)
	version := s.notFound.version(key)
	var err error
	if s.batch != nil {
		err = s.write(ctx, id, &stateWrite{op: opForget, key: key})
	} else {
		_, err = bounded(s, ctx, opForget, id, key, func(ctx context.Context, key string) (struct{}, error) {
			return struct{}{}, s.engine.Forget(ctx, key)
		})
	}
	if err == nil {
		s.notFound.add(key, version, s.now())
	}
	return err
}

type lookupResult struct {
	rec   serializer.Record
	found bool
}

// Lookup answers "not found" without calling the engine for a key it
// answered so less than notFoundTTL ago.
func (s *sharedState) Lookup(ctx context.Context, id string) (serializer.Record, bool, error) {
	key := serializer.StoreKey(id)
	if s.notFound.has(key, s.now()) {
		return serializer.Record{}, false, nil
	}
	version := s.notFound.version(key)
	res, err := bounded(s, ctx, opLookup, id, key, func(ctx context.Context, key string) (lookupResult, error) {
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
func bounded[T any](s *sharedState, ctx context.Context, op stateOp, id, key string, call func(context.Context, string) (T, error)) (T, error) {
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

func (s *sharedState) failed(op stateOp, id string, err error) {
	s.errors[op].Inc()
	if ok, suppressed := s.warns[op].allow(s.now()); ok {
		s.logger.Warn("shared session state unavailable; this instance carries on with what it knows",
			zap.Stringer("op", op), zap.String("session", sessionHash(id)),
			zap.Int("suppressed", suppressed), zap.Error(err))
	}
}

// warnLimiter lets one line through per stateWarnInterval and counts the
// ones it held back.
type warnLimiter struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

func (w *warnLimiter) allow(now time.Time) (ok bool, suppressed int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.last.IsZero() && now.Sub(w.last) < stateWarnInterval {
		w.suppressed++
		return false, 0
	}
	w.last, suppressed, w.suppressed = now, w.suppressed, 0
	return true, suppressed
}

// errNotStateEngine names a module in the state namespace that is not one.
var errNotStateEngine = errors.New("is not a mcp_serializer state engine")

var _ serializer.Store = (*sharedState)(nil)
