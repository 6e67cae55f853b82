//go:build !linux

package caddymodule

import "syscall"

// peerClosed cannot tell here without reading from the socket.
func peerClosed(syscall.RawConn) bool { return false }
