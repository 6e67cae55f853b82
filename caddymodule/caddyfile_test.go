package caddymodule_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddytest"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/mcpserializer/caddy-mcp-serializer/caddymodule"
)

var update = flag.Bool("update", false, "rewrite the JSON half of testdata/*.caddytest")

// Each testdata/*.caddytest file is a Caddyfile, a line of dashes, and the
// JSON it must adapt to.
func TestCaddyfileAdaptsToGoldenJSON(t *testing.T) {
	files, err := filepath.Glob("testdata/*.caddytest")
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden files: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			caddyfile, expected, ok := strings.Cut(string(data), "----------")
			if !ok {
				t.Fatalf("%s: no ---------- separator", file)
			}
			caddyfile = strings.TrimSpace(caddyfile) + "\n"
			if *update {
				writeGolden(t, file, caddyfile)
				return
			}
			if !caddytest.CompareAdapt(t, file, caddyfile, "caddyfile", strings.TrimSpace(expected)) {
				t.Errorf("%s does not adapt to its JSON (go test -run Golden -update rewrites it)", file)
			}
		})
	}
}

func writeGolden(t *testing.T, file, caddyfile string) {
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
	if err != nil {
		t.Fatal(err)
	}
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, out, "", "\t"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte(caddyfile+"----------\n"+pretty.String()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestCaddyfileRejectsBadSettings(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{"max_queue lots", "max_queue"},
		{"init_timeout soon", "init_timeout"},
		{"max_body huge", "max_body"},
		{"max_buffered plenty", "max_buffered"},
		{"queue_timeout", "wrong argument count"},
		{"max_queue 3 4", "max_queue: too many values"},
		{"bogus 1", `unrecognized mcp_serializer setting "bogus"`},
		{"state", "wrong argument count"},
		{"state memcached", "http.handlers.mcp_serializer.state.memcached"},
		{"state redis {\n db lots\n }", "db"},
		{"state redis {\n timeout soon\n }", "timeout"},
		{"state redis {\n tls maybe\n }", "tls"},
		{"state redis {\n address\n }", "wrong argument count"},
		{"state redis {\n key_prefix a b\n }", "key_prefix: too many values"},
		{"state redis {\n bogus 1\n }", `unrecognized redis state setting "bogus"`},
		{"state storage {\n sweep_interval often\n }", "sweep_interval"},
		{"state storage {\n bogus 1\n }", `unrecognized storage state setting "bogus"`},
		{"state storage somewhere", "wrong argument count"},
		// A setting given twice would silently override the first.
		{"max_queue 3\n max_queue 4", "max_queue: given twice"},
		{"state storage\n state redis", "state: given twice"},
		{"state redis {\n timeout 1s\n timeout 2s\n }", "timeout: given twice"},
		{"state redis {\n address 127.0.0.1:1\n address 127.0.0.1:2\n }", "address: given twice"},
		{"state storage {\n timeout 1s\n timeout 2s\n }", "timeout: given twice"},
		{"state redis {\n tls off\n tls_ca_file /etc/ca.pem\n }", "tls off beside tls_ca_file"},
		{"state redis {\n tls_cert_file /etc/c.pem\n tls off\n }", "tls off beside tls_cert_file"},
		{"state redis {\n sentinel\n }", "wrong argument count"},
	} {
		caddyfile := "http://localhost {\n\tmcp_serializer {\n\t\t" + tc.body + "\n\t}\n\trespond ok\n}\n"
		_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err = %v, want one mentioning %q", tc.body, err, tc.want)
		}
	}
}
