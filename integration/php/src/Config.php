<?php

declare(strict_types=1);

/**
 * Settings, read from FastCGI parameters first and the environment second,
 * so they can come from the PHP-FPM pool (env[...]) or from the web server.
 *
 *   MCP_PHP_STORE        path of the SQLite session store (default: temp dir)
 *   MCP_PHP_WORK_MS      random work per request between load and save,
 *                        "MIN-MAX" or "N" milliseconds (default "2-8")
 *   MCP_PHP_PROGRESS_MS  pause after each progress event of slow_count (default 150)
 *   MCP_PHP_GET_SECONDS  lifetime of a GET stream before it ends itself; 0, the
 *                        default, keeps it open until the session is gone or
 *                        the client has left, as php-mcp does
 *   MCP_PHP_GET_POLL_MS  interval at which a GET stream re-reads and re-saves
 *                        the session record (default 1000)
 */
final class Config
{
    public function __construct(
        public readonly string $storePath,
        public readonly int $workMinMs,
        public readonly int $workMaxMs,
        public readonly int $progressPauseMs,
        public readonly int $getStreamSeconds,
        public readonly int $getPollMs,
    ) {
    }

    public static function fromEnvironment(): self
    {
        $store = self::value('MCP_PHP_STORE', '');
        if ($store === '') {
            $store = sys_get_temp_dir() . '/mcp-php-sessions.sqlite';
        }
        [$min, $max] = self::range(self::value('MCP_PHP_WORK_MS', '2-8'));
        return new self(
            $store,
            $min,
            $max,
            max(0, (int) self::value('MCP_PHP_PROGRESS_MS', '150')),
            max(0, (int) self::value('MCP_PHP_GET_SECONDS', '0')),
            max(10, (int) self::value('MCP_PHP_GET_POLL_MS', '1000')),
        );
    }

    private static function value(string $name, string $default): string
    {
        if (isset($_SERVER[$name]) && is_string($_SERVER[$name]) && $_SERVER[$name] !== '') {
            return $_SERVER[$name];
        }
        $env = getenv($name);
        if (is_string($env) && $env !== '') {
            return $env;
        }
        return $default;
    }

    /** @return array{int, int} */
    private static function range(string $spec): array
    {
        $parts = array_map('intval', explode('-', trim($spec), 2));
        $min = max(0, $parts[0]);
        $max = max($min, $parts[1] ?? $min);
        return [$min, $max];
    }
}
