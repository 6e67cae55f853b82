package serializer

import (
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
