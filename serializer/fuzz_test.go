package serializer

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode"
)

// FuzzClassify checks that Classify never panics and agrees with a plain
// encoding/json decode of the body (referenceClassify). Run it with
//
//	go test ./serializer -run '^$' -fuzz '^FuzzClassify$' -fuzztime 30s
func FuzzClassify(f *testing.F) {
	for _, seed := range classifySeeds() {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		traits, id, method := Classify(body)
		wantTraits, wantID, wantMethod := referenceClassify(t, body)
		if traits != wantTraits || !bytes.Equal(id, wantID) || method.String() != wantMethod {
			t.Fatalf("Classify(%q) = %b, %q, %q; encoding/json says %b, %q, %q", body, traits, id, method, wantTraits, wantID, wantMethod)
		}
	})
}

// referenceClassify is Classify's contract written with encoding/json:
//
//   - A body that is not valid JSON, or whose top level is neither an
//     object nor an array, has no traits and no id.
//   - A message is an object, at the top level or as an element of a
//     top-level array (deeper values never count). Its members are
//     decoded as into map[string]json.RawMessage: keys match exactly
//     (case included) after unescaping, and the last duplicate wins.
//   - CarriesInitialized: some message has a "method" member that is a
//     string equal to "notifications/initialized".
//   - RepliesOnly: the body is an object, or a non-empty array of which
//     every element is an object, and every message is a response (no
//     "method" member, an "id" member, and a "result" or "error" member)
//     or has the string method "notifications/cancelled".
//   - The id is returned for a top-level object only, when its "method" is
//     a string and it has an "id" member: the member's raw JSON text.
//   - The method: for a top-level object, its "method" member when that is
//     a string, decoded and shown as refShown says; else "response" when it
//     is a response; for a top-level array, "batch"; else "".
func referenceClassify(t *testing.T, body []byte) (Traits, []byte, string) {
	// RawMessage, not any: a number beyond float64 is still valid JSON.
	var top json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		if json.Valid(body) {
			t.Fatalf("json.Valid accepts what json.Unmarshal rejects: %v", err)
		}
		return 0, nil, ""
	}
	switch top[0] {
	case '{':
		var m map[string]json.RawMessage
		mustUnmarshal(t, top, &m)
		traits := refTraits(t, m)
		var id []byte
		name, isString := refMethod(t, m)
		if isString {
			if raw, ok := m["id"]; ok {
				id = raw
			}
		}
		_, hasMethod := m["method"]
		_, hasID := m["id"]
		_, hasResult := m["result"]
		_, hasError := m["error"]
		switch {
		case isString:
			name = refShown(name)
		case !hasMethod && hasID && (hasResult || hasError):
			name = "response"
		default:
			name = ""
		}
		return traits, id, name
	case '[':
		var elems []json.RawMessage
		mustUnmarshal(t, top, &elems)
		var some Traits
		all := RepliesOnly
		for _, e := range elems {
			if e[0] != '{' {
				all = 0 // not an object
				continue
			}
			var m map[string]json.RawMessage
			mustUnmarshal(t, e, &m)
			tr := refTraits(t, m)
			some |= tr
			all &= tr
		}
		if len(elems) == 0 {
			return 0, nil, "batch"
		}
		return some&CarriesInitialized | all, nil, "batch"
	}
	return 0, nil, ""
}

func refTraits(t *testing.T, m map[string]json.RawMessage) Traits {
	method, isString := refMethod(t, m)
	_, hasMethod := m["method"]
	_, hasID := m["id"]
	_, hasResult := m["result"]
	_, hasError := m["error"]
	var traits Traits
	if isString && method == methodInitialized {
		traits |= CarriesInitialized
	}
	response := !hasMethod && hasID && (hasResult || hasError)
	if response || (isString && method == methodCancelled) {
		traits |= RepliesOnly
	}
	return traits
}

// refMethod returns the "method" member when it is a string.
func refMethod(t *testing.T, m map[string]json.RawMessage) (string, bool) {
	raw, ok := m["method"]
	if !ok || len(raw) == 0 || raw[0] != '"' {
		return "", false
	}
	var s string
	mustUnmarshal(t, raw, &s)
	return s, true
}

// refShown is Method.String's rule written out: every character that is
// not printable becomes U+FFFD (encoding/json has already made each byte
// of invalid UTF-8 one), and only the leading characters whose encodings
// add up to at most 128 bytes are kept.
func refShown(decoded string) string {
	var out []rune
	n := 0
	for _, r := range decoded {
		if !unicode.IsPrint(r) {
			r = '\uFFFD'
		}
		n += len(string(r))
		if n > 128 {
			break
		}
		out = append(out, r)
	}
	return string(out)
}

