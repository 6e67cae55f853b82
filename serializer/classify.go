package serializer

import (
	"bytes"
	"encoding/json"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// Traits are the properties of a request that change how it is scheduled.
type Traits uint8

const (
	// CarriesInitialized marks a body holding notifications/initialized,
	// alone or inside a batch: it opens the gate and may pass held messages.
	CarriesInitialized Traits = 1 << iota
	// RepliesOnly marks a body made only of JSON-RPC responses and/or
	// notifications/cancelled: a streaming exchange may be waiting for it.
	RepliesOnly
	// EndsSession marks a DELETE: a 2xx answer drops the session's state.
	EndsSession
)

// Has reports whether all of x are set in t.
func (t Traits) Has(x Traits) bool { return t&x == x }

const (
	methodInitialized = "notifications/initialized"
	methodCancelled   = "notifications/cancelled"
)

// Classify reads a JSON-RPC body (one message or a batch) and returns its
// traits, plus the raw id of a single request so that a local error reply
// can answer it, and its method for logs. Malformed JSON has no traits: it
// is an ordinary message and the upstream answers it. The returned id and
// method alias body.
func Classify(body []byte) (traits Traits, id []byte, method Method) {
	if !valid(body) {
		return 0, nil, Method{}
	}
	s := scanner{b: body}
	s.space()
	switch s.peek() {
	case '{':
		m := s.object()
		if m.isRequest() {
			id = m.id
		}
		switch {
		case m.methodString:
			method = Method{raw: m.method, kind: methodNamed}
		case m.isResponse():
			method = Method{kind: methodResponse}
		}
		return m.traits(), id, method
	case '[':
		return s.batch(), nil, Method{kind: methodBatch}
	}
	return 0, nil, Method{}
}

// Method names what a body holds, for logs and placeholders: the method of
// a single request or notification, "response" for a single response,
// "batch" for an array, and "" for anything else. The zero value is "".
type Method struct {
	raw  []byte // a single message's method, raw string contents
	text string // or the value of an Mcp-Method header (HeaderMethod)
	kind methodKind
}

type methodKind uint8

const (
	methodNone methodKind = iota
	methodNamed
	methodResponse
	methodBatch
	methodHeader
)

// HeaderMethod is the method a request names in its Mcp-Method header (MCP
// 2026-07-28 puts it there, so that intermediaries need not read the
// body); String shows it by the same rule as a body's method.
func HeaderMethod(v string) Method {
	if v == "" {
		return Method{}
	}
	return Method{text: v, kind: methodHeader}
}

// ShowHeader returns a header value fit to show in a log line or a
// placeholder, by Method.String's rule: a client chooses it.
func ShowHeader(v string) string {
	if len(v) <= MaxMethodLen && plainPrintable(v) {
		return v
	}
	return showable([]byte(v))
}

// MaxMethodLen bounds what Method.String returns, in bytes: the client
// chooses the method, and it goes into placeholders and access logs.
const MaxMethodLen = 128

// String returns the method fit to show in a log line or a header: the
// JSON string decoded, each byte of invalid UTF-8 and each character that
// is not printable (unicode.IsPrint: control characters, format
// characters such as bidirectional overrides, line and paragraph
// separators, spaces other than U+0020, unassigned code points) replaced
// by U+FFFD, then cut to the whole characters that fit in MaxMethodLen
// bytes. A method of printable ASCII within the bound is returned unchanged.
// It allocates; call it only to show it.
func (m Method) String() string {
	switch m.kind {
	case methodNamed:
		if len(m.raw) <= MaxMethodLen && plainPrintable(m.raw) {
			return string(m.raw)
		}
		return showable(decodeString(m.raw))
	case methodHeader:
		return ShowHeader(m.text)
	case methodResponse:
		return "response"
	case methodBatch:
		return "batch"
	}
	return ""
}

// Is reports whether the body is a single message whose method is name,
// without allocating unless the method holds escapes.
func (m Method) Is(name string) bool {
	if m.kind == methodHeader {
		return m.text == name
	}
	return m.kind == methodNamed && stringEquals(m.raw, name)
}

// plainPrintable reports raw string contents that decode to themselves and
// are printable ASCII.
func plainPrintable[T string | []byte](raw T) bool {
	for i := range len(raw) {
		c := raw[i]
		if c < 0x20 || c > 0x7e || c == '\\' {
			return false
		}
	}
	return true
}

// decodeString decodes raw JSON string contents; invalid UTF-8 becomes
// U+FFFD, one per byte, as encoding/json does.
func decodeString(raw []byte) []byte {
	if bytes.IndexByte(raw, '\\') < 0 {
		return raw // showable replaces invalid UTF-8 as json would
	}
	quoted := make([]byte, 0, len(raw)+2)
	quoted = append(append(append(quoted, '"'), raw...), '"')
	var decoded string
	_ = json.Unmarshal(quoted, &decoded) // valid: Classify checked the body
	return []byte(decoded)
}

// showable applies String's rule to decoded text.
func showable(b []byte) string {
	var out strings.Builder
	out.Grow(min(len(b), MaxMethodLen))
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		b = b[size:]
		// Invalid UTF-8 decodes as utf8.RuneError, U+FFFD, itself printable.
		if !unicode.IsPrint(r) {
			r = utf8.RuneError
		}
		if out.Len()+utf8.RuneLen(r) > MaxMethodLen {
			break
		}
		out.WriteRune(r)
	}
	return out.String()
}

// message is what scheduling needs to know of one JSON-RPC object.
type message struct {
	method       []byte // raw string contents; valid when methodString
	methodString bool   // the last "method" member is a string
	hasMethod    bool
	hasID        bool
	hasResult    bool // "result" or "error"
	id           []byte
}

