<?php

declare(strict_types=1);

// Front controller: every request to the site (e.g. /mcp) lands here.

require __DIR__ . '/../src/Config.php';
require __DIR__ . '/../src/SessionStore.php';
require __DIR__ . '/../src/SessionLock.php';
require __DIR__ . '/../src/CartStore.php';
require __DIR__ . '/../src/ModernEndpoint.php';
require __DIR__ . '/../src/McpEndpoint.php';
require __DIR__ . '/../src/UserSessionsEndpoint.php';

$config = Config::fromEnvironment();
if (str_starts_with($_SERVER['REQUEST_URI'] ?? '', '/user-mcp')) {
    (new UserSessionsEndpoint($config, new SessionStore($config->storePath)))->handle();
} else {
    (new McpEndpoint($config))->handle();
}
