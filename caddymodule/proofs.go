package caddymodule

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/mcpserializer/caddy-mcp-serializer/internal/warnlimit"
	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// With key basic_user anyone can name a user in Basic credentials, and
// user names are public; only the MCP server can tell a right password.
// So a credential joins its user's line only once the server has accepted
// it in a request of the module's own: a GET of key_proof that carries
// the Authorization header and nothing the client could authenticate
// with otherwise (no cookie, no body), sent once per credential at a
// time and one at a time per user. The verdict is kept by keyed hash. A
// refused credential's requests go upstream in no line, where the server
// answers them as it would without the module.

// defaultKeyProof is key_proof's default: WordPress's route that answers
// 2xx to a right credential and 401 to a wrong one, naming the user's
// login (context=edit, which a user may read of itself).
const defaultKeyProof = "/wp-json/wp/v2/users/me?context=edit"

// refusedFor is how long a refusal is kept: a flood of one wrong password
// costs the server one proof per refusedFor, and a password created just
// after it was refused works that much later at most.
const refusedFor = 10 * time.Second

// verdict is what a proof found.
type verdict int

const (
	verdictAccepted  verdict = iota + 1 // a 2xx: the credential joins its user's line
	verdictRefused                      // 401: it joins none
	verdictUndecided                    // any other answer, or none
	verdictFull                         // the user's proofs waiting were max_queue already
	verdictTimeout                      // the user's other proofs took queue_timeout
	verdictAbandoned                    // every request waiting for it left
)

// Errors a request whose credential could not be proven is answered by.
var (
	errProofFull      = errors.New("too many credentials of this user waiting for their proof")
	errProofTimeout   = errors.New("timed out waiting for the credential's proof")
	errProofUndecided = errors.New("the MCP server answered the credential's proof with neither 2xx nor 401")
)

// proofCall is a proof in flight; done is closed once verdict is set.
// It is called off once no request waits for it any more (waiters, under
// the proofs' lock), so that requests whose clients left hold nothing.
type proofCall struct {
	done    chan struct{}
	verdict verdict
	login   string // the login the server named in its 2xx, if it did
	waiters int
	cancel  context.CancelFunc
}

// proofs keeps, by keyed hash, the credentials the MCP server accepted
// (until session_ttl after their proof, with the login the server named,
// if it did) and refused (for refusedFor), each kind at most max, and the
// proofs in flight. It belongs to the table, so that a reload keeps it.
type proofs struct {
	mu       sync.Mutex
	accepted map[string]time.Time
	logins   map[string]string // of accepted credentials
	refused  map[string]time.Time
	inFlight map[string]*proofCall
	max      int
}

func newProofs(max int) *proofs {
	return &proofs{accepted: map[string]time.Time{}, logins: map[string]string{}, refused: map[string]time.Time{},
		inFlight: map[string]*proofCall{}, max: max}
}

// login is the login the server named when it accepted cred ("" if it
// named none); ok is false if cred is not accepted.
func (p *proofs) login(cred string, now time.Time) (login string, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !kept(p.accepted, cred, now) {
		delete(p.logins, cred)
		return "", false
	}
	return p.logins[cred], true
}

// lookup returns the kept verdict on credential cred, or else the proof
// in flight for it; lead is true when the caller has just started that
// proof and must send it and settle it.
func (p *proofs) lookup(cred string, now time.Time) (v verdict, call *proofCall, lead bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if kept(p.accepted, cred, now) {
		return verdictAccepted, nil, false
	}
	delete(p.logins, cred)
	if kept(p.refused, cred, now) {
		return verdictRefused, nil, false
	}
	if call = p.inFlight[cred]; call != nil {
		call.waiters++
		return 0, call, false
	}
	call = &proofCall{done: make(chan struct{}), waiters: 1}
	p.inFlight[cred] = call
	return 0, call, true
}

