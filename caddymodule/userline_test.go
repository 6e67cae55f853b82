package caddymodule_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/wait"
)

// With key basic_user a user's line is joined by credentials the MCP
// server accepted at key_proof, never by a name alone: these tests play
// a stranger who knows only the user's name against the user's own
// clients.

// userLineUpstream stands in for WordPress's MCP Adapter: it keeps all of
// a user's sessions in one record, so it counts how many requests of one
// user it runs at once. The user it acts as is the cookie's if the
// request carries a login cookie and a nonce (WordPress checks cookies
// first, then skips other credentials), else the Basic user if the
// password does not begin with "wrong". Requests carrying X-Test-Hold
// wait until release is closed; a tools/call named "stream" answers with
// an event stream that lasts until its reply comes. It notes, per
// session, the methods in the order they arrived.
type userLineUpstream struct {
	sessions atomic.Int32
	proofs   atomic.Int32
	// proofsCalledOff counts proofs held at proofGate whose sender gave
	// them up.
	proofsCalledOff atomic.Int32
	arrived         chan struct{} // a held request is here
	release         chan struct{}
	replied         chan struct{} // a reply came: the stream may end

	releaseOnce sync.Once

	mu        sync.Mutex
	proofGate chan struct{} // if not nil, each proof waits for it to close (holdProofs)
	now       map[string]int
	most      map[string]int
	order     map[string][]string
}

func startUserLineUpstream(t *testing.T) (*userLineUpstream, string) {
	u := &userLineUpstream{
		arrived: make(chan struct{}, 64), release: make(chan struct{}), replied: make(chan struct{}, 16),
		now: map[string]int{}, most: map[string]int{}, order: map[string][]string{},
	}
	srv := httptest.NewServer(u)
	t.Cleanup(srv.Close)
	t.Cleanup(u.releaseAll) // before the server closes: held requests end
	return u, srv.Listener.Addr().String()
}

func (u *userLineUpstream) releaseAll() { u.releaseOnce.Do(func() { close(u.release) }) }

// actingUser is who the stand-in runs the request as, "" for nobody.
func actingUser(r *http.Request) string {
	if c, err := r.Cookie("wordpress_logged_in"); err == nil && r.Header.Get("X-WP-Nonce") != "" {
		return c.Value
	}
	user, password, ok := r.BasicAuth()
	if !ok || strings.HasPrefix(password, "wrong") {
		return ""
	}
	// A user may sign in by e-mail address, <login>@example.com.
	return strings.TrimSuffix(user, "@example.com")
}

func (u *userLineUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && r.URL.Path == proofPath {
		u.proofs.Add(1)
		u.mu.Lock()
		gate := u.proofGate
		u.mu.Unlock()
		if gate != nil {
			select {
			case <-gate:
			case <-r.Context().Done():
				u.proofsCalledOff.Add(1)
				return
			}
		}
		user := actingUser(r)
		if user == "" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		fmt.Fprintf(w, `{"id":1,"username":%q}`, user)
		return
	}
	hold := r.Header.Get("X-Test-Hold") != ""
	if hold {
		u.arrived <- struct{}{}
	}
	body, _ := io.ReadAll(r.Body)
	method := methodOf(string(body))
	user := actingUser(r)
	if user == "" {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	sid := r.Header.Get("Mcp-Session-Id")
	u.mu.Lock()
	if sid != "" {
		u.order[sid] = append(u.order[sid], method)
	}
	reply := method == "reply"
	if !reply {
		u.now[user]++
		u.most[user] = max(u.most[user], u.now[user])
	}
	u.mu.Unlock()
	defer func() {
		if !reply {
			u.mu.Lock()
			u.now[user]--
			u.mu.Unlock()
		}
	}()
	if hold {
		<-u.release
	}
	switch {
	case reply:
		u.replied <- struct{}{}
		w.WriteHeader(http.StatusAccepted)
	case method == "notifications/initialized":
		w.WriteHeader(http.StatusAccepted)
	case method == "initialize":
		w.Header().Set("Mcp-Session-Id", fmt.Sprintf("user-line-session-%04d", u.sessions.Add(1)))
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
	case strings.Contains(string(body), `"stream"`):
		// The stream is the user's request upstream until its reply has
		// come: counted until then, as WordPress runs it.
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "data: {\"jsonrpc\":\"2.0\",\"id\":\"ask-1\",\"method\":\"elicitation/create\",\"params\":{}}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-u.replied:
		case <-u.release:
		}
		io.WriteString(w, "data: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{}}\n\n")
	default:
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
	}
}

