module github.com/mcpserializer/caddy-mcp-serializer

go 1.26.0

require github.com/hashicorp/golang-lru/v2 v2.0.7
