package caddymodule

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// A key's value may be a credential: its queue is named by a hash keyed
// with key_secret, or without one by a secret of the process's own, never
// by the value or its plain hash, which a reader of Redis or the logs
// could match guesses against.
func TestAKeysQueueIsNamedByAHashKeyedWithItsSecret(t *testing.T) {
	const credential = "Basic YWxpY2U6cGFzc3dvcmQ="
	queueOf := func(secret string) string {
		h := &Handler{Key: "{http.request.header.Authorization}", KeySecret: secret, logger: zap.NewNop()}
		if err := h.provisionKey(); err != nil {
			t.Fatal(err)
		}
		r := httptest.NewRequest("POST", "/mcp", nil)
		r.Header.Set("Authorization", credential)
		r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), httptest.NewRecorder(), nil)
		return h.keyOf(r)
	}
	mac := func(secret []byte) string {
		m := hmac.New(sha256.New, secret)
		m.Write([]byte(credential))
		return "key " + hex.EncodeToString(m.Sum(nil))
	}
	plain := sha256.Sum256([]byte(credential))

	if got, want := queueOf("s3cret"), mac([]byte("s3cret")); got != want {
		t.Errorf("with key_secret: queue %q, want %q", got, want)
	}
	if queueOf("s3cret") == queueOf("other") {
		t.Error("two secrets name the same queue")
	}
	own := queueOf("")
	if own != mac(processKeySecret()) || own != queueOf("") {
		t.Errorf("without key_secret or state: queue %q, want one keyed with the process's secret, the same each time", own)
	}
	for _, q := range []string{own, queueOf("s3cret")} {
		if strings.Contains(q, credential) || strings.Contains(q, hex.EncodeToString(plain[:])) {
			t.Errorf("queue %q holds the value or its plain hash", q)
		}
	}
}

// Basic credentials are read as PHP reads them for WordPress
// (PHP_AUTH_USER): each header below was decoded by PHP 8.2 (strncasecmp
// "Basic ", base64_decode without strict mode, the part before ":"), and
// Go's strict Request.BasicAuth refuses the ones marked so, which would
// reach WordPress as the user while they joined no line (or, with a NUL,
// join the line of a user WordPress does not see).
func TestBasicCredentialsAreReadAsPHPReadsThem(t *testing.T) {
	for _, c := range []struct {
		header, user string // "" user: PHP sees none
		goDiffers    bool
	}{
		{"Basic YWRtaW46cHc=", "admin", false},
		{"basic YWRtaW46cHc=", "admin", false},
		{"Basic YWRtaW46cHc", "admin", true},   // no padding
		{"Basic  YWRtaW46cHc=", "admin", true}, // two spaces
		{"Basic YWRt aW46cHc=", "admin", true}, // a space inside
		{"Basic YW=I6Yw", "ab", true},          // "=" inside
		{"Basic YWI6Yw", "ab", true},           // no padding, a password of one byte
		{"Basic YWI6Y", "", false},             // a lone last character dropped: "ab:", no password, anonymous to WordPress
		{"Basic YWRtaW46cHc=, Basic YWI6Yw==", "admin", true},
		{"BASIC\tYWRtaW46cHc=", "", false},
		{"Basic !!!", "", false},
		{"Basic YWJ=6Yw==", "", false}, // "abzc": no ":"
		{"Bearer YWRtaW46cHc=", "", false},
		{"Basic " + base64.StdEncoding.EncodeToString([]byte("ad\x00min:pw")), "", true},
	} {
		user, ok := basicUser(c.header)
		if ok != (c.user != "") || user != c.user {
			t.Errorf("%q: user %q, %v; PHP sees %q", c.header, user, ok, c.user)
		}
		r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
		r.Header.Set("Authorization", c.header)
		if goUser, _, goOK := r.BasicAuth(); c.goDiffers != (goOK != (c.user != "") || goUser != c.user) {
			t.Errorf("%q: Go's BasicAuth gives %q, %v; the case says it differs from PHP: %v", c.header, goUser, goOK, c.goDiffers)
		}
	}
}