// holdProofs makes the proofs sent from now on wait until the returned
// function is called.
func (u *userLineUpstream) holdProofs() (release func()) {
	gate := make(chan struct{})
	u.mu.Lock()
	u.proofGate = gate
	u.mu.Unlock()
	return func() { close(gate) }
}

// methodOf is a body's method, or "reply" for a JSON-RPC response.
func methodOf(body string) string {
	_, rest, ok := strings.Cut(body, `"method":"`)
	if !ok {
		return "reply"
	}
	method, _, _ := strings.Cut(rest, `"`)
	return method
}

// awaitHeld waits for a request carrying X-Test-Hold to reach the
// upstream, failing after ten seconds.
func (u *userLineUpstream) awaitHeld(t *testing.T) {
	t.Helper()
	select {
	case <-u.arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the held request did not reach the upstream within 10s")
	}
}

// mostAtOnce is the most requests of user the upstream ran at once.
func (u *userLineUpstream) mostAtOnce(user string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.most[user]
}

func (u *userLineUpstream) arrivals(sid string) []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.order[sid]...)
}

// credentialRequest is a POST of body as credential (an Authorization
// header) in session sid ("" for none), with extra headers (name, value).
func credentialRequest(url, credential, sid, body string, extra ...string) *http.Request {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", credential)
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
	}
	for i := 0; i+1 < len(extra); i += 2 {
		req.Header.Set(extra[i], extra[i+1])
	}
	return req
}

// send posts credentialRequest and returns the response.
func send(t *testing.T, url, credential, sid, body string, extra ...string) *http.Response {
	t.Helper()
	resp, err := do(http.DefaultClient, credentialRequest(url, credential, sid, body, extra...))
	if err != nil {
		t.Fatalf("POST %.40s: %v", body, err)
	}
	return resp
}

