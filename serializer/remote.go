package serializer

import "time"

// Reading a held gate's record. With a Store and GateReadAfter, a gate
// that has held a request GateReadAfter reads its session's record, again
// every GateReadAfter, until the record says open: the session's
// notifications/initialized may have been served by another instance.
// A session that no request holds costs nothing.

// watchGateIfHeld starts watching the record of s while a request is held
// at its gate, with GateReadAfter and if no watch runs yet. Caller holds
// s.mu.
func (s *Session) watchGateIfHeld() {
	cfg := s.table.config()
	if cfg.GateReadAfter <= 0 || cfg.Store == nil || s.gate != gateInitializing || s.lookingUp || s.gone || s.gateWatched {
		return
	}
	s.gateWatched = true
	go s.watchGate(cfg.Store, cfg.GateReadAfter)
}

// watchGate reads s's record each time the period every has passed, until
// the record says open or is missing (the gate then opens here too) or
// nothing is held at the gate any more: the gate opened or timed out here,
// or no request holds the session. A gate held for a slow client so costs
// a few reads, not a stream of them.
func (s *Session) watchGate(store Store, every time.Duration) {
	t := s.table
	for t.pause(every) {
		s.mu.Lock()
		if s.gate != gateInitializing || s.gone || s.refs.Load() == 0 {
			s.gateWatched = false
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		// Missing counts as open, as for a first sight (adopt): the session
		// ended elsewhere, or the engine lost its records (a restart).
		rec, found, err := lookupRecord(store, t.config(), s.id)
		if err == nil && (!found || rec.Open) {
			s.mu.Lock()
			s.openedElsewhere()
			s.gateWatched = false
			s.mu.Unlock()
			t.gateSettled(s)
			return
		}
	}
}

// pause waits d on the table's clock; false if the table closes first.
func (t *Table) pause(d time.Duration) bool {
	woke := make(chan struct{})
	stop := t.clock.AfterFunc(d, func() { close(woke) })
	defer stop()
	select {
	case <-woke:
		return true
	case <-t.stop:
		return false
	}
}
