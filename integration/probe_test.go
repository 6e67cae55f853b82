package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/integration/mcpstub"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/testnet"
)

// mcpProbe runs `caddy mcp-probe` with args and returns its exit status,
// stdout and stderr.
func mcpProbe(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, caddyBinary(t), append([]string{"mcp-probe"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, stdout.String(), stderr.String()
	case errors.As(err, &exit) && exit.ExitCode() > 0:
		return exit.ExitCode(), stdout.String(), stderr.String()
	default:
		t.Fatalf("caddy mcp-probe %v: %v\n%s%s", args, err, stdout.String(), stderr.String())
		return 0, "", ""
	}
}

// probeReport is the part of `caddy mcp-probe --json` the tests read.
type probeReport struct {
	Connects int    `json:"connects"`
	Failed   bool   `json:"failed"`
	Error    string `json:"error"`
	Targets  []struct {
		URL             string   `json:"url"`
		Connects        int      `json:"connects"`
		Failed          int      `json:"failed"`
		Broken          int      `json:"broken_sessions"`
		Rejected        int      `json:"rejections"`
		HTTPErrors      int      `json:"http_errors"`
		IDMismatches    int      `json:"wrong_id_replies"`
		TransportErrors int      `json:"transport_errors"`
		OtherErrors     int      `json:"other_errors"`
		EventStreams    int      `json:"event_stream_responses"`
		Samples         []string `json:"samples"`
	} `json:"targets"`
}

func parseProbeReport(t *testing.T, stdout string) probeReport {
	t.Helper()
	var rep probeReport
	dec := json.NewDecoder(strings.NewReader(stdout))
	if err := dec.Decode(&rep); err != nil {
		t.Fatalf("--json output: %v\n%s", err, stdout)
	}
	if _, err := dec.Token(); err != io.EOF {
		t.Fatalf("--json printed more than one object:\n%s", stdout)
	}
	return rep
}

// The subcommand every binary built with the module has: against the Go
// stand-in directly, pipelined connects fail (exit 1); through Caddy with
// mcp_serializer none do (exit 0), in JSON and in SSE mode.
func TestMCPProbeCommandDirectAndThroughTheModule(t *testing.T) {
	work := func(sse bool) *httptest.Server {
		srv := httptest.NewServer(&mcpstub.Backend{WorkMin: time.Millisecond, WorkMax: 5 * time.Millisecond, StreamResponses: sse, DisableRequestLog: true})
		t.Cleanup(srv.Close)
		return srv
	}
	jsonBackend, sseBackend := work(false), work(true)
	proxy := func(srv *httptest.Server) string {
		return "reverse_proxy " + strings.TrimPrefix(srv.URL, "http://") + " {\n\t\tflush_interval -1\n\t}"
	}
	base := startCaddy(t, caddySite(fmt.Sprintf("\tmcp_serializer\n\thandle /sse/* {\n\t%s\n\t}\n\thandle {\n\t%s\n\t}",
		proxy(sseBackend), proxy(jsonBackend))))
	direct, through := jsonBackend.URL+"/mcp", base+"/mcp"

	t.Run("compare", func(t *testing.T) {
		code, stdout, stderr := mcpProbe(t, "--url", direct, "--compare", through, "-n", "100", "--json")
		rep := parseProbeReport(t, stdout)
		t.Logf("exit %d\n%s%s", code, stdout, stderr)
		if code != 1 || !rep.Failed || len(rep.Targets) != 2 {
			t.Fatalf("want exit 1 and two targets, got %d: %+v", code, rep)
		}
		d, c := rep.Targets[0], rep.Targets[1]
		if d.URL != direct || d.Connects != 100 || d.Failed == 0 || d.Rejected == 0 {
			t.Errorf("direct: want rejected connects: %+v", d)
		}
		if c.URL != through || c.Connects != 100 || c.Failed != 0 || c.Rejected != 0 || c.Broken != 0 || len(c.Samples) != 0 {
			t.Errorf("through mcp_serializer: want no failure: %+v", c)
		}
		if !strings.Contains(stderr, "of 100 connects to "+direct+" failed") || strings.Contains(stderr, through) {
			t.Errorf("stderr does not name the failing URL alone: %s", stderr)
		}
	})

	t.Run("through the module", func(t *testing.T) {
		code, stdout, stderr := mcpProbe(t, "--url", through, "-n", "200", "--concurrency", "16")
		t.Logf("exit %d\n%s%s", code, stdout, stderr)
		if code != 0 || !strings.Contains(stdout, "0 of 200 (0.0%)") || !strings.Contains(stdout, "mcpstub 1.0.0") {
			t.Fatalf("want exit 0 and no failed connect")
		}
		if stderr != "" || strings.ContainsAny(stdout, "\r\033") {
			t.Fatalf("progress or messages when the output is not a terminal: %q %q", stdout, stderr)
		}
	})

	t.Run("direct", func(t *testing.T) {
		code, stdout, stderr := mcpProbe(t, "--url", direct, "-n", "50")
		t.Logf("exit %d\n%s%s", code, stdout, stderr)
		if code != 1 || !strings.Contains(stdout, "rejections (-32600)") || !strings.Contains(stdout, "first problems at "+direct) {
			t.Fatalf("want exit 1 and the table with problems")
		}
	})

	t.Run("sse through the module", func(t *testing.T) {
		code, stdout, stderr := mcpProbe(t, "--url", base+"/sse/mcp", "-n", "100", "--sse", "--json")
		rep := parseProbeReport(t, stdout)
		t.Logf("exit %d\n%s%s", code, stdout, stderr)
		if code != 0 || rep.Failed || len(rep.Targets) != 1 || rep.Targets[0].Connects != 100 || rep.Targets[0].EventStreams < 300 {
			t.Fatalf("want exit 0 with event-stream replies: %+v", rep)
		}
	})
}

// Bad input is exit 2 with a message saying what is wrong, and no run.
func TestMCPProbeCommandBadInput(t *testing.T) {
	refused := testnet.RefusedURL(t)
	html := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = io.WriteString(w, "<!doctype html><title>It works</title>")
	}))
	defer html.Close()
	notFound := httptest.NewServer(http.NotFoundHandler())
	defer notFound.Close()

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"refused", []string{"--url", refused}, "connection refused: nothing listens on"},
		{"HTML page", []string{"--url", html.URL}, "initialize was answered with an HTML page that is not JSON-RPC: not an MCP endpoint"},
		{"404", []string{"--url", notFound.URL + "/mcp"}, "initialize was answered with HTTP 404 Not Found"},
		{"bad URL", []string{"--url", "localhost:8080/mcp"}, "not an http:// or https:// URL"},
		{"no URL", nil, "--url is required"},
		{"bad flag value", []string{"--url", html.URL, "-n", "many"}, "-n, --connects"},
		{"unknown flag", []string{"--url", html.URL, "--fast"}, "unknown flag: --fast"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := mcpProbe(t, tc.args...)
			if code != 2 || !strings.Contains(stderr, tc.want) {
				t.Fatalf("want exit 2 and %q; got %d\nstdout: %s\nstderr: %s", tc.want, code, stdout, stderr)
			}
			if stdout != "" {
				t.Fatalf("a table for bad input: %s", stdout)
			}
		})
	}

	t.Run("json", func(t *testing.T) {
		code, stdout, _ := mcpProbe(t, "--url", refused, "--json")
		rep := parseProbeReport(t, stdout)
		if code != 2 || !rep.Failed || !strings.Contains(rep.Error, "connection refused") || len(rep.Targets) != 0 {
			t.Fatalf("exit %d, %+v", code, rep)
		}
	})
}

