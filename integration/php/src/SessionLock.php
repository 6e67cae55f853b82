<?php

declare(strict_types=1);

/**
 * A per-session lock in the shared SQLite store, the way Laravel's
 * `Cache::lock($name, $seconds)->block($wait)` works on its database store:
 *
 *  - acquire inserts a row (name, owner token, expiry), or takes over a row
 *    whose expiry has passed, in one statement;
 *  - block() tries to acquire, sleeps a fixed interval between tries (250 ms
 *    in Laravel) and gives up after the wait with a SessionLockTimeout
 *    (Laravel's LockTimeoutException);
 *  - release deletes the row only while this owner still holds it, so a
 *    lock that expired and was taken by another request stays theirs;
 *  - a lock whose holder died frees itself when its expiry passes.
 *
 * The lock name is a hash of the session id: the id is a credential.
 */
final class SessionLock
{
    private ?string $owner = null;

    public function __construct(
        private readonly PDO $db,
        private readonly string $name,
        private readonly int $seconds,
    ) {
    }

    public static function forSession(PDO $db, string $sessionId, int $seconds): self
    {
        return new self($db, 'mcp-session:' . hash('sha256', $sessionId), $seconds);
    }

    /** One try; true when this owner now holds the lock. */
    public function acquire(): bool
    {
        $owner = bin2hex(random_bytes(16));
        $now = microtime(true);
        $stmt = $this->db->prepare(
            'INSERT INTO mcp_locks (name, owner, expires_at) VALUES (?, ?, ?)'
            . ' ON CONFLICT(name) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at'
            . ' WHERE mcp_locks.expires_at <= ?'
        );
        $stmt->execute([$this->name, $owner, $now + $this->seconds, $now]);
        if ($stmt->rowCount() !== 1) {
            return false;
        }
        $this->owner = $owner;
        // Laravel's lottery: now and then, clear out locks that expired long ago.
        if (random_int(1, 100) <= 2) {
            $this->db->prepare('DELETE FROM mcp_locks WHERE expires_at <= ?')->execute([$now - 60]);
        }
        return true;
    }

    /**
     * Tries until the lock is held, sleeping $retryMs between tries, and
     * throws SessionLockTimeout once $waitMs have passed without it.
     */
    public function block(int $waitMs, int $retryMs): void
    {
        $start = microtime(true);
        while (!$this->acquire()) {
            usleep($retryMs * 1000);
            if ((microtime(true) - $start) * 1000 >= $waitMs) {
                throw new SessionLockTimeout("session lock not acquired within {$waitMs} ms");
            }
        }
    }

    public function release(): void
    {
        if ($this->owner === null) {
            return;
        }
        $this->db->prepare('DELETE FROM mcp_locks WHERE name = ? AND owner = ?')->execute([$this->name, $this->owner]);
        $this->owner = null;
    }
}

final class SessionLockTimeout extends RuntimeException
{
}
