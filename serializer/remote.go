package serializer

import (
	"sync"
	"time"
)

// Waiting on another instance. With a Store, a request here may wait for
// something only another instance sees: a gate opened there (its client's
// notifications/initialized was acknowledged there), or a cluster turn
// handed on there (see turn.go). Every such wait re-reads the shared state
// with a short backoff, so it ends within remoteMaxBackoff of the change;
// a Watcher (Config.Watcher) announces changes, which ends the wait at
// once. A lost announcement costs a backoff, never a stuck request, and a
// session that no request holds costs nothing.

// Backoff between reads of the shared state while a request waits on
// another instance: short, since the change usually comes within
// milliseconds, and capped so a long wait costs a few calls a second.
const (
	remoteFirstBackoff = 2 * time.Millisecond
	remoteMaxBackoff   = 100 * time.Millisecond
)

// Watcher announces changes made by any instance to the Store
// (Config.Watcher): a record opened, a session's cluster turn asked for or
// handed on.
type Watcher interface {
	// Watch calls changed for each announcement until stop is called: key
	// is the StoreKey of the session whose shared state changed; asker the
	// token of a request asking for its cluster turn, which arrived waited
	// before the announcement ("" for any other change). Announcements may
	// be lost (a reconnect); the table reads the state again after a
	// backoff anyway.
	Watch(changed func(key, asker string, waited time.Duration)) (stop func())
	// Announcing reports whether announcements go out and come in: false
	// while the engine refuses them (an ACL without the channel) or the
	// subscription is down. A holder of a cluster turn then hands it on
	// after every exchange, since it would not hear an ask.
	Announcing() bool
}

// remoteWaits is the table's index of the sessions waiting on another
// instance, by StoreKey, so that an announcement finds them.
type remoteWaits struct {
	mu       sync.Mutex
	sessions map[string]*remoteWait
	stop     func()  // ends the watch of watcher
	watcher  Watcher // Config.Watcher, as last configured
}

type remoteWait struct {
	s     *Session
	count int // waits on s in progress
}

// watch starts announcements from w (Config.Watcher), ending those of a
// Watcher watched before. Called by Configure. The old watch is stopped
// outside the lock: stopping waits for an announcement being delivered,
// which takes the lock.
func (t *Table) watch(w Watcher) {
	r := &t.remote
	r.mu.Lock()
	if w == r.watcher {
		r.mu.Unlock()
		return
	}
	old := r.stop
	r.watcher, r.stop = w, nil
	r.mu.Unlock()
	if old != nil {
		old()
	}
	if w != nil {
		stop := w.Watch(t.changedElsewhere)
		r.mu.Lock()
		if r.watcher == w {
			r.stop, stop = stop, nil
		}
		r.mu.Unlock()
		if stop != nil {
			stop() // another Configure came first
		}
	}
}

// unwatch ends announcements; the table is closing.
func (t *Table) unwatch() { t.watch(nil) }

// announcing reports whether the watched Store's announcements work.
func (r *remoteWaits) announcing() bool {
	r.mu.Lock()
	w := r.watcher
	r.mu.Unlock()
	return w != nil && w.Announcing()
}

// changedElsewhere wakes the requests waiting on session key, if any.
func (t *Table) changedElsewhere(key, _ string, _ time.Duration) {
	t.remote.mu.Lock()
	w := t.remote.sessions[key]
	t.remote.mu.Unlock()
	if w == nil {
		return
	}
	s := w.s
	s.mu.Lock()
	s.wakeRemoteWaits()
	s.mu.Unlock()
}

// awaitRemote registers a wait on s for announcements; the returned
// function ends it.
func (t *Table) awaitRemote(s *Session) (done func()) {
	key := StoreKey(s.id)
	r := &t.remote
	r.mu.Lock()
	if r.sessions == nil {
		r.sessions = map[string]*remoteWait{}
	}
	w := r.sessions[key]
	if w == nil || w.s != s {
		w = &remoteWait{s: s}
		r.sessions[key] = w
	}
	w.count++
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		if w.count--; w.count == 0 && r.sessions[key] == w {
			delete(r.sessions, key)
		}
		r.mu.Unlock()
	}
}

// remoteChange returns a channel closed at the next announcement for s.
// Take it before reading the shared state, so that a change announced
// during the read is not missed. Caller holds s.mu.
func (s *Session) remoteChange() <-chan struct{} {
	if s.changed == nil {
		s.changed = make(chan struct{})
	}
	return s.changed
}

// wakeRemoteWaits ends the current remoteChange channel. Caller holds s.mu.
func (s *Session) wakeRemoteWaits() {
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
}

// pause waits for an announcement, d on the table's clock, the caller
// giving up (cancel), or the table closing (false).
func (t *Table) pause(changed, cancel <-chan struct{}, d time.Duration) bool {
	woke := make(chan struct{})
	stop := t.clock.AfterFunc(d, func() { close(woke) })
	defer stop()
	select {
	case <-changed:
	case <-cancel:
	case <-woke:
	case <-t.stop:
		return false
	}
	return true
}

// nextRemoteChange returns a channel closed at the next announcement for
// s. Take it before reading the shared state, so that a change announced
// during the read is not missed.
func (s *Session) nextRemoteChange() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.remoteChange()
}

// watchGateIfHeld starts watching the record of s while a request is held
// at its gate, with GateReadAfter and if no watch runs yet: the session's
// notifications/initialized may have been served on another instance
// (see Config.GateReadAfter). Caller holds s.mu.
func (s *Session) watchGateIfHeld() {
	cfg := s.table.config()
	if cfg.GateReadAfter <= 0 || cfg.Store == nil || s.gate != gateInitializing || s.lookingUp || s.gone || s.gateWatched {
		return
	}
	s.gateWatched = true
	go s.watchGate(cfg.Store)
}

// watchGate reads s's record GateReadAfter after the watch began, then
// every GateReadAfter, until it says open or is missing (the gate then
// opens here too) or nothing is held at the gate any more: the gate
// opened or timed out here, or no request holds the session. A gate held
// for a slow client so costs a few reads, not a stream of them.
func (s *Session) watchGate(store Store) {
	t := s.table
	defer t.awaitRemote(s)()
	every := t.config().GateReadAfter
	if !t.pause(nil, nil, every) {
		return
	}
	for {
		s.mu.Lock()
		changed := s.remoteChange()
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
		if !t.pause(changed, nil, every) {
			return
		}
	}
}
