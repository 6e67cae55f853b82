<?php

declare(strict_types=1);

// Creates the SQLite store (WAL mode; sessions, carts, locks, overlap counts) before PHP-FPM starts.
//
//   php8.2 bin/init-store.php /path/to/sessions.sqlite
//
// Without an argument the path comes from MCP_PHP_STORE, as for the workers.

require __DIR__ . '/../src/Config.php';
require __DIR__ . '/../src/SessionStore.php';
require __DIR__ . '/../src/SessionLock.php';
require __DIR__ . '/../src/OverlapCounter.php';

$path = $argv[1] ?? Config::fromEnvironment()->storePath;
(new SessionStore($path))->migrate();
fwrite(STDOUT, "session store ready: {$path}\n");
