package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proc is a child process of the benchmark.
type proc struct {
	name   string
	cmd    *exec.Cmd
	log    string // file holding its output
	exited chan struct{}
}

func startProc(name string, cmd *exec.Cmd, logPath string) (*proc, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd.Stderr = f
	if cmd.Stdout == nil {
		cmd.Stdout = f
	}
	// Die with the benchmark even if it is killed outright.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(p.exited)
	}()
	return p, nil
}

func (p *proc) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stop ends the process: SIGTERM, then SIGKILL after a grace period.
func (p *proc) stop() {
	if !p.running() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// tail returns the end of the process's output, for error reports.
func (p *proc) tail() string {
	data, _ := os.ReadFile(p.log)
	if len(data) > 4000 {
		data = data[len(data)-4000:]
	}
	return strings.TrimSpace(string(data))
}

// upstreamProc is the upstream process and its addresses.
type upstreamProc struct {
	*proc
	stdin io.Closer
	addrs upstreamAddrs
}

// startUpstream runs this binary again in the upstream role.
func startUpstream(dir string, serviceTime time.Duration) (*upstreamProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, upstreamRole, "-service-time", serviceTime.String())
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p, err := startProc("upstream", cmd, filepath.Join(dir, "upstream.log"))
	if err != nil {
		return nil, err
	}
	addrs, err := readUpstreamAddrs(stdout)
	if err != nil {
		stdin.Close()
		p.stop()
		return nil, fmt.Errorf("%w\n%s", err, p.tail())
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	return &upstreamProc{proc: p, stdin: stdin, addrs: addrs}, nil
}

func (u *upstreamProc) stop() {
	u.stdin.Close()
	select {
	case <-u.exited:
	case <-time.After(2 * time.Second):
	}
	u.proc.stop()
}

func (u *upstreamProc) resetStats(c *http.Client) error {
	resp, err := c.Post("http://"+u.addrs.Control+"/reset", "", nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

func (u *upstreamProc) stats(c *http.Client) (serviceStats, error) {
	var s serviceStats
	resp, err := c.Get("http://" + u.addrs.Control + "/stats")
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return s, err
	}
	err = json.Unmarshal(body, &s)
	return s, err
}

// caddyProc is one Caddy process: A (reverse_proxy alone) or B
// (mcp_serializer in front of reverse_proxy).
type caddyProc struct {
	*proc
	label    string
	fast     string // base URL of the site proxying to the fast upstream
	slow     string // base URL of the site proxying to the slow upstream
	adminURL string // "" unless profiling
}

// caddyfile returns the configuration of one Caddy. They differ only in
// the mcp_serializer directive ("" for none) and their ports.
func caddyfile(serializer string, fastPort, slowPort, adminPort int, up upstreamAddrs) string {
	var b strings.Builder
	b.WriteString("{\n")
	if adminPort > 0 {
		fmt.Fprintf(&b, "\tadmin 127.0.0.1:%d\n", adminPort)
	} else {
		b.WriteString("\tadmin off\n")
	}
	b.WriteString("\tauto_https off\n\tpersist_config off\n\tlog {\n\t\tlevel ERROR\n\t}\n}\n")
	for _, site := range []struct {
		port     int
		upstream string
	}{{fastPort, up.Fast}, {slowPort, up.Slow}} {
		fmt.Fprintf(&b, "\nhttp://:%d {\n\tbind 127.0.0.1\n", site.port)
		b.WriteString(serializer)
		fmt.Fprintf(&b, "\treverse_proxy %s {\n\t\tflush_interval -1\n\t}\n}\n", site.upstream)
	}
	return b.String()
}

// startCaddy writes the Caddyfile, with a plain mcp_serializer line or
// without, and runs Caddy on it until its sites answer.
func startCaddy(ctx context.Context, bin, dir, label string, serializer, profile bool, up upstreamAddrs) (*caddyProc, error) {
	directive := ""
	if serializer {
		directive = "\tmcp_serializer\n"
	}
	return startCaddyWith(ctx, bin, dir, label, directive, profile, up)
}

// startCaddyWith is startCaddy with the mcp_serializer directive given.
func startCaddyWith(ctx context.Context, bin, dir, label, serializer string, profile bool, up upstreamAddrs) (*caddyProc, error) {
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	adminPort := 0
	if profile {
		adminPort = ports[2]
	}
	home := filepath.Join(dir, "caddy-"+label)
	if err := os.MkdirAll(home, 0o755); err != nil {
		return nil, err
	}
	config := filepath.Join(home, "Caddyfile")
	if err := os.WriteFile(config, []byte(caddyfile(serializer, ports[0], ports[1], adminPort, up)), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "run", "--config", config, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+home, "XDG_DATA_HOME="+home)
	p, err := startProc("caddy "+label, cmd, filepath.Join(home, "caddy.log"))
	if err != nil {
		return nil, err
	}
	c := &caddyProc{
		proc:  p,
		label: label,
		fast:  fmt.Sprintf("http://127.0.0.1:%d/mcp", ports[0]),
		slow:  fmt.Sprintf("http://127.0.0.1:%d/mcp", ports[1]),
	}
	if profile {
		c.adminURL = fmt.Sprintf("http://127.0.0.1:%d", adminPort)
	}
	if err := c.waitReady(ctx); err != nil {
		p.stop()
		return nil, fmt.Errorf("caddy %s: %w\n%s", label, err, p.tail())
	}
	return c, nil
}

// waitReady polls both sites with a session-less tools/list until they
// answer 200.
func (c *caddyProc) waitReady(ctx context.Context) error {
	client := &http.Client{Timeout: time.Second}
	defer client.CloseIdleConnections()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if !c.running() {
			return errors.New("exited")
		}
		ok := true
		for _, url := range []string{c.fast, c.slow} {
			resp, err := client.Post(url, "application/json", bytes.NewReader(bodyToolsList))
			if err != nil {
				ok = false
				break
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			ok = ok && resp.StatusCode == http.StatusOK
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("sites did not answer within 20s")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// freePorts returns n loopback ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	ports := make([]int, n)
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		ports[i] = ln.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}

// caddyVersion returns the first word of `caddy version`.
func caddyVersion(bin string) string {
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(out))
	if len(f) == 0 {
		return "unknown"
	}
	return f[0]
}

// cpuProfile fetches a CPU profile of seconds from the Caddy's admin
// endpoint into path; it runs beside the load.
func (c *caddyProc) cpuProfile(path string, d time.Duration) error {
	if c.adminURL == "" {
		return nil
	}
	secs := max(1, int(d.Round(time.Second)/time.Second))
	client := &http.Client{Timeout: d + 30*time.Second}
	resp, err := client.Get(c.adminURL + "/debug/pprof/profile?seconds=" + strconv.Itoa(secs))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile: HTTP %d", resp.StatusCode)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}
