package serializer

import (
	"encoding/json"
	"strings"
	"testing"
)

// validCorpus holds inputs at the edges of the JSON grammar, for the
// comparison of valid with encoding/json.Valid.
func validCorpus() []string {
	corpus := []string{
		``, ` `, `{}`, `[]`, `[ ]`, `{ }`, `""`, `"`, `"\"`, `"\\"`, `"\/"`, `"\b\f\n\r\t"`, `"\x"`, `"\u"`, `"\u12"`,
		`"\u12g4"`, `"\u00e9"`, `"\uD83D\uDE00"`, "\"\x00\"", "\"\x1f\"", "\"\x7f\"", "\"\xff\xfe\"", "\"é\"",
		`0`, `-0`, `-`, `01`, `1.`, `.5`, `1.5`, `1e`, `1e+`, `1e+5`, `1E-5`, `-1.5e10`, `+1`, `1.e5`, `0.0e0`, `00`, `-01`,
		`true`, `false`, `null`, `tru`, `truex`, `nul`, `True`, `[true,false,null]`, `[1,]`, `[,1]`, `[1 2]`, `{"a"}`,
		`{"a":}`, `{"a":1,}`, `{"a":1 "b":2}`, `{,"a":1}`, `{"a" : 1 , "b" : [ 1 , { } ] }`, `{1:2}`, `{"a":1}}`,
		`[1]]`, `[[1]`, `{"a":[}`, `[{]`, " \t\r\n[1]\n", "\v[1]", "[1]\x00", `"a" "b"`, `1 2`, `{"a":"\u0041"}`,
		`[` + strings.Repeat(`"0123456789abcdef"`, 3) + `]`, `"` + strings.Repeat(`\"`, 9) + `"`, `"abcdefg\"hijklmnop"`,
		`"abcdefgh` + "\x01" + `ijklmnop"`, `"abcdefghijklmnopqrstuvwxyz`, string(benchSingle), string(benchBatch),
		`"` + strings.Repeat("é", 12) + `"`, `"` + strings.Repeat("\xff", 9) + "\x1f" + strings.Repeat("\x80", 9) + `"`,
		`"` + strings.Repeat("\xdf", 7) + `\"` + strings.Repeat("\xa2", 7) + `"`,
	}
	for _, depth := range []int{maxDepth - 1, maxDepth, maxDepth + 1} {
		corpus = append(corpus,
			strings.Repeat("[", depth)+strings.Repeat("]", depth),
			strings.Repeat(`{"a":`, depth-1)+`{}`+strings.Repeat("}", depth-1),
			strings.Repeat("[", depth)+"1"+strings.Repeat("]", depth))
	}
	return corpus
}

func TestValidMatchesEncodingJSON(t *testing.T) {
	check := func(in string) {
		if got, want := valid([]byte(in)), json.Valid([]byte(in)); got != want {
			t.Errorf("valid(%.80q) = %v, encoding/json says %v", in, got, want)
		}
	}
	corpus := validCorpus()
	for _, in := range corpus {
		check(in)
		// Every prefix, and every single-byte change to a few telling bytes.
		for i := range len(in) {
			if len(in) > 300 {
				break
			}
			check(in[:i])
			for _, c := range []byte{'"', '\\', ',', ':', '}', ']', ' ', 0x01, 'u', '0'} {
				check(in[:i] + string(c) + in[i+1:])
			}
		}
	}
}

// FuzzValid compares valid with encoding/json.Valid on any input:
//
//	go test ./serializer -run '^$' -fuzz '^FuzzValid$' -fuzztime 30s
func FuzzValid(f *testing.F) {
	for _, in := range validCorpus() {
		if len(in) < 4096 {
			f.Add([]byte(in))
		}
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if got, want := valid(in), json.Valid(in); got != want {
			t.Fatalf("valid(%q) = %v, encoding/json says %v", in, got, want)
		}
	})
}
