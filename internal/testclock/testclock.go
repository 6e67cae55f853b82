// Package testclock is a clock that tests move by hand.
package testclock

import (
	"sync"
	"time"
)

// Clock starts at the system's time and moves only by Advance.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

func New() *Clock { return &Clock{now: time.Now()} }

func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
