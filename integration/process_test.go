package integration

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// repoRoot is the directory holding go.mod, found upwards from the test's
// working directory (the package directory).
func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := findRepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func findRepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found above the test's working directory")
		}
		dir = parent
	}
}

// process is a child process started by a test, in its own process group so
// that it and its children (PHP-FPM workers) can be ended together.
type process struct {
	name   string
	cmd    *exec.Cmd
	exited chan struct{}
	err    error // valid once exited is closed
}

// startProcess starts cmd with stdout and stderr appended to logPath and
// registers a cleanup that ends it (stopSignal first, SIGKILL after grace).
func startProcess(t testing.TB, name string, cmd *exec.Cmd, logPath string, stopSignal syscall.Signal, grace time.Duration) *process {
	t.Helper()
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatalf("%s: log file: %v", name, err)
	}
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		t.Fatalf("%s: start %s: %v", name, cmd.Path, err)
	}
	p := &process{name: name, cmd: cmd, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.exited)
	}()
	t.Cleanup(func() { p.stop(t, stopSignal, grace) })
	return p
}

// running reports whether the process is still alive.
func (p *process) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

func (p *process) stop(t testing.TB, sig syscall.Signal, grace time.Duration) {
	if !p.running() {
		return
	}
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, sig)
	select {
	case <-p.exited:
		return
	case <-time.After(grace):
	}
	t.Logf("%s (pid %d) did not stop within %v after %v; killing it", p.name, pgid, grace, sig)
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		t.Errorf("%s (pid %d) still running 10s after SIGKILL", p.name, pgid)
	}
}

// tailFile returns the last max bytes of a log file, for failure reports.
func tailFile(path string, max int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	if len(data) > max {
		data = append([]byte("…"), data[len(data)-max:]...)
	}
	if len(strings.TrimSpace(string(data))) == 0 {
		return "(empty)"
	}
	return string(data)
}

// dumpOnFailure logs the tail of each file when the test has failed.
func dumpOnFailure(t testing.TB, label string, paths ...string) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, path := range paths {
			t.Logf("---- %s: %s ----\n%s", label, filepath.Base(path), tailFile(path, 16000))
		}
	})
}
