package caddymodule_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/testnet"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/wait"
	"github.com/mcpserializer/caddy-mcp-serializer/owner"
	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// credentialUpstream is an MCP server that, like WordPress's MCP Adapter,
// keeps all of a user's sessions together: it records, per user named in
// the Basic credentials, the most requests it ever had at once, hands
// each initialize a new session id, and answers 401 to the password
// "wrong".
type credentialUpstream struct {
	sessions atomic.Int32
	proofs   atomic.Int32 // GETs of the proof route
	mu       sync.Mutex
	now      map[string]int
	most     map[string]int
	all      int // at once, whatever the credential
	mostAll  int
}

func startCredentialUpstream(t *testing.T) (*credentialUpstream, string) {
	u := &credentialUpstream{now: map[string]int{}, most: map[string]int{}}
	srv := httptest.NewServer(u)
	t.Cleanup(srv.Close)
	return u, srv.Listener.Addr().String()
}

func (u *credentialUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	user, password, _ := r.BasicAuth()
	if r.Method == http.MethodGet && r.URL.Path == proofPath {
		// The proof route, as WordPress's: it reads the user and keeps
		// nothing, so it is not counted.
		u.proofs.Add(1)
		if password == "wrong" || password == "" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		io.WriteString(w, `{"id":1}`)
		return
	}
	u.mu.Lock()
	u.now[user]++
	u.all++
	u.most[user] = max(u.most[user], u.now[user])
	u.mostAll = max(u.mostAll, u.all)
	u.mu.Unlock()
	time.Sleep(20 * time.Millisecond) // the user's record is read, changed, written back
	u.mu.Lock()
	u.now[user]--
	u.all--
	u.mu.Unlock()
	switch {
	case password == "wrong":
		w.WriteHeader(http.StatusUnauthorized)
		return
	case r.Method == http.MethodDelete:
	case strings.Contains(string(body), `"notifications/initialized"`):
		w.WriteHeader(http.StatusAccepted)
		return
	case strings.Contains(string(body), `"initialize"`):
		w.Header().Set("Mcp-Session-Id", fmt.Sprintf("credential-session-%04d", u.sessions.Add(1)))
	}
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
}

// proofPath is key_proof's default, WordPress's route.
const proofPath = "/wp-json/wp/v2/users/me"

// connectAs runs one client of user: initialize, then
// notifications/initialized, tools/list and prompts/list at once, then
// DELETE. It returns the first failure.
func connectAs(url, user string) error {
	send := func(method, id, body string) (*http.Response, error) {
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", user)
		if id != "" {
			req.Header.Set("Mcp-Session-Id", id)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return resp, fmt.Errorf("%s %.40s: status %d", method, body, resp.StatusCode)
		}
		return resp, nil
	}
	resp, err := send(http.MethodPost, "", initializeBody)
	if err != nil {
		return err
	}
	sid := resp.Header.Get("Mcp-Session-Id")
	errs := make(chan error, 3)
	for _, body := range []string{initializedBody, rpcRequest("2", "tools/list"), rpcRequest("3", "prompts/list")} {
		go func() {
			_, err := send(http.MethodPost, sid, body)
			errs <- err
		}()
	}
	for range 3 {
		if err := <-errs; err != nil {
			return err
		}
	}
	_, err = send(http.MethodDelete, sid, "")
	return err
}

// With key set to a credential, every request carrying it, initialize and
// DELETE included, goes upstream one at a time across all the sessions it
// opened; other credentials' requests go beside them.
func TestKeyRunsEveryRequestOfACredentialOneAtATime(t *testing.T) {
	up, addr := startCredentialUpstream(t)
	c := startCaddy(t, fmt.Sprintf("mcp_serializer {\n\tkey {http.request.header.Authorization}\n}\nreverse_proxy %s", addr))
	// The admin endpoint, read all along, sees the lines and sessions
	// change under it (a data race shows under -race).
	stop, polled := make(chan struct{}), make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				polled <- n
				return
			default:
			}
			if resp, err := http.Get(c.admin + "/mcp_serializer/sessions?limit=1000"); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					n++
				}
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for _, user := range []string{"Basic YWxpY2U6cHc=", "Basic Ym9iOnB3"} {
		for range 4 {
			wg.Go(func() {
				if err := connectAs(c.url, user); err != nil {
					errs <- err
				}
			})
		}
	}
	wg.Wait()
	close(stop)
	if n := <-polled; n == 0 {
		t.Error("the admin endpoint never answered while the clients ran")
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	for user, most := range up.most {
		if most != 1 {
			t.Errorf("the upstream had %d requests of %s at once, want 1", most, user)
		}
	}
	if up.mostAll < 2 {
		t.Errorf("the two credentials' requests never ran side by side (most at once: %d)", up.mostAll)
	}
}

