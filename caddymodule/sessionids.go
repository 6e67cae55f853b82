package caddymodule

import (
	"net/http"

	"github.com/mcpserializer/caddy-mcp-serializer/owner"
	"github.com/mcpserializer/caddy-mcp-serializer/serializer"
)

// With order owner, the client's Mcp-Session-Id names the instance that
// serves the session (owner.WithOwner): this instance adds its ID to the
// id in every response it serves, and takes an ID off a request's id at
// the edge, so that everything past it (the table, the state engine,
// logs, the admin API, the upstream) sees the upstream's id only. Without
// owners, ids pass untouched.

// clientSessionID is the id a client is given for the upstream's id of a
// session this instance serves.
func (h *Handler) clientSessionID(upstreamID string) string {
	if h.owners == nil || h.owners.Members().Addr() == "" {
		// No other instance can reach this one (TLS or a unix socket
		// without advertise): an id naming it would route nowhere.
		return upstreamID
	}
	id, _ := owner.WithOwner(h.owners.Self(), upstreamID)
	return id
}

// splitSessionID reads a request's Mcp-Session-Id: the instance it names
// ("" for none) and the upstream's id. An id that names none (a session
// begun before owners were carried) is the upstream's whole.
func (h *Handler) splitSessionID(clientID string) (instanceID, upstreamID string) {
	if h.owners == nil {
		return "", clientID
	}
	instanceID, upstreamID, _ = owner.SplitOwner(clientID)
	return instanceID, upstreamID
}

// nameOwnerInResponse gives the client, in a response this instance
// serves, the id that names it: the TypeScript SDK adopts whatever
// Mcp-Session-Id a response carries, not only initialize's.
func (h *Handler) nameOwnerInResponse(header http.Header) {
	if h.owners == nil {
		return
	}
	for i, id := range header[sessionHeader] {
		if serializer.ValidSessionID(id) {
			header[sessionHeader][i] = h.clientSessionID(id)
		}
	}
}

// upstreamRequest is r as the upstream gets it: with the upstream's own
// id. The request's header is copied rather than changed, so that Caddy's
// access log shows the id the client sent, the same on both hops of a
// forward.
func upstreamRequest(r *http.Request, info *requestInfo) *http.Request {
	if info.idOwner == "" {
		return r
	}
	up := r.WithContext(r.Context())
	up.Header = r.Header.Clone()
	up.Header.Set(sessionHeader, info.sessionID)
	return up
}
