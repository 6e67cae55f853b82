<?php

declare(strict_types=1);

/**
 * An MCP endpoint that keeps every session of a user in one record, the way
 * WordPress's MCP Adapter does (its SessionManager keeps them all in one
 * user_meta map): the record is read, changed and written back whole by
 * `initialize` (which adds a session and drops expired ones), by a
 * request's activity update (at most once per MCP_PHP_ACTIVITY_SECONDS per
 * session, 60 as in the adapter) and by DELETE. Two of these for one user
 * at once, and the later write drops a session the other had just added or
 * kept: its next request is answered 404, -32005 "Session not found".
 *
 * The user is the name in the request's Basic credentials; any password
 * that does not begin with "wrong" is right (the tests need whose record it
 * is, and passwords the server refuses). Served at /user-mcp.
 */
final class UserSessionsEndpoint
{
    public function __construct(private readonly Config $config, private readonly SessionStore $store)
    {
    }

    public function handle(): void
    {
        $user = $this->user();
        if ($user === null) {
            $this->httpError(401, -32600, 'Basic credentials required');
            return;
        }
        if ($this->wrongPassword()) {
            $this->httpError(401, -32600, 'Incorrect password');
            return;
        }
        $sessionId = $_SERVER['HTTP_MCP_SESSION_ID'] ?? '';
        match ($_SERVER['REQUEST_METHOD'] ?? 'GET') {
            'POST' => $this->post($user, $sessionId),
            'DELETE' => $this->delete($user, $sessionId),
            default => http_response_code(405), // the adapter serves no GET stream
        };
    }

    /**
     * WordPress's GET /wp/v2/users/me, which mcp_serializer's key_proof
     * asks: the user for right credentials, 401 for any other. It reads
     * the user and writes nothing.
     */
    public function me(): void
    {
        $user = $this->user();
        if ($user === null || $this->wrongPassword()) {
            $this->httpError(401, -32600, 'Incorrect password');
            return;
        }
        header('Content-Type: application/json');
        echo json_encode(['id' => crc32($user), 'username' => $user]);
    }

    private function post(string $user, string $sessionId): void
    {
        $message = json_decode((string) file_get_contents('php://input'), true);
        if (!is_array($message) || ($message['jsonrpc'] ?? null) !== '2.0') {
            $this->httpError(400, -32600, 'Invalid Request');
            return;
        }
        $method = $message['method'] ?? null;
        if ($sessionId === '') {
            if ($method !== 'initialize') {
                $this->httpError(400, -32600, 'Missing Mcp-Session-Id header');
                return;
            }
            $this->initialize($user, $message);
            return;
        }
        if (!$this->touch($user, $sessionId)) {
            $this->httpError(404, -32005, 'Session not found');
            return;
        }
        if (!array_key_exists('id', $message)) {
            http_response_code(202); // a notification or a client's reply
            return;
        }
        $result = match ($method) {
            'tools/list' => ['tools' => []],
            'prompts/list' => ['prompts' => []],
            'resources/list' => ['resources' => []],
            default => new stdClass(),
        };
        $this->reply(['jsonrpc' => '2.0', 'id' => $message['id'], 'result' => $result]);
    }

    /** create_session: drop expired sessions, add the new one, write the map back. */
    private function initialize(string $user, array $message): void
    {
        $sessions = $this->store->loadUserSessions($user);
        $now = time();
        foreach ($sessions as $id => $s) {
            if ($s['last_activity'] + 86400 < $now) {
                unset($sessions[$id]);
            }
        }
        $this->work();
        $sessionId = bin2hex(random_bytes(16));
        $sessions[$sessionId] = ['created_at' => $now, 'last_activity' => $now];
        $this->store->saveUserSessions($user, $sessions);
        header('Mcp-Session-Id: ' . $sessionId);
        $version = $message['params']['protocolVersion'] ?? McpEndpoint::PROTOCOL_VERSIONS[0];
        if (!in_array($version, McpEndpoint::PROTOCOL_VERSIONS, true)) {
            $version = McpEndpoint::PROTOCOL_VERSIONS[0];
        }
        $this->reply(['jsonrpc' => '2.0', 'id' => $message['id'] ?? null, 'result' => [
            'protocolVersion' => $version,
            'capabilities' => ['tools' => new stdClass(), 'prompts' => new stdClass(), 'resources' => new stdClass()],
            'serverInfo' => ['name' => 'user-sessions', 'version' => '1.0.0'],
        ]]);
    }

    /** validate_session: the session must be in the map; its activity is written back when due. */
    private function touch(string $user, string $sessionId): bool
    {
        $sessions = $this->store->loadUserSessions($user);
        if (!isset($sessions[$sessionId])) {
            return false;
        }
        $this->work();
        $now = time();
        if ($now - $sessions[$sessionId]['last_activity'] >= $this->config->activitySeconds) {
            $sessions[$sessionId]['last_activity'] = $now;
            $this->store->saveUserSessions($user, $sessions);
        }
        return true;
    }

    private function delete(string $user, string $sessionId): void
    {
        $sessions = $this->store->loadUserSessions($user);
        if (!isset($sessions[$sessionId])) {
            $this->httpError(404, -32005, 'Session not found');
            return;
        }
        $this->work();
        unset($sessions[$sessionId]);
        $this->store->saveUserSessions($user, $sessions);
        http_response_code(200);
    }

    private function wrongPassword(): bool
    {
        return str_starts_with($this->password(), 'wrong');
    }

    private function password(): string
    {
        $decoded = base64_decode(substr($_SERVER['HTTP_AUTHORIZATION'] ?? '', 6), true);
        return is_string($decoded) ? (explode(':', $decoded, 2)[1] ?? '') : '';
    }

    private function user(): ?string
    {
        $auth = $_SERVER['HTTP_AUTHORIZATION'] ?? '';
        if (!str_starts_with($auth, 'Basic ')) {
            return null;
        }
        $decoded = base64_decode(substr($auth, 6), true);
        if ($decoded === false || !str_contains($decoded, ':')) {
            return null;
        }
        $name = explode(':', $decoded, 2)[0];
        // A user may sign in by e-mail address, <login>@example.test, as
        // WordPress allows; the record is the login's either way.
        if (str_ends_with($name, '@example.test')) {
            $name = substr($name, 0, -strlen('@example.test'));
        }
        return $name === '' ? null : $name;
    }

    /** The few milliseconds of application work between reading the map and writing it back. */
    private function work(): void
    {
        if ($this->config->workMaxMs > 0) {
            usleep(random_int($this->config->workMinMs, $this->config->workMaxMs) * 1000);
        }
    }

    private function reply(array $message): void
    {
        header('Content-Type: application/json');
        echo json_encode($message, JSON_UNESCAPED_SLASHES | JSON_THROW_ON_ERROR);
    }

    private function httpError(int $status, int $code, string $message): void
    {
        http_response_code($status);
        header('Content-Type: application/json');
        echo json_encode(['jsonrpc' => '2.0', 'id' => null, 'error' => ['code' => $code, 'message' => $message]]);
    }
}