// sendAsyncAs is send in the background, returning the status (0 for none).
func sendAsyncAs(t *testing.T, url, credential, sid, body string, extra ...string) <-chan int {
	done := make(chan int, 1)
	go func() {
		resp, err := do(http.DefaultClient, credentialRequest(url, credential, sid, body, extra...))
		if err != nil {
			done <- 0
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	return done
}

// openSession initializes a session as credential and acknowledges it.
func openSession(t *testing.T, url, credential string) string {
	t.Helper()
	resp := send(t, url, credential, "", initializeBody)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	sid := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || sid == "" {
		t.Fatalf("initialize: status %d, session %q", resp.StatusCode, sid)
	}
	if status := statusOf(send(t, url, credential, sid, initializedBody)); status != http.StatusAccepted {
		t.Fatalf("notifications/initialized: status %d", status)
	}
	return sid
}

func statusOf(resp *http.Response) int {
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// userLineSite is a site with key basic_user in front of addr.
func userLineSite(addr, settings string) string {
	return fmt.Sprintf("mcp_serializer {\n\tkey basic_user\n%s}\nreverse_proxy %s", settings, addr)
}

// A stranger who knows alice's name sends a wrong password with a body
// larger than max_body, a few bytes of it, then nothing: the server
// cannot refuse it before it has read the body. It joins no line, so
// alice's clients connect beside it.
func TestASlowBodyWithAWrongPasswordDoesNotHoldTheUsersLine(t *testing.T) {
	up, addr := startUserLineUpstream(t)
	c := startCaddy(t, userLineSite(addr, "\tmax_body 1KB\n\tqueue_timeout 2s\n"))
	alice := basic("alice", "pw-0")
	if err := connectAs(c.url, alice); err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", strings.TrimPrefix(c.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The module classifies a large body by its first 4 KiB; the rest
	// would come a byte at a time.
	prefix := `{"jsonrpc":"2.0","id":9,"method":"tools/list","params":{"pad":"` + strings.Repeat("x", 4096)
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: %s\r\nAuthorization: %s\r\nX-Test-Hold: 1\r\nContent-Type: application/json\r\nContent-Length: 8192\r\n\r\n%s",
		strings.TrimPrefix(c.url, "http://"), basic("alice", "wrong"), prefix)
	up.awaitHeld(t)
	for round := range 3 {
		if err := connectAs(c.url, alice); err != nil {
			t.Errorf("round %d: alice's client beside the stranger's slow body: %v", round, err)
		}
	}
	if n := up.mostAtOnce("alice"); n != 1 {
		t.Errorf("the upstream ran %d of alice's requests at once, want 1", n)
	}
}

// WordPress accepts any account's login cookie with its nonce before it
// looks at Basic credentials, so a stranger's wrong password for alice
// gets a 2xx with the stranger's own cookie. The proof carries no cookie:
// the wrong password stays refused, and the stranger's requests, held as
// long as it likes, never hold alice's line.
func TestACookieDoesNotProveAWrongPassword(t *testing.T) {
	up, addr := startUserLineUpstream(t)
	c := startCaddy(t, userLineSite(addr, "\tqueue_timeout 2s\n"))
	stranger := basic("alice", "wrong-x")
	cookie := []string{"Cookie", "wordpress_logged_in=mallory", "X-WP-Nonce", "n"}
	if status := statusOf(send(t, c.url, stranger, "", rpcRequest("1", "tools/list"), cookie...)); status != http.StatusOK {
		t.Fatalf("the stranger's cookie request: status %d, want the stand-in's 200", status)
	}
	var held []<-chan int
	for range 3 {
		held = append(held, sendAsyncAs(t, c.url, stranger, "", rpcRequest("2", "tools/list"), append(cookie, "X-Test-Hold", "1")...))
		up.awaitHeld(t)
	}
	for round := range 3 {
		if err := connectAs(c.url, basic("alice", "pw-0")); err != nil {
			t.Errorf("round %d: alice's client beside the stranger's held requests: %v", round, err)
		}
	}
	up.releaseAll()
	for _, h := range held {
		<-h
	}
}

// A reply the session's stream waits for overtakes the stream, whatever
// its credential: it waits neither for a proof nor in the user's line,
// which the stream holds, by login or by e-mail.
func TestAReplyToAStreamOfANewCredentialGoesBesideIt(t *testing.T) {
	for _, name := range []string{"alice", "alice@example.com"} {
		t.Run(name, func(t *testing.T) {
			up, addr := startUserLineUpstream(t)
			c := startCaddy(t, userLineSite(addr, "\tqueue_timeout 2s\n"))
			sid := openSession(t, c.url, basic(name, "pw-0"))
			// The client's next requests carry a password not proven yet,
			// as after session_ttl, a restart, or on another instance.
			resp := send(t, c.url, basic(name, "pw-1"), sid, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"stream"}}`)
			defer resp.Body.Close()
			if resp.Header.Get("Content-Type") != "text/event-stream" {
				t.Fatalf("the streaming call: status %d", resp.StatusCode)
			}
			line, err := bufio.NewReader(resp.Body).ReadString('\n')
			if err != nil || !strings.Contains(line, "elicitation/create") {
				t.Fatalf("the stream's first event: %q, %v", line, err)
			}
			// The reply carries yet another password, whose proof would not
			// end before queue_timeout: it waits for none.
			release := up.holdProofs()
			defer release()
			if status := statusOf(send(t, c.url, basic(name, "pw-2"), sid, `{"jsonrpc":"2.0","id":"ask-1","result":{"action":"accept"}}`)); status != http.StatusAccepted {
				t.Fatalf("the reply the stream waits for: status %d, want 202", status)
			}
		})
	}
}

// A request joins its session's turn first and its line second: a later
// request of the session never reaches the server before an earlier one
// that waited for its credential's proof or for the line.
func TestASessionsRequestsKeepTheirOrderAcrossTheProofAndTheLine(t *testing.T) {
	up, addr := startUserLineUpstream(t)
	c := startCaddy(t, userLineSite(addr, "\tqueue_timeout 5s\n"))
	proven := basic("alice", "pw-0")
	other := openSession(t, c.url, proven)
	sid := openSession(t, c.url, proven)
	// Another client of alice's, with a password not proven before,
	// holds her line.
	holding := sendAsyncAs(t, c.url, basic("alice", "pw-2"), other, rpcRequest("1", "tools/list"), "X-Test-Hold", "1")
	up.awaitHeld(t)
	first := sendAsyncAs(t, c.url, basic("alice", "pw-1"), sid, rpcRequest("2", "prompts/list"))
	c.awaitWaiting(t, 1)
	second := sendAsyncAs(t, c.url, proven, sid, rpcRequest("3", "resources/list"))
	c.awaitWaiting(t, 2)
	up.releaseAll()
	for _, done := range []<-chan int{holding, first, second} {
		if status := <-done; status != http.StatusOK {
			t.Errorf("status %d", status)
		}
	}
	got := up.arrivals(sid)
	want := []string{"notifications/initialized", "prompts/list", "resources/list"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("the session's requests reached the server as %q, want %q", got, want)
	}
}

// A request held at its session's gate holds nothing else: the session's
// own notifications/initialized, of a credential not proven yet, opens
// the gate.
func TestARequestHeldAtItsGateDoesNotHoldBackItsInitialized(t *testing.T) {
	_, addr := startUserLineUpstream(t)
	c := startCaddy(t, userLineSite(addr, "\tqueue_timeout 5s\n\tinit_timeout 3s\n\ton_init_timeout reject\n"))
	resp := send(t, c.url, basic("alice", "pw-0"), "", initializeBody)
	statusOf(resp)
	sid := resp.Header.Get("Mcp-Session-Id")
	fresh := basic("alice", "pw-1")
	held := sendAsyncAs(t, c.url, fresh, sid, rpcRequest("2", "tools/list"))
	c.awaitWaiting(t, 1)
	if status := statusOf(send(t, c.url, fresh, sid, initializedBody)); status != http.StatusAccepted {
		t.Fatalf("notifications/initialized behind a request held at the gate: status %d, want 202", status)
	}
	if status := <-held; status != http.StatusOK {
		t.Fatalf("the request held at the gate: status %d, want 200", status)
	}
}

// A flood of wrong passwords for alice, one repeated from many threads
// and new ones from a few, neither locks alice's new clients out nor
// joins her line: a refusal is kept, and a user's proofs are bounded.
func TestAFloodOfWrongPasswordsLocksNoNewClientOut(t *testing.T) {
	up, addr := startUserLineUpstream(t)
	c := startCaddy(t, userLineSite(addr, "\tmax_queue 4\n\tqueue_timeout 5s\n"))
	fullBefore := c.metric(t, `caddy_mcp_serializer_rejections_total{reason="proof_full"}`)
	stop := make(chan struct{})
	var flood sync.WaitGroup
	var answered atomic.Int64
	for thread := range 18 {
		flood.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				password := "wrong" // one refusal, kept
				if thread < 2 {
					password = fmt.Sprintf("wrong-%d-%d", thread, n) // a proof each
				}
				req, _ := http.NewRequest(http.MethodPost, c.url, strings.NewReader(initializeBody))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", basic("alice", password))
				resp, err := do(http.DefaultClient, req)
				if err != nil {
					continue
				}
				if statusOf(resp) == http.StatusUnauthorized {
					answered.Add(1)
				}
			}
		})
	}
	wait.Until(t, "the flood answered", func() bool { return answered.Load() >= 20 })
	for client := range 5 {
		if err := connectAs(c.url, basic("alice", fmt.Sprintf("pw-%d", client))); err != nil {
			t.Errorf("alice's new client %d during the flood: %v", client, err)
		}
	}
	close(stop)
	flood.Wait()
	if n := up.mostAtOnce("alice"); n != 1 {
		t.Errorf("the upstream ran %d of alice's requests at once, want 1", n)
	}
	if full := c.metric(t, `caddy_mcp_serializer_rejections_total{reason="proof_full"}`) - fullBefore; full != 0 {
		t.Errorf("%v requests refused proof_full", full)
	}
}

// More credentials of one user waiting for their proofs than max_queue
// are refused 429 with a reason of their own, and nothing of them is
// forwarded.
func TestAUsersProofsAreBoundedByMaxQueue(t *testing.T) {
	up, addr := startUserLineUpstream(t)
	releaseProofs := up.holdProofs()
	c := startCaddy(t, userLineSite(addr, "\tmax_queue 2\n\tqueue_timeout 10s\n"))
	before := c.metric(t, `caddy_mcp_serializer_rejections_total{reason="proof_full"}`)
	var waiting []<-chan int
	for n := range 3 { // one in flight, two waiting
		waiting = append(waiting, sendAsyncAs(t, c.url, basic("alice", fmt.Sprintf("pw-%d", n)), "", rpcRequest("1", "tools/list")))
		wait.Until(t, "the proof sent or waiting", func() bool { return up.proofs.Load() == 1 && c.waiting(t) == n })
	}
	resp := send(t, c.url, basic("alice", "pw-9"), "", rpcRequest("1", "tools/list"))
	rpcErr := expectRPCError(t, resp, http.StatusTooManyRequests, "1")
	if !strings.Contains(rpcErr.Error.Message, "proof") {
		t.Errorf("the refusal says %q; want it to name the proof", rpcErr.Error.Message)
	}
	if got := c.metric(t, `caddy_mcp_serializer_rejections_total{reason="proof_full"}`) - before; got != 1 {
		t.Errorf("rejections_total{reason=\"proof_full\"} rose by %v, want 1", got)
	}
	releaseProofs()
	for _, w := range waiting {
		if status := <-w; status != http.StatusOK {
			t.Errorf("a credential that waited for its proof: status %d", status)
		}
	}
	if n := up.proofs.Load(); n != 3 {
		t.Errorf("%d proofs sent, want 3: the refused credential's was not", n)
	}
}

// The proof goes through the handlers after the module with what the
// handlers before it set: php_fastcgi finds index.php by the root
// variable, without which WordPress's route would be a 404.
func TestTheProofSeesTheVariablesTheHandlersBeforeTheModuleSet(t *testing.T) {
	proofs := make(chan string, 4)
	_, addr := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if r.URL.Path == proofPath {
			proofs <- r.Header.Get("X-Root")
			if r.Header.Get("X-Root") != "/srv/wp" {
				w.WriteHeader(http.StatusNotFound)
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`)
	})
	c := startCaddy(t, fmt.Sprintf("root * /srv/wp\nmcp_serializer {\n\tkey basic_user\n}\nreverse_proxy %s {\n\theader_up X-Root {http.vars.root}\n}", addr))
	if status := statusOf(send(t, c.url, basic("alice", "pw-0"), "", rpcRequest("1", "tools/list"))); status != http.StatusOK {
		t.Errorf("a right credential: status %d, want 200", status)
	}
	if root := <-proofs; root != "/srv/wp" {
		t.Errorf("the proof reached the upstream with root %q, want /srv/wp", root)
	}
}

// A reload that changes key_proof proves credentials again: a verdict of
// the old route, which may have accepted anyone, does not hold.
func TestAReloadThatChangesKeyProofDropsTheOldRoutesVerdicts(t *testing.T) {
	up, _ := startUserLineUpstream(t)
	open := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == "/wp-json/" {
			io.WriteString(w, `{"name":"site"}`) // WordPress's REST index: 200 to anyone
			return
		}
		up.ServeHTTP(w, r)
	}))
	t.Cleanup(open.Close)
	addr := open.Listener.Addr().String()
	c := startCaddy(t, userLineSite(addr, "\tkey_proof /wp-json/\n\tqueue_timeout 2s\n"))
	stranger := basic("alice", "wrong-1")
	if status := statusOf(send(t, c.url, stranger, "", rpcRequest("1", "tools/list"))); status != http.StatusUnauthorized {
		t.Fatalf("the stranger's request under the old key_proof: status %d, want the upstream's 401", status)
	}
	c.reload(t, userLineSite(addr, "\tqueue_timeout 2s\n")) // key_proof: WordPress's users/me
	holding := sendAsyncAs(t, c.url, basic("alice", "pw-0"), "", rpcRequest("2", "tools/list"), "X-Test-Hold", "1")
	up.awaitHeld(t)
	status := statusOf(send(t, c.url, stranger, "", rpcRequest("3", "tools/list")))
	up.releaseAll()
	<-holding
	if status != http.StatusUnauthorized {
		t.Errorf("the stranger's wrong password after the reload: status %d, want the upstream's 401 in no line", status)
	}
}