func TestKeySecretIsRefusedWithoutAKeyOrWhenEmpty(t *testing.T) {
	for _, tc := range []struct{ settings, want string }{
		{"key_secret s3cret", "key_secret is for key only"},
		{"key {http.request.header.Authorization}\n\t\tkey_secret {env.MCP_TEST_KEY_SECRET_NEVER_SET}", "key_secret \"{env.MCP_TEST_KEY_SECRET_NEVER_SET}\" is empty"},
	} {
		caddyfile := fmt.Sprintf("{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n}\nhttp://127.0.0.1:%d {\n\tmcp_serializer {\n\t\t%s\n\t}\n\trespond ok\n}\n",
			testnet.FreePort(t), tc.settings)
		err := loadCaddyfile(t, caddyfile)
		if err == nil {
			_ = caddy.Stop()
			t.Fatalf("%q loaded; want it refused", tc.settings)
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err = %v, want one saying %q", tc.settings, err, tc.want)
		}
	}
}

// postAs posts body in session id with the X-User header, in the
// background.
func postAs(url, id, user, body string) <-chan *http.Response {
	ch := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Mcp-Session-Id", id)
		req.Header.Set("X-User", user)
		resp, err := do(http.DefaultClient, req)
		if err != nil {
			resp = nil
		}
		ch <- resp
	}()
	return ch
}

// reached reports whether a request whose body holds marker reached up.
func reached(up *upstream, marker string) bool {
	for _, r := range up.requests() {
		if strings.Contains(string(r.Body), marker) {
			return true
		}
	}
	return false
}

// A request that waits in its key's line past queue_timeout is answered
// 503, saying what it waited for, and never forwarded.
func TestAWaitInAKeysLinePastQueueTimeoutIsAnswered503AndNotForwarded(t *testing.T) {
	up, addr, release := blockingUpstream(t)
	c := startCaddy(t, "mcp_serializer {\n\tkey {http.request.header.X-User}\n\tqueue_timeout 200ms\n}\nreverse_proxy "+addr)
	first := postAs(c.url, "s1", "alice", `{"jsonrpc":"2.0","id":1,"method":"block"}`)
	up.next(t)
	resp := <-postAs(c.url, "s2", "alice", `{"jsonrpc":"2.0","id":2,"method":"late"}`)
	if resp == nil {
		t.Fatal("no answer")
	}
	e := expectRPCError(t, resp, http.StatusServiceUnavailable, "2")
	if !strings.Contains(e.Error.Message, "key") {
		t.Errorf("message %q does not say the request waited for its key", e.Error.Message)
	}
	other := <-postAs(c.url, "s3", "bob", `{"jsonrpc":"2.0","id":3,"method":"beside"}`)
	if other == nil || other.StatusCode != http.StatusOK {
		t.Fatalf("another key's request beside the blocked one: %v", other)
	}
	close(release)
	<-first
	if reached(up, "late") {
		t.Fatal("the timed-out request reached the upstream")
	}
	if again := <-postAs(c.url, "s2", "alice", `{"jsonrpc":"2.0","id":4,"method":"after"}`); again == nil || again.StatusCode != http.StatusOK {
		t.Fatalf("the key's line did not recover: %v", again)
	}
}

// A reload that changes the config keeps each key's line: a request sent
// after it still waits for the key's request in flight from before.
func TestAKeysLineHoldsAcrossAReload(t *testing.T) {
	up, addr, release := blockingUpstream(t)
	site := "mcp_serializer {\n\tkey {http.request.header.X-User}\n\tqueue_timeout %s\n}\nreverse_proxy " + addr
	c := startCaddy(t, fmt.Sprintf(site, "30s"))
	first := postAs(c.url, "s1", "alice", `{"jsonrpc":"2.0","id":1,"method":"block"}`)
	up.next(t)
	c.reload(t, fmt.Sprintf(site, "20s"))
	second := postAs(c.url, "s2", "alice", `{"jsonrpc":"2.0","id":2,"method":"after-reload"}`)
	select {
	case <-second:
		t.Fatal("a request of the key answered while the key's request from before the reload was in flight")
	case <-time.After(300 * time.Millisecond):
	}
	if reached(up, "after-reload") {
		t.Fatal("a request of the key reached the upstream beside the one in flight from before the reload")
	}
	close(release)
	<-first
	if resp := <-second; resp == nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the request after the reload: %v", resp)
	}
}

// An instance that takes a key over from an owner that does not answer
// holds the key's next request, initialize included, until the old
// owner's running mark on the key has lapsed: the old owner's backend may
// still be writing the user's record.
func TestAnInitializeWaitsForItsKeysPreviousOwnersExchange(t *testing.T) {
	ctx := context.Background()
	var markWhenServed atomic.Int64 // ms the mark still had when initialize reached the upstream; -1 before
	markWhenServed.Store(-1)
	var in *ownerInstances
	_, addr := newUpstream(t, mcpAnswer("keyed-takeover-session", func(m rpcMsg, w http.ResponseWriter, r *http.Request) bool {
		if m.Method == "initialize" {
			markWhenServed.Store(in.markLeft(t, keyLine("alice")))
		}
		return false
	}))
	in = startOwnerInstances(t, addr, "key {http.request.header.X-User}")
	dead := owner.Owner{ID: "dead", Addr: strings.TrimPrefix(testnet.RefusedURL(t), "http://")}
	dead.Addr, _, _ = strings.Cut(dead.Addr, "/")
	record := "mcp_serializer:" + serializer.StoreKey(keyLine("alice"))
	now, err := in.redis.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := in.redis.HSet(ctx, record, "open", "1", "deadline", "0", "inflight", "0", "owner", dead.String(), "running", now.UnixMilli()+1500, "running_by", dead.String()).Err(); err != nil {
		t.Fatal(err)
	}
	in.redis.Expire(ctx, record, time.Hour)

	req, _ := http.NewRequest(http.MethodPost, in.b, strings.NewReader(initializeBody))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User", "alice")
	resp, err := do(http.DefaultClient, req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("initialize: %s", resp.Status)
	}
	if left := markWhenServed.Load(); left != 0 {
		t.Fatalf("initialize reached the upstream with the dead owner's mark standing %d ms more (-1: never)", left)
	}
}

