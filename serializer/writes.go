package serializer

import (
	"context"
	"time"
)

// A session's writes to the Store, beside Begin's Created, all made here:
// record is the one way in. Each write includes the ones a session makes
// before it, so writes waiting to be sent go as the last of them
// (strongestWrite). They go to a Store that queues writes itself at once
// (WriteQueue), else one at a time and in order from one goroutine per
// session, which also sends again, after a pause, a write that failed.

// storeOp is a write to the Store queued by a session, in the order a
// session makes them: each includes the ones before it (strongestWrite).
type storeOp uint8

const (
	opInitializeEnded storeOp = iota
	opOpened
	opForget
)

// strongestWrite picks, of a session's queued writes, the one to send in
// their place: each write in storeOp's order includes the ones before it
// (Opened also ends the initialize, and Forget ends the record).
func strongestWrite(ops []storeOp) storeOp {
	strongest := ops[0]
	for _, op := range ops[1:] {
		strongest = max(strongest, op)
	}
	return strongest
}

// WriteQueue takes a session's later writes to the Store and sends them
// itself (Config.Writes), so the table needs no goroutine per session to
// send them. The writes may land out of order; that is safe because no
// write reopens a closed gate or brings back a forgotten record. With a
// Watcher, the queue must announce an Opened once it is written.
type WriteQueue interface {
	// QueueInitializeEnded, QueueOpened and QueueForget hand the write
	// over and return at once, without calling back into the table;
	// false when the store does not take writes so (the table then sends
	// it as any Store's). failed is called, outside any of the store's
	// locks, if the write fails: the table then sends it again itself.
	QueueInitializeEnded(id string, failed func()) bool
	QueueOpened(id string, failed func()) bool
	QueueForget(id string, failed func()) bool
}

// queueWrite hands op to the Store's WriteQueue; false when there is
// none, or it does not take op, or when s has writes on their way from its goroutine,
// which op must follow. Caller holds s.mu.
func (s *Session) queueWrite(cfg *Config, op storeOp) bool {
	q := cfg.Writes
	if q == nil || s.writing {
		return false
	}
	failed := func() { s.writeFailed(op) }
	switch op {
	case opInitializeEnded:
		return q.QueueInitializeEnded(s.id, failed)
	case opOpened:
		return q.QueueOpened(s.id, failed)
	case opForget:
		return q.QueueForget(s.id, failed)
	}
	return false
}

// writeFailed: a write a WriteQueue took has failed. The session's own
// goroutine sends it again after a pause, and the session's later writes
// after it.
func (s *Session) writeFailed(op storeOp) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes = append(s.writes, op)
	if !s.writing {
		s.writing = true
		go s.sendWrites(firstWriteRetryPause)
	}
}

// record queues a write of s's state to the Store, if there is one: to a
// store that queues writes itself, at once (WriteQueue); to any other,
// from one goroutine per session, one at a time and in the order queued,
// so the store never sees Opened or Forget before the Created and
// InitializeEnded that came first here; writes queued while another is
// sent go as the one that does all they do (strongestWrite). Caller holds
// s.mu.
func (s *Session) record(op storeOp) {
	cfg := s.table.config()
	if cfg.Store == nil || s.queueWrite(cfg, op) {
		return
	}
	s.writes = append(s.writes, op)
	if !s.writing {
		s.writing = true
		go s.sendWrites(0)
	}
}

// sendWrites sends s's queued writes until none is left, the first after
// waiting wait (a write that already failed once). A write that fails is
// tried again after a pause for as long as init_timeout: the other
// instances hold the session's follow-ups that long waiting for its
// Opened, so a write that outlasts a Redis failover still frees them.
func (s *Session) sendWrites(wait time.Duration) {
	paused, pause := wait, wait // since the write last succeeded; the last pause
	for {
		if wait > 0 && !s.table.sleep(wait) {
			s.mu.Lock()
			s.writing = false // the table closed
			s.mu.Unlock()
			return
		}
		s.mu.Lock()
		if len(s.writes) == 0 {
			s.writes, s.writing = nil, false
			s.mu.Unlock()
			return
		}
		op := strongestWrite(s.writes)
		s.writes = s.writes[:0]
		s.mu.Unlock()

		wait = 0
		cfg := s.table.config()
		if cfg.Store == nil {
			continue // a reload turned the store off
		}
		if err := sendWrite(cfg, s.id, op); err == nil {
			paused, pause = 0, 0
			continue
		}
		pause = min(max(2*pause, firstWriteRetryPause), maxWriteRetryPause)
		if paused+pause > cfg.InitTimeout {
			paused, pause = 0, 0 // given up; the store counted each failure
			continue
		}
		paused, wait = paused+pause, pause
		s.mu.Lock()
		s.writes = append(s.writes, op) // the strongest of them goes next
		s.mu.Unlock()
	}
}

// The pauses between tries of a failing write: 100 ms, doubling to 1 s.
const (
	firstWriteRetryPause = 100 * time.Millisecond
	maxWriteRetryPause   = time.Second
)

// sendWrite sends one write to the Store.
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