// A 403 at key_proof is not WordPress refusing a password but something
// in front of the route (a rule against user enumeration that lets only
// requests with a login cookie through): the request is answered 503
// naming key_proof, with its own id, and never sent on in no line, by
// login or by e-mail.
func TestAProofAnswered403IsUndecidedNotARefusal(t *testing.T) {
	up, addr := startUserLineUpstream(t)
	c := startCaddy(t, fmt.Sprintf(`mcp_serializer {
	key basic_user
}
@userenum {
	path /wp-json/wp/v2/users*
	not header_regexp Cookie wordpress_logged_in
}
respond @userenum 403
reverse_proxy %s`, addr))
	for _, name := range []string{"alice", "alice@example.com"} {
		before := c.metric(t, `caddy_mcp_serializer_rejections_total{reason="proof_undecided"}`)
		resp := send(t, c.url, basic(name, "pw-0"), "", rpcRequest("7", "tools/list"))
		rpcErr := expectRPCError(t, resp, http.StatusServiceUnavailable, "7")
		if !strings.Contains(rpcErr.Error.Message, "key_proof") {
			t.Errorf("%s: the answer does not name key_proof: %q", name, rpcErr.Error.Message)
		}
		if got := c.metric(t, `caddy_mcp_serializer_rejections_total{reason="proof_undecided"}`) - before; got != 1 {
			t.Errorf("%s: rejections_total{reason=\"proof_undecided\"} rose by %v, want 1", name, got)
		}
	}
	if n := up.mostAtOnce("alice"); n != 0 {
		t.Errorf("a request went upstream (%d at once) though its credential was not proven", n)
	}
}

