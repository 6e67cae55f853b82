package stateengine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// Writes over an engine that takes batches (Abilities.Batch): the adapter
// gathers the writes that calls make while an exchange is in flight into
// the next one, so a busy instance pays one round trip, and one wake-up
// of Redis, for the records of many sessions instead of one per write. It
// also takes a session's writes from the table without anyone waiting
// (serializer.WriteQueue): no goroutine then waits on each.

// The states of a Write on its way.
const (
	writeQueued uint32 = iota
	writeSent
	// Its caller stopped waiting before it was sent: it is never sent, so
	// that the session's next write, which its caller may make at once,
	// cannot end up before it.
	writeAbandoned
)

// maxWriteBatches bounds the exchanges of writes one adapter has in
// flight. A write that finds one in flight waits for the next, so that
// the writes of a busy instance go together; only a Created, which a
// client's initialize answer waits for, starts a second exchange rather
// than wait for the first's round trip.
const maxWriteBatches = 2

// senderLinger is how long a sender with nothing to send waits for more
// before its goroutine ends: on a busy instance the same goroutines send
// batch after batch.
const senderLinger = time.Second

// writeQueue holds an adapter's writes not yet sent.
type writeQueue struct {
	mu      sync.Mutex
	queued  []*Write
	senders int           // goroutines sending batches, idle ones included
	idle    int           // senders waiting for writes, not yet woken; the others are busy
	wake    chan struct{} // one token per idle sender woken
}

// timers reuses the timers that bound a caller's wait.
var timers = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}}

// write sends w through the engine's batches and waits for its answer,
// with bounded's bounds: at most the engine's timeout, and a slot held
// until the engine answered (errStateBusy, without the engine, when none
// is free). Failures are counted and logged as bounded does.
func (s *Adapter) write(ctx context.Context, id string, w *Write) error {
	select {
	case s.slots <- struct{}{}:
	default:
		if w.after != nil {
			w.after()
		}
		s.failed(w.Op, id, errStateBusy)
		return errStateBusy
	}
	w.done = make(chan struct{})
	s.enqueue(w)

	// A timer rather than a context derived from ctx: cheaper, and this
	// runs for every write.
	timer := timers.Get().(*time.Timer)
	resetTimer(timer, s.timeout)
	var err error
	select {
	case <-w.done:
		err = w.Err
	case <-timer.C:
		err = s.gaveUp(w, context.DeadlineExceeded)
	case <-ctx.Done():
		err = s.gaveUp(w, ctx.Err())
	}
	stopTimer(timer)
	timers.Put(timer)
	if err != nil && !errors.Is(ctx.Err(), context.Canceled) {
		s.failed(w.Op, id, err)
	}
	return err
}

// enqueue queues w, which holds a slot, and sees that a sender will take
// it: an idle one woken, or a new one, unless one is busy already (then
// w waits for its next batch), or for a Created, two.
func (s *Adapter) enqueue(w *Write) {
	q := &s.writes
	q.mu.Lock()
	defer q.mu.Unlock()
	q.queued = append(q.queued, w)
	if busy := q.senders - q.idle; busy == 0 || (w.Op == OpCreated && busy < maxWriteBatches) {
		if q.idle > 0 {
			q.idle--
			q.wake <- struct{}{} // never blocks: at most one token per sender
		} else {
			q.senders++
			go s.sendBatches()
		}
	}
}

// queue sends w through the engine's batches with nobody waiting for
// it: the serializer.WriteQueue writes. The engine's answer goes to the
// table through done, a failure counted and logged first. False, without
// w, when the engine takes no batches or no slot is free: the table then
// sends it itself.
func (s *Adapter) queue(id string, w *Write, done func(error)) bool {
	if s.batch == nil {
		return false
	}
	select {
	case s.slots <- struct{}{}:
	default:
		return false
	}
	w.id, w.written = id, done
	s.enqueue(w)
	return true
}

// QueueInitializeEnded is InitializeEnded with nobody waiting
// (serializer.WriteQueue).
func (s *Adapter) QueueInitializeEnded(id string, done func(error)) bool {
	return s.queue(id, &Write{Op: OpInitializeEnded, Key: serializer.StoreKey(id)}, done)
}

// QueueOpened is Opened with nobody waiting.
func (s *Adapter) QueueOpened(id string, done func(error)) bool {
	return s.queue(id, &Write{Op: OpOpened, Key: serializer.StoreKey(id)}, done)
}

// QueueForget is Forget with nobody waiting, "not found" remembered as
// Forget does once the record is gone.
func (s *Adapter) QueueForget(id string, done func(error)) bool {
	if s.batch == nil {
		return false
	}
	key := serializer.StoreKey(id)
	s.notFound.drop(key)
	version := s.notFound.version(key)
	w := &Write{Op: OpForget, Key: key}
	w.after = func() {
		if w.Err == nil {
			s.notFound.add(key, version, s.now())
		}
	}
	return s.queue(id, w, done)
}

// gaveUp: w's caller stops waiting, for cause; w is not sent if it was
// not yet.
func (s *Adapter) gaveUp(w *Write, cause error) error {
	w.state.CompareAndSwap(writeQueued, writeAbandoned)
	return fmt.Errorf("no answer within %s: %w", s.timeout, cause)
}

// stopTimer stops t with nothing left to read on t.C, whatever the Go
// version's timer semantics.
func stopTimer(t *time.Timer) {
	if !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
}

func resetTimer(t *time.Timer, d time.Duration) {
	stopTimer(t)
	t.Reset(d)
}

// sendBatches sends whatever is queued as one batch, again and again,
// and ends once nothing has come for senderLinger.
func (s *Adapter) sendBatches() {
	q := &s.writes
	var batch, send []*Write
	linger := time.NewTimer(senderLinger)
	defer linger.Stop()
	for {
		q.mu.Lock()
		if len(q.queued) == 0 {
			q.queued = nil // let a burst's backing array go
			if !s.awaitWrites(linger) {
				return
			}
			continue
		}
		// All of them: each holds a slot, so there are at most
		// maxStateCallsInFlight.
		batch = append(batch[:0], q.queued...)
		clear(q.queued)
		q.queued = q.queued[:0]
		q.mu.Unlock()

		send = send[:0]
		for _, w := range batch {
			if w.state.CompareAndSwap(writeQueued, writeSent) {
				send = append(send, w)
			} else {
				s.answered(w)
			}
		}
		if len(send) > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
			s.batch(ctx, send, s.ttl)
			cancel()
			for _, w := range send {
				s.answered(w)
			}
		}
		clear(batch)
		clear(send)
	}
}

// awaitWrites waits, as an idle sender, until a write wakes it (true) or
// senderLinger passes (false: the sender is gone). Caller holds q.mu; it
// is released.
func (s *Adapter) awaitWrites(linger *time.Timer) bool {
	q := &s.writes
	q.idle++
	q.mu.Unlock()
	resetTimer(linger, senderLinger)
	select {
	case <-q.wake:
		return true
	case <-linger.C:
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	select {
	case <-q.wake: // a write came as the time ran out: take it
		return true
	default:
		q.idle--
		q.senders--
		return false
	}
}

// answered ends w: its slot freed, its caller woken, or, with none, its
// failure counted and its answer handed to the table.
func (s *Adapter) answered(w *Write) {
	if w.after != nil {
		w.after()
	}
	<-s.slots
	if w.done == nil {
		if w.Err != nil {
			s.failed(w.Op, w.id, w.Err)
		}
		if w.written != nil {
			w.written(w.Err)
		}
		return
	}
	close(w.done)
}

var _ serializer.WriteQueue = (*Adapter)(nil)