func mustUnmarshal(t *testing.T, data []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("decoding %q: %v", data, err)
	}
}

// classifySeeds are real MCP messages and the shapes that could trip a
// hand-written scanner.
func classifySeeds() []string {
	seeds := []string{
		// A client's connect, as sent.
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{"sampling":{},"elicitation":{},"roots":{"listChanged":true}},"clientInfo":{"name":"claude-code","version":"1.0.0"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"method":"notifications/initialized","jsonrpc":"2.0","params":{}}`,
		`{"jsonrpc":"2.0","id":2,"method":"logging/setLevel","params":{"level":"info"}}`,
		`{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{"cursor":"eyJvZmZzZXQiOjEwfQ=="}}`,
		`{"jsonrpc":"2.0","id":"req-4","method":"tools/call","params":{"name":"echo","arguments":{"text":"hi \"there\" \\ \u00e9 \ud83d\ude00"},"_meta":{"progressToken":"p1"}}}`,
		`{"jsonrpc":"2.0","id":5,"method":"ping"}`,
		`{"jsonrpc":"2.0","id":6,"method":"resources/read","params":{"uri":"file:///tmp/a.txt"}}`,
		`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":4,"reason":"user"}}`,
		`{"jsonrpc":"2.0","method":"notifications/roots/list_changed"}`,
		`{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"p1","progress":0.5,"total":1}}`,
		// The client's answers to server requests.
		`{"jsonrpc":"2.0","id":0,"result":{"role":"assistant","content":{"type":"text","text":"ok"},"model":"m","stopReason":"endTurn"}}`,
		`{"jsonrpc":"2.0","id":"elicit-1","result":{"action":"accept","content":{"name":"x"}}}`,
		`{"jsonrpc":"2.0","id":7,"error":{"code":-32601,"message":"Method not found"}}`,
		`{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}`,
		`{"jsonrpc":"2.0","id":8,"result":null}`,
		// Batches.
		`[{"jsonrpc":"2.0","method":"notifications/initialized"},{"jsonrpc":"2.0","id":2,"method":"logging/setLevel","params":{"level":"debug"}}]`,
		`[{"jsonrpc":"2.0","id":1,"result":{}},{"jsonrpc":"2.0","id":2,"error":{"code":1,"message":"no"}},{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":9}}]`,
		`[{"jsonrpc":"2.0","id":1,"result":{}},{"jsonrpc":"2.0","id":3,"method":"ping"}]`,
		`[{"jsonrpc":"2.0","id":1,"result":{}},null]`,
		`[[{"jsonrpc":"2.0","method":"notifications/initialized"}]]`,
		`[]`, `[ ]`, `{}`, `[{}]`, `[1,"a",true,null]`,
		// Keys and values that only look right.
		`{"jsonrpc":"2.0","Method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","method ":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized "}`,
		`{"jsonrpc":"2.0","method":"Notifications/Initialized"}`,
		`{"jsonrpc":"2.0","method":"notifications\/initialized"}`,
		`{"jsonrpc":"2.0","method":"notifications\u002finitialized"}`,
		`{"jsonrpc":"2.0","m\u0065thod":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized\u0000"}`,
		// Methods that must be cleaned or cut before they are shown.
		`{"jsonrpc":"2.0","id":1,"method":"tools/list\r\n\u001b[31mFAKE\u202e\u2028\u0085\u007f\ud800"}`,
		"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"a\x01b\xffc\xc3\"}",
		`{"jsonrpc":"2.0","id":1,"method":"` + strings.Repeat("m", 127) + `\u00e9"}`,
		`{"jsonrpc":"2.0","id":1,"method":"` + strings.Repeat("m", 200) + `"}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized","method":"ping"}`,
		`{"jsonrpc":"2.0","method":"ping","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","method":["notifications/initialized"]}`,
		`{"jsonrpc":"2.0","method":null,"id":1,"result":{}}`,
		`{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}`,
		`{"jsonrpc":"2.0","id":{"a":[1,2,{"b":"}"}]},"method":"x"}`,
		`{"jsonrpc":"2.0","id":-1.5e+10,"method":"x"}`,
		`{"jsonrpc":"2.0","id":"\"]}","method":"x"}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"method":"notifications/initialized","x":[1,{"y":"]"}]}}`,
		`{"jsonrpc":"2.0","params":{"a":"\\"},"method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","method":"notifications/\ud800initialized"}`,
		"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\xff\"}",
		"{\"method\xff\":\"notifications/initialized\"}",
		" \t\r\n{\"jsonrpc\" : \"2.0\" ,\n \"method\" :\t\"notifications/initialized\" }\n",
		"\ufeff{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}",
		// Malformed.
		``, ` `, `{`, `[`, `{"jsonrpc":"2.0","method":"notifications/initialized"`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"} {}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized",}`,
		`[{"jsonrpc":"2.0","method":"notifications/initialized"},]`,
		`{'method':'notifications/initialized'}`,
		`{"method":"notifications/initialized\"}`,
		`"notifications/initialized"`, `null`, `42`, `true`,
		`notifications/initialized`,
	}
	// Nesting and long strings, sized so that mutation stays fast; the
	// extremes are in extremeBodies.
	for _, depth := range []int{64, 600} {
		seeds = append(seeds,
			`{"jsonrpc":"2.0","method":"notifications/initialized","params":`+strings.Repeat(`[{"a":`, depth)+`1`+strings.Repeat(`}]`, depth)+`}`,
			strings.Repeat(`[`, depth)+strings.Repeat(`]`, depth),
		)
	}
	seeds = append(seeds,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"text":"`+strings.Repeat(`x\"\\`, 1000)+`"}}`,
		`{"jsonrpc":"2.0","method":"`+strings.Repeat("n", 4096)+`"}`,
		`[`+strings.Repeat(`{"jsonrpc":"2.0","id":1,"result":{}},`, 100)+`{"jsonrpc":"2.0","method":"notifications/initialized"}]`,
		// Methods that must be decoded before they are shown.
		`{"jsonrpc":"2.0","id":1,"method":"tools\u002flist"}`,
		"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"bad\xff\xfeutf8\"}",
		`{"jsonrpc":"2.0","id":1,"method":"tools/list","result":{}}`,
	)
	return seeds
}

// extremeBodies are too large to mutate quickly but must agree too:
// nesting at and past encoding/json's depth limit (10000), strings of
// hundreds of kilobytes, batches of thousands.
func extremeBodies() []string {
	var bodies []string
	for _, depth := range []int{9999, 10000, 10001, 50000} {
		bodies = append(bodies,
			`{"jsonrpc":"2.0","method":"notifications/initialized","params":`+strings.Repeat(`[`, depth-1)+strings.Repeat(`]`, depth-1)+`}`,
			strings.Repeat(`[`, depth)+strings.Repeat(`]`, depth),
			`[`+strings.Repeat(`{"a":`, depth-1)+`1`+strings.Repeat(`}`, depth-1)+`]`,
		)
	}
	return append(bodies,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"text":"`+strings.Repeat(`x\"\\`, 100000)+`"}}`,
		`{"jsonrpc":"2.0","method":"`+strings.Repeat("n", 1<<20)+`"}`,
		`[`+strings.Repeat(`{"jsonrpc":"2.0","id":1,"result":{}},`, 20000)+`{"jsonrpc":"2.0","method":"notifications/cancelled"}]`,
		`[`+strings.Repeat(`{"jsonrpc":"2.0","id":1,"result":{}},`, 20000)+`{"jsonrpc":"2.0","method":"notifications/initialized"}]`,
	)
}