// Repeated Authorization headers reach PHP joined with ", ", as Caddy's
// php_fastcgi passes them, and the key is the user PHP sees.
func TestABasicUserKeyIsTheUserPHPSeesInEveryAcceptedSpelling(t *testing.T) {
	h := &Handler{Key: keyBasicUser}
	want := h.keyOf(basicRequest("Basic YWRtaW46cHc="))
	if want == "" {
		t.Fatal("no key for admin's credentials")
	}
	for _, spelling := range [][]string{{"Basic YWRtaW46cHc"}, {"basic  YWRt aW46cHc="}, {"Basic YWRtaW46cHc=", "Basic YWI6Yw=="}} {
		if got := h.keyOf(basicRequest(spelling...)); got != want {
			t.Errorf("%q: key %q, want admin's %q", spelling, got, want)
		}
	}
}

func basicRequest(headers ...string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
	for _, v := range headers {
		r.Header.Add("Authorization", v)
	}
	return r
}

func basicOf(user, password string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+password))
}

// WordPress looks a Basic user up with get_user_by('login') (trim, then
// sanitize_user: tags, %XX and entities removed, whitespace collapsed),
// then by e-mail: every spelling below is the user "admin" to WordPress,
// so its requests touch admin's per-user record while they wait in
// another line.
func TestAUserSpelledAsWordPressTrimsItJoinsItsLine(t *testing.T) {
	h := &Handler{Key: keyBasicUser}
	want := h.keyOf(basicRequest(basicOf("admin", "pw")))
	for _, user := range []string{"admin ", " admin", "\tadmin\n", "ad%41min", "<b>admin</b>"} {
		if got := h.keyOf(basicRequest(basicOf(user, "pw"))); got != want {
			t.Errorf("user %q (admin to WordPress) is lined apart from admin", user)
		}
	}
}

// PHP sets no PHP_AUTH_PW when the password is empty or starts with a NUL
// (checked against php-fpm 8.2), and WordPress then ignores the Basic
// credentials: the request is anonymous. It is not admin's, yet it waits
// in admin's line, and should the server answer it 2xx it proves
// "admin:<anything after NUL>" for everyone who knows only the name.
func TestACredentialPHPGivesNoPasswordJoinsNoUsersLine(t *testing.T) {
	h := &Handler{Key: keyBasicUser}
	for _, password := range []string{"", "\x00", "\x00anything"} {
		if got := h.keyOf(basicRequest(basicOf("admin", password))); got != "" {
			t.Errorf("password %q: PHP sets no PHP_AUTH_PW, WordPress sees no user, yet lined as admin", password)
		}
	}
}

// WordPress strips every non-alphanumeric byte from an Application
// Password (preg_replace('/[^a-z\d]/i', ”, ...)) and PHP cuts
// PHP_AUTH_PW at its first NUL: each spelling below is the same valid
// password, yet each is its own proof, so one valid password still
// fills the proof record in endless spellings.
func TestAProofHoldsForEverySpellingWordPressAccepts(t *testing.T) {
	const pw = "abcdefghijklmnopqrstuvwx"
	want := provenSpelling(basicRequest(basicOf("admin", pw)))
	for _, spelling := range []string{
		"abcd-efgh-ijkl-mnop-qrst-uvwx",
		"abcd.efgh.ijkl.mnop.qrst.uvwx",
		"abcd\tefgh\tijkl\tmnop\tqrst\tuvwx",
		"abcd\u00a0efgh\u00a0ijkl\u00a0mnop\u00a0qrst\u00a0uvwx",
		pw + "\x00one",
		pw + "\x00two",
	} {
		if got := provenSpelling(basicRequest(basicOf("admin", spelling))); got != want {
			t.Errorf("%q (the same password to WordPress) is kept apart from its proof", spelling)
		}
	}
}

// A regular password, which basic auth accepts where a plugin such as
// Basic-Auth calls wp_authenticate, is compared by WordPress as typed
// (trimmed only): "correct horse battery staple" proven must not prove
// "correcthorsebatterystaple", which WordPress refuses.
func TestARegularPasswordWithSpacesDoesNotProveItsSpellingWithout(t *testing.T) {
	proven := provenSpelling(basicRequest(basicOf("admin", "correct horse battery staple")))
	if provenSpelling(basicRequest(basicOf("admin", "correcthorsebatterystaple"))) == proven {
		t.Error("a password WordPress refuses shares the proof of a different, accepted one")
	}
}
