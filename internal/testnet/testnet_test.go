package testnet

import (
	"net"
	"path/filepath"
	"strconv"
	"testing"
)

func TestAClaimedPortIsNotClaimedAgainUntilReleased(t *testing.T) {
	path := filepath.Join(t.TempDir(), "port")
	release, ok := claim(path)
	if !ok {
		t.Fatal("first claim refused")
	}
	if _, again := claim(path); again {
		t.Fatal("a port already claimed was claimed again")
	}
	release()
	release, ok = claim(path)
	if !ok {
		t.Fatal("a released port could not be claimed")
	}
	release()
}

func TestFreePortsAreDistinctListenableAndBelowTheEphemeralRange(t *testing.T) {
	seen := map[int]bool{}
	for range 200 {
		port := FreePort(t)
		if seen[port] {
			t.Fatalf("port %d handed out twice in one test", port)
		}
		seen[port] = true
		if port < firstPort || port >= lastPort {
			t.Fatalf("port %d outside %d-%d", port, firstPort, lastPort)
		}
	}
	for port := range seen {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			t.Fatalf("port %d handed out but not listenable: %v", port, err)
		}
		l.Close()
	}
}
