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
    private int $run = 0;

    public function __construct(private readonly PDO $db)
    {
    }

    /** The table's name-hash of a session id. */
    public static function sessionKey(string $sessionId): string
    {
        return substr(hash('sha256', $sessionId), 0, 16);
    }

    /**
     * The ids of the JSON-RPC requests (a method and an id) a POST body
     * holds: responses and notifications, notifications/cancelled
     * included, may run beside a request by design, so they are not
     * counted.
     *
     * @return list<string>
     */
    public static function requestIds(string $raw): array
    {
        $decoded = json_decode($raw, true);
        if (!is_array($decoded)) {
            return [];
        }
        $messages = array_is_list($decoded) ? $decoded : [$decoded];
        $ids = [];
        foreach ($messages as $message) {
            if (is_array($message) && is_string($message['method'] ?? null) && array_key_exists('id', $message)) {
                $ids[] = is_scalar($message['id']) ? (string) $message['id'] : json_encode($message['id']);
            }
        }
        return $ids;
    }

    /**
     * Counts a request of the session as running until the script ends; the
     * decrement is a shutdown function so that it runs also when the script
     * ends early (its client left, a fatal error). Its run is kept too: the
     * pool it ran in and its message ids, from when it entered to when it
     * left.
     */
    public function enter(string $sessionId, string $pool = '', string $messages = ''): void
    {
        $key = self::sessionKey($sessionId);
        // In DO UPDATE, running and peak are the row's values before this request.
        $stmt = $this->db->prepare(
            'INSERT INTO mcp_overlap (session, running, peak, overlaps, requests) VALUES (?, 1, 1, 0, 1)'
            . ' ON CONFLICT(session) DO UPDATE SET running = running + 1, peak = MAX(peak, running + 1),'
            . ' overlaps = overlaps + running, requests = requests + 1'
        );
        $stmt->execute([$key]);
        $this->db->prepare('INSERT INTO mcp_overlap_runs (session, pool, pid, message, entered) VALUES (?, ?, ?, ?, ?)')
            ->execute([$key, $pool, getmypid(), $messages, microtime(true)]);
        $this->run = (int) $this->db->lastInsertId();
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
        $this->db->prepare('UPDATE mcp_overlap_runs SET left_at = ? WHERE rowid = ?')->execute([microtime(true), $this->run]);
        $this->entered = null;
    }

    /**
     * The counts so far: each session's peak by its hash, the highest peak,
     * the pairs that overlapped, the requests counted and those running now;
     * and, for each session whose peak is above 1, its requests' runs in the
     * order they entered (pool, pid, message ids, entered and left in
     * seconds since the epoch, left null while it runs).
     *
     * @return array{sessions: array<string, int>, peak: int, overlaps: int, requests: int, running: int, runs: array<string, list<array{pool: string, pid: int, messages: string, entered: float, left: ?float}>>}
     */
    public function report(): array
    {
        $out = ['sessions' => [], 'peak' => 0, 'overlaps' => 0, 'requests' => 0, 'running' => 0, 'runs' => []];
        foreach ($this->db->query('SELECT session, running, peak, overlaps, requests FROM mcp_overlap ORDER BY session') as $row) {
            $out['sessions'][$row['session']] = (int) $row['peak'];
            $out['peak'] = max($out['peak'], (int) $row['peak']);
            $out['overlaps'] += (int) $row['overlaps'];
            $out['requests'] += (int) $row['requests'];
            $out['running'] += (int) $row['running'];
        }
        $runs = $this->db->prepare('SELECT pool, pid, message, entered, left_at FROM mcp_overlap_runs WHERE session = ? ORDER BY entered');
        foreach ($out['sessions'] as $session => $peak) {
            if ($peak < 2) {
                continue;
            }
            $runs->execute([$session]);
            foreach ($runs->fetchAll(PDO::FETCH_ASSOC) as $run) {
                $out['runs'][$session][] = [
                    'pool' => (string) $run['pool'],
                    'pid' => (int) $run['pid'],
                    'messages' => (string) $run['message'],
                    'entered' => (float) $run['entered'],
                    'left' => $run['left_at'] === null ? null : (float) $run['left_at'],
                ];
            }
        }
        return $out;
    }
}
