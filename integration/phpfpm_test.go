package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

const phpFPMInstallHint = "install PHP-FPM 8.2 with SQLite: apt-get install -y php8.2-fpm php8.2-sqlite3"

// phpFPMOptions tunes the backend; zero values take the defaults.
type phpFPMOptions struct {
	Workers    int    // pm.max_children with pm = static (default 8)
	WorkMS     string // MCP_PHP_WORK_MS, random work per request, "MIN-MAX" ms (default "2-8")
	ProgressMS int    // MCP_PHP_PROGRESS_MS, pause after each progress event (default 150)
	GetSeconds int    // MCP_PHP_GET_SECONDS, lifetime of a GET stream (default 0: until the session or the client is gone)
	AppLock    bool   // MCP_PHP_APP_LOCK, a per-session lock around each POST and DELETE (default off)
	// CountOverlap is MCP_PHP_COUNT_OVERLAP: count each session's requests
	// running at once in the store (read with overlapReport).
	CountOverlap bool
	// Pool is MCP_PHP_POOL: a name kept with each request counted, so that
	// an overlap shows where each of its requests ran.
	Pool string
	// Store is an existing session store to share with other pools (one
	// per Caddy instance, as app servers share a database); "" creates
	// one for this pool.
	Store string
}

// phpFPM is a running PHP-FPM master serving integration/php/public.
type phpFPM struct {
	Socket    string // unix socket, for `php_fastcgi unix/<Socket>`
	PublicDir string // document root, for `root * <PublicDir>`
	Store     string // SQLite session store
	Dir       string // config, logs and store
}

// phpFPMBinary finds php-fpm8.2 (or $MCP_SERIALIZER_PHP_FPM) and checks that
// it has pdo_sqlite, failing the test with what to install otherwise.
func phpFPMBinary(t testing.TB) string {
	t.Helper()
	bin := os.Getenv("MCP_SERIALIZER_PHP_FPM")
	if bin == "" {
		bin = "php-fpm8.2"
	}
	path, err := exec.LookPath(bin)
	if err != nil && !strings.Contains(bin, "/") {
		// Debian installs it in /usr/sbin, which a non-root PATH may lack.
		if _, statErr := os.Stat(filepath.Join("/usr/sbin", bin)); statErr == nil {
			path, err = filepath.Join("/usr/sbin", bin), nil
		}
	}
	if err != nil {
		t.Fatalf("%s not found (%v): %s", bin, err, phpFPMInstallHint)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "-m").CombinedOutput()
	if err != nil {
		t.Fatalf("%s -m: %v\n%s", path, err, out)
	}
	if !strings.Contains(string(out), "pdo_sqlite") {
		t.Fatalf("%s has no pdo_sqlite extension: %s", path, phpFPMInstallHint)
	}
	return path
}

