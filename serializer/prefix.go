package serializer

// ClassifyPrefix classifies a body of which only the first bytes are
// known, one too large to read whole: RepliesOnly, with the method
// "response", if those bytes show a JSON-RPC response, else no traits. It
// decides from the members shown so far of a top-level object: a "result"
// or "error" member and no "method" member, and an "id" too if the object
// ended within the prefix (the TypeScript SDK writes the id after the
// result, so a large result hides it). What follows the prefix is not
// seen: a "method" member after a large result would go unnoticed, and
// only in the sender's own session. A top-level array (a batch, which MCP
// has not had since 2025-06-18) is ordinary: a request could follow its
// replies unseen. Bytes that cannot begin valid JSON are ordinary.
func ClassifyPrefix(prefix []byte) (Traits, Method) {
	s := prefixScanner{b: prefix}
	s.space()
	if s.i == len(s.b) || s.b[s.i] != '{' {
		return 0, Method{}
	}
	m, st := s.object()
	switch {
	case st == prefixCut && !m.hasMethod && m.hasResult,
		st == prefixDone && m.isResponse() && s.endsWell():
		return RepliesOnly, Method{kind: methodResponse}
	}
	return 0, Method{}
}

// prefixStatus is how a value ends within a prefix.
type prefixStatus uint8

const (
	prefixDone prefixStatus = iota // it ended within the prefix
	prefixCut                      // the prefix ended first; valid so far
	prefixBad                      // not valid JSON
)

// prefixScanner walks the start of a JSON text that may be cut anywhere,
// checking it as far as it goes.
type prefixScanner struct {
	b []byte
	i int
}

func (s *prefixScanner) space() { s.i = skipSpace(s.b, s.i) }

// endsWell reports whether only whitespace follows the top-level value
// that ended at s.i.
func (s *prefixScanner) endsWell() bool {
	s.space()
	return s.i == len(s.b)
}

// object reads the object at s.i, noting its members as Classify does; a
// member whose name was read whole counts even if its value is cut.
func (s *prefixScanner) object() (message, prefixStatus) {
	var m message
	s.i++ // {
	s.space()
	if s.i == len(s.b) {
		return m, prefixCut
	}
	if s.b[s.i] == '}' {
		s.i++
		return m, prefixDone
	}
	for {
		if s.i == len(s.b) {
			return m, prefixCut
		}
		if s.b[s.i] != '"' {
			return m, prefixBad
		}
		start := s.i
		if st := s.str(); st != prefixDone {
			return m, st
		}
		switch key := s.b[start+1 : s.i-1]; {
		case stringEquals(key, "method"):
			m.hasMethod = true
		case stringEquals(key, "id"):
			m.hasID = true
		case stringEquals(key, "result"), stringEquals(key, "error"):
			m.hasResult = true
		}
		s.space()
		if s.i == len(s.b) {
			return m, prefixCut
		}
		if s.b[s.i] != ':' {
			return m, prefixBad
		}
		s.i++
		if st := s.value(0); st != prefixDone {
			return m, st
		}
		s.space()
		if s.i == len(s.b) {
			return m, prefixCut
		}
		switch s.b[s.i] {
		case '}':
			s.i++
			return m, prefixDone
		case ',':
			s.i++
			s.space()
		default:
			return m, prefixBad
		}
	}
}

// value checks the value at s.i (after optional whitespace).
func (s *prefixScanner) value(depth int) prefixStatus {
	s.space()
	if s.i == len(s.b) {
		return prefixCut
	}
	if depth == maxDepth {
		return prefixBad
	}
	switch c := s.b[s.i]; c {
	case '"':
		return s.str()
	case '{', '[':
		s.i++
		s.space()
		if s.i < len(s.b) && s.b[s.i] == c+2 { // empty
			s.i++
			return prefixDone
		}
		for {
			if c == '{' {
				if s.i == len(s.b) {
					return prefixCut
				}
				if s.b[s.i] != '"' {
					return prefixBad
				}
				if st := s.str(); st != prefixDone {
					return st
				}
				s.space()
				if s.i == len(s.b) {
					return prefixCut
				}
				if s.b[s.i] != ':' {
					return prefixBad
				}
				s.i++
			}
			if st := s.value(depth + 1); st != prefixDone {
				return st
			}
			s.space()
			if s.i == len(s.b) {
				return prefixCut
			}
			switch s.b[s.i] {
			case ',':
				s.i++
				s.space()
			case c + 2:
				s.i++
				return prefixDone
			default:
				return prefixBad
			}
		}
	case 't':
		return s.literal("true")
	case 'f':
		return s.literal("false")
	case 'n':
		return s.literal("null")
	}
	return s.number()
}

func (s *prefixScanner) literal(word string) prefixStatus {
	n := min(len(word), len(s.b)-s.i)
	if string(s.b[s.i:s.i+n]) != word[:n] {
		return prefixBad
	}
	s.i += n
	if n < len(word) {
		return prefixCut
	}
	return prefixDone
}

// number checks a number; one cut by the prefix is taken as valid so far
// if some continuation of it would be.
func (s *prefixScanner) number() prefixStatus {
	start, j := s.i, s.i
	for j < len(s.b) && isNumberByte(s.b[j]) {
		j++
	}
	s.i = j
	if j == len(s.b) {
		// Cut: valid so far if completing it with digits makes a number.
		run := s.b[start:j]
		for _, tail := range []string{"", "0", "1"} {
			if end := number(append(run[:len(run):len(run)], tail...), 0); end == len(run)+len(tail) {
				return prefixCut
			}
		}
		return prefixBad
	}
	if j == start || number(s.b[:j], start) != j {
		return prefixBad
	}
	return prefixDone
}

func isNumberByte(c byte) bool {
	return '0' <= c && c <= '9' || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E'
}

// str checks the string whose opening quote is at s.i and moves past it.
func (s *prefixScanner) str() prefixStatus {
	i := s.i + 1
	for {
		i = plainRun(s.b, i)
		if i == len(s.b) {
			s.i = i
			return prefixCut
		}
		switch c := s.b[i]; {
		case c == '"':
			s.i = i + 1
			return prefixDone
		case c < 0x20:
			return prefixBad
		}
		// A backslash: check as much of its escape as there is.
		if i+1 == len(s.b) {
			s.i = len(s.b)
			return prefixCut
		}
		switch s.b[i+1] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			i += 2
		case 'u':
			for k := i + 2; k < i+6; k++ {
				if k == len(s.b) {
					s.i = k
					return prefixCut
				}
				if !isHex(s.b[k]) {
					return prefixBad
				}
			}
			i += 6
		default:
			return prefixBad
		}
	}
}