// keyLine is the queue of a key's value with shared state and no
// key_secret: its plain hash.
func keyLine(value string) string {
	sum := sha256.Sum256([]byte(value))
	return "key " + hex.EncodeToString(sum[:])
}

// markLeft is how many ms the running mark on id's record still stands on
// Redis' clock; 0 if none.
func (in *ownerInstances) markLeft(t *testing.T, id string) int64 {
	ctx := context.Background()
	until, _ := in.redis.HGet(ctx, "mcp_serializer:"+serializer.StoreKey(id), "running").Int64()
	now, err := in.redis.Time(ctx).Result()
	if err != nil {
		t.Error(err)
		return -1
	}
	return max(0, until-now.UnixMilli())
}

// basic is the Authorization header of user's Basic credentials.
func basic(user, password string) string {
	req, _ := http.NewRequest(http.MethodGet, "/", nil)
	req.SetBasicAuth(user, password)
	return req.Header.Get("Authorization")
}

// connectAll runs clients clients of each user at once, client c with
// password "pw-c", and fails the test on any failure.
func connectAll(t *testing.T, url string, users []string, clients int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, len(users)*clients)
	for _, user := range users {
		for c := range clients {
			wg.Go(func() {
				if err := connectAs(url, basic(user, fmt.Sprintf("pw-%d", c))); err != nil {
					errs <- err
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// With key basic_user, the requests of every password of one user go
// upstream one at a time, as the backend keeps all of the user's sessions
// in one record; keyed on the Authorization header, each password is a
// line of its own, and one user's requests overlap.
func TestKeyBasicUserLinesUpEveryPasswordOfAUser(t *testing.T) {
	users := []string{"alice", "bob"}
	up, addr := startCredentialUpstream(t)
	c := startCaddy(t, fmt.Sprintf("mcp_serializer {\n\tkey basic_user\n}\nreverse_proxy %s", addr))
	connectAll(t, c.url, users, 4)
	up.mu.Lock()
	for _, user := range users {
		if up.most[user] != 1 {
			t.Errorf("key basic_user: the upstream had %d requests of %s at once, want 1", up.most[user], user)
		}
	}
	if up.mostAll < 2 {
		t.Errorf("key basic_user: the two users' requests never ran side by side (most at once: %d)", up.mostAll)
	}
	up.mu.Unlock()

	byHeader, addr := startCredentialUpstream(t)
	c.reload(t, fmt.Sprintf("mcp_serializer {\n\tkey {http.request.header.Authorization}\n}\nreverse_proxy %s", addr))
	connectAll(t, c.url, users, 4)
	byHeader.mu.Lock()
	defer byHeader.mu.Unlock()
	if byHeader.most["alice"] < 2 && byHeader.most["bob"] < 2 {
		t.Errorf("keyed on the Authorization header, no user's passwords overlapped: the test cannot tell the two apart")
	}
}

// Two instances hashing key values with different secrets would each
// claim their own queue for one user. Each records a fingerprint of its
// secret, one per table name: an instance whose secret differs from the
// one recorded says so in key_secret_differs (and a WARN); endpoints with
// their own table and secret in one Caddy do not.
func TestAnInstanceWhoseKeySecretDiffersFromTheRecordedOneSaysSo(t *testing.T) {
	_, addr := newUpstream(t, nil)
	in := startOwnerInstances(t, addr, "key {http.request.header.X-User}", "key_secret secret-of-{instance}")
	differs := func() float64 { return scrapeMetric(t, in.a, "caddy_mcp_serializer_key_secret_differs") }
	if n := differs(); n != 0 {
		t.Fatalf("key_secret_differs = %v for two tables with their own secrets, want 0", n)
	}
	// Another instance of table a, with another secret, recorded its
	// fingerprint first.
	record := "mcp_serializer:" + serializer.StoreKey("mcp_serializer key_secret fingerprint a")
	if err := in.redis.HSet(context.Background(), record, "owner", "key_secret 0123456789abcdef").Err(); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, "key_secret_differs", func() bool { return differs() == 1 })
	if status := statusOf(send(t, in.a, "", "", rpcRequest("1", "tools/list"), "X-User", "alice")); status != http.StatusOK {
		t.Errorf("a keyed request at the instance that differs: status %d, want 200 (it says so; it does not refuse)", status)
	}
}
