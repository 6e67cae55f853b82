package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

const nodeInstallHint = "install Node.js 20 and the client's packages: apt-get install -y nodejs npm && npm ci --prefix integration/client"

// clientScript returns node and the client script, failing the test with what
// to install when node or the SDK is missing.
func clientScript(t testing.TB) (node, script string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node not found (%v): %s", err, nodeInstallHint)
	}
	dir := filepath.Join(repoRoot(t), "integration", "client")
	sdk := filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk", "package.json")
	if _, err := os.Stat(sdk); err != nil {
		t.Fatalf("MCP SDK not installed in %s (%v): run `npm ci --prefix integration/client` from the repository root", dir, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, node, "--version").Output()
	if err != nil {
		t.Fatalf("node --version: %v", err)
	}
	version := strings.TrimPrefix(strings.TrimSpace(string(out)), "v")
	if major, _ := strconv.Atoi(strings.SplitN(version, ".", 2)[0]); major < 20 {
		t.Fatalf("node %s is too old (need 20 or later): %s", version, nodeInstallHint)
	}
	return node, filepath.Join(dir, "client.mjs")
}

// runClient runs the client script with args and decodes the JSON object on
// the last line of its stdout into result. A non-zero exit is not an error by
// itself (the pipeline mode exits 1 when it counted failures); a missing or
// malformed result line is. The client's stderr is logged.
func runClient(t testing.TB, timeout time.Duration, result any, args ...string) {
	t.Helper()
	runClientWith(t, scriptIO{}, timeout, result, args...)
}

// runClientWith runs the client script as runClient does, connected to the
// test through sio.
func runClientWith(t testing.TB, sio scriptIO, timeout time.Duration, result any, args ...string) {
	t.Helper()
	node, script := clientScript(t)
	runNodeScript(t, "client", node, script, 8000, sio, timeout, result, args...)
}

// scriptIO connects a running script to its test: stdin, when set, is the
// script's input, and onLine, when set, gets each line the script prints on
// stdout as it comes (the barriers it is held at, say).
type scriptIO struct {
	stdin  io.Reader
	onLine func(line string)
}

// runNodeScript runs a client script as runClient describes, naming it
// label in the test log, which keeps the last logTail bytes of its stderr.
func runNodeScript(t testing.TB, label, node, script string, logTail int, sio scriptIO, timeout time.Duration, result any, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, append([]string{script}, args...)...)
	cmd.Dir = filepath.Dir(script)
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	if sio.onLine != nil {
		cmd.Stdout = io.MultiWriter(&stdout, &lineWriter{onLine: sio.onLine})
	}
	cmd.Stderr = &stderr
	cmd.Stdin = sio.stdin
	start := time.Now()
	runErr := cmd.Run()
	t.Logf("%s %s (%v):\n%s", label, strings.Join(args, " "), time.Since(start).Round(time.Millisecond), tail(stderr.String(), logTail))
	if ctx.Err() != nil {
		t.Fatalf("%s timed out after %v", label, timeout)
	}
	var exitErr *exec.ExitError
	if runErr != nil && !errors.As(runErr, &exitErr) {
		t.Fatalf("%s: %v", label, runErr)
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	last := lines[len(lines)-1]
	if err := json.Unmarshal([]byte(last), result); err != nil {
		t.Fatalf("%s result line %q: %v (exit: %v)", label, tail(last, 2000), err, runErr)
	}
}

// lineWriter hands each complete line written to it to onLine; exec writes
// a command's stdout from one goroutine, so no lock is needed.
type lineWriter struct {
	onLine  func(string)
	partial []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.partial = append(w.partial, p...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.onLine(string(w.partial[:i]))
		w.partial = w.partial[i+1:]
	}
}

func tail(s string, max int) string {
	if len(s) > max {
		return "…" + s[len(s)-max:]
	}
	return s
}

