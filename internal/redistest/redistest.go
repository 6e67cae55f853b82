// Package redistest starts the real redis-server the tests run against:
// one server, a Sentinel, a Redis Cluster, TLS, each on a free loopback
// port and stopped by pid when the test ends.
package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/testcerts"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/testnet"
)

// Start runs a redis-server on a free loopback port for the test and
// returns its address.
func Start(t testing.TB, args ...string) string {
	t.Helper()
	port := testnet.FreePort(t)
	addr, _ := Run(t, port, append([]string{"--port", strconv.Itoa(port)}, args...)...)
	return addr
}

// Run starts redis-server with args, stopped by pid when the test
// ends or by stop, and waits until it listens on port.
func Run(t testing.TB, port int, args ...string) (addr string, stop func()) {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server is not installed: apt-get install -y redis-server")
	}
	addr = "127.0.0.1:" + strconv.Itoa(port)
	cmd := exec.Command(bin, append([]string{"--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", t.TempDir()}, args...)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
		})
	}
	t.Cleanup(stop)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return addr, stop
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server not listening on %s after 10s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// RunSentinel starts a Sentinel on loopback watching master under name,
// quick to fail over (a second to call it down), and returns its address.
func RunSentinel(t testing.TB, name, master string) string {
	t.Helper()
	host, port, _ := net.SplitHostPort(master)
	sentinelPort := testnet.FreePort(t)
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\n"+
		"sentinel monitor %s %s %s 1\nsentinel down-after-milliseconds %s 1000\n"+
		"sentinel failover-timeout %s 5000\n", sentinelPort, dir, name, host, port, name, name)), 0o600); err != nil {
		t.Fatal(err)
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server is not installed: apt-get install -y redis-server")
	}
	cmd := exec.Command(bin, conf, "--sentinel")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	addr := "127.0.0.1:" + strconv.Itoa(sentinelPort)
	client := redis.NewSentinelClient(&redis.Options{Addr: addr})
	defer client.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if got, err := client.GetMasterAddrByName(context.Background(), name).Result(); err == nil && len(got) == 2 {
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("sentinel on %s does not know %s after 10s", addr, name)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// StartCluster runs n masters on loopback and joins them into a Redis
// Cluster with redis-cli --cluster create; it returns their addresses.
func StartCluster(t testing.TB, n int) []string {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatal("redis-cli is not installed: apt-get install -y redis-tools")
	}
	var addrs []string
	for range n {
		port := testnet.FreePort(t)
		addr, _ := Run(t, port, "--port", strconv.Itoa(port), "--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(t.TempDir(), "nodes.conf"))
		addrs = append(addrs, addr)
	}
	out, err := exec.Command(cli, append(append([]string{"--cluster", "create"}, addrs...), "--cluster-replicas", "0", "--cluster-yes")...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	ctx := context.Background()
	for _, addr := range addrs {
		node := redis.NewClient(&redis.Options{Addr: addr})
		deadline := time.Now().Add(20 * time.Second)
		for {
			info, err := node.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster not ok on %s after 20s: %v %s", addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		node.Close()
	}
	return addrs
}

// StartTLS runs a redis-server that speaks TLS only, with a
// certificate for redis.test, asking clients for theirs as authClients
// says (yes, optional, no).
func StartTLS(t testing.TB, authClients string) (addr, caFile, certFile, keyFile string) {
	t.Helper()
	caFile, certFile, keyFile = writeCerts(t, t.TempDir())
	port := testnet.FreePort(t)
	addr, _ = Run(t, port, "--port", "0", "--tls-port", strconv.Itoa(port),
		"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-ca-cert-file", caFile,
		"--tls-auth-clients", authClients)
	return addr, caFile, certFile, keyFile
}

// writeCerts writes a CA and a certificate for redis.test, signed by
// it, as PEM files: the server's, and a client's for mutual TLS.
func writeCerts(t testing.TB, dir string) (caFile, certFile, keyFile string) {
	t.Helper()
	caFile, certFile, keyFile, err := testcerts.Write(dir)
	if err != nil {
		t.Fatal(err)
	}
	return caFile, certFile, keyFile
}
