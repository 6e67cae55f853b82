package serializer

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		name   string
		body   string
		traits Traits
		id     string
	}{
		{"initialized alone", `{"jsonrpc":"2.0","method":"notifications/initialized"}`, CarriesInitialized, ""},
		{"initialized in a batch", `[{"jsonrpc":"2.0","id":2,"method":"logging/setLevel","params":{"level":"info"}},{"jsonrpc":"2.0","method":"notifications/initialized"}]`, CarriesInitialized, ""},
		{"escaped method name", `{"jsonrpc":"2.0","method":"notifications\/initialized"}`, CarriesInitialized, ""},
		{"unicode-escaped key", `{"jsonrpc":"2.0","meth\u006fd":"notifications/initialized"}`, CarriesInitialized, ""},
		{"request keeps its id", `{"jsonrpc":"2.0","id":"abc","method":"tools/list"}`, 0, `"abc"`},
		{"numeric id", ` {"id" : 7 , "method":"ping","jsonrpc":"2.0"} `, 0, `7`},
		{"result response", `{"jsonrpc":"2.0","id":5,"result":{"action":"accept"}}`, RepliesOnly, ""},
		{"error response", `{"jsonrpc":"2.0","id":5,"error":{"code":-1,"message":"no"}}`, RepliesOnly, ""},
		{"cancellation", `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":3}}`, RepliesOnly, ""},
		{"batch of replies and a cancellation", `[{"jsonrpc":"2.0","id":1,"result":{}},{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":3}}]`, RepliesOnly, ""},
		{"reply beside a request", `[{"jsonrpc":"2.0","id":1,"result":{}},{"jsonrpc":"2.0","id":2,"method":"ping"}]`, 0, ""},
		{"reply beside a scalar", `[{"jsonrpc":"2.0","id":1,"result":{}},3]`, 0, ""},
		{"response without id", `{"jsonrpc":"2.0","result":{}}`, 0, ""},
		{"empty batch", `[]`, 0, ""},
		{"empty object", `{}`, 0, ""},
		{"non-string method", `{"jsonrpc":"2.0","method":5}`, 0, ""},
		{"last duplicate key wins", `{"method":"notifications/initialized","method":"ping"}`, 0, ""},
		{"method inside params does not count", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"method":"notifications/initialized","x":[1,{"y":"]"}]}}`, 0, "1"},
		{"malformed", `{"jsonrpc":"2.0","method":"notifications/initialized"`, 0, ""},
		{"not JSON at all", `notifications/initialized`, 0, ""},
		{"empty", ``, 0, ""},
		{"scalar", `"notifications/initialized"`, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			traits, id, _ := Classify([]byte(tc.body))
			if traits != tc.traits || string(id) != tc.id {
				t.Fatalf("Classify(%s) = %b, %q; want %b, %q", tc.body, traits, id, tc.traits, tc.id)
			}
		})
	}
}

func TestClassifyNamesTheMethod(t *testing.T) {
	for body, want := range map[string]string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`:            "tools/list",
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`:    "notifications/initialized",
		`{"jsonrpc":"2.0","id":1,"method":"tools\/li\u0073t"}`:      "tools/list",
		"{\"jsonrpc\":\"2.0\",\"method\":\"a\xffb\"}":               "a\ufffdb",
		`{"jsonrpc":"2.0","id":5,"result":{}}`:                      "response",
		`{"jsonrpc":"2.0","id":5,"error":{"code":1,"message":"x"}}`: "response",
		`[{"jsonrpc":"2.0","method":"notifications/initialized"}]`:  "batch",
		`[]`:                            "batch",
		`{"jsonrpc":"2.0","method":5}`:  "",
		`{"jsonrpc":"2.0","result":{}}`: "",
		`{"jsonrpc":"2.0","method":"notifications/in`: "",
		`"tools/list"`: "",
		``:             "",
		// Shown cleaned and cut (Method.String).
		`{"jsonrpc":"2.0","id":1,"method":"a\u0000b\nc\td\u007fe\u0085f\u202eg\u2028h\u00a0i j"}`: "a\ufffdb\ufffdc\ufffdd\ufffde\ufffdf\ufffdg\ufffdh\ufffdi j",
		"{\"jsonrpc\":\"2.0\",\"method\":\"x\xffy\xc3\"}":                                         "x\ufffdy\ufffd", // invalid UTF-8, one U+FFFD a byte
		`{"jsonrpc":"2.0","method":"\ud800 lone surrogate"}`:                                      "\ufffd lone surrogate",
		`{"jsonrpc":"2.0","method":"` + strings.Repeat("m", 200) + `"}`:                           strings.Repeat("m", MaxMethodLen),
		`{"jsonrpc":"2.0","method":"` + strings.Repeat("m", 127) + `é"}`:                          strings.Repeat("m", 127), // é would end at byte 129
		`{"jsonrpc":"2.0","method":"` + strings.Repeat("m", 126) + `é"}`:                          strings.Repeat("m", 126) + "é",
		`{"jsonrpc":"2.0","method":"` + strings.Repeat("m", 127) + `\u0000"}`:                     strings.Repeat("m", 127),
		`{"jsonrpc":"2.0","method":"` + strings.Repeat("m", 125) + `\u0000"}`:                     strings.Repeat("m", 125) + "\ufffd",
		`{"jsonrpc":"2.0","method":"` + strings.Repeat("\\u0041", 128) + `B"}`:                    strings.Repeat("A", 128),
	} {
		_, _, method := Classify([]byte(body))
		if got := method.String(); got != want {
			t.Errorf("Classify(%s) method = %q, want %q", body, got, want)
		}
		if _, _, ref := referenceClassify(t, []byte(body)); ref != want {
			t.Errorf("referenceClassify(%s) method = %q, want %q", body, ref, want)
		}
	}
}

