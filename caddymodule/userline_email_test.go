package caddymodule_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/mcpserializer/caddy-mcp-serializer/caddymodule"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/testclock"
	"github.com/mcpserializer/caddy-mcp-serializer/internal/wait"
)

// Behind a round-robin front, an instance that has not met a credential
// signing in by e-mail does not prove it before it forwards the session's
// request: it is routed by its session, and its owner, which knows the
// credential, serves it. Proofs are held here: one sent on the way would
// hold the request until queue_timeout.
func TestAnEmailSessionsRequestGoesUnprovenToItsOwner(t *testing.T) {
	up, addr := startUserLineUpstream(t)
	in := startOwnerInstances(t, addr, "key basic_user", "queue_timeout 3s")
	cred := basic("alice@example.com", "pw-0")
	csid := openSession(t, in.a, cred) // a proves the credential and owns the session
	release := up.holdProofs()
	defer release()
	before := up.proofs.Load()
	if status := statusOf(send(t, in.b, cred, csid, rpcRequest("2", "prompts/list"))); status != http.StatusOK {
		t.Fatalf("the session's request through b, which never met the credential: status %d, want 200", status)
	}
	if n := up.proofs.Load() - before; n != 0 {
		t.Errorf("%d proofs sent on the way to the session's owner, want none", n)
	}
}

// queue_timeout bounds a request's proof and line together, whether it
// signs in by login or by e-mail, whose proof comes before its key is
// known. The table runs on a hand-moved clock: 40 s of proof queue, then
// 40 s in the line, of 60 s.
func TestAnEmailRequestsProofCountsAgainstItsQueueTimeout(t *testing.T) {
	for _, tc := range []struct{ name, late string }{
		{"alice", "session"}, {"alice@example.com", "session"}, {"alice", "sessionless"}, {"alice@example.com", "sessionless"},
	} {
		name := tc.name
		t.Run(name+" "+tc.late, func(t *testing.T) {
			clock := testclock.New()
			caddymodule.UseTableClock(t, clock)
			up, addr := startUserLineUpstream(t)
			c := startCaddy(t, userLineSite(addr, "\tqueue_timeout 1m\n"))
			sid := openSession(t, c.url, basic(name, "pw-0"))
			other := openSession(t, c.url, basic("alice", "pw-0"))
			holding := sendAsyncAs(t, c.url, basic("alice", "pw-0"), other, rpcRequest("1", "tools/list"), "X-Test-Hold", "1")
			up.awaitHeld(t) // alice's line is held
			releaseProofs := sync.OnceFunc(up.holdProofs())
			defer releaseProofs()
			before := up.proofs.Load()
			// Another new password of the same name holds the name's proof queue.
			blocker := sendAsyncAs(t, c.url, basic(name, "pw-9"), "", rpcRequest("8", "tools/list"))
			wait.Until(t, "the blocker's proof sent", func() bool { return up.proofs.Load() == before+1 })
			if tc.late == "sessionless" {
				sid = ""
			}
			late := sendAsyncAs(t, c.url, basic(name, "pw-1"), sid, rpcRequest("2", "prompts/list"))
			c.awaitWaiting(t, 1) // its proof waits in the user's proof queue
			clock.Advance(40_000_000_000)
			releaseProofs()
			c.awaitWaiting(t, 2) // the blocker and it wait in alice's line
			clock.Advance(40_000_000_000)
			up.releaseAll()
			<-holding
			<-blocker
			if status := <-late; status != http.StatusServiceUnavailable {
				t.Errorf("after 40 s for its proof and 40 s in the line, queue_timeout 60 s: status %d, want 503", status)
			}
		})
	}
}

// The login is read from a proof's answer token by token: a profile
// longer than what is kept of the answer (a description the user edits,
// fields plugins add) does not take an e-mail client out of its user's
// line.
func TestALongProfileDoesNotTakeAnEmailClientOutOfItsLine(t *testing.T) {
	up, _ := startUserLineUpstream(t)
	long := strings.Repeat("x", 70<<10)
	wp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == proofPath && actingUser(r) == "bob" {
			fmt.Fprintf(w, `{"id":2,"username":"bob","description":%q}`, long)
			return
		}
		up.ServeHTTP(w, r)
	}))
	t.Cleanup(wp.Close)
	c := startCaddy(t, userLineSite(wp.Listener.Addr().String(), "\tqueue_timeout 10s\n"))
	byLogin := sendAsyncAs(t, c.url, basic("bob", "pw-0"), "", rpcRequest("1", "tools/list"), "X-Test-Hold", "1")
	up.awaitHeld(t)
	byEmail := sendAsyncAs(t, c.url, basic("bob@example.com", "pw-1"), "", rpcRequest("2", "tools/list"))
	wait.Until(t, "the e-mail's request waiting or served", func() bool { return c.waiting(t) == 1 || up.mostAtOnce("bob") == 2 })
	up.releaseAll()
	<-byLogin
	<-byEmail
	if n := up.mostAtOnce("bob"); n != 1 {
		t.Errorf("the upstream ran %d of bob's requests at once, by login and by e-mail, want 1", n)
	}
}
