<?php

declare(strict_types=1);

/**
 * Session records shared by every PHP-FPM worker.
 *
 * One row per session holding the whole record as JSON, like a Laravel cache
 * or database session store: plain autocommit reads and upserts, no locking
 * and no transactions of its own. Two workers that load the same record,
 * change it and save it back overwrite each other (last save wins), which is
 * exactly the behaviour of the stores php-mcp's Laravel transport runs on.
 *
 * SQLite in WAL mode lets readers and the single writer proceed at the same
 * time; the busy timeout makes a writer wait for the write lock instead of
 * failing with SQLITE_BUSY, so lock contention never shows up as errors.
 */
final class SessionStore
{
    private PDO $db;

    public function __construct(string $path)
    {
        $this->db = new PDO('sqlite:' . $path, null, null, [
            PDO::ATTR_ERRMODE => PDO::ERRMODE_EXCEPTION,
            PDO::ATTR_TIMEOUT => 30,
        ]);
        $this->db->exec('PRAGMA busy_timeout = 30000');
        $this->db->exec('PRAGMA synchronous = NORMAL');
    }

    /**
     * Creates the tables and switches the database to WAL mode (a setting
     * stored in the file). Run once before the workers start (bin/init-store.php):
     * switching the journal mode while other connections are open fails with
     * "database is locked" no matter the busy timeout.
     */
    public function migrate(): void
    {
        $mode = $this->db->query('PRAGMA journal_mode = WAL')->fetchColumn();
        if (strtolower((string) $mode) !== 'wal') {
            throw new RuntimeException("cannot switch the session store to WAL mode (journal_mode is {$mode})");
        }
        $this->db->exec(
            'CREATE TABLE IF NOT EXISTS mcp_sessions ('
            . ' id TEXT PRIMARY KEY,'
            . ' payload TEXT NOT NULL,'
            . ' updated_at REAL NOT NULL)'
        );
        // Whole cart records of the 2026-07-28 era's handle tools (CartStore).
        $this->db->exec(
            'CREATE TABLE IF NOT EXISTS mcp_carts ('
            . ' handle TEXT PRIMARY KEY,'
            . ' payload TEXT NOT NULL,'
            . ' updated_at REAL NOT NULL)'
        );
        // Every session of a user in one map (UserSessionsEndpoint).
        $this->db->exec(
            'CREATE TABLE IF NOT EXISTS mcp_user_sessions ('
            . ' user TEXT PRIMARY KEY,'
            . ' payload TEXT NOT NULL)'
        );
        // Requests of a session running at once, when counted (OverlapCounter).
        $this->db->exec(
            'CREATE TABLE IF NOT EXISTS mcp_overlap ('
            . ' session TEXT PRIMARY KEY,'
            . ' running INTEGER NOT NULL,'
            . ' peak INTEGER NOT NULL,'
            . ' overlaps INTEGER NOT NULL,'
            . ' requests INTEGER NOT NULL)'
        );
        // Each counted request's run, so that an overlap can be told apart (OverlapCounter).
        $this->db->exec(
            'CREATE TABLE IF NOT EXISTS mcp_overlap_runs ('
            . ' session TEXT NOT NULL,'
            . ' pool TEXT NOT NULL,'
            . ' pid INTEGER NOT NULL,'
            . ' message TEXT NOT NULL,'
            . ' entered REAL NOT NULL,'
            . ' left_at REAL)'
        );
        // Per-session locks of the opt-in app-lock mode (SessionLock).
        $this->db->exec(
            'CREATE TABLE IF NOT EXISTS mcp_locks ('
            . ' name TEXT PRIMARY KEY,'
            . ' owner TEXT NOT NULL,'
            . ' expires_at REAL NOT NULL)'
        );
    }

    /** The lock of one session, held in this store; it frees itself after $seconds. */
    public function lock(string $sessionId, int $seconds): SessionLock
    {
        return SessionLock::forSession($this->db, $sessionId, $seconds);
    }

    /** The count of each session's requests running at once, in this store. */
    public function overlapCounter(): OverlapCounter
    {
        return new OverlapCounter($this->db);
    }

    /**
     * The record as last saved, or null when the session does not exist.
     *
     * @return array{initialized: bool, log_level: string, pending: list<string>, created_at: float}|null
     */
    public function load(string $id): ?array
    {
        $stmt = $this->db->prepare('SELECT payload FROM mcp_sessions WHERE id = ?');
        $stmt->execute([$id]);
        $payload = $stmt->fetchColumn();
        $stmt->closeCursor();
        if ($payload === false) {
            return null;
        }
        $record = json_decode((string) $payload, true);
        if (!is_array($record)) {
            return null;
        }
        return $record;
    }

    /** Writes the whole record, replacing whatever another worker saved in between. */
    public function save(string $id, array $record): void
    {
        $stmt = $this->db->prepare(
            'INSERT INTO mcp_sessions (id, payload, updated_at) VALUES (?, ?, ?)'
            . ' ON CONFLICT(id) DO UPDATE SET payload = excluded.payload, updated_at = excluded.updated_at'
        );
        $stmt->execute([$id, json_encode($record, JSON_UNESCAPED_SLASHES | JSON_THROW_ON_ERROR), microtime(true)]);
    }

    public function delete(string $id): void
    {
        $stmt = $this->db->prepare('DELETE FROM mcp_sessions WHERE id = ?');
        $stmt->execute([$id]);
    }

    /**
     * The map of a user's sessions, by session id, as last saved.
     *
     * @return array<string, array{created_at: int, last_activity: int}>
     */
    public function loadUserSessions(string $user): array
    {
        $stmt = $this->db->prepare('SELECT payload FROM mcp_user_sessions WHERE user = ?');
        $stmt->execute([$user]);
        $payload = $stmt->fetchColumn();
        $stmt->closeCursor();
        $sessions = $payload === false ? null : json_decode((string) $payload, true);
        return is_array($sessions) ? $sessions : [];
    }

    /** Writes a user's whole map, replacing whatever another worker saved in between. */
    public function saveUserSessions(string $user, array $sessions): void
    {
        $stmt = $this->db->prepare(
            'INSERT INTO mcp_user_sessions (user, payload) VALUES (?, ?)'
            . ' ON CONFLICT(user) DO UPDATE SET payload = excluded.payload'
        );
        $stmt->execute([$user, json_encode((object) $sessions, JSON_UNESCAPED_SLASHES | JSON_THROW_ON_ERROR)]);
    }

    /** A fresh record for a session that has just been created by `initialize`. */
    public static function newRecord(): array
    {
        return [
            'initialized' => false,
            'log_level' => 'info',
            'pending' => [],
            'created_at' => microtime(true),
        ];
    }
}
