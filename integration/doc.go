// Package integration holds end-to-end tests that run real processes: a Caddy
// binary built with the mcp_serializer module, PHP-FPM with several workers
// serving the MCP backend in php/, and the official MCP TypeScript SDK as the
// client (client/). The cluster tests add redis-server and several Caddy
// instances behind a front Caddy that hashes Mcp-Session-Id.
//
// Prerequisites: php-fpm8.2 with pdo_sqlite (Debian: php8.2-fpm
// php8.2-sqlite3), redis-server, Node.js 20 with the client's packages installed
// (npm ci --prefix integration/client), and make plus Go to build Caddy
// (or MCP_SERIALIZER_CADDY pointing at a built binary). `make deps`
// installs the packages (scripts/install-test-deps).
package integration