// A proof whose requests have all left is called off: a stranger naming
// made-up users and hanging up leaves no proof holding the table, and
// the site's users still get new sessions.
func TestAProofIsCalledOffOnceItsRequestsHaveLeft(t *testing.T) {
	up, addr := startUserLineUpstream(t)
	releaseProofs := up.holdProofs()
	c := startCaddy(t, userLineSite(addr, "\tmax_sessions 4\n\tqueue_timeout 30s\n"))
	ctx, hangUp := context.WithCancel(context.Background())
	var left sync.WaitGroup
	for i := range 4 {
		left.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.url, strings.NewReader(rpcRequest("1", "tools/list")))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", basic(fmt.Sprintf("made-up-%d", i), "pw"))
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		})
	}
	wait.Until(t, "the made-up users' proofs sent", func() bool { return up.proofs.Load() == 4 })
	hangUp()
	left.Wait()
	wait.Until(t, "the proofs called off", func() bool { return up.proofsCalledOff.Load() == 4 })
	releaseProofs()
	resp := send(t, c.url, basic("alice", "pw-0"), "", initializeBody)
	if status := statusOf(resp); status != http.StatusOK {
		t.Errorf("alice's new session once the stranger hung up: status %d, want 200", status)
	}
}

// A later request of a session whose credential is proven does not reach
// the server before an earlier one whose proof is still on its way, by
// login or by e-mail.
func TestALaterRequestWithAProvenPasswordDoesNotOvertakeAnEarlierOneInProof(t *testing.T) {
	for _, name := range []string{"alice", "alice@example.com"} { // by login, by e-mail
		t.Run(name, func(t *testing.T) {
			up, addr := startUserLineUpstream(t)
			c := startCaddy(t, userLineSite(addr, "\tqueue_timeout 10s\n"))
			proven := basic(name, "pw-0")
			sid := openSession(t, c.url, proven)
			releaseProofs := up.holdProofs()
			proofsBefore := up.proofs.Load()
			first := sendAsyncAs(t, c.url, basic(name, "pw-1"), sid, rpcRequest("2", "prompts/list"))
			wait.Until(t, "the first request's proof sent", func() bool { return up.proofs.Load() == proofsBefore+1 })
			second := sendAsyncAs(t, c.url, proven, sid, rpcRequest("3", "resources/list"))
			// The second either waits behind the first or, were the proof
			// before the session's turn, reaches the server first.
			wait.Until(t, "the second request waiting or served", func() bool { return c.waiting(t) == 1 || len(up.arrivals(sid)) == 2 })
			releaseProofs()
			for _, done := range []<-chan int{first, second} {
				if status := <-done; status != http.StatusOK {
					t.Errorf("status %d", status)
				}
			}
			if got, want := strings.Join(up.arrivals(sid), " "), "notifications/initialized prompts/list resources/list"; got != want {
				t.Errorf("the session's requests reached the server as %q, want %q", got, want)
			}
		})
	}
}