// started gives the proof call its cancel, before its leader can leave.
func (p *proofs) started(call *proofCall, cancel context.CancelFunc) {
	p.mu.Lock()
	call.cancel = cancel
	p.mu.Unlock()
}

// left records that a request stopped waiting for call, calling the proof
// off if none waits any more.
func (p *proofs) left(call *proofCall) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if call.waiters--; call.waiters == 0 && call.cancel != nil {
		call.cancel()
	}
}

// kept reports whether m holds key until after now, forgetting it if its
// time is up.
func kept(m map[string]time.Time, key string, now time.Time) bool {
	until, ok := m[key]
	if ok && !now.Before(until) {
		delete(m, key)
		return false
	}
	return ok
}

// settle ends the proof call of cred with v, keeping an acceptance until
// acceptedUntil and a refusal for refusedFor. A full record forgets one
// verdict of the same kind first, whichever the map yields: a refusal
// never pushes an acceptance out, and only a right credential can add one.
func (p *proofs) settle(cred string, call *proofCall, v verdict, now, acceptedUntil time.Time) {
	p.mu.Lock()
	switch v {
	case verdictAccepted:
		delete(p.logins, keep(p.accepted, cred, acceptedUntil, p.max))
		if call.login != "" {
			p.logins[cred] = call.login
		} else {
			delete(p.logins, cred)
		}
	case verdictRefused:
		keep(p.refused, cred, now.Add(refusedFor), p.max)
	}
	delete(p.inFlight, cred)
	p.mu.Unlock()
	call.verdict = v
	close(call.done)
}

// keep records key in m until until, forgetting another if m holds max
// already; it returns the key forgotten, "" for none.
func keep(m map[string]time.Time, key string, until time.Time, max int) (forgotten string) {
	if _, ok := m[key]; !ok && len(m) >= max {
		for old := range m {
			delete(m, old)
			forgotten = old
			break
		}
	}
	m[key] = until
	return forgotten
}

// len is how many verdicts are kept, expired ones included.
func (p *proofs) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.accepted) + len(p.refused)
}

// admission is, with key basic_user, what decides whether a request of
// line, its user's, joins it (serializer.Line's Admit): only once its
// credential is proven, and, when its line is pending (loginPending), the
// line of the login its proof named. Any other request joins its line as
// it is.
func (h *Handler) admission(r *http.Request, next caddyhttp.Handler, line string, pending bool) serializer.Line {
	if h.Key != keyBasicUser || (line == "" && !pending) {
		return serializer.Line{Key: line}
	}
	return serializer.Line{Key: line, Admit: func(ctx context.Context) (string, error) {
		// A pending line's proofs wait in the queue of the name as sent,
		// and its line is the login the proof named.
		queue := line
		if pending {
			queue = h.keyOf(r)
		}
		proven, err := h.prove(ctx, r, next, queue)
		if err != nil || !proven {
			return "", err
		}
		if pending {
			return h.keyOf(r), nil
		}
		return line, nil
	}}
}

// prove reports whether the MCP server accepts r's credentials, waiting,
// within ctx, for a proof if none is kept. A verdict other than accepted
// or refused is an error to answer the request with.
func (h *Handler) prove(ctx context.Context, r *http.Request, next caddyhttp.Handler, line string) (bool, error) {
	cred := h.proofKey(r)
	start := time.Now()
	v, waited := verdictAbandoned, false
	// A proof called off as this request joined it is sent again.
	for v == verdictAbandoned {
		var call *proofCall
		var lead bool
		if v, call, lead = h.proofs.lookup(cred, time.Now()); call == nil {
			break
		}
		if lead {
			proof, vars := h.proofRequest(r)
			proofCtx, cancel := context.WithTimeout(proof.Context(), h.settings.QueueTimeout)
			h.proofs.started(call, cancel)
			go h.sendProof(proof.WithContext(proofCtx), vars, next, line, cred, call)
		}
		select {
		case <-call.done:
			v = call.verdict
		case <-ctx.Done():
			h.proofs.left(call)
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return false, errProofTimeout
			}
			return false, ctx.Err()
		}
		waited = true
	}
	if waited {
		metrics.proofWait.Observe(time.Since(start).Seconds())
	}
	switch v {
	case verdictAccepted:
		return true, nil
	case verdictRefused:
		return false, nil
	case verdictFull:
		return false, errProofFull
	case verdictTimeout:
		return false, errProofTimeout
	}
	return false, errProofUndecided
}

