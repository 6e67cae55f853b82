package caddymodule

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"go.uber.org/zap"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/testnet"
	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// initializingStore answers every lookup with a record still initializing
// until deadline, as if another instance had just created the session.
type initializingStore struct{ deadline time.Time }

func (s initializingStore) Created(context.Context, string, time.Time) error { return nil }
func (s initializingStore) InitializeEnded(context.Context, string) error    { return nil }
func (s initializingStore) Opened(context.Context, string) error             { return nil }
func (s initializingStore) Touch(context.Context, string) error              { return nil }
func (s initializingStore) Forget(context.Context, string) error             { return nil }
func (s initializingStore) Lookup(context.Context, string) (serializer.Record, bool, error) {
	return serializer.Record{InitDeadline: s.deadline}, true, nil
}

// A session created behind another instance and adopted here is
// synthesized for with the headers of the follow-up that is waiting here:
// the initialize request never passed through this instance.
func TestAdoptedSessionSynthesizesWithTheFollowUpsHeaders(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, fmt.Sprintf("%s auth=%s", body, r.Header.Get("Authorization")))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
	}))
	t.Cleanup(upstream.Close)

	port := testnet.FreePort(t)
	caddyfile := fmt.Sprintf(`{
	admin off
	auto_https off
	persist_config off
	log {
		output discard
	}
}
http://127.0.0.1:%d {
	mcp_serializer {
		name adopt-test
		on_init_timeout synthesize
	}
	reverse_proxy %s
}
`, port, upstream.Listener.Addr())
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })

	// The shared state a state module would give the table.
	var tab *serializer.Table
	tables.Range(func(key, v any) bool {
		if key == "mcp_serializer/adopt-test" {
			tab = v.(pooledTable).Table
		}
		return tab == nil
	})
	if tab == nil {
		t.Fatal("no session table named adopt-test")
	}
	tcfg := serializer.Defaults()
	tcfg.OnInitTimeout = serializer.Synthesize
	tcfg.Events = events{logger: zap.NewNop()}
	tcfg.Store = initializingStore{deadline: time.Now().Add(300 * time.Millisecond)}
	tab.Configure(tcfg)

	req, _ := http.NewRequest(http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d/mcp", port),
		strings.NewReader(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Mcp-Session-Id", "created-elsewhere")
	req.Header.Set("Authorization", "Bearer follow-up")
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("held follow-up answered %d, want 200", resp.StatusCode)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{
		`{"jsonrpc":"2.0","method":"notifications/initialized"} auth=Bearer follow-up`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/list"} auth=Bearer follow-up`,
	}
	if strings.Join(seen, "\n") != strings.Join(want, "\n") {
		t.Fatalf("upstream saw:\n%s\nwant:\n%s", strings.Join(seen, "\n"), strings.Join(want, "\n"))
	}
}
