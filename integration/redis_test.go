package integration

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/testcerts"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/testnet"
)

const redisInstallHint = "install Redis: apt-get install -y redis-server (or run make deps)"

// redisServer is a redis-server the test started on a loopback port, with
// no persistence: a restart starts empty, as a crashed cache does.
type redisServer struct {
	Addr string // 127.0.0.1:port, for `state redis { address … }`
	bin  string
	dir  string
	log  string
	args []string // more options, e.g. --replicaof
	// tls, when set, is how a client reaches a server that speaks TLS only.
	tls  *tls.Config
	proc *process
}

// startRedis runs redis-server in the foreground on a free loopback port.
// It is stopped at the end of the test, and its log is shown if the test
// failed.
func startRedis(t testing.TB) *redisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if _, statErr := os.Stat("/usr/bin/redis-server"); statErr != nil {
			t.Fatalf("redis-server not found (%v): %s", err, redisInstallHint)
		}
		bin = "/usr/bin/redis-server"
	}
	r := newRedisServer(t)
	r.bin = bin
	r.start(t)
	return r
}

// newRedisServer describes a server on a free loopback port, not started.
func newRedisServer(t testing.TB, args ...string) *redisServer {
	t.Helper()
	dir := t.TempDir()
	r := &redisServer{
		Addr: "127.0.0.1:" + strconv.Itoa(testnet.FreePort(t)),
		bin:  "redis-server",
		dir:  dir,
		log:  filepath.Join(dir, "redis.log"),
		args: args,
	}
	if bin, err := exec.LookPath("redis-server"); err == nil {
		r.bin = bin
	}
	dumpOnFailure(t, "redis", r.log)
	return r
}

