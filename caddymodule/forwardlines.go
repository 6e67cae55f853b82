package caddymodule

import "sync"

// forwardLines keep a session's requests in their arrival order on their
// way to its owner: a request goes out only once the one before it (of
// the same session, at this instance) is through: taken by the owner,
// served here, or given up. Without them a request waiting to be sent
// again, its owner out of reach, would let a later one overtake it.
type forwardLines struct {
	mu    sync.Mutex
	lines map[string]*forwardLine
}

type forwardLine struct {
	last    chan struct{} // closed once the last request to join is through
	waiting int           // requests joined and not yet through
}

// join puts a request of session id at the end of its line. It may go
// out once before is closed (nil: at once); through says it is, and may
// be called more than once.
func (f *forwardLines) join(id string) (before <-chan struct{}, through func()) {
	f.mu.Lock()
	if f.lines == nil {
		f.lines = map[string]*forwardLine{}
	}
	l := f.lines[id]
	if l == nil {
		l = &forwardLine{}
		f.lines[id] = l
	}
	prev, mine := l.last, make(chan struct{})
	l.last = mine
	l.waiting++
	f.mu.Unlock()
	var once sync.Once
	return prev, func() {
		once.Do(func() {
			f.mu.Lock()
			if l.waiting--; l.waiting == 0 {
				delete(f.lines, id)
			}
			f.mu.Unlock()
			if prev == nil {
				close(mine)
				return
			}
			// One that gives up ahead of its turn still lets the next
			// go only after those before it.
			go func() {
				<-prev
				close(mine)
			}()
		})
	}
}