func (m *message) isRequest() bool { return m.methodString && m.hasID }

func (m *message) isResponse() bool { return !m.hasMethod && m.hasID && m.hasResult }

func (m *message) isMethod(name string) bool {
	return m.methodString && stringEquals(m.method, name)
}

func (m *message) traits() Traits {
	var t Traits
	if m.isMethod(methodInitialized) {
		t |= CarriesInitialized
	}
	if m.isResponse() || m.isMethod(methodCancelled) {
		t |= RepliesOnly
	}
	return t
}

// scanner walks JSON already checked by valid, so it never meets a
// syntax error and needs no bounds checks beyond the input's end.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *scanner) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// batch classifies an array: RepliesOnly needs every element to qualify,
// CarriesInitialized any one. An empty batch or a non-object element makes
// the whole body ordinary for RepliesOnly.
func (s *scanner) batch() Traits {
	s.i++ // [
	some, all := Traits(0), RepliesOnly
	n := 0
	for {
		s.space()
		switch s.peek() {
		case ']':
			if n == 0 {
				return 0
			}
			return some&CarriesInitialized | all
		case ',':
			s.i++
			continue
		case '{':
			m := s.object()
			t := m.traits()
			some |= t
			all &= t
		default:
			s.skip()
			all = 0
		}
		n++
	}
}

func (s *scanner) object() message {
	var m message
	s.i++ // {
	for {
		s.space()
		switch s.peek() {
		case '}':
			s.i++
			return m
		case ',':
			s.i++
			continue
		}
		key := s.str()
		s.space()
		s.i++ // :
		s.space()
		start := s.i
		isString := s.peek() == '"'
		var val []byte
		if isString {
			val = s.str()
		} else {
			s.skip()
		}
		switch {
		case stringEquals(key, "method"):
			m.hasMethod, m.methodString, m.method = true, isString, val
		case stringEquals(key, "id"):
			m.hasID, m.id = true, s.b[start:s.i]
		case stringEquals(key, "result"), stringEquals(key, "error"):
			m.hasResult = true
		}
	}
}

// str consumes a string and returns its raw contents, escapes included.
func (s *scanner) str() []byte {
	s.i++ // opening quote
	start := s.i
	for {
		// Valid JSON has no control characters in strings: the run ends
		// at the closing quote or at a backslash.
		s.i = plainRun(s.b, s.i)
		if s.b[s.i] == '"' {
			break
		}
		s.i += 2 // the backslash and the byte it escapes
	}
	s.i++
	return s.b[start : s.i-1]
}

// skip consumes one value of any kind.
func (s *scanner) skip() {
	switch s.b[s.i] {
	case '"':
		s.str()
	case '{', '[':
		depth := 0
		for {
			switch s.b[s.i] {
			case '"':
				s.str()
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
			}
			s.i++
			if depth == 0 {
				return
			}
		}
	default: // number or literal
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return
			}
			s.i++
		}
	}
}

// stringEquals compares raw JSON string contents with want, decoding
// escapes only when there are any (rare in practice).
func stringEquals(raw []byte, want string) bool {
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw) == want
	}
	return unescapedEquals(raw, want)
}

// unescapedEquals compares raw string contents holding escapes with want
// as encoding/json would decode them, character by character and without
// allocating: a hostile body may escape every key, and decoding each one
// whole for every name compared costs many times the scan.
func unescapedEquals(raw []byte, want string) bool {
	var enc [utf8.UTFMax]byte
	for i := 0; i < len(raw); {
		var r rune
		switch c := raw[i]; {
		case c == '\\' && raw[i+1] == 'u':
			r, i = unescapeU(raw, i)
		case c == '\\':
			r, i = rune(unescapeByte(raw[i+1])), i+2
		case c < utf8.RuneSelf:
			if len(want) == 0 || want[0] != c {
				return false
			}
			want, i = want[1:], i+1
			continue
		default:
			var size int
			r, size = utf8.DecodeRune(raw[i:]) // invalid UTF-8: U+FFFD a byte
			i += size
		}
		n := utf8.EncodeRune(enc[:], r)
		if len(want) < n || want[:n] != string(enc[:n]) {
			return false
		}
		want = want[n:]
	}
	return len(want) == 0
}

// unescapeU decodes the \uXXXX escape at i of valid string contents, with
// the low surrogate that may follow it, as encoding/json does (an unpaired
// surrogate becomes U+FFFD), and returns the index after it.
func unescapeU(raw []byte, i int) (rune, int) {
	r := hex4(raw[i+2 : i+6])
	i += 6
	if !utf16.IsSurrogate(r) {
		return r, i
	}
	if i+6 <= len(raw) && raw[i] == '\\' && raw[i+1] == 'u' {
		if pair := utf16.DecodeRune(r, hex4(raw[i+2:i+6])); pair != utf8.RuneError {
			return pair, i + 6
		}
	}
	return utf8.RuneError, i
}

// hex4 decodes four hex digits, already checked by valid.
func hex4(h []byte) rune {
	var r rune
	for _, c := range h {
		switch {
		case c <= '9':
			c -= '0'
		case c >= 'a':
			c -= 'a' - 10
		default:
			c -= 'A' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// unescapeByte decodes the one-letter escape \c.
func unescapeByte(c byte) byte {
	switch c {
	case 'b':
		return '\b'
	case 'f':
		return '\f'
	case 'n':
		return '\n'
	case 'r':
		return '\r'
	case 't':
		return '\t'
	}
	return c // '"', '\\' or '/'
}
