package serializer

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

// WriteQueue is a Store that batches a session's later writes itself, so
// the table needs no goroutine per session to send them. The writes may
// land out of order; that is safe because no write reopens a closed gate
// or brings back a forgotten record. A store that also watches must
// announce an Opened once it is written.
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

// queueWrite hands op to a WriteQueue store; false when the store does
// not take it, or when s has writes on their way from its goroutine,
// which op must follow. Caller holds s.mu.
func (s *Session) queueWrite(cfg *Config, op storeOp) bool {
	q, ok := cfg.Store.(WriteQueue)
	if !ok || s.writing {
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
