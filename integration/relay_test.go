package integration

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// hopRelay passes TCP connections on to one instance, which advertises
// the relay's address (clusterOptions.Relays): the other instances reach
// the instance only through it, while the front and Redis reach the
// instance directly. Cutting it partitions the instance from the others.
type hopRelay struct {
	ln   net.Listener
	addr string

	mu     sync.Mutex
	target string // the instance, host:port: setTarget
	cut    cutKind
	healed chan struct{}        // closed when a black hole ends
	conns  map[net.Conn]bool    // open connections, both sides
	held   map[net.Conn]float64 // connections accepted during the black hole, by when (s since the cut)
	// chunksHeld counts the reads of connections made before the black
	// hole that it held.
	chunksHeld int
	cutAt      time.Time
	stats      relayStats
	stopped    bool
}

// cutKind is how a relay is cut.
type cutKind int

const (
	notCut cutKind = iota
	// cutRefused closes the listener: connections to the instance are
	// refused, as by a firewall that rejects new connections; those
	// already open go on.
	cutRefused
	// cutBlackHoled accepts connections and passes nothing either way,
	// on them and on those already open, as a network that drops packets
	// after the handshake: the instance never answers. Once healed, what
	// was held goes through, as TCP's retransmissions do after a short
	// partition.
	cutBlackHoled
)

func (k cutKind) String() string {
	switch k {
	case cutRefused:
		return "refused"
	case cutBlackHoled:
		return "black_holed"
	}
	return "not_cut"
}

// relayStats counts what a relay saw.
type relayStats struct {
	Accepted int // connections accepted while not cut, all told
	Held     int // connections accepted during the last black hole
	// LongestHeld is the longest a connection accepted during the last
	// black hole waited for it to heal.
	LongestHeld time.Duration
}

// startHopRelay listens on a free loopback port; its target is set before
// anything connects.
func startHopRelay(t testing.TB) *hopRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &hopRelay{ln: ln, addr: ln.Addr().String(), conns: map[net.Conn]bool{}, held: map[net.Conn]float64{}}
	t.Cleanup(h.stop)
	go h.accept(ln)
	return h
}

// Addr is where the relay listens, as the instance advertises it.
func (h *hopRelay) Addr() string { return h.addr }

// setTarget names the instance the relay passes connections on to, before
// the instance starts and advertises the relay.
func (h *hopRelay) setTarget(addr string) {
	h.mu.Lock()
	h.target = addr
	h.mu.Unlock()
}

func (h *hopRelay) accept(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		h.mu.Lock()
		if h.stopped {
			h.mu.Unlock()
			c.Close()
			return
		}
		h.conns[c] = true
		healed := h.healed
		if h.cut == cutBlackHoled {
			h.stats.Held++
			h.held[c] = time.Since(h.cutAt).Seconds()
		} else {
			h.stats.Accepted++
		}
		h.mu.Unlock()
		go h.pass(c, healed)
	}
}

// metNow reports whether the black hole in place has held anything: a
// connection it accepted, or bytes of one made before it.
func (h *hopRelay) metNow() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.stats.Held > 0 || h.chunksHeld > 0
}

// pass dials the target for c once any black hole has healed, and copies
// both ways, holding the bytes while the relay is black-holed.
func (h *hopRelay) pass(c net.Conn, healed chan struct{}) {
	if healed != nil {
		<-healed
	}
	h.mu.Lock()
	target := h.target
	h.mu.Unlock()
	up, err := net.Dial("tcp", target)
	if err != nil {
		h.forget(c)
		c.Close()
		return
	}
	h.mu.Lock()
	if h.stopped {
		h.mu.Unlock()
		c.Close()
		up.Close()
		return
	}
	h.conns[up] = true
	h.mu.Unlock()
	go func() { h.copy(up, c); up.Close(); h.forget(up) }()
	go func() { h.copy(c, up); c.Close(); h.forget(c) }()
}

// copy copies src to dst, each chunk only while the relay is not
// black-holed.
func (h *hopRelay) copy(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			h.mu.Lock()
			healed := h.healed
			h.mu.Unlock()
			if healed != nil {
				h.mu.Lock()
				h.chunksHeld++
				h.mu.Unlock()
				<-healed
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				return
			}
			if tcp, ok := dst.(*net.TCPConn); ok {
				_ = tcp.CloseWrite()
			}
			return
		}
	}
}

func (h *hopRelay) forget(c net.Conn) {
	h.mu.Lock()
	delete(h.conns, c)
	h.mu.Unlock()
}

// cutAs partitions the hop: refused or black-holed.
func (h *hopRelay) cutAs(t testing.TB, kind cutKind) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cut != notCut {
		t.Fatalf("relay %s is cut already (%v)", h.addr, h.cut)
	}
	h.cut, h.cutAt = kind, time.Now()
	h.stats.Held, h.stats.LongestHeld, h.chunksHeld = 0, 0, 0
	switch kind {
	case cutRefused:
		h.ln.Close()
	case cutBlackHoled:
		h.healed = make(chan struct{})
	}
}

// heal ends the partition and returns what the relay saw.
func (h *hopRelay) heal(t testing.TB) relayStats {
	t.Helper()
	h.mu.Lock()
	kind := h.cut
	h.cut = notCut
	if kind == cutBlackHoled {
		for c, at := range h.held {
			h.stats.LongestHeld = max(h.stats.LongestHeld, time.Since(h.cutAt)-time.Duration(at*float64(time.Second)))
			delete(h.held, c)
		}
		close(h.healed)
		h.healed = nil
	}
	h.mu.Unlock()
	if kind == cutRefused {
		// The same port again: the instance's address stays what it
		// advertised.
		var ln net.Listener
		var err error
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if ln, err = net.Listen("tcp", h.addr); err == nil || time.Now().After(deadline) {
				break
			}
		}
		if err != nil {
			t.Fatalf("relay %s: listening again: %v", h.addr, err)
		}
		h.mu.Lock()
		h.ln = ln
		h.mu.Unlock()
		go h.accept(ln)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.stats
}

// stop ends the relay and every connection through it.
func (h *hopRelay) stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return
	}
	h.stopped = true
	h.ln.Close()
	if h.healed != nil {
		close(h.healed)
		h.healed = nil
	}
	for c := range h.conns {
		c.Close()
	}
}
