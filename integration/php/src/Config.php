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
 *                        the session record, and a subscriptions/listen stream
 *                        writes its keepalive (default 1000)
 *   MCP_PHP_APP_LOCK     "1": a per-session lock in the store around each POST
 *                        and DELETE, like a Laravel middleware with Cache::lock
 *                        (default off)
 *   MCP_PHP_LOCK_SECONDS the lock's expiry (default 10)
 *   MCP_PHP_LOCK_WAIT_MS how long a request waits for the lock before it fails
 *                        with HTTP 500 (default 5000)
 *   MCP_PHP_LOCK_RETRY_MS pause between tries while waiting (default 250)
 *   MCP_PHP_ERAS         "both" (default): MCP 2026-07-28 beside the 2025 era on
 *                        the same endpoint; "legacy": the 2025 era only, as
 *                        before (a server/discover probe gets today's 400)
 *   MCP_PHP_CART_MS      work of cart_add between loading and saving the
 *                        cart, "MIN-MAX" or "N" milliseconds (default "20")
 *   MCP_PHP_LISTEN_SECONDS lifetime of a subscriptions/listen stream before
 *                        the server ends it; 0, the default, keeps it open
 *                        until the client has left
 *   MCP_PHP_COUNT_OVERLAP "1": count each session's requests running at once
 *                        in the store (OverlapCounter; read with
 *                        bin/overlap-report.php); default off
 *   MCP_PHP_POOL         a name for this pool, kept with each request counted
 *                        so that an overlap shows where each of its requests
 *                        ran; default ""
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
        public readonly bool $appLock = false,
        public readonly int $lockSeconds = 10,
        public readonly int $lockWaitMs = 5000,
        public readonly int $lockRetryMs = 250,
        public readonly bool $modernEra = true,
        public readonly int $cartWorkMinMs = 20,
        public readonly int $cartWorkMaxMs = 20,
        public readonly int $listenSeconds = 0,
        public readonly int $activitySeconds = 60,
        public readonly bool $countOverlap = false,
        public readonly string $pool = '',
    ) {
    }

    public static function fromEnvironment(): self
    {
        $store = self::value('MCP_PHP_STORE', '');
        if ($store === '') {
            $store = sys_get_temp_dir() . '/mcp-php-sessions.sqlite';
        }
        [$min, $max] = self::range(self::value('MCP_PHP_WORK_MS', '2-8'));
        [$cartMin, $cartMax] = self::range(self::value('MCP_PHP_CART_MS', '20'));
        $eras = strtolower(self::value('MCP_PHP_ERAS', 'both'));
        if (!in_array($eras, ['both', 'legacy'], true)) {
            throw new InvalidArgumentException("MCP_PHP_ERAS must be both or legacy, not {$eras}");
        }
        return new self(
            $store,
            $min,
            $max,
            max(0, (int) self::value('MCP_PHP_PROGRESS_MS', '150')),
            max(0, (int) self::value('MCP_PHP_GET_SECONDS', '0')),
            max(10, (int) self::value('MCP_PHP_GET_POLL_MS', '1000')),
            appLock: in_array(strtolower(self::value('MCP_PHP_APP_LOCK', '0')), ['1', 'on', 'true', 'yes'], true),
            lockSeconds: max(1, (int) self::value('MCP_PHP_LOCK_SECONDS', '10')),
            lockWaitMs: max(0, (int) self::value('MCP_PHP_LOCK_WAIT_MS', '5000')),
            lockRetryMs: max(1, (int) self::value('MCP_PHP_LOCK_RETRY_MS', '250')),
            modernEra: $eras === 'both',
            cartWorkMinMs: $cartMin,
            cartWorkMaxMs: $cartMax,
            listenSeconds: max(0, (int) self::value('MCP_PHP_LISTEN_SECONDS', '0')),
            activitySeconds: max(0, (int) self::value('MCP_PHP_ACTIVITY_SECONDS', '60')),
            countOverlap: in_array(strtolower(self::value('MCP_PHP_COUNT_OVERLAP', '0')), ['1', 'on', 'true', 'yes'], true),
            pool: self::value('MCP_PHP_POOL', ''),
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
