<?php

declare(strict_types=1);

// Prints, as one JSON object, each session's most requests running at once
// as counted with MCP_PHP_COUNT_OVERLAP=1 (by a hash of its id), the
// highest of them, the pairs that overlapped, the requests counted and
// those running now. It only reads the store.
//
//   php8.2 bin/overlap-report.php /path/to/sessions.sqlite

require __DIR__ . '/../src/Config.php';
require __DIR__ . '/../src/SessionStore.php';
require __DIR__ . '/../src/SessionLock.php';
require __DIR__ . '/../src/OverlapCounter.php';

$path = $argv[1] ?? Config::fromEnvironment()->storePath;
$report = (new SessionStore($path))->overlapCounter()->report();
$report['sessions'] = (object) $report['sessions'];
$report['runs'] = (object) $report['runs'];
fwrite(STDOUT, json_encode($report, JSON_UNESCAPED_SLASHES | JSON_THROW_ON_ERROR) . "\n");
