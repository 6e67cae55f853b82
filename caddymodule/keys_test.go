package caddymodule

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
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
