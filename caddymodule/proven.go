package caddymodule

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// With key basic_user, anyone can name a user in Basic credentials; only
// the MCP server can tell whether the password is right. A password's
// requests share its user's queue freely once the server has accepted it
// (a 2xx answer); until then they also wait for the user's other
// unproven requests, one at a time, so that someone who only knows the
// name holds the user's queue for one request at a time at most.

// provenPasswords remembers the credentials the MCP server accepted, by
// keyed hash, each until session_ttl after it was last accepted. It
// belongs to the table, so that a reload keeps it.
type provenPasswords struct {
	mu    sync.Mutex
	until map[string]time.Time
	max   int
}

func newProvenPasswords(max int) *provenPasswords {
	return &provenPasswords{until: map[string]time.Time{}, max: max}
}

// proven reports whether the server accepted password and that has not
// expired.
func (p *provenPasswords) proven(password string, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	until, ok := p.until[password]
	if ok && !now.Before(until) {
		delete(p.until, password)
		return false
	}
	return ok
}

// accepted records that the server accepted password, until until. A full
// record forgets one credential first, whichever the map yields: only a
// credential the server accepted can be added, and a forgotten one is
// proven again by its next accepted request.
func (p *provenPasswords) accepted(password string, until time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.until[password]; !ok && len(p.until) >= p.max {
		for old := range p.until {
			delete(p.until, old)
			break
		}
	}
	p.until[password] = until
}

// len is how many credentials are proven, expired ones included.
func (p *provenPasswords) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.until)
}

// awaitProof makes a request with key basic_user whose password is not
// yet proven wait for its user's other unproven requests, at most
// queue_timeout: the returned turn holds that line until the request
// ends. Any other request goes at once (a zero turn). password is the
// keyed hash of the request's credentials with key basic_user, for
// answered.
func (h *Handler) awaitProof(r *http.Request, info *requestInfo) (unproven serializer.Turn, password string, err error) {
	line, lined := info.owned()
	if h.Key != keyBasicUser || !lined {
		return serializer.Turn{}, "", nil
	}
	password = h.hashKey(provenSpelling(r))
	if h.proven.proven(password, time.Now()) {
		return serializer.Turn{}, password, nil
	}
	unproven, err = h.table.AcquireKeyed(r.Context(), line+" unproven", 0)
	return unproven, password, err
}

// provenSpelling is what a proof is kept under: the credentials as
// WordPress compares them (wordpressLogin, wordpressPassword), so that one
// password written in endless spellings is proven once rather than
// pushing other users' proofs out.
func provenSpelling(r *http.Request) string {
	user, password, ok := basicCredentials(phpAuthorization(r))
	if !ok {
		return r.Header.Get("Authorization")
	}
	return "proof " + wordpressLogin(user) + ":" + wordpressPassword(password)
}

// answered records, with key basic_user, that the MCP server accepted the
// credentials whose hash is password if status is a 2xx.
func (h *Handler) answered(password string, status int) {
	if password != "" && status >= 200 && status <= 299 {
		h.proven.accepted(password, time.Now().Add(h.settings.SessionTTL))
	}
}

// keyAnswered claims, with order owner, the key of a request the upstream
// answered with a 2xx for session_ttl: before, its claim lives 30 s.
func (h *Handler) keyAnswered(r *http.Request, info *requestInfo, status int) {
	if h.owners == nil || status < 200 || status > 299 {
		return
	}
	if id, keyed := info.owned(); keyed {
		h.owners.KeyAnswered(context.WithoutCancel(r.Context()), h.ownerStore, id, h.hereAddr(r))
	}
}
