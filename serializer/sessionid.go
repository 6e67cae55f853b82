package serializer

// MaxSessionIDLen bounds an Mcp-Session-Id: the id keys memory the table
// holds for as long as the session lives.
const MaxSessionIDLen = 256

// ValidSessionID reports whether id is an acceptable Mcp-Session-Id: 1 to
// MaxSessionIDLen bytes, each visible ASCII (0x21 to 0x7E), the charset the
// MCP specification allows.
func ValidSessionID(id string) bool {
	if len(id) == 0 || len(id) > MaxSessionIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return false
		}
	}
	return true
}