// proofKey is what r's credentials' verdict is kept under: by route too,
// so that a reload that changes key_proof proves them again.
func (h *Handler) proofKey(r *http.Request) string {
	return h.hashKey(h.keyProof.String() + " " + provenSpelling(r))
}

// loginPending reports, with key basic_user, credentials whose line is
// known only once they are proven: WordPress takes a user name with an
// "@" that names no login as an e-mail address, and the proof's answer
// names the login (keyOf), so that the user's line is one whichever way
// each client signs in. Other names are their login.
func (h *Handler) loginPending(r *http.Request) bool {
	if h.Key != keyBasicUser {
		return false
	}
	user, ok := basicUser(phpAuthorization(r))
	if !ok || !strings.Contains(user, "@") {
		return false
	}
	_, known := h.proofs.login(h.proofKey(r), time.Now())
	return !known
}

// proofRequest is the GET of key_proof that proves r's credentials: the
// site, client address and TLS state of r (an app may require HTTPS for
// passwords), its Authorization and forwarding headers, nothing else.
// It does not end with r. vars is a copy of r's variables, which the
// handlers before this one set (root, which php_fastcgi needs).
func (h *Handler) proofRequest(r *http.Request) (proof *http.Request, vars map[string]any) {
	target := *r.URL
	target.Path, target.RawPath, target.RawQuery = h.keyProof.Path, h.keyProof.RawPath, h.keyProof.RawQuery
	proof = (&http.Request{
		Method: http.MethodGet, URL: &target, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Accept": {"application/json"}}, Body: http.NoBody,
		Host: r.Host, RemoteAddr: r.RemoteAddr, RequestURI: target.RequestURI(),
	}).WithContext(context.WithoutCancel(r.Context()))
	for _, name := range []string{"Authorization", "Forwarded", "X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host"} {
		if values := r.Header.Values(name); len(values) > 0 {
			proof.Header[name] = append([]string(nil), values...)
		}
	}
	if r.TLS != nil {
		state := *r.TLS
		proof.TLS = &state
	}
	if orig, ok := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any); ok {
		vars = maps.Clone(orig)
	}
	return proof, vars
}

// sendProof sends proof through the handlers after this one, to the MCP
// server, once the user's earlier proofs are done, and settles call with
// what it answered. Its context bounds it by queue_timeout and ends it
// once no request waits for it.
func (h *Handler) sendProof(proof *http.Request, vars map[string]any, next caddyhttp.Handler, line, cred string, call *proofCall) {
	v := verdictUndecided
	status := 0
	defer func() {
		metrics.proofs.WithLabelValues(v.String()).Inc()
		if v == verdictUndecided {
			h.warnUndecided(status)
		}
		now := time.Now()
		h.proofs.settle(cred, call, v, now, now.Add(h.settings.SessionTTL))
	}()
	ctx := proof.Context()
	defer call.cancel()
	turn, err := h.table.AcquireAside(ctx, line+" proof")
	switch {
	case errors.Is(err, serializer.ErrQueueFull):
		v = verdictFull
		return
	case errors.Is(ctx.Err(), context.Canceled):
		v = verdictAbandoned
		return
	case err != nil:
		v = verdictTimeout
		return
	}
	defer turn.Done(0)
	server, _ := proof.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	rec := &proofRecorder{statusRecorder: statusRecorder{header: http.Header{}}}
	proof = caddyhttp.PrepareRequest(proof.WithContext(ctx), caddy.NewReplacer(), rec, server)
	if own, ok := proof.Context().Value(caddyhttp.VarsCtxKey).(map[string]any); ok {
		for name, value := range vars {
			if _, set := own[name]; !set {
				own[name] = value
			}
		}
	}
	err = next.ServeHTTP(rec, proof)
	status = statusOf(rec.status, err)
	switch {
	case errors.Is(ctx.Err(), context.Canceled):
		v = verdictAbandoned
	case ctx.Err() != nil:
		v = verdictTimeout
	case status >= 200 && status <= 299:
		v = verdictAccepted
		if call.login = rec.login(); call.login == "" {
			if user, _ := basicUser(phpAuthorization(proof)); strings.Contains(user, "@") {
				h.warnNoLogin()
			}
		}
	case status == http.StatusUnauthorized:
		v = verdictRefused
	}
}