// flowResult is the flow mode's final line.
type flowResult struct {
	Mode            string            `json:"mode"`
	OK              bool              `json:"ok"`
	Error           string            `json:"error"`
	SessionID       string            `json:"sessionId"`
	ProtocolVersion string            `json:"protocolVersion"`
	Tools           []string          `json:"tools"`
	Echo            string            `json:"echo"`
	SlowResult      string            `json:"slowResult"`
	CallStartedAt   float64           `json:"callStartedAt"` // ms since the client started
	ResultAt        float64           `json:"resultAt"`
	Progress        []progressEvent   `json:"progress"`
	GetStatuses     []json.RawMessage `json:"getStatuses"`
	Exchanges       []exchange        `json:"exchanges"`
	TransportErrors []string          `json:"transportErrors"`
	IDMismatches    int               `json:"idMismatches"`
}

type progressEvent struct {
	Progress float64 `json:"progress"`
	Total    float64 `json:"total"`
	Message  string  `json:"message"`
	At       float64 `json:"at"` // ms since the client started
}

type exchange struct {
	Method      string          `json:"method"`
	Status      json.RawMessage `json:"status"` // a number, or "network"
	At          float64         `json:"at"`
	ContentType string          `json:"contentType"`
	Local       bool            `json:"local"`
}

// pipelineResult is the pipeline mode's final line.
type pipelineResult struct {
	Mode              string         `json:"mode"`
	OK                bool           `json:"ok"`
	Error             string         `json:"error"`
	N                 int            `json:"n"`
	Concurrency       int            `json:"concurrency"`
	Get               string         `json:"get"`
	Connects          int            `json:"connects"`
	FailedConnects    int            `json:"failedConnects"`
	Rejections        int            `json:"rejections"`
	HTTPErrors        map[string]int `json:"httpErrors"`
	HTTPErrorCount    int            `json:"httpErrorCount"`
	IDMismatches      int            `json:"idMismatches"`
	Broken            int            `json:"broken"`
	UnexpectedReplies int            `json:"unexpectedReplies"`
	Timeouts          int            `json:"timeouts"` // replies awaited in vain for 20 s
	FailedSessions    int            `json:"failedSessions"`
	Failures          int            `json:"failures"`
	GetStatuses       map[string]int `json:"getStatuses"`
	Samples           []string       `json:"samples"`
	ElapsedMs         int            `json:"elapsedMs"`
	// A connect from sending initialize until the later tools/list's reply,
	// over the ConnectTimed connects whose initialize returned a session.
	ConnectTimed int       `json:"connectTimed"`
	ConnectP50Ms float64   `json:"connectP50Ms"`
	ConnectP99Ms float64   `json:"connectP99Ms"`
	ConnectMs    []float64 `json:"connectMs"` // each timed connect
}

func (r pipelineResult) summary() string {
	return "connects " + strconv.Itoa(r.Connects) + "/" + strconv.Itoa(r.N) +
		", sessions with failures " + strconv.Itoa(r.FailedSessions) +
		", rejections " + strconv.Itoa(r.Rejections) +
		", http errors " + strconv.Itoa(r.HTTPErrorCount) + " " + jsonString(r.HTTPErrors) +
		", id mismatches " + strconv.Itoa(r.IDMismatches) +
		", broken sessions " + strconv.Itoa(r.Broken) +
		", failed connects " + strconv.Itoa(r.FailedConnects) +
		", unexpected replies " + strconv.Itoa(r.UnexpectedReplies) +
		", reply timeouts " + strconv.Itoa(r.Timeouts) +
		", GET statuses " + jsonString(r.GetStatuses) +
		", connect p50 " + strconv.FormatFloat(r.ConnectP50Ms, 'f', 1, 64) + " ms" +
		", p99 " + strconv.FormatFloat(r.ConnectP99Ms, 'f', 1, 64) + " ms" +
		", in " + strconv.Itoa(r.ElapsedMs) + " ms"
}

func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
