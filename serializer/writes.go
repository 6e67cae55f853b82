package serializer

// strongestWrite is the one write that does to a record all that the
// queued writes ops would do, in their order: the latest of them in
// storeOp's order. Opened clears the in-flight mark as InitializeEnded
// does, and writes never recreate a forgotten record, so a Forget leaves
// nothing for the others to do, before or after it.
func strongestWrite(ops []storeOp) storeOp {
	strongest := ops[0]
	for _, op := range ops[1:] {
		strongest = max(strongest, op)
	}
	return strongest
}

// WriteQueue is a Store that takes a session's later writes without
// blocking: it queues them and sends them within its own bounds. A table
// hands InitializeEnded, Opened and Forget to it as they happen, under the
// session's lock, instead of sending them one at a time from a goroutine
// per session. A session's writes may then land in any order among
// themselves, never before its Created returned, which the Store's rules
// make harmless: no write turns an open record back into an initializing
// one or recreates a missing one, so Opened and Forget end where they
// would have in order. The store must keep that true for writes that
// overlap (the redis engine's are atomic scripts), and, as a Watcher,
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
