package serializer

import (
	"context"
	"time"
)

// A session's writes to the Store, beside Begin's Created, all made here.
// record is the one way in, and a session has one write on its way at a
// time, so the Store gets them in the order the session made them. Each
// write includes the ones before it, so the writes made while one is on
// its way go as the last of them. A write goes to the Store's WriteQueue
// if it takes it, else from a goroutine; either way its answer comes back
// to written, which sends the next, or tries a failed write again after a
// pause.

// storeOp is a write to the Store, in the order a session makes them:
// each includes the ones before it (Opened also ends the initialize, and
// Forget ends the record), so the larger of two does what both do.
type storeOp uint8

const (
	writeNone storeOp = iota
	opInitializeEnded
	opOpened
	opForget
)

// WriteQueue takes a session's writes to the Store and sends them itself
// (Config.Writes), so that no goroutine waits on each.
type WriteQueue interface {
	// QueueInitializeEnded, QueueOpened and QueueForget take the write
	// and return at once, without calling back into the table; false when
	// the queue does not take it (the table then calls the Store itself).
	// done is called once with the Store's answer, outside any of the
	// queue's locks.
	QueueInitializeEnded(id string, done func(error)) bool
	QueueOpened(id string, done func(error)) bool
	QueueForget(id string, done func(error)) bool
}

// record has s's state written to the Store, if there is one: at once if
// no write of s is on its way, else after it, with any others made
// meanwhile. Caller holds s.mu.
func (s *Session) record(op storeOp) {
	if s.table.config().Store == nil {
		return
	}
	s.nextWrite = max(s.nextWrite, op)
	if !s.writing {
		s.sendNextWrite()
	}
}

// sendNextWrite sends s's next write, if any. Caller holds s.mu.
func (s *Session) sendNextWrite() {
	op, cfg := s.nextWrite, s.table.config()
	s.nextWrite = writeNone
	s.writing = op != writeNone && cfg.Store != nil // a reload may turn the store off
	if !s.writing {
		return
	}
	done := func(err error) { s.written(cfg, op, err) }
	if cfg.Writes != nil && queueWrite(cfg.Writes, s.id, op, done) {
		return
	}
	go func() { done(sendWrite(cfg, s.id, op)) }()
}

// written: the Store answered op. On success the next write goes; a
// failure is tried again after a pause for as long as init_timeout: the
// other instances hold the session's follow-ups that long waiting for its
// Opened, so a write that outlasts a Redis failover still frees them.
func (s *Session) written(cfg *Config, op storeOp, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if pause := min(max(2*s.retryPause, firstWriteRetryPause), maxWriteRetryPause); s.retried+pause <= cfg.InitTimeout {
			s.retryPause, s.retried = pause, s.retried+pause
			s.nextWrite = max(s.nextWrite, op)
			go s.retryAfter(pause)
			return
		}
		// Given up; the store counted each failure.
	}
	s.retryPause, s.retried = 0, 0
	s.sendNextWrite()
}

// retryAfter sends s's next write, the one that failed among it, after
// pause.
func (s *Session) retryAfter(pause time.Duration) {
	slept := s.table.sleep(pause)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !slept {
		s.writing = false // the table closed
		return
	}
	s.sendNextWrite()
}

// The pauses between tries of a failing write: 100 ms, doubling to 1 s.
const (
	firstWriteRetryPause = 100 * time.Millisecond
	maxWriteRetryPause   = time.Second
)

// sendWrite sends one write to the Store and waits for its answer.
func sendWrite(cfg *Config, id string, op storeOp) error {
	ctx, cancel := context.WithTimeout(context.Background(), cfg.StoreTimeout)
	defer cancel()
	switch op {
	case opInitializeEnded:
		return cfg.Store.InitializeEnded(ctx, id)
	case opOpened:
		return cfg.Store.Opened(ctx, id)
	case opForget:
		return cfg.Store.Forget(ctx, id)
	}
	return nil
}

// queueWrite hands one write to q; false when q does not take it.
func queueWrite(q WriteQueue, id string, op storeOp, done func(error)) bool {
	switch op {
	case opInitializeEnded:
		return q.QueueInitializeEnded(id, done)
	case opOpened:
		return q.QueueOpened(id, done)
	case opForget:
		return q.QueueForget(id, done)
	}
	return false
}
