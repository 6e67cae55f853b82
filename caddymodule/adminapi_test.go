package caddymodule_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

func adminRequest(t *testing.T, method, url string) (int, http.Header, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var v map[string]any
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("%s %s: %d, not JSON: %s", method, url, resp.StatusCode, body)
	}
	return resp.StatusCode, resp.Header, v
}

// Tables are reported by name, ?table= and ?limit= bound the answer, and
// bad input gets a JSON error with the right status.
func TestAdminSessionsByTableWithLimitsAndErrors(t *testing.T) {
	_, addr := newUpstream(t, nil)
	c := startCaddy(t, fmt.Sprintf(`route /a* {
	mcp_serializer {
		name alpha
	}
	reverse_proxy %s
}
route /b* {
	mcp_serializer {
		name beta
	}
	reverse_proxy %s
}`, addr, addr))
	ctx := context.Background()
	for i := range 5 {
		call(ctx, http.DefaultClient, http.MethodPost, c.url+"/a", fmt.Sprintf("alpha-%d", i), rpcRequest("1", "ping"))
	}
	call(ctx, http.DefaultClient, http.MethodPost, c.url+"/b", "beta-0", rpcRequest("1", "ping"))
	api := c.admin + "/mcp_serializer/sessions"

	status, _, v := adminRequest(t, http.MethodGet, api+"?limit=2")
	tables, _ := v["tables"].([]any)
	if status != http.StatusOK || len(tables) != 2 {
		t.Fatalf("GET: %d %v", status, v)
	}
	alpha, beta := tables[0].(map[string]any), tables[1].(map[string]any)
	if alpha["name"] != "alpha" || beta["name"] != "beta" {
		t.Fatalf("tables not by name in order: %v", v)
	}
	if n := len(alpha["sessions"].([]any)); n != 2 || alpha["matching"] != 5.0 || alpha["counts"].(map[string]any)["sessions"] != 5.0 {
		t.Fatalf("alpha with limit 2: %d listed of %v: %v", n, alpha["matching"], alpha)
	}
	if strings.Contains(fmt.Sprint(v), "alpha-") {
		t.Fatalf("raw session id in %v", v)
	}

	status, _, v = adminRequest(t, http.MethodGet, api+"?table=beta&state=open")
	if tables := v["tables"].([]any); status != http.StatusOK || len(tables) != 1 || tables[0].(map[string]any)["matching"] != 1.0 {
		t.Fatalf("?table=beta&state=open: %d %v", status, v)
	}

	for _, tc := range []struct {
		method, query string
		status        int
	}{
		{http.MethodGet, "?limit=1001", http.StatusBadRequest},
		{http.MethodGet, "?limit=-1", http.StatusBadRequest},
		{http.MethodGet, "?limit=x", http.StatusBadRequest},
		{http.MethodGet, "?state=stuck", http.StatusBadRequest},
		{http.MethodGet, "?table=gamma", http.StatusNotFound},
		{http.MethodDelete, "/NOT-A-HASH", http.StatusBadRequest},
		{http.MethodDelete, "/0123456789ab", http.StatusNotFound},
		{http.MethodGet, "/0123456789ab", http.StatusMethodNotAllowed},
		{http.MethodPut, "", http.StatusMethodNotAllowed},
		{http.MethodGet, "/a/b", http.StatusNotFound},
	} {
		status, _, v := adminRequest(t, tc.method, api+tc.query)
		if status != tc.status || v["error"] == nil {
			t.Errorf("%s %s: %d %v, want %d with an error", tc.method, tc.query, status, v, tc.status)
		}
	}
}
