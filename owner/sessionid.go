package owner

import (
	"strings"

	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// With shared state, the client's Mcp-Session-Id names the instance that
// owns the session: idMarker, the owner's instance ID, a dot, and the id
// the upstream minted. Any instance can then route a request from its id
// alone, and the upstream is only ever shown its own id.
const (
	// idMarker opens an id that names its owner; distinctive enough that
	// an id minted by an upstream before owners were carried (a session
	// begun before an upgrade) is very unlikely to parse as one.
	idMarker = "mcps1."
	// instanceIDLen is the length of an instance ID: NewID's 8 random
	// bytes in lowercase hex.
	instanceIDLen = 16
	// idPrefixLen is what WithOwner adds to an upstream's id.
	idPrefixLen = len(idMarker) + instanceIDLen + 1
)

// WithOwner returns the id a client is given for upstreamID, a session
// owned by the instance instanceID. ok is false, and upstreamID is
// returned as it is, when instanceID is not an ID NewID makes or
// upstreamID is not a valid session id or too long to carry the prefix
// within serializer.MaxSessionIDLen: the client's id then names no owner.
func WithOwner(instanceID, upstreamID string) (string, bool) {
	if !isInstanceID(instanceID) || !serializer.ValidSessionID(upstreamID) ||
		len(upstreamID) > serializer.MaxSessionIDLen-idPrefixLen {
		return upstreamID, false
	}
	return idMarker + instanceID + "." + upstreamID, true
}

// SplitOwner takes one owner prefix off a client's id: the owner's
// instance ID and the upstream's id, ok true. An id without the prefix
// (minted before owners were carried, or by an instance that could not
// add one) is the upstream's id whole, ok false. Exactly one prefix comes
// off, so that an upstream which itself names owners this way (another
// such cluster behind this one) gets its own id back.
func SplitOwner(clientID string) (instanceID, upstreamID string, ok bool) {
	rest, found := strings.CutPrefix(clientID, idMarker)
	if !found || len(rest) < instanceIDLen+2 || rest[instanceIDLen] != '.' || !isInstanceID(rest[:instanceIDLen]) {
		return "", clientID, false
	}
	return rest[:instanceIDLen], rest[instanceIDLen+1:], true
}

// isInstanceID reports whether s has the form of NewID's IDs.
func isInstanceID(s string) bool {
	if len(s) != instanceIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