// startPHPFPM runs PHP-FPM in the foreground with a generated configuration:
// pm = static with opts.Workers workers on a unix socket in a temporary
// directory, logs and the session store beside it. It is stopped at the end
// of the test, and its logs are shown if the test failed.
func startPHPFPM(t testing.TB, opts phpFPMOptions) *phpFPM {
	t.Helper()
	bin := phpFPMBinary(t)
	if opts.Workers == 0 {
		opts.Workers = 8
	}
	if opts.WorkMS == "" {
		opts.WorkMS = "2-8"
	}
	if opts.ProgressMS == 0 {
		opts.ProgressMS = 150
	}

	// A short directory of its own: a unix socket path must fit in 108 bytes.
	dir, err := os.MkdirTemp("", "mcp-fpm-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	f := &phpFPM{
		Socket:    filepath.Join(dir, "php-fpm.sock"),
		PublicDir: filepath.Join(repoRoot(t), "integration", "php", "public"),
		Store:     opts.Store,
		Dir:       dir,
	}
	if f.Store == "" {
		f.Store = filepath.Join(dir, "sessions.sqlite")
	}
	if len(f.Socket) >= 100 {
		t.Fatalf("socket path too long for a unix socket: %s (set TMPDIR to a shorter directory)", f.Socket)
	}
	if _, err := os.Stat(filepath.Join(f.PublicDir, "index.php")); err != nil {
		t.Fatalf("PHP backend missing: %v", err)
	}

	errorLog := filepath.Join(dir, "php-fpm.log")
	phpLog := filepath.Join(dir, "php-errors.log")
	stdoutLog := filepath.Join(dir, "php-fpm.out")
	conf := filepath.Join(dir, "php-fpm.conf")
	config := fmt.Sprintf(`[global]
pid = %[1]s/php-fpm.pid
error_log = %[2]s
log_level = notice
daemonize = no

[mcp]
listen = %[3]s
listen.mode = 0666
listen.backlog = 511
pm = static
pm.max_children = %[4]d
pm.max_requests = 0
; 0, as in Debian's pool: a GET stream may live as long as its session
request_terminate_timeout = 0
catch_workers_output = yes
decorate_workers_output = no
clear_env = yes
env[MCP_PHP_STORE] = %[5]s
env[MCP_PHP_WORK_MS] = %[6]s
env[MCP_PHP_PROGRESS_MS] = %[7]d
env[MCP_PHP_GET_SECONDS] = %[8]d
env[MCP_PHP_APP_LOCK] = %[10]d
env[MCP_PHP_COUNT_OVERLAP] = %[11]d
php_admin_value[output_buffering] = 0
php_admin_flag[log_errors] = on
php_admin_flag[display_errors] = off
php_admin_value[error_log] = %[9]s
php_admin_value[max_execution_time] = 120
`, dir, errorLog, f.Socket, opts.Workers, f.Store, opts.WorkMS, opts.ProgressMS, opts.GetSeconds, phpLog, boolInt(opts.AppLock), boolInt(opts.CountOverlap))
	if opts.Pool != "" {
		config += fmt.Sprintf("env[MCP_PHP_POOL] = %s\n", opts.Pool)
	}
	if err := os.WriteFile(conf, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}

	if opts.Store == "" {
		initStore(t, bin, f)
	}

	args := []string{"--nodaemonize", "-y", conf}
	if os.Geteuid() == 0 {
		args = append(args, "--allow-to-run-as-root")
	}
	dumpOnFailure(t, "php-fpm", errorLog, phpLog, stdoutLog)
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	// SIGQUIT: graceful stop; workers still busy after the grace period are killed.
	p := startProcess(t, "php-fpm", cmd, stdoutLog, syscall.SIGQUIT, 5*time.Second)

	deadline := time.Now().Add(20 * time.Second)
	for {
		if !p.running() {
			t.Fatalf("php-fpm exited during startup: %v\n%s\n%s", p.err, tailFile(errorLog, 8000), tailFile(stdoutLog, 8000))
		}
		if conn, err := net.DialTimeout("unix", f.Socket, time.Second); err == nil {
			conn.Close()
			return f
		}
		if time.Now().After(deadline) {
			t.Fatalf("php-fpm did not listen on %s within 20s\n%s", f.Socket, tailFile(errorLog, 8000))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// initStore creates the session store with the PHP CLI that comes with
// php-fpm8.2 (package php8.2-cli), as a deployment runs its migrations.
func initStore(t testing.TB, fpmBin string, f *phpFPM) {
	t.Helper()
	cli := phpCLIName(fpmBin)
	path, err := exec.LookPath(cli)
	if err != nil {
		t.Fatalf("%s not found (%v): %s", cli, err, phpFPMInstallHint)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	script := filepath.Join(filepath.Dir(f.PublicDir), "bin", "init-store.php")
	out, err := exec.CommandContext(ctx, path, script, f.Store).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s %s: %v\n%s", path, script, f.Store, err, out)
	}
}

// fastcgiDirectives is the Caddyfile fragment that serves the backend.
func (f *phpFPM) fastcgiDirectives() string {
	return fmt.Sprintf("\troot * %s\n\tphp_fastcgi unix/%s\n", f.PublicDir, f.Socket)
}

// logSummary counts the PHP error log's lines by message (timestamps and
// session hashes stripped), for the test log.
func (f *phpFPM) logSummary() string {
	data, err := os.ReadFile(filepath.Join(f.Dir, "php-errors.log"))
	if os.IsNotExist(err) {
		return "(empty)"
	}
	if err != nil {
		return err.Error()
	}
	counts := map[string]int{}
	var order []string
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		if i := strings.Index(line, "] "); strings.HasPrefix(line, "[") && i > 0 {
			line = line[i+2:]
		}
		if i := strings.Index(line, " for session "); i > 0 {
			line = line[:i]
		}
		if counts[line] == 0 {
			order = append(order, line)
		}
		counts[line]++
	}
	if len(order) == 0 {
		return "(empty)"
	}
	var b strings.Builder
	for _, line := range order {
		fmt.Fprintf(&b, "\n  %5d × %s", counts[line], line)
	}
	return b.String()
}