func TestClassifyAgreesWithEncodingJSONOnExtremeBodies(t *testing.T) {
	for _, body := range extremeBodies() {
		traits, id, method := Classify([]byte(body))
		wantTraits, wantID, wantMethod := referenceClassify(t, []byte(body))
		if traits != wantTraits || !bytes.Equal(id, wantID) || method.String() != wantMethod {
			t.Errorf("Classify(%.80s...) = %b, %q, %.40q; encoding/json says %b, %q, %.40q", body, traits, id, method, wantTraits, wantID, wantMethod)
		}
	}
}

// The reference itself is checked on a few bodies whose answer is known,
// so that the fuzz target cannot pass by two wrongs agreeing.
func TestReferenceClassifyOnKnownBodies(t *testing.T) {
	for body, want := range map[string]Traits{
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`:                                      CarriesInitialized,
		`{"jsonrpc":"2.0","m\u0065thod":"notifications/initialized"}`:                                 CarriesInitialized,
		`{"jsonrpc":"2.0","Method":"notifications/initialized"}`:                                      0,
		`[{"jsonrpc":"2.0","id":1,"result":{}},{"jsonrpc":"2.0","method":"notifications/cancelled"}]`: RepliesOnly,
		`[{"jsonrpc":"2.0","id":1,"result":{}},null]`:                                                 0,
		`[]`: 0,
	} {
		if got, _, _ := referenceClassify(t, []byte(body)); got != want {
			t.Errorf("reference(%s) = %b, want %b", body, got, want)
		}
	}
}
