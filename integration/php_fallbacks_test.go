package integration

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A client that never sends notifications/initialized: with
// on_init_timeout synthesize, the module sends it to PHP-FPM itself, through
// php_fastcgi, and the held request is then answered by a session PHP
// considers initialized.
func TestSynthesizedInitializedReachesPHPFPM(t *testing.T) {
	fpm := startPHPFPM(t, phpFPMOptions{Workers: 4})
	base := startCaddy(t, caddySite(`	mcp_serializer {
		init_timeout 500ms
		on_init_timeout synthesize
	}
`+fpm.fastcgiDirectives()))
	client := &http.Client{Timeout: 30 * time.Second}

	resp, _ := post(t, client, base+"/mcp", "", initializeBody)
	session := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || session == "" {
		t.Fatalf("initialize: %s, session %q", resp.Status, session)
	}
	resp, body := post(t, client, base+"/mcp", session, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"tools"`) {
		t.Fatalf("held tools/list after synthesized initialized: %s %s", resp.Status, body)
	}
}

// A session's POST sent chunked is read by the module to classify it and
// reaches PHP-FPM whole, with a length (FastCGI cannot carry a body of
// unknown length): the gate opens and the next request is served.
func TestChunkedBodiesThroughTheModuleReachPHPFPM(t *testing.T) {
	fpm := startPHPFPM(t, phpFPMOptions{Workers: 4})
	base := startCaddy(t, caddySite("\tmcp_serializer\n"+fpm.fastcgiDirectives()))
	client := &http.Client{Timeout: 30 * time.Second}
	resp, _ := post(t, client, base+"/mcp", "", initializeBody)
	session := resp.Header.Get("Mcp-Session-Id")

	for _, body := range []string{
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`,
	} {
		req, _ := http.NewRequest(http.MethodPost, base+"/mcp", io.MultiReader(strings.NewReader(body)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Session-Id", session)
		r, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		answer, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode/100 != 2 || strings.Contains(string(answer), "not initialized") {
			t.Fatalf("chunked %s: %s %s", body, r.Status, answer)
		}
	}
}

const initializeBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"go-test","version":"1"}}}`
