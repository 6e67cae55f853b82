<?php

declare(strict_types=1);

/**
 * Cart records of the 2026-07-28 era's handle tools, in the same SQLite file
 * as the sessions: one row per cart handle holding the whole record as JSON,
 * read and written like a Laravel cache entry (Cache::get, then Cache::put)
 * with plain autocommit statements and no locking. Two workers that load the
 * same cart, change it and save it back overwrite each other: the last save
 * wins, and the other's change is lost.
 *
 * The table is created by SessionStore::migrate (bin/init-store.php).
 */
final class CartStore
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
     * The cart as last saved, or null when there is no such cart.
     *
     * @return array{items: list<string>, created_at: float}|null
     */
    public function load(string $handle): ?array
    {
        $stmt = $this->db->prepare('SELECT payload FROM mcp_carts WHERE handle = ?');
        $stmt->execute([$handle]);
        $payload = $stmt->fetchColumn();
        $stmt->closeCursor();
        if ($payload === false) {
            return null;
        }
        $record = json_decode((string) $payload, true);
        return is_array($record) ? $record : null;
    }

    /** Writes the whole record, replacing whatever another worker saved in between. */
    public function save(string $handle, array $record): void
    {
        $stmt = $this->db->prepare(
            'INSERT INTO mcp_carts (handle, payload, updated_at) VALUES (?, ?, ?)'
            . ' ON CONFLICT(handle) DO UPDATE SET payload = excluded.payload, updated_at = excluded.updated_at'
        );
        $stmt->execute([$handle, json_encode($record, JSON_UNESCAPED_SLASHES | JSON_THROW_ON_ERROR), microtime(true)]);
    }
}
