package caddymodule

// The state engines register themselves as Caddy modules; a Caddy built
// with this package has both, however it names the module to xcaddy.
import (
	_ "github.com/mcpserializer/caddy-mcp-serializer/redisstate"
	_ "github.com/mcpserializer/caddy-mcp-serializer/storagestate"
)