// start runs the server (again) on its address.
func (r *redisServer) start(t testing.TB) {
	t.Helper()
	_, port, _ := net.SplitHostPort(r.Addr)
	cmd := exec.Command(r.bin, append([]string{
		"--bind", "127.0.0.1", "--port", port,
		"--save", "", "--appendonly", "no",
		"--dir", r.dir, "--daemonize", "no", "--protected-mode", "yes",
	}, r.args...)...)
	cmd.Dir = r.dir
	r.proc = startProcess(t, "redis-server", cmd, r.log, syscall.SIGTERM, 5*time.Second)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if !r.proc.running() {
			t.Fatalf("redis-server exited during startup: %v\n%s", r.proc.err, tailFile(r.log, 4000))
		}
		if reply, err := r.command("PING"); err == nil && reply == "PONG" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server did not answer PING on %s within 20s\n%s", r.Addr, tailFile(r.log, 4000))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// sentinelSet is a master, its replica and three Sentinels watching them
// under sentinelMaster with a quorum of two, as operators run it, quick to
// fail over (the master is called down after a second without an answer).
type sentinelSet struct {
	Master, Replica *redisServer
	Sentinels       []string // the Sentinels' addresses
}

const sentinelMaster = "mymaster"

func startSentinelSet(t testing.TB) *sentinelSet {
	t.Helper()
	master := startRedis(t)
	replica := newRedisServer(t, "--replicaof", "127.0.0.1", strings.TrimPrefix(master.Addr, "127.0.0.1:"))
	replica.start(t)
	_, masterPort, _ := net.SplitHostPort(master.Addr)
	set := &sentinelSet{Master: master, Replica: replica}
	var logs []string
	for i := 0; i < 3; i++ {
		dir := t.TempDir()
		port := testnet.FreePort(t)
		conf := filepath.Join(dir, "sentinel.conf")
		text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor %s 127.0.0.1 %s 2\n"+
			"sentinel down-after-milliseconds %s 1000\nsentinel failover-timeout %s 5000\n",
			port, dir, sentinelMaster, masterPort, sentinelMaster, sentinelMaster)
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		log := filepath.Join(dir, "sentinel.log")
		logs = append(logs, log)
		dumpOnFailure(t, "sentinel "+strconv.Itoa(i+1), log)
		startProcess(t, "redis-sentinel", exec.Command(master.bin, conf, "--sentinel"), log, syscall.SIGTERM, 5*time.Second)
		set.Sentinels = append(set.Sentinels, "127.0.0.1:"+strconv.Itoa(port))
	}
	// Each Sentinel must know the master and have found the other two
	// (through the master's hello channel) before a failover can reach
	// its quorum.
	deadline := time.Now().Add(30 * time.Second)
	for _, s := range set.Sentinels {
		for !set.sentinelReady(s, masterPort) {
			if time.Now().After(deadline) {
				t.Fatalf("sentinel %s does not know %s and its two peers after 30s\n%s", s, sentinelMaster, tailFile(logs[0], 4000))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return set
}

// sentinelReady tells whether the Sentinel at addr names the master on
// masterPort and knows two other Sentinels.
func (s *sentinelSet) sentinelReady(addr, masterPort string) bool {
	reply, err := redisCommand(addr, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", sentinelMaster)
	if _, port, _ := strings.Cut(reply, " "); err != nil || port != masterPort {
		return false
	}
	reply, err = redisCommand(addr, "SENTINEL", "MASTER", sentinelMaster)
	fields := strings.Fields(reply)
	for i := 0; err == nil && i+1 < len(fields); i++ {
		if fields[i] == "num-other-sentinels" {
			return fields[i+1] == "2"
		}
	}
	return false
}

// masterPort is the port the first Sentinel gives for the master, "" if
// none.
func (s *sentinelSet) masterPort() string {
	reply, err := redisCommand(s.Sentinels[0], "SENTINEL", "GET-MASTER-ADDR-BY-NAME", sentinelMaster)
	if err != nil {
		return ""
	}
	_, port, _ := strings.Cut(reply, " ")
	return port
}

// state is the `state redis` block that reaches the master through the
// Sentinel.
func (s *sentinelSet) state() string {
	return "state redis {\n\tsentinel " + strings.Join(s.Sentinels, " ") + "\n\tmaster_name " + sentinelMaster + "\n}"
}

// kill ends the server at once (SIGKILL), as a crash does; its records are
// gone.
func (r *redisServer) kill(t testing.TB) {
	t.Helper()
	r.proc.stop(t, syscall.SIGKILL, 5*time.Second)
}

// keys returns the number of keys in database 0.
func (r *redisServer) keys(t testing.TB) int {
	t.Helper()
	reply, err := redisCommand(r.Addr, "DBSIZE")
	if err != nil {
		t.Fatalf("redis DBSIZE: %v", err)
	}
	n, err := strconv.Atoi(reply)
	if err != nil {
		t.Fatalf("redis DBSIZE answered %q", reply)
	}
	return n
}

// redisCommand sends one command in RESP and returns a simple, integer or
// bulk reply as text; enough for PING, DBSIZE and INFO without a client
// library.
func redisCommand(addr string, args ...string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	return roundTrip(conn, args...)
}

// command sends one command to r, over TLS if r speaks it.
func (r *redisServer) command(args ...string) (string, error) {
	if r.tls == nil {
		return redisCommand(r.Addr, args...)
	}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", r.Addr, r.tls)
	if err != nil {
		return "", err
	}
	return roundTrip(conn, args...)
}

// roundTrip sends one command on conn, reads its reply and closes conn.
func roundTrip(conn net.Conn, args ...string) (string, error) {
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := conn.Write([]byte(b.String())); err != nil {
		return "", err
	}
	return readReply(bufio.NewReader(conn))
}

// readReply reads one RESP reply as text; an array's elements are joined
// by spaces.
func readReply(rd *bufio.Reader) (string, error) {
	line, err := rd.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", fmt.Errorf("empty reply")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", fmt.Errorf("redis: %s", line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", fmt.Errorf("bulk reply %q", line)
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(rd, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return "", fmt.Errorf("array reply %q", line)
		}
		items := make([]string, 0, max(n, 0))
		for range n {
			item, err := readReply(rd)
			if err != nil {
				return "", err
			}
			items = append(items, item)
		}
		return strings.Join(items, " "), nil
	}
	return "", fmt.Errorf("unexpected reply %q", line)
}

// startRedisCluster runs three masters on loopback joined into a Redis
// Cluster (redis-cli --cluster create) and returns them.
func startRedisCluster(t testing.TB) []*redisServer {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("redis-cli not found (%v): %s", err, redisInstallHint)
	}
	var nodes []*redisServer
	args := []string{"--cluster", "create"}
	for range 3 {
		r := newRedisServer(t)
		r.args = []string{"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(r.dir, "nodes.conf")}
		r.start(t)
		nodes = append(nodes, r)
		args = append(args, r.Addr)
	}
	if out, err := exec.Command(cli, append(args, "--cluster-replicas", "0", "--cluster-yes")...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	for _, r := range nodes {
		deadline := time.Now().Add(20 * time.Second)
		for {
			info, err := redisCommand(r.Addr, "CLUSTER", "INFO")
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster not ok on %s after 20s: %v %s", r.Addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nodes
}

// startTLSRedis runs a redis-server that speaks TLS only and requires
// client certificates signed by its CA (mutual TLS); it returns the server
// and the CA, certificate and key files (one certificate, the server's and
// a client's).
func startTLSRedis(t testing.TB) (r *redisServer, caFile, certFile, keyFile string) {
	t.Helper()
	caFile, certFile, keyFile, err := testcerts.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	r = newRedisServer(t)
	_, port, _ := net.SplitHostPort(r.Addr)
	r.args = []string{"--port", "0", "--tls-port", port, "--tls-cert-file", certFile, "--tls-key-file", keyFile,
		"--tls-ca-cert-file", caFile, "--tls-auth-clients", "yes"}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	r.tls = &tls.Config{RootCAs: roots, ServerName: testcerts.ServerName, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	r.start(t)
	return r, caFile, certFile, keyFile
}
