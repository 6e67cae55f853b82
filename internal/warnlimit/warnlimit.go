// Package warnlimit spaces the WARN lines of one kind: a failure that
// repeats on every request would otherwise flood the log.
package warnlimit

import (
	"sync"
	"time"
)

// Interval is the least time between two lines of one kind.
const Interval = 10 * time.Second

// Limiter lets one line through per Interval and counts the ones it held
// back. Its zero value is ready to use.
type Limiter struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// Allow reports whether a line may go out at now, and how many were held
// back since the last one that did.
func (w *Limiter) Allow(now time.Time) (ok bool, suppressed int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.last.IsZero() && now.Sub(w.last) < Interval {
		w.suppressed++
		return false, 0
	}
	w.last, suppressed, w.suppressed = now, w.suppressed, 0
	return true, suppressed
}