func (v verdict) String() string {
	switch v {
	case verdictAccepted:
		return "accepted"
	case verdictRefused:
		return "refused"
	case verdictFull:
		return "full"
	case verdictTimeout:
		return "timeout"
	case verdictAbandoned:
		return "abandoned"
	}
	return "undecided"
}

// undecidedWarns spaces the WARNs of proofs the server answered with
// neither 2xx nor 401. A 403 is one: a rule that blocks the route for
// requests without a login cookie (against user enumeration) answers
// every proof 403, and taking that as a wrong password would take every
// request out of its line without a word.
var undecidedWarns warnlimit.Limiter

func (h *Handler) warnUndecided(status int) {
	if ok, suppressed := undecidedWarns.Allow(time.Now()); ok {
		h.logger.Warn("key basic_user: the MCP server answered a credential's proof (key_proof) with neither 2xx nor 401; "+
			"the request was answered 503; check that key_proof names a route that answers a right credential with 2xx",
			zap.String("key_proof", h.keyProof.String()), zap.Int("status", status), zap.Int("suppressed", suppressed))
	}
}

// noLoginWarns spaces the WARNs of proofs that name no login for a
// client signing in by e-mail.
var noLoginWarns warnlimit.Limiter

func (h *Handler) warnNoLogin() {
	if ok, suppressed := noLoginWarns.Allow(time.Now()); ok {
		h.logger.Warn("key basic_user: key_proof accepted a client signing in by e-mail address but named no username in its JSON answer; "+
			"that client gets a line of its own, beside its user's other clients; WordPress names it at /wp-json/wp/v2/users/me?context=edit",
			zap.String("key_proof", h.keyProof.String()), zap.Int("suppressed", suppressed))
	}
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

// proofRecorder keeps the first bytes of a proof's answer, which may name
// the user's login (WordPress's users/me with context=edit: username).
type proofRecorder struct {
	statusRecorder
	body []byte
}

// proofAnswerMax is how much of a proof's answer is read for the login.
const proofAnswerMax = 64 << 10

func (w *proofRecorder) Write(b []byte) (int, error) {
	w.statusRecorder.Write(b)
	if room := proofAnswerMax - len(w.body); room > 0 {
		w.body = append(w.body, b[:min(len(b), room)]...)
	}
	return len(b), nil
}

// login is the username the answer's object names at its top level, ""
// if it names none within proofAnswerMax. It reads token by token, so
// that a long profile after it (a description, fields plugins add) does
// not hide it.
func (w *proofRecorder) login() string {
	dec := json.NewDecoder(bytes.NewReader(w.body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return ""
	}
	for dec.More() {
		name, err := dec.Token()
		if err != nil {
			return ""
		}
		if name == "username" {
			var login string
			if dec.Decode(&login) != nil {
				return ""
			}
			return login
		}
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return ""
		}
	}
	return ""
}

// parseKeyProof reads key_proof: a path, with a query if wanted.
func parseKeyProof(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "" || u.Host != "" || len(u.Path) == 0 || u.Path[0] != '/' {
		return nil, errors.New("key_proof must be a path on the same site, such as " + defaultKeyProof)
	}
	return u, nil
}
