package serializer

import (
	"bytes"
	"strings"
	"testing"
)

func TestClassifyPrefix(t *testing.T) {
	big := strings.Repeat("x", 100)
	for _, tc := range []struct {
		name, prefix string
		traits       Traits
		method       string
	}{
		{"response, result cut", `{"jsonrpc":"2.0","id":5,"result":{"content":[{"type":"image","data":"` + big, RepliesOnly, "response"},
		{"error response, message cut", `{"jsonrpc":"2.0","id":"a","error":{"code":-1,"message":"` + big, RepliesOnly, "response"},
		{"result before id", `{"result":{},"id":5,"x":"` + big, RepliesOnly, "response"},
		{"result name read, value not begun", `{"id":5,"result"`, RepliesOnly, "response"},
		{"escaped names", `{"\u0069d":5,"r\u0065sult":"` + big, RepliesOnly, "response"},
		{"id not shown yet", `{"jsonrpc":"2.0","result":{"data":"` + big, RepliesOnly, "response"},
		{"a name cut after the result", `{"result":{},"i`, RepliesOnly, "response"},
		{"request", `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"data":"` + big, 0, ""},
		{"method beside a result", `{"id":5,"method":"x","result":"` + big, 0, ""},
		{"cancellation", `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"reason":"` + big, 0, ""},
		{"batch of responses, second cut", `[{"jsonrpc":"2.0","id":1,"result":{}}, {"id":2,"result":"` + big, 0, ""},
		{"batch cut between responses", `[{"id":1,"result":{}},`, 0, ""},
		{"batch hiding a request after a large reply", `[{"jsonrpc":"2.0","id":1,"result":{"data":"` + big, 0, ""},
		{"result first, id not yet shown (TypeScript SDK)", `{"result":{"role":"assistant","content":{"type":"image","data":"` + big, RepliesOnly, "response"},
		{"error first, id not yet shown", `{"error":{"code":-1,"message":"` + big, RepliesOnly, "response"},
		{"result and method, cut", `{"result":{},"method":"tools/call","params":{"x":"` + big, 0, ""},
		{"result, ended without an id", `{"result":{}}`, 0, ""},
		{"batch with a request", `[{"id":1,"result":{}},{"id":2,"method":"ping"},{"id":3,"result":"` + big, 0, ""},
		{"batch with a scalar", `[{"id":1,"result":{}},3,`, 0, ""},
		{"empty batch so far", `[ `, 0, ""},
		{"not JSON after the result name", `{"id":5,"result" x`, 0, ""},
		{"not JSON in the result", `{"id":5,"result":{"a":tru}`, 0, ""},
		{"bad escape", `{"id":5,"result":"\q` + big, 0, ""},
		{"bad number", `{"id":05,"result":"` + big, 0, ""},
		{"number cut", `{"result":1,"id":-1.5e`, RepliesOnly, "response"},
		{"literal cut", `{"result":null,"id":tr`, RepliesOnly, "response"},
		{"whole object then more", `{"id":1,"result":{}} x`, 0, ""},
		{"scalar", `"` + big, 0, ""},
		{"empty", ``, 0, ""},
	} {
		traits, method := ClassifyPrefix([]byte(tc.prefix))
		if traits != tc.traits || method.String() != tc.method {
			t.Errorf("%s: ClassifyPrefix(%.60s) = %b, %q; want %b, %q", tc.name, tc.prefix, traits, method, tc.traits, tc.method)
		}
	}
}

// Cut anywhere, a request or a notification is never taken for a reply,
// and a response is taken for one exactly once its "id" and "result" names
// have both been read.
func TestEveryPrefixOfARequestIsOrdinaryAndOfAResponseAReplyOnceItShowsOne(t *testing.T) {
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hel\"lo\u00e9","n":[1,2.5e-3,true,null,{}]}}}`,
		`{"method":"notifications/cancelled","jsonrpc":"2.0","params":{"requestId":3,"reason":"x"}}`,
		`[{"jsonrpc":"2.0","id":2,"method":"ping"},{"jsonrpc":"2.0","id":1,"result":{}}]`,
	} {
		for k := range len(body) + 1 {
			if traits, _ := ClassifyPrefix([]byte(body[:k])); traits != 0 {
				t.Errorf("ClassifyPrefix(%s) = %b, want ordinary", body[:k], traits)
			}
		}
	}
	body := `{"jsonrpc":"2.0","id":"call-1","result":{"content":[{"type":"text","text":"a \"quoted\" \\ line\n"}],"n":-0.5E+2,"ok":false}}`
	shown := strings.Index(body, `"result"`) + len(`"result"`)
	for k := range len(body) + 1 {
		traits, _ := ClassifyPrefix([]byte(body[:k]))
		if want := k >= shown; (traits == RepliesOnly) != want {
			t.Errorf("ClassifyPrefix(%s) = %b, want a reply: %v", body[:k], traits, want)
		}
	}
}

// Whole, a body ClassifyPrefix takes for replies is one Classify does too,
// and no cut of any body makes it fail.
func TestClassifyPrefixAgreesWithClassifyOnWholeBodies(t *testing.T) {
	for _, seed := range classifySeeds() {
		b := []byte(seed)
		for k := range len(b) + 1 {
			ClassifyPrefix(b[:k])
		}
		if traits, _ := ClassifyPrefix(b); traits == RepliesOnly {
			if whole, _, _ := Classify(b); whole&RepliesOnly == 0 {
				t.Errorf("ClassifyPrefix(%s) says replies, Classify does not", b)
			}
		}
		if !bytes.Equal(b, []byte(seed)) {
			t.Fatalf("ClassifyPrefix changed its input")
		}
	}
}
