// Package testnet gives tests loopback addresses: a port nothing uses, a
// URL that refuses connections.
package testnet

import (
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// Ports come from below the kernel's ephemeral range (32768 and up on
// Linux), where no outgoing connection takes one, and a Redis Cluster
// node's bus port (the port + 10000) stays below it too.
const firstPort, lastPort = 15000, 22000

// claimDir holds one lock file per port claimed by a running test process.
var claimDir = filepath.Join(os.TempDir(), "caddy-mcp-serializer-test-ports")

// FreePort returns a TCP port on 127.0.0.1 that nothing listens on and
// that no other test process of this repository holds, until the test
// ends. A port the kernel picks for ":0" may be picked for another process
// a moment later, and Caddy listens with SO_REUSEPORT: two test processes
// given one port would both listen on it and share its connections.
func FreePort(t testing.TB) int {
	t.Helper()
	if err := os.MkdirAll(claimDir, 0o777); err != nil {
		t.Fatalf("free port: %v", err)
	}
	for range 1000 {
		port := firstPort + rand.IntN(lastPort-firstPort)
		release, ok := claim(filepath.Join(claimDir, strconv.Itoa(port)))
		if !ok {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			release()
			continue
		}
		l.Close()
		t.Cleanup(release)
		return port
	}
	t.Fatalf("free port: none of 1000 tries in %d-%d was free", firstPort, lastPort)
	return 0
}

// RefusedURL returns an MCP endpoint on 127.0.0.1 where nothing listens.
func RefusedURL(t testing.TB) string {
	t.Helper()
	return "http://127.0.0.1:" + strconv.Itoa(FreePort(t)) + "/mcp"
}
