package serializer

import "encoding/binary"

// maxDepth is encoding/json's nesting limit: deeper input is not valid.
const maxDepth = 10000

// valid reports whether b is exactly one JSON value with optional
// whitespace around it. It accepts what encoding/json.Valid accepts, no
// more and no less (the same grammar, whitespace, string rules and nesting
// limit; like encoding/json it does not check UTF-8), in one pass with no
// allocation, and it skips the plain runs of strings eight bytes at a time.
func valid(b []byte) bool {
	// One bit per open container: 1 for an object, 0 for an array.
	var objects [maxDepth/64 + 1]uint64
	depth, i := 0, 0
	for {
		// A value starts at i, after optional whitespace.
		i = skipSpace(b, i)
		if i >= len(b) {
			return false
		}
		switch c := b[i]; c {
		case '{', '[':
			if depth == maxDepth {
				return false
			}
			i = skipSpace(b, i+1)
			if i < len(b) && b[i] == c+2 { // '}' or ']': empty
				i++
				break
			}
			bit := uint64(1) << (depth & 63)
			if c == '{' {
				objects[depth>>6] |= bit
				if i = member(b, i); i < 0 {
					return false
				}
			} else {
				objects[depth>>6] &^= bit
			}
			depth++
			continue // the first element's value
		case '"':
			if i = validString(b, i); i < 0 {
				return false
			}
		case 't':
			if i = literal(b, i, "true"); i < 0 {
				return false
			}
		case 'f':
			if i = literal(b, i, "false"); i < 0 {
				return false
			}
		case 'n':
			if i = literal(b, i, "null"); i < 0 {
				return false
			}
		default:
			if i = number(b, i); i < 0 {
				return false
			}
		}
		// A value ended at i: close the containers that end here, then go
		// on with the next element, or stop at the end of the top value.
		for {
			i = skipSpace(b, i)
			if depth == 0 {
				return i == len(b)
			}
			if i >= len(b) {
				return false
			}
			inObject := objects[(depth-1)>>6]&(1<<((depth-1)&63)) != 0
			c := b[i]
			if c == ',' {
				i++
				if inObject {
					if i = member(b, skipSpace(b, i)); i < 0 {
						return false
					}
				}
				break
			}
			if inObject && c == '}' || !inObject && c == ']' {
				depth--
				i++
				continue
			}
			return false
		}
	}
}

// member checks `"key" :` at i and returns the index after the colon, or
// -1.
func member(b []byte, i int) int {
	if i >= len(b) || b[i] != '"' {
		return -1
	}
	if i = validString(b, i); i < 0 {
		return -1
	}
	i = skipSpace(b, i)
	if i >= len(b) || b[i] != ':' {
		return -1
	}
	return i + 1
}

func skipSpace(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

func literal(b []byte, i int, word string) int {
	if len(b)-i < len(word) || string(b[i:i+len(word)]) != word {
		return -1
	}
	return i + len(word)
}

// number checks -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? at i and
// returns the index after it, or -1.
func number(b []byte, i int) int {
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		i = digits(b, i+1)
	default:
		return -1
	}
	if i < len(b) && b[i] == '.' {
		j := digits(b, i+1)
		if j == i+1 {
			return -1
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(b, i)
		if j == i {
			return -1
		}
		i = j
	}
	return i
}

func digits(b []byte, i int) int {
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		i++
	}
	return i
}

// validString checks the string whose opening quote is at i and returns
// the index after its closing quote, or -1. A string may hold any byte but
// control characters (below 0x20), and only JSON's escapes.
func validString(b []byte, i int) int {
	i++
	for {
		i = plainRun(b, i)
		if i >= len(b) {
			return -1
		}
		switch c := b[i]; {
		case c == '"':
			return i + 1
		case c < 0x20:
			return -1
		}
		// A backslash.
		if i+1 >= len(b) {
			return -1
		}
		switch b[i+1] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			i += 2
		case 'u':
			if len(b)-i < 6 || !isHex(b[i+2]) || !isHex(b[i+3]) || !isHex(b[i+4]) || !isHex(b[i+5]) {
				return -1
			}
			i += 6
		default:
			return -1
		}
	}
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// plainRun returns the index of the first byte at or after i that is a
// quote, a backslash or a control character, or len(b). It tests eight
// bytes at a time while none of them is.
func plainRun(b []byte, i int) int {
	const (
		ones  = 0x0101010101010101
		highs = 0x8080808080808080
	)
	for i+8 <= len(b) {
		x := binary.LittleEndian.Uint64(b[i:])
		// A byte of x is below 0x20, or equals '"' or '\\', if and only if
		// the corresponding test below sets its high bit somewhere.
		control := (x - 0x20*ones) &^ x
		quote := x ^ '"'*ones
		backslash := x ^ '\\'*ones
		if (control|(quote-ones)&^quote|(backslash-ones)&^backslash)&highs != 0 {
			break
		}
		i += 8
	}
	for i < len(b) {
		if c := b[i]; c == '"' || c == '\\' || c < 0x20 {
			return i
		}
		i++
	}
	return i
}
