// Package wait lets a test wait for what other goroutines or processes
// bring about.
package wait

import (
	"testing"
	"time"
)

// Until checks cond every millisecond until it holds; the test fails,
// naming what it waited for, if it does not within 10 s.
func Until(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
