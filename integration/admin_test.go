package integration

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/integration/mcpstub"
)

// sessionsReport is GET /mcp_serializer/sessions.
type sessionsReport struct {
	Tables []struct {
		Name     string         `json:"name"`
		Counts   map[string]int `json:"counts"`
		Matching int            `json:"matching"`
		Sessions []struct {
			SessionHash string  `json:"session_hash"`
			State       string  `json:"state"`
			InFlight    bool    `json:"in_flight"`
			Waiting     int     `json:"waiting"`
			AgeSeconds  float64 `json:"age_seconds"`
			IdleSeconds float64 `json:"idle_seconds"`
		} `json:"sessions"`
	} `json:"tables"`
}

// adminCall sends a request to Caddy's admin endpoint and returns the
// status and body, failing the test if the body is not JSON.
func adminCall(t *testing.T, method, url string) (int, http.Header, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if !json.Valid(body) {
		t.Fatalf("%s %s: %s, body is not JSON: %s", method, url, resp.Status, body)
	}
	return resp.StatusCode, resp.Header, body
}

// The admin endpoint of the built binary lists the sessions the module
// tracks, by hash, and drops a session stuck at its gate: the request
// held there is answered 503 with Retry-After, as a queue timeout is.
func TestAdminEndpointListsSessionsAndDropsAStuckOne(t *testing.T) {
	stub := httptest.NewServer(&mcpstub.Backend{})
	defer stub.Close()
	c := runCaddy(t, caddySite(`	mcp_serializer {
		init_timeout 30s
		queue_timeout 30s
	}
	reverse_proxy `+strings.TrimPrefix(stub.URL, "http://")))
	base, admin := c.URL, "http://"+c.Admin+"/mcp_serializer/sessions"
	client := &http.Client{Timeout: 30 * time.Second}

	connect := func(initialized bool) string {
		resp, body := post(t, client, base+"/mcp", "", initializeBody)
		sid := resp.Header.Get("Mcp-Session-Id")
		if resp.StatusCode != http.StatusOK || sid == "" {
			t.Fatalf("initialize: %s %s", resp.Status, body)
		}
		if initialized {
			if resp, body := post(t, client, base+"/mcp", sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); resp.StatusCode/100 != 2 {
				t.Fatalf("initialized: %s %s", resp.Status, body)
			}
		}
		return sid
	}
	open1, open2, stuck := connect(true), connect(true), connect(false)
	hash := func(sid string) string {
		sum := sha256.Sum256([]byte(sid))
		return hex.EncodeToString(sum[:6])
	}

	list := func(query string) (sessionsReport, string) {
		t.Helper()
		status, _, body := adminCall(t, http.MethodGet, admin+query)
		if status != http.StatusOK {
			t.Fatalf("GET sessions%s: %d %s", query, status, body)
		}
		for _, sid := range []string{open1, open2, stuck} {
			if strings.Contains(string(body), sid) {
				t.Fatalf("the admin endpoint shows a raw session id: %s", body)
			}
		}
		var rep sessionsReport
		if err := json.Unmarshal(body, &rep); err != nil || len(rep.Tables) != 1 {
			t.Fatalf("GET sessions%s: %v, %s", query, err, body)
		}
		return rep, string(body)
	}
	rep, body := list("")
	if c := rep.Tables[0].Counts; c["sessions"] != 3 || c["open"] != 2 || c["initializing"] != 1 || len(rep.Tables[0].Sessions) != 3 {
		t.Fatalf("three sessions, one still initializing; got %s", body)
	}
	t.Logf("GET /mcp_serializer/sessions:\n%s", body)

	// A request held at the stuck session's gate.
	held := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, base+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":7,"method":"tools/list"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Session-Id", stuck)
		resp, err := client.Do(req)
		if err != nil {
			t.Errorf("held request: %v", err)
		}
		held <- resp
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		rep, body = list("?state=waiting")
		if s := rep.Tables[0].Sessions; len(s) == 1 && s[0].Waiting == 1 {
			if s[0].SessionHash != hash(stuck) || s[0].State != "initializing" {
				t.Fatalf("the waiting session is not the stuck one (%s): %s", hash(stuck), body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the held request never showed as waiting: %s", body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("GET /mcp_serializer/sessions?state=waiting:\n%s", body)

	status, _, body2 := adminCall(t, http.MethodDelete, admin+"/"+hash(stuck))
	if status != http.StatusOK || !strings.Contains(string(body2), `"answered": 1`) {
		t.Fatalf("DELETE the stuck session: %d %s", status, body2)
	}
	t.Logf("DELETE /mcp_serializer/sessions/%s:\n%s", hash(stuck), body2)
	var resp *http.Response
	select {
	case resp = <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the held request was not answered after DELETE")
	}
	if resp == nil {
		t.FailNow()
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var rpc struct {
		ID    json.RawMessage `json:"id"`
		Error struct {
			Code int `json:"code"`
		} `json:"error"`
	}
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
		json.Unmarshal(answer, &rpc) != nil || rpc.Error.Code != -32000 || string(rpc.ID) != "7" {
		t.Fatalf("held request after DELETE: %s (Retry-After %q) %s; want 503, Retry-After, JSON-RPC -32000 with id 7",
			resp.Status, resp.Header.Get("Retry-After"), answer)
	}

	rep, body = list("")
	if c := rep.Tables[0].Counts; c["sessions"] != 2 || c["initializing"] != 0 {
		t.Fatalf("after DELETE: %s", body)
	}
	if status, _, body := adminCall(t, http.MethodDelete, admin+"/"+hash(stuck)); status != http.StatusNotFound {
		t.Fatalf("DELETE of a dropped session: %d %s, want 404", status, body)
	}
	if status, header, body := adminCall(t, http.MethodPost, admin); status != http.StatusMethodNotAllowed || header.Get("Allow") != "GET" {
		t.Fatalf("POST sessions: %d (Allow %q) %s, want 405 with Allow: GET", status, header.Get("Allow"), body)
	}
	// The other sessions go on working.
	if resp, body := post(t, client, base+"/mcp", open1, `{"jsonrpc":"2.0","id":8,"method":"tools/list"}`); resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"tools"`) {
		t.Fatalf("an open session after DELETE of another: %s %s", resp.Status, body)
	}
}