func TestClassifyDoesNotAllocateForSmallMessages(t *testing.T) {
	body := []byte(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"text":"` + strings.Repeat("x", 3000) + `"}}}`)
	allocs := testing.AllocsPerRun(100, func() { Classify(body) })
	if allocs > 2 {
		t.Fatalf("Classify allocates %.0f times per call, want at most 2", allocs)
	}
}

func TestMethodIsComparesTheDecodedMethodOfOneMessage(t *testing.T) {
	for body, want := range map[string]bool{
		`{"jsonrpc":"2.0","id":1,"method":"initialize"}`:            true,
		`{"jsonrpc":"2.0","id":1,"method":"initi\u0061lize"}`:       true,
		`{"jsonrpc":"2.0","id":1,"method":"Initialize"}`:            false,
		`{"jsonrpc":"2.0","id":1,"method":"initialize "}`:           false,
		`[{"jsonrpc":"2.0","id":1,"method":"initialize"}]`:          false,
		`{"jsonrpc":"2.0","id":1,"result":{"method":"initialize"}}`: false,
		`{"jsonrpc":"2.0","id":1,"method":"initialize"`:             false,
	} {
		if _, _, method := Classify([]byte(body)); method.Is("initialize") != want {
			t.Errorf("Classify(%s) method.Is(initialize) = %v, want %v", body, !want, want)
		}
	}
	body := []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`)
	if allocs := testing.AllocsPerRun(100, func() { _, _, m := Classify(body); m.Is("initialize") }); allocs != 0 {
		t.Fatalf("Classify and Is allocate %.0f times, want none", allocs)
	}
}

func TestHeaderMethodIsShownByTheBodysRule(t *testing.T) {
	for _, tc := range []struct{ header, want string }{
		{"tools/call", "tools/call"},
		{"", ""},
		{"a\x1bb", "a\uFFFDb"},
		{`say\u0041`, `say\u0041`}, // a header is not JSON: no unescaping
		{strings.Repeat("x", MaxMethodLen+10), strings.Repeat("x", MaxMethodLen)},
	} {
		m := HeaderMethod(tc.header)
		if got := m.String(); got != tc.want {
			t.Errorf("HeaderMethod(%q).String() = %q, want %q", tc.header, got, tc.want)
		}
	}
	if !HeaderMethod("server/discover").Is("server/discover") || HeaderMethod("server/discover").Is("initialize") {
		t.Error("Is does not compare the header's method")
	}
}

