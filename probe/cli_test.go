package probe_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/integration/mcpstub"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/testnet"
	"github.com/mcpserializer/caddy-mcp-serializer/probe"
)

func options(url, compare string, out *bytes.Buffer) probe.Options {
	return probe.Options{
		URL: url, Compare: compare,
		Connects: 60, Concurrency: 8, Timeout: 10 * time.Second,
		Stdout: out,
	}
}

// The racing backend against a correct one, side by side: exit 1, a table
// with both URLs, and the racing one's problems described below it.
func TestMainComparesTwoURLs(t *testing.T) {
	racing := serve(t, &mcpstub.Backend{WorkMin: time.Millisecond, WorkMax: 5 * time.Millisecond, DisableRequestLog: true})
	correct := serve(t, &fakeServer{})
	var out bytes.Buffer
	code, err := probe.Main(t.Context(), options(racing, correct, &out))
	t.Logf("%s", out.String())
	if code != probe.ExitFailed || err == nil || !strings.Contains(err.Error(), "of 60 connects to "+racing+" failed") {
		t.Fatalf("exit %d, %v", code, err)
	}
	if strings.Contains(err.Error(), correct) {
		t.Fatalf("the correct server is named as failing: %v", err)
	}
	table := out.String()
	for _, want := range []string{
		"60 pipelined connects per URL, 8 at a time, timeout 10s",
		racing, correct, "mcpstub 1.0.0 (2025-06-18)", "fake 0.1 (2025-06-18)",
		"rejections (-32600)", "sessions left broken", "replies with wrong id", "transport errors",
		"0 of 60 (0.0%)",
		"first problems at " + racing + ":\n  ",
		"Client session not initialized.",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q", want)
		}
	}
	if strings.Contains(table, "first problems at "+correct) {
		t.Error("problems listed for the correct server")
	}
}

// --json prints one object a program can read, and exit 0 when nothing
// failed.
func TestMainJSONWhenNothingFails(t *testing.T) {
	url := serve(t, &fakeServer{})
	var out bytes.Buffer
	o := options(url, "", &out)
	o.JSON = true
	code, err := probe.Main(t.Context(), o)
	if code != probe.ExitOK || err != nil {
		t.Fatalf("exit %d, %v", code, err)
	}
	var rep struct {
		Connects int  `json:"connects"`
		Failed   bool `json:"failed"`
		Targets  []struct {
			URL       string   `json:"url"`
			Connects  int      `json:"connects"`
			Failed    int      `json:"failed"`
			Rejected  int      `json:"rejections"`
			P99       float64  `json:"connect_p99_ms"`
			Samples   []string `json:"samples"`
			ServerObj struct {
				Name string `json:"name"`
			} `json:"server"`
		} `json:"targets"`
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if rep.Connects != 60 || rep.Failed || len(rep.Targets) != 1 {
		t.Fatalf("report %+v", rep)
	}
	tr := rep.Targets[0]
	if tr.URL != url || tr.Connects != 60 || tr.Failed != 0 || tr.Rejected != 0 || tr.P99 <= 0 || tr.Samples == nil || tr.ServerObj.Name != "fake" {
		t.Fatalf("target %+v", tr)
	}
	if bytes.Count(out.Bytes(), []byte("\n}\n")) != 1 {
		t.Fatalf("want exactly one object:\n%s", out.String())
	}
}

// Bad input is exit 2 with a message that says what is wrong, and with
// --json still one object, carrying the message.
func TestMainBadInput(t *testing.T) {
	refused := testnet.RefusedURL(t)
	good := serve(t, &fakeServer{})
	for _, tc := range []struct {
		name string
		edit func(o *probe.Options)
		want string
	}{
		{"no URL", func(o *probe.Options) { o.URL = "" }, "--url is required"},
		{"bad URL", func(o *probe.Options) { o.URL = "127.0.0.1:9081/mcp" }, "not an http:// or https:// URL"},
		{"bad compare URL", func(o *probe.Options) { o.Compare = "mcp" }, "mcp: not an http:// or https:// URL"},
		{"zero connects", func(o *probe.Options) { o.Connects = 0 }, "-n must be at least 1"},
		{"zero concurrency", func(o *probe.Options) { o.Concurrency = 0 }, "--concurrency must be at least 1"},
		{"zero timeout", func(o *probe.Options) { o.Timeout = 0 }, "--timeout must be positive"},
		{"refused", func(o *probe.Options) { o.URL = refused }, "connection refused"},
		{"refused compare", func(o *probe.Options) { o.Compare = refused }, "connection refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, asJSON := range []bool{false, true} {
				var out bytes.Buffer
				o := options(good, "", &out)
				o.JSON = asJSON
				tc.edit(&o)
				code, err := probe.Main(t.Context(), o)
				if code != probe.ExitBadInput || err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("json=%v: exit %d, %v; want 2 and %q", asJSON, code, err, tc.want)
				}
				if !asJSON {
					if out.Len() != 0 {
						t.Fatalf("output on bad input: %s", out.String())
					}
					continue
				}
				var rep struct {
					Failed bool   `json:"failed"`
					Error  string `json:"error"`
				}
				if jerr := json.Unmarshal(out.Bytes(), &rep); jerr != nil || !rep.Failed || rep.Error != err.Error() {
					t.Fatalf("json: %v %+v\n%s", err, rep, out.String())
				}
			}
		})
	}
}

// Progress goes where it is told, and the line is cleared at the end.
func TestMainProgress(t *testing.T) {
	url := serve(t, &fakeServer{})
	var out, progress bytes.Buffer
	o := options(url, "", &out)
	o.Progress = &progress
	if code, err := probe.Main(t.Context(), o); code != probe.ExitOK {
		t.Fatalf("exit %d, %v", code, err)
	}
	p := progress.String()
	if !strings.Contains(p, "probing "+url+": ") || !strings.HasSuffix(p, "\r\033[K") {
		t.Fatalf("progress %q", p)
	}
	if strings.Contains(out.String(), "probing") {
		t.Fatal("progress in the report")
	}
}
