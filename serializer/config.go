package serializer

import (
	"fmt"
	"time"
)

// TimeoutAction says what happens to a session's held messages when
// notifications/initialized has not been acknowledged within InitTimeout.
type TimeoutAction uint8

const (
	// Forward opens the gate: held messages go upstream in arrival order.
	Forward TimeoutAction = iota
	// Synthesize sends notifications/initialized upstream on the client's
	// behalf and opens the gate on its answer.
	Synthesize
	// Reject answers held and later messages with an error until the
	// client's own notifications/initialized is acknowledged.
	Reject
)

func (a TimeoutAction) String() string {
	switch a {
	case Forward:
		return "forward"
	case Synthesize:
		return "synthesize"
	case Reject:
		return "reject"
	}
	return fmt.Sprintf("TimeoutAction(%d)", uint8(a))
}

// ParseTimeoutAction is the inverse of TimeoutAction.String.
func ParseTimeoutAction(s string) (TimeoutAction, error) {
	for _, a := range []TimeoutAction{Forward, Synthesize, Reject} {
		if a.String() == s {
			return a, nil
		}
	}
	return 0, fmt.Errorf("unknown action %q (want forward, synthesize or reject)", s)
}

// Config holds a table's limits. Zero values are not defaults: callers
// fill them in (see Defaults).
type Config struct {
	InitTimeout   time.Duration // gate hold before OnInitTimeout applies
	OnInitTimeout TimeoutAction
	QueueTimeout  time.Duration // longest wait in the queue or at the gate
	MaxQueue      int           // waiting requests per session
	MaxSessions   int           // sessions tracked before idle ones are evicted (see Table.Saturated)
	SessionTTL    time.Duration // idle time before a session is forgotten

	Clock  Clock  // nil: the system clock
	Events Events // nil: no events
	Store  Store  // nil: sessions are known to this table only
	// StoreTimeout bounds each call to Store (a context deadline): the
	// initialize answer waits at most this long for Created, the first
	// requests of a session unknown here at most this long (and at most
	// QueueTimeout/2) for its lookup. Nothing else waits on the store.
	StoreTimeout time.Duration
	// Writes, unless nil, takes a session's later writes and sends them
	// itself (writes.go), so that no goroutine waits on each. It needs a
	// Store, and is usually the Store itself.
	Writes WriteQueue
	// GateReadAfter, when positive, makes a gate that has held a request
	// this long read its session's record, again every GateReadAfter or
	// so, until the record says open (remote.go): the session's
	// notifications/initialized may have been served by an instance that
	// could not learn the session's owner while the Store was down.
	GateReadAfter time.Duration
}

// Defaults returns the documented default limits.
func Defaults() Config {
	return Config{
		InitTimeout:   10 * time.Second,
		OnInitTimeout: Forward,
		QueueTimeout:  30 * time.Second,
		MaxQueue:      32,
		MaxSessions:   100_000,
		SessionTTL:    time.Hour,
		StoreTimeout:  time.Second,
	}
}

// Validate reports the first setting out of range, by its config name.
func (c Config) Validate() error {
	switch {
	case c.InitTimeout <= 0:
		return fmt.Errorf("init_timeout must be positive, got %s", c.InitTimeout)
	case c.OnInitTimeout > Reject:
		return fmt.Errorf("on_init_timeout: %s is not a valid action", c.OnInitTimeout)
	case c.QueueTimeout <= 0:
		return fmt.Errorf("queue_timeout must be positive, got %s", c.QueueTimeout)
	case c.MaxQueue < 1:
		return fmt.Errorf("max_queue must be at least 1, got %d", c.MaxQueue)
	case c.MaxSessions < 1:
		return fmt.Errorf("max_sessions must be at least 1, got %d", c.MaxSessions)
	case c.SessionTTL <= 0:
		return fmt.Errorf("session_ttl must be positive, got %s", c.SessionTTL)
	case c.StoreTimeout <= 0:
		return fmt.Errorf("store_timeout must be positive, got %s", c.StoreTimeout)
	case c.Writes != nil && c.Store == nil:
		return fmt.Errorf("queued writes need a Store")
	}
	return nil
}

// Clock is the time source; tests replace it to drive timeouts.
type Clock interface {
	Now() time.Time
	// AfterFunc runs f once d has passed, unless stop is called first.
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, f).Stop
}

// Events receives what a table does, for metrics and logs. Methods are
// called synchronously and must not block or call back into the table.
type Events interface {
	// Waited reports how long a request waited before its turn; 0 when it
	// went straight through.
	Waited(d time.Duration)
	// Held reports a request held at a session's initialization gate.
	Held()
	// GateTimedOut reports a gate that reached InitTimeout.
	GateTimedOut(sessionID string, action TimeoutAction)
	// Evicted reports an idle session forgotten to make room for a new
	// one within MaxSessions: gated when it was still waiting for the
	// client's notifications/initialized, which happens only when no idle
	// open session was left to evict.
	Evicted(gated bool)
	// Adopted reports a session this table met first through a request
	// and looked up in the Store: gated if the record said it was still
	// initializing, else (open, missing, or the store failed) queue only.
	Adopted(sessionID string, gated bool)
}

type noEvents struct{}

func (noEvents) Waited(time.Duration)               {}
func (noEvents) Held()                              {}
func (noEvents) GateTimedOut(string, TimeoutAction) {}
func (noEvents) Evicted(bool)                       {}
func (noEvents) Adopted(string, bool)               {}
