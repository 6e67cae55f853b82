<?php

declare(strict_types=1);

/**
 * Counts, per session, the POSTs carrying a JSON-RPC request that run in
 * PHP at once, across every worker and pool on one store (opt-in:
 * MCP_PHP_COUNT_OVERLAP=1). It is the backend's own view of overlap:
 * whatever ran in front of PHP-FPM, two requests of a session either ran
 * here at the same time or they did not.
 *
 * One row per session in table mcp_overlap: how many of its requests run
 * now, the most that ran at once, how many pairs of its requests ran at
 * once (a request that starts while k others run adds k), and how many
 * were counted. Each change is one UPSERT or UPDATE statement, which
 * SQLite runs under its write lock, so counts from concurrent workers are
 * exact. The row is named by a hash of the session id: the id is a
 * credential.
 */
final class OverlapCounter
{
    private ?string $entered = null;

    public function __construct(private readonly PDO $db)
    {
    }

    /** The table's name-hash of a session id. */
    public static function sessionKey(string $sessionId): string
    {
        return substr(hash('sha256', $sessionId), 0, 16);
    }

    /**
     * Whether a POST body holds a JSON-RPC request (a method and an id):
     * responses and notifications, notifications/cancelled included, may
     * run beside a request by design, so they are not counted.
     */
    public static function carriesRequest(string $raw): bool
    {
        $decoded = json_decode($raw, true);
        if (!is_array($decoded)) {
            return false;
        }
        $messages = array_is_list($decoded) ? $decoded : [$decoded];
        foreach ($messages as $message) {
            if (is_array($message) && is_string($message['method'] ?? null) && array_key_exists('id', $message)) {
                return true;
            }
        }
        return false;
    }

    /**
     * Counts a request of the session as running until the script ends; the
     * decrement is a shutdown function so that it runs also when the script
     * ends early (its client left, a fatal error).
     */
    public function enter(string $sessionId): void
    {
        $key = self::sessionKey($sessionId);
        // In DO UPDATE, running and peak are the row's values before this request.
        $stmt = $this->db->prepare(
            'INSERT INTO mcp_overlap (session, running, peak, overlaps, requests) VALUES (?, 1, 1, 0, 1)'
            . ' ON CONFLICT(session) DO UPDATE SET running = running + 1, peak = MAX(peak, running + 1),'
            . ' overlaps = overlaps + running, requests = requests + 1'
        );
        $stmt->execute([$key]);
        $this->entered = $key;
        register_shutdown_function(fn () => $this->leave());
    }

    public function leave(): void
    {
        if ($this->entered === null) {
            return;
        }
        $stmt = $this->db->prepare('UPDATE mcp_overlap SET running = running - 1 WHERE session = ?');
        $stmt->execute([$this->entered]);
        $this->entered = null;
    }

    /**
     * The counts so far: each session's peak by its hash, the highest peak,
     * the pairs that overlapped, the requests counted and those running now.
     *
     * @return array{sessions: array<string, int>, peak: int, overlaps: int, requests: int, running: int}
     */
    public function report(): array
    {
        $out = ['sessions' => [], 'peak' => 0, 'overlaps' => 0, 'requests' => 0, 'running' => 0];
        foreach ($this->db->query('SELECT session, running, peak, overlaps, requests FROM mcp_overlap ORDER BY session') as $row) {
            $out['sessions'][$row['session']] = (int) $row['peak'];
            $out['peak'] = max($out['peak'], (int) $row['peak']);
            $out['overlaps'] += (int) $row['overlaps'];
            $out['requests'] += (int) $row['requests'];
            $out['running'] += (int) $row['running'];
        }
        return $out;
    }
}
