package caddymodule

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// A key's value may be a credential (an Authorization header), so the
// handler keeps only a keyed hash of it: in its table, in the state
// engine and in logs, where a plain hash would let anyone who reads them
// test guesses of a weak password offline.

// processKeySecret is the secret a key's values are hashed with when the
// instance shares no state: one per process, so that it outlives reloads
// and the requests in flight across one stay in the same queues.
var processKeySecret = sync.OnceValue(func() []byte {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return b
})

// provisionKey chooses the secret a key's values are hashed with:
// key_secret (placeholders read at load), else a secret of this process's
// own when no state is shared. Instances sharing state must hash alike,
// and get a secret only from key_secret: without one, they hash plainly,
// which a WARN says.
func (h *Handler) provisionKey() error {
	if h.Key == keyBasicUser {
		proof := h.KeyProof
		if proof == "" {
			proof = defaultKeyProof
		}
		var err error
		if h.keyProof, err = parseKeyProof(proof); err != nil {
			return err
		}
	}
	switch {
	case h.Key == "":
	case h.KeySecret != "":
		secret := caddy.NewReplacer().ReplaceAll(h.KeySecret, "")
		if secret == "" {
			return fmt.Errorf("key_secret %q is empty once its placeholders are read (an environment variable not set?)", h.KeySecret)
		}
		h.keySecret = []byte(secret)
	case h.engine == nil:
		h.keySecret = processKeySecret()
	default:
		h.logger.Warn("key: without key_secret, key values are hashed with no secret, so that every instance finds the same queue; " +
			"anyone who reads Redis or the logs can test guesses of a weak credential offline; " +
			"set key_secret, the same on every instance, e.g. {env.MCP_SERIALIZER_KEY_SECRET}")
	}
	return nil
}

// keyBasicUser is the key setting's value that lines requests up by the
// user named in their HTTP Basic credentials (WordPress's Application
// Passwords: one user, a password per client), rather than by a
// placeholder's value.
const keyBasicUser = "basic_user"

// keyOf returns the queue a request goes to under the key setting: a
// keyed hash of the key's value, "" when there is none. No session id can
// equal it: it holds a space.
func (h *Handler) keyOf(r *http.Request) string {
	if h.Key == keyBasicUser {
		user, ok := basicUser(phpAuthorization(r))
		if !ok {
			return ""
		}
		user = wordpressLogin(user)
		if user == "" {
			return ""
		}
		// A name with an "@" may be an e-mail address: its line is the
		// login the server named when it accepted these credentials
		// (loginPending). Any other name is its login.
		if h.proofs != nil && strings.Contains(user, "@") {
			if login, _ := h.proofs.login(h.proofKey(r), time.Now()); login != "" {
				user = wordpressLogin(login)
			}
		}
		return h.nameLine(user)
	}
	repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if !ok {
		return ""
	}
	value := repl.ReplaceAll(h.Key, "")
	if value == "" {
		return ""
	}
	return "key " + h.hashKey(value)
}

// nameLine is the line of the user whose login, as wordpressLogin gives
// it, is user.
func (h *Handler) nameLine(user string) string {
	return "key " + h.hashKey(keyBasicUser+" "+user)
}

// hashKey is the hex of value's hash keyed with the key's secret, or
// without one its plain hash, as a Store keys records.
func (h *Handler) hashKey(value string) string {
	if h.keySecret == nil {
		return serializer.StoreKey(value)
	}
	mac := hmac.New(sha256.New, h.keySecret)
	mac.Write([]byte(value))
	return hex.EncodeToString(mac.Sum(nil))
}

// phpAuthorization is the Authorization header as PHP gets it: Caddy's
// php_fastcgi joins repeated headers with ", ".
func phpAuthorization(r *http.Request) string {
	return strings.Join(r.Header.Values("Authorization"), ", ")
}

// basicUser is the user name PHP gives a script (PHP_AUTH_USER, which
// WordPress reads) for an Authorization header; ok is false where PHP
// sees no user. See basicCredentials.
func basicUser(header string) (user string, ok bool) {
	user, _, ok = basicCredentials(header)
	return user, ok
}

// basicCredentials are the user and password PHP gives a script for an
// Authorization header, decoded as PHP does: "Basic " in any case, then
// base64 without strict mode (every character outside the alphabet, "="
// included, skipped wherever it stands, a lone last character dropped),
// split at the first ":" unless a NUL comes first. Go's
// Request.BasicAuth is stricter: a credential it refuses that PHP accepts
// would reach WordPress as the user while it joined no line.
func basicCredentials(header string) (user, password string, ok bool) {
	if len(header) < 6 || !strings.EqualFold(header[:6], "basic ") {
		return "", "", false
	}
	alphabet := make([]byte, 0, len(header)-6)
	for _, c := range []byte(header[6:]) {
		if 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '+' || c == '/' {
			alphabet = append(alphabet, c)
		}
	}
	if len(alphabet)%4 == 1 {
		alphabet = alphabet[:len(alphabet)-1]
	}
	raw, err := base64.RawStdEncoding.DecodeString(string(alphabet))
	if err != nil {
		return "", "", false
	}
	name, pass, found := bytes.Cut(raw, []byte(":"))
	if nul := bytes.IndexByte(pass, 0); nul >= 0 {
		pass = pass[:nul]
	}
	// PHP sets no password for an empty one, and WordPress then takes
	// the request as anonymous.
	if !found || bytes.IndexByte(name, 0) >= 0 || len(pass) == 0 {
		return "", "", false
	}
	return string(name), string(pass), true
}

var (
	loginTags     = regexp.MustCompile(`<[^>]*>`)
	loginEscapes  = regexp.MustCompile(`%[a-fA-F0-9]{2}|&.+?;`)
	loginSpaces   = regexp.MustCompile(`\s+`)
	appPasswordRe = regexp.MustCompile(`[^a-zA-Z0-9]`)
)

// wordpressLogin is the login WordPress looks a Basic user up by, as its
// sanitize_user does without strict mode (tags, %XX escapes and entities
// removed, whitespace trimmed and collapsed), in lower case as its
// database compares it. Accents are left as they are; a user signing in
// by e-mail is lined up by the login its proof names (keyOf).
func wordpressLogin(user string) string {
	user = loginTags.ReplaceAllString(user, "")
	user = loginEscapes.ReplaceAllString(user, "")
	user = loginSpaces.ReplaceAllString(strings.TrimSpace(user), " ")
	return strings.ToLower(user)
}

// wordpressPassword is a Basic password as WordPress compares it: trimmed
// as wp_authenticate trims it, and, when what is left without its
// non-alphanumeric bytes is as long as an Application Password (24), that
// stripped form, which WordPress checks Application Passwords by. Any
// other password stays as typed: a regular one is compared whole.
func wordpressPassword(password string) string {
	password = strings.Trim(password, " \t\n\r\x00\x0b")
	if stripped := appPasswordRe.ReplaceAllString(password, ""); len(stripped) == 24 {
		return stripped
	}
	return password
}
