<?php

declare(strict_types=1);

// Front controller: every request to the site (e.g. /mcp) lands here.

require __DIR__ . '/../src/Config.php';
require __DIR__ . '/../src/SessionStore.php';
require __DIR__ . '/../src/SessionLock.php';
require __DIR__ . '/../src/OverlapCounter.php';
require __DIR__ . '/../src/CartStore.php';
require __DIR__ . '/../src/ModernEndpoint.php';
require __DIR__ . '/../src/McpEndpoint.php';
require __DIR__ . '/../src/UserSessionsEndpoint.php';

$config = Config::fromEnvironment();
// The user-sessions endpoint also answers where WordPress's MCP Adapter
// does, with or without pretty permalinks, for the WordPress examples,
// and WordPress's users/me, which proves a credential (key_proof).
$uri = $_SERVER['REQUEST_URI'] ?? '';
$restRoute = is_string($_GET['rest_route'] ?? null) ? $_GET['rest_route'] : '';
if (str_starts_with($uri, '/wp-json/wp/v2/users/me') || $restRoute === '/wp/v2/users/me') {
    (new UserSessionsEndpoint($config, new SessionStore($config->storePath)))->me();
} elseif (str_starts_with($uri, '/user-mcp') || str_starts_with($uri, '/wp-json/mcp/') || str_starts_with($restRoute, '/mcp/')) {
    (new UserSessionsEndpoint($config, new SessionStore($config->storePath)))->handle();
} else {
    (new McpEndpoint($config))->handle();
}
