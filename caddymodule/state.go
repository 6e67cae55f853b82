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
// and an initializing record at least until its init deadline. It comes
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
	numStateOps
)

var stateOpNames = [numStateOps]string{"created", "initialize_ended", "opened", "touch", "forget", "lookup"}

func (o stateOp) String() string { return stateOpNames[o] }

// stateWarnInterval spaces the WARN lines of one operation: an engine that
// is down fails every call, and one line per call would flood the log.
const stateWarnInterval = 10 * time.Second

// sharedState is the serializer.Store the table calls: it turns ids into
// keys, bounds every call by the engine's timeout, and on failure counts
// caddy_mcp_serializer_state_errors_total{op} and logs a rate-limited WARN.
// The table treats an error as "unknown" and carries on locally.
type sharedState struct {
	engine  StateEngine
	ttl     time.Duration
	timeout time.Duration
	logger  *zap.Logger
	now     func() time.Time

	errors [numStateOps]prometheus.Counter
	warns  [numStateOps]warnLimiter
}

func newSharedState(engine StateEngine, ttl time.Duration, logger *zap.Logger) *sharedState {
	s := &sharedState{
		engine:  engine,
		ttl:     ttl,
		timeout: engine.CallTimeout(),
		logger:  logger,
		now:     time.Now,
	}
	for op := range numStateOps {
		s.errors[op] = metrics.stateErrors.WithLabelValues(op.String())
	}
	return s
}

func (s *sharedState) Created(ctx context.Context, id string, initDeadline time.Time) error {
	_, err := bounded(s, ctx, opCreated, id, func(ctx context.Context, key string) (struct{}, error) {
		return struct{}{}, s.engine.Created(ctx, key, initDeadline, s.ttl)
	})
	return err
}

func (s *sharedState) InitializeEnded(ctx context.Context, id string) error {
	_, err := bounded(s, ctx, opInitializeEnded, id, func(ctx context.Context, key string) (struct{}, error) {
		return struct{}{}, s.engine.InitializeEnded(ctx, key, s.ttl)
	})
	return err
}

func (s *sharedState) Opened(ctx context.Context, id string) error {
	_, err := bounded(s, ctx, opOpened, id, func(ctx context.Context, key string) (struct{}, error) {
		return struct{}{}, s.engine.Opened(ctx, key, s.ttl)
	})
	return err
}

func (s *sharedState) Touch(ctx context.Context, id string) error {
	_, err := bounded(s, ctx, opTouch, id, func(ctx context.Context, key string) (struct{}, error) {
		return struct{}{}, s.engine.Touch(ctx, key, s.ttl)
	})
	return err
}

func (s *sharedState) Forget(ctx context.Context, id string) error {
	_, err := bounded(s, ctx, opForget, id, func(ctx context.Context, key string) (struct{}, error) {
		return struct{}{}, s.engine.Forget(ctx, key)
	})
	return err
}

type lookupResult struct {
	rec   serializer.Record
	found bool
}

func (s *sharedState) Lookup(ctx context.Context, id string) (serializer.Record, bool, error) {
	res, err := bounded(s, ctx, opLookup, id, func(ctx context.Context, key string) (lookupResult, error) {
		rec, found, err := s.engine.Lookup(ctx, key)
		return lookupResult{rec, found}, err
	})
	return res.rec, res.found, err
}

// bounded runs one engine call in its own goroutine so that the caller
// waits no longer than the timeout, whatever the engine does with its
// context (a hung network file system ignores it); a late answer is
// dropped.
func bounded[T any](s *sharedState, ctx context.Context, op stateOp, id string, call func(context.Context, string) (T, error)) (T, error) {
	type answer struct {
		val T
		err error
	}
	callCtx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	done := make(chan answer, 1)
	key := serializer.StoreKey(id)
	go func() {
		v, err := call(callCtx, key)
		done <- answer{v, err}
	}()
	var a answer
	select {
	case a = <-done:
	case <-callCtx.Done():
		a.err = fmt.Errorf("no answer within %s: %w", s.timeout, callCtx.Err())
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
