package caddymodule

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// peerClosed reports whether the peer of a socket has closed it or shut
// down its sending half (POLLRDHUP), even with data still unread.
func peerClosed(raw syscall.RawConn) bool {
	var closed bool
	_ = raw.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		n, err := unix.Poll(fds, 0)
		closed = err == nil && n == 1 && fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
	})
	return closed
}