// Escaped top-level keys classify as the names they decode to, as
// encoding/json reads them, whichever escapes spell them.
func TestEscapedKeysClassifyAsTheirDecodedNames(t *testing.T) {
	for _, tc := range []struct {
		body   string
		traits Traits
		id     string
	}{
		{`{"jsonrpc":"2.0","\u006dethod":"notifications/initialized"}`, CarriesInitialized, ""},
		{`{"jsonrpc":"2.0","\u006D\u0065\u0074\u0068\u006f\u0064":"notifications/cancelled"}`, RepliesOnly, ""},
		{`{"jsonrpc":"2.0","\u0069\u0064":5,"r\u0065sult":{}}`, RepliesOnly, ""},
		{`{"jsonrpc":"2.0","\u0069d":5,"\u0065rror":{"code":1,"message":"x"}}`, RepliesOnly, ""},
		{`{"jsonrpc":"2.0","\u0069d":"a","\u006dethod":"tools/list"}`, 0, `"a"`},
		{`{"jsonrpc":"2.0","i\/d":5,"result":{}}`, 0, ""},                                 // i/d is not id
		{`{"jsonrpc":"2.0","id":5,"result":{},"\u006dethod\u0000":"x"}`, RepliesOnly, ""}, // method NUL is not method
		{`{"jsonrpc":"2.0","id":5,"result":{},"\ud800method":"x"}`, RepliesOnly, ""},      // a lone surrogate decodes to U+FFFD
		{`{"jsonrpc":"2.0","id":5,"\u0072esult":{},"\u006Dethod":"x"}`, 0, "5"},
		{`[{"jsonrpc":"2.0","\u006dethod":"notifications/initialized"},{"\u0069d":1,"result":{}}]`, CarriesInitialized, ""},
	} {
		traits, id, _ := Classify([]byte(tc.body))
		refTraits, refID, _ := referenceClassify(t, []byte(tc.body))
		if traits != tc.traits || string(id) != tc.id || traits != refTraits || string(id) != string(refID) {
			t.Errorf("Classify(%s) = %b, %q; want %b, %q (encoding/json: %b, %q)", tc.body, traits, id, tc.traits, tc.id, refTraits, refID)
		}
	}
}

// stringEquals decodes escapes as encoding/json does: one-letter escapes,
// \u escapes in either case, surrogate pairs, lone surrogates and invalid
// UTF-8 (each U+FFFD).
func TestStringEqualsDecodesAsEncodingJSON(t *testing.T) {
	raws := []string{
		`\u006dethod`, `meth\u006Fd`, `\"quoted\"`, `back\\slash`, `a\/b`, `\b\f\n\r\t`,
		`\ud83d\ude00 smile`, `\ud83d`, `\ud83dx`, `\ude00\ud83d`, `\ud83d\u0041`, `\u00e9t\u00E9`, "caf\xc3\xa9\\n",
		"bad \xff\\u0041", "\xc3\\u0041", `\u0000`, `\uFFFD`, `\ufffd\ufffd`,
	}
	for _, raw := range raws {
		var decoded string
		if err := json.Unmarshal([]byte(`"`+raw+`"`), &decoded); err != nil {
			t.Fatalf("%q: %v", raw, err)
		}
		wants := []string{decoded, decoded + "x", "", "method", "\ufffd"}
		if len(decoded) > 0 {
			wants = append(wants, decoded[:len(decoded)-1], decoded[1:])
		}
		for _, want := range wants {
			if got := stringEquals([]byte(raw), want); got != (decoded == want) {
				t.Errorf("stringEquals(%q, %q) = %v, want %v (decoded %q)", raw, want, got, !got, decoded)
			}
		}
	}
}

// Escaped keys cost no allocation: a body escaping every top-level key
// would otherwise cost a decode per key and name compared.
func TestClassifyingEscapedKeysAllocatesNothing(t *testing.T) {
	body := []byte(`{"\u006asonrpc":"2.0","\u0069d":1,"\u0070arams":{},"\u0078":0,"\u006dethod":"notifications/cancelled"}`)
	if traits, _, _ := Classify(body); traits != RepliesOnly {
		t.Fatalf("traits %b, want RepliesOnly", traits)
	}
	if n := testing.AllocsPerRun(100, func() { Classify(body) }); n != 0 {
		t.Fatalf("Classify allocated %v times per body of escaped keys, want 0", n)
	}
}
