package serializer

import (
	"context"
	"time"
)

// What a table reads from a Store: the lookup of an id met first through a
// request, the check before acting at init_timeout, and the refresh of
// live records (the writes are in writes.go). None of it runs for a table
// without a Store.

// Backoff between lookups of a record whose initialize exchange is still
// in flight on another instance: short, since an initialize answer takes
// milliseconds, and capped so a long one costs a few calls a second.
const (
	inFlightFirstBackoff = 5 * time.Millisecond
	inFlightMaxBackoff   = 100 * time.Millisecond
)

// touchFailuresToStop ends a round of Touch early: a store that failed
// this many calls in a row is down, and the next round will try again.
const touchFailuresToStop = 3

// lookupRecord asks the store for id's record, bounded by StoreTimeout
// and by half of QueueTimeout: the requests waiting for the answer must
// still have time to be served.
func lookupRecord(store Store, cfg *Config, id string) (Record, bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), min(cfg.StoreTimeout, cfg.QueueTimeout/2))
	defer cancel()
	return store.Lookup(ctx, id)
}

// adopt settles the gate of s, a session met first through a request and
// published holding its own slot and a closed gate (lookupStarted), from
// the store's record, then frees that slot. While the record says the
// initialize exchange is still in flight on another instance, the slot
// stays taken (so that not even notifications/initialized overtakes it)
// and the record is read again, with a short backoff, for at most half of
// QueueTimeout, so that the requests waiting behind it are still served
// in time.
func (s *Session) adopt(store Store) {
	defer s.unref()
	clock := s.table.clock
	cfg := s.table.config()
	rec, found, err := lookupRecord(store, cfg, s.id)
	gated := err == nil && found && !rec.Open

	s.mu.Lock()
	if gated {
		s.recordSaysInitializing(rec.InitDeadline)
	} else {
		s.recordSaysOpen()
	}
	s.mu.Unlock()
	cfg.Events.Adopted(s.id, gated)

	giveUp := clock.Now().Add(cfg.QueueTimeout / 2)
	backoff := inFlightFirstBackoff
	for gated && rec.InitializeInFlight && clock.Now().Before(giveUp) {
		if !s.table.sleep(backoff) {
			break
		}
		backoff = min(2*backoff, inFlightMaxBackoff)
		rec, found, err = lookupRecord(store, s.table.config(), s.id)
		if err != nil {
			break // keep the gate as last known; stop waiting
		}
		if !found || rec.Open {
			// Opened, ended or expired meanwhile: nothing to hold for.
			s.mu.Lock()
			s.recordSaysOpen()
			s.mu.Unlock()
			break
		}
	}

	s.mu.Lock()
	s.lookupEnded()
	if len(s.waiting) > 0 {
		s.watchGateIfHeld() // requests that came during the lookup
	}
	s.mu.Unlock()
}

// sleep waits d on the table's clock; false if the table closed first.
func (t *Table) sleep(d time.Duration) bool {
	woke := make(chan struct{})
	stop := t.clock.AfterFunc(d, func() { close(woke) })
	select {
	case <-woke:
		return true
	case <-t.stop:
		stop()
		return false
	}
}

// touchEvery spaces the refreshes of a live session's record: often enough
// that a record outlives its session's idle time (SessionTTL) by a margin,
// rarely enough to cost nothing per request.
func touchEvery(ttl time.Duration) time.Duration { return ttl / 3 }

// touchRecords starts a round of Touch for the sessions used since the
// last round began, at most once per touchEvery, in the background and
// one round at a time. Caller holds t.mu.
func (t *Table) touchRecords(cfg *Config) {
	now := t.clock.Now().UnixNano()
	since := t.touchedAt
	if now-since < int64(touchEvery(cfg.SessionTTL)) || !t.touching.CompareAndSwap(false, true) {
		return
	}
	t.touchedAt = now
	// Busy sessions are in use now; the idle lists are in the order of
	// lastUsed, so their sessions used since are at their ends.
	var ids []string
	for s := t.busy.head; s != nil; s = s.next {
		ids = append(ids, s.id)
	}
	for _, l := range []*sessionList{&t.idleOpen, &t.idleGated} {
		for s := l.tail; s != nil && s.lastUsed.Load() >= since; s = s.prev {
			ids = append(ids, s.id)
		}
	}
	go func() {
		defer t.touching.Store(false)
		failed := 0
		for _, id := range ids {
			select {
			case <-t.stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), cfg.StoreTimeout)
			err := cfg.Store.Touch(ctx, id)
			cancel()
			if err == nil {
				failed = 0
			} else if failed++; failed == touchFailuresToStop {
				return
			}
		}
	}()
}
