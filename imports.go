// Package caddymcpserializer lets xcaddy build Caddy with mcp_serializer from
// the module path alone:
//
//	xcaddy build --with github.com/mcpserializer/caddy-mcp-serializer
//
// The handler is in package caddymodule, which brings the state engines
// (packages redisstate and storagestate, on the contract of package
// stateengine); the scheduling core, which depends on neither Caddy nor
// Redis, is in package serializer.
package caddymcpserializer

import _ "github.com/mcpserializer/caddy-mcp-serializer/caddymodule"
