// Package testnet gives tests loopback addresses: a port nothing uses, a
// URL that refuses connections.
package testnet

import (
	"net"
	"strconv"
	"testing"
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// RefusedURL returns an MCP endpoint on 127.0.0.1 where nothing listens.
func RefusedURL(t testing.TB) string {
	t.Helper()
	return "http://127.0.0.1:" + strconv.Itoa(FreePort(t)) + "/mcp"
}
