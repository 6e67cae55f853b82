// Package caddymcpserializer lets xcaddy build Caddy with mcp_serializer from
// the module path alone:
//
//	xcaddy build --with github.com/mcpserializer/caddy-mcp-serializer
//
// The handler itself is in package caddymodule; the scheduling core, which
// does not depend on Caddy, is in package serializer.
package caddymcpserializer

import _ "github.com/mcpserializer/caddy-mcp-serializer/caddymodule"
