package caddymodule

import (
	"context"
	"net"
	"net/http"
	"syscall"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// connKey holds, in a request's context, the connection it came on.
type connKey struct{}

// watchConns has the server that provisions the handler put each
// connection in its requests' contexts, for clientGone.
func watchConns(ctx caddy.Context) {
	if srv, _ := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); srv != nil {
		srv.RegisterConnContext(func(ctx context.Context, c net.Conn) context.Context {
			if ctx.Value(connKey{}) != nil {
				return ctx // another handler of the server put it there
			}
			return context.WithValue(ctx, connKey{}, c)
		})
	}
}

// clientGone reports whether the client of an HTTP/1 request has closed
// its connection, as the operating system tells without reading from it
// (false if it cannot tell). net/http notices a closed HTTP/1 connection
// only by reading it, and reads it only once the handler has read the
// body whole, so the context of a request whose body is still unread never
// ends; HTTP/2 and HTTP/3 end it.
func clientGone(r *http.Request) bool {
	if r.ProtoMajor != 1 {
		return false
	}
	c, _ := r.Context().Value(connKey{}).(net.Conn)
	for c != nil {
		switch v := c.(type) {
		case syscall.Conn:
			raw, err := v.SyscallConn()
			return err == nil && peerClosed(raw)
		case interface{ NetConn() net.Conn }: // *tls.Conn
			c = v.NetConn()
		default:
			return false
		}
	}
	return false
}