// WordPress takes a user name with an "@" as the user's e-mail address:
// a client signing in that way is in the line of the user its proof
// names, with the clients that sign in by login.
func TestAUserSigningInByEmailSharesTheLineOfTheLogin(t *testing.T) {
	up, addr := startUserLineUpstream(t)
	c := startCaddy(t, userLineSite(addr, "\tqueue_timeout 10s\n"))
	byLogin := sendAsyncAs(t, c.url, basic("alice", "pw-0"), "", rpcRequest("1", "tools/list"), "X-Test-Hold", "1")
	up.awaitHeld(t)
	byEmail := sendAsyncAs(t, c.url, basic("alice@example.com", "pw-1"), "", rpcRequest("2", "tools/list"))
	// It waits behind the login's request, or, in a line of its own,
	// reaches the server beside it.
	wait.Until(t, "the e-mail's request waiting or served", func() bool { return c.waiting(t) == 1 || up.mostAtOnce("alice") == 2 })
	up.releaseAll()
	for _, done := range []<-chan int{byLogin, byEmail} {
		if status := <-done; status != http.StatusOK {
			t.Errorf("status %d", status)
		}
	}
	if n := up.mostAtOnce("alice"); n != 1 {
		t.Errorf("the upstream ran %d of alice's requests at once, by login and by e-mail, want 1", n)
	}
}