// Against real PHP-FPM workers sharing a session store, the probe finds
// every kind of failure directly, and none through mcp_serializer.
func TestMCPProbeCommandAgainstPHPFPM(t *testing.T) {
	phpFPMBinary(t)
	fpm := startPHPFPM(t, phpFPMOptions{})
	plain := startCaddy(t, caddySite(fpm.fastcgiDirectives()))
	with := startCaddy(t, caddySite("\tmcp_serializer {\n\t\tget_stream reject\n\t}\n"+fpm.fastcgiDirectives()))
	code, stdout, stderr := mcpProbe(t, "--url", plain+"/mcp", "--compare", with+"/mcp", "-n", "200", "--concurrency", "8", "--json")
	rep := parseProbeReport(t, stdout)
	t.Logf("exit %d\n%s%s", code, stdout, stderr)
	if code != 1 || len(rep.Targets) != 2 {
		t.Fatalf("want exit 1 and two targets, got %d", code)
	}
	if d := rep.Targets[0]; d.Failed == 0 || d.Rejected+d.Broken == 0 {
		t.Errorf("direct to PHP-FPM: no connect rejected or broken: %+v", d)
	}
	if c := rep.Targets[1]; c.Connects != 200 || c.Failed != 0 {
		t.Errorf("through mcp_serializer: %+v", c)
	}
}
