<?php

declare(strict_types=1);

/**
 * An MCP Streamable HTTP endpoint that keeps its session state the way
 * php-mcp's Laravel transport does under PHP-FPM:
 *
 *  - every request loads the whole session record from the shared store,
 *    works on its copy and saves the whole copy back at the end, also after
 *    it rejected the request;
 *  - each reply is parked in the record's pending list (saved to the store)
 *    and then taken back out of the store to build the HTTP response, so a
 *    concurrent save of the same record can drop the reply (HTTP 500) or hand
 *    it to another request;
 *  - until the session's `initialized` flag is set, every request other than
 *    `initialize` is answered with -32600 "Client session not initialized.";
 *  - the GET stream re-reads and re-saves the record about once a second.
 *
 * A POST of the MCP 2026-07-28 era (its _meta or MCP-Protocol-Version header
 * names that revision) goes to ModernEndpoint instead, unless MCP_PHP_ERAS
 * is "legacy".
 *
 * Nothing here orders or locks the requests of one session (unless the
 * opt-in app lock, MCP_PHP_APP_LOCK, is on): that is left to whatever runs
 * in front of PHP-FPM.
 */
final class McpEndpoint
{
    public const PROTOCOL_VERSIONS = ['2025-11-25', '2025-06-18', '2025-03-26', '2024-11-05'];
    private const LOG_LEVELS = ['debug', 'info', 'notice', 'warning', 'error', 'critical', 'alert', 'emergency'];

    private ?SessionStore $store = null;
    private bool $streaming = false;

    public function __construct(private readonly Config $config)
    {
    }

    public function handle(): void
    {
        $method = $_SERVER['REQUEST_METHOD'] ?? 'GET';
        $sessionId = $this->sessionHeader();
        try {
            if ($this->config->countOverlap && $method === 'POST' && $sessionId !== null) {
                $ids = OverlapCounter::requestIds((string) file_get_contents('php://input'));
                if ($ids !== []) {
                    $this->store()->overlapCounter()->enter($sessionId, $this->config->pool, implode(',', $ids));
                }
            }
            match ($method) {
                'POST' => $this->locked($sessionId, fn () => $this->post($sessionId)),
                'GET' => $this->get($sessionId),
                'DELETE' => $this->locked($sessionId, fn () => $this->delete($sessionId)),
                default => $this->methodNotAllowed(),
            };
        } catch (SessionLockTimeout) {
            // What Laravel shows for a LockTimeoutException thrown by a middleware: HTTP 500.
            error_log('mcp endpoint: session lock wait timed out for session ' . substr(sha1((string) $sessionId), 0, 8));
            if (!headers_sent()) {
                $this->httpError(500, -32603, 'Internal error');
            }
        } catch (Throwable $e) {
            error_log('mcp endpoint: ' . $e::class . ': ' . $e->getMessage());
            if (!headers_sent()) {
                $this->httpError(500, -32603, 'Internal error');
            }
        }
    }

    /**
     * Runs $handler for a request that carries a session id while holding
     * that session's lock, when the app lock is on: what a Laravel
     * middleware doing Cache::lock("mcp-session:{id}", 10)->block(5, $next)
     * does. The response goes out after the release, as Laravel sends it
     * after the middleware returned; a streamed response goes out as it is
     * written, inside the lock.
     */
    private function locked(?string $sessionId, callable $handler): void
    {
        if (!$this->config->appLock || $sessionId === null) {
            $handler();
            return;
        }
        $lock = $this->store()->lock($sessionId, $this->config->lockSeconds);
        $lock->block($this->config->lockWaitMs, $this->config->lockRetryMs);
        $level = ob_get_level();
        ob_start();
        try {
            $handler();
        } finally {
            $lock->release();
            while (ob_get_level() > $level) {
                ob_end_flush();
            }
        }
    }

    private function post(?string $sessionId): void
    {
        $raw = (string) file_get_contents('php://input');
        $isBatch = str_starts_with(ltrim($raw), '[');
        try {
            $decoded = json_decode($raw, true, 512, JSON_THROW_ON_ERROR);
        } catch (JsonException) {
            $this->httpError(400, -32700, 'Parse error');
            return;
        }
        if ($this->config->modernEra && ModernEndpoint::claims($decoded, $isBatch)) {
            (new ModernEndpoint($this->config))->handle($decoded, $isBatch);
            return;
        }
        $messages = $isBatch ? $decoded : [$decoded];
        if (!is_array($messages) || $messages === []) {
            $this->httpError(400, -32600, 'Invalid Request');
            return;
        }
        foreach ($messages as $message) {
            if (!is_array($message) || ($message['jsonrpc'] ?? null) !== '2.0') {
                $this->httpError(400, -32600, 'Invalid Request');
                return;
            }
        }

        $created = false;
        if ($sessionId === null) {
            $first = $messages[0];
            if ($isBatch || ($first['method'] ?? null) !== 'initialize' || !array_key_exists('id', $first)) {
                $this->httpError(400, -32600, 'Bad Request: Mcp-Session-Id header is required');
                return;
            }
            $sessionId = bin2hex(random_bytes(16));
            $record = SessionStore::newRecord();
            $created = true;
        } else {
            $record = $this->existingSession($sessionId);
            if ($record === null) {
                return;
            }
        }

        $this->work();

        $hasRequests = false;
        foreach ($messages as $message) {
            if (!isset($message['method']) || !is_string($message['method'])) {
                continue; // a response from the client (sampling, elicitation): nothing to answer
            }
            if (!array_key_exists('id', $message)) {
                $this->notification($record, $message);
                continue;
            }
            $hasRequests = true;
            $reply = $this->request($record, $message, $created);
            // Park the reply in the session record, as the transport's message queue does.
            $record['pending'][] = $reply;
            $this->store()->save($sessionId, $record);
        }

        if (!$hasRequests) {
            // Notifications and responses only: save the whole record, then 202.
            $this->store()->save($sessionId, $record);
            http_response_code(202);
            return;
        }

        // More of the request's work (events, logging, response building)
        // runs while the replies sit in the store.
        $this->work();

        // Take the queued replies back out of the store to build the response:
        // whatever is queued there now, which a concurrent save may have changed.
        $fresh = $this->store()->load($sessionId);
        $out = is_array($fresh['pending'] ?? null) ? $fresh['pending'] : [];
        $record['pending'] = [];
        $this->store()->save($sessionId, $record);

        if ($this->streaming) {
            foreach ($out as $json) {
                $this->event($json);
            }
            if ($out === []) {
                error_log('mcp endpoint: reply lost for session ' . substr(sha1($sessionId), 0, 8));
            }
            return;
        }
        if ($out === []) {
            error_log('mcp endpoint: reply lost for session ' . substr(sha1($sessionId), 0, 8));
            $this->httpError(500, -32603, 'Internal error');
            return;
        }
        if ($created) {
            header('Mcp-Session-Id: ' . $sessionId);
        }
        header('Content-Type: application/json');
        echo (count($out) === 1 && !$isBatch) ? $out[0] : '[' . implode(',', $out) . ']';
    }

    private function notification(array &$record, array $message): void
    {
        if ($message['method'] === 'notifications/initialized') {
            $record['initialized'] = true;
        }
        // notifications/cancelled, notifications/roots/list_changed, ...: nothing to do.
    }

    /** Handles one request and returns its JSON-RPC reply, encoded. */
    private function request(array &$record, array $message, bool $created): string
    {
        $id = $message['id'];
        $method = $message['method'];
        $params = is_array($message['params'] ?? null) ? $message['params'] : [];

        if ($method === 'initialize') {
            if (!$created) {
                return $this->errorReply($id, -32600, 'Session already initialized.');
            }
            $requested = $params['protocolVersion'] ?? null;
            return $this->result($id, [
                'protocolVersion' => in_array($requested, self::PROTOCOL_VERSIONS, true) ? $requested : self::PROTOCOL_VERSIONS[0],
                'capabilities' => [
                    'tools' => ['listChanged' => false],
                    'logging' => new stdClass(),
                ],
                'serverInfo' => ['name' => 'mcp-php-fpm-backend', 'version' => '1.0.0'],
            ]);
        }

        if (!($record['initialized'] ?? false)) {
            return $this->errorReply($id, -32600, 'Client session not initialized.');
        }

        switch ($method) {
            case 'ping':
                return $this->result($id, new stdClass());
            case 'logging/setLevel':
                $level = $params['level'] ?? null;
                if (!in_array($level, self::LOG_LEVELS, true)) {
                    return $this->errorReply($id, -32602, 'Invalid log level');
                }
                $record['log_level'] = $level;
                return $this->result($id, new stdClass());
            case 'tools/list':
                return $this->result($id, ['tools' => self::tools()]);
            case 'tools/call':
                return $this->callTool($id, $params);
            default:
                return $this->errorReply($id, -32601, 'Method not found');
        }
    }

    private function callTool(mixed $id, array $params): string
    {
        $arguments = is_array($params['arguments'] ?? null) ? $params['arguments'] : [];
        switch ($params['name'] ?? null) {
            case 'echo':
                return $this->result($id, [
                    'content' => [['type' => 'text', 'text' => (string) ($arguments['text'] ?? '')]],
                ]);
            case 'slow_count':
                $n = min(20, max(1, (int) ($arguments['n'] ?? 5)));
                $token = $params['_meta']['progressToken'] ?? null;
                $this->startStream();
                for ($i = 1; $i <= $n; $i++) {
                    if ($token !== null) {
                        $this->event(json_encode([
                            'jsonrpc' => '2.0',
                            'method' => 'notifications/progress',
                            'params' => [
                                'progressToken' => $token,
                                'progress' => $i,
                                'total' => $n,
                                'message' => "counted {$i} of {$n}",
                            ],
                        ], JSON_UNESCAPED_SLASHES | JSON_THROW_ON_ERROR));
                    }
                    usleep($this->config->progressPauseMs * 1000);
                }
                return $this->result($id, [
                    'content' => [['type' => 'text', 'text' => "counted to {$n}"]],
                ]);
            default:
                return $this->errorReply($id, -32602, 'Unknown tool: ' . json_encode($params['name'] ?? null));
        }
    }

    private static function tools(): array
    {
        return [
            [
                'name' => 'echo',
                'description' => 'Returns its text argument at once.',
                'inputSchema' => [
                    'type' => 'object',
                    'properties' => ['text' => ['type' => 'string']],
                    'required' => ['text'],
                ],
            ],
            [
                'name' => 'slow_count',
                'description' => 'Counts to n, sending a progress notification per step over an SSE response.',
                'inputSchema' => [
                    'type' => 'object',
                    'properties' => ['n' => ['type' => 'integer', 'minimum' => 1, 'maximum' => 20]],
                ],
            ],
        ];
    }

    /**
     * The server-to-client stream. Like php-mcp's, it polls the session
     * record and writes it back about once a second, outside any ordering
     * of the session's POSTs, and holds its worker for as long as it runs:
     * it ends only when the session is gone or a write to the client fails
     * (a departed client is noticed at the next keepalive). With
     * MCP_PHP_GET_SECONDS it also ends after that many seconds.
     */
    private function get(?string $sessionId): void
    {
        if ($this->existingSession($sessionId) === null) {
            return;
        }
        ignore_user_abort(true);
        set_time_limit(0);
        $this->startStream();
        echo ": stream open\n\n";
        flush();

        $deadline = $this->config->getStreamSeconds > 0
            ? microtime(true) + $this->config->getStreamSeconds
            : INF;
        while (microtime(true) < $deadline) {
            usleep($this->config->getPollMs * 1000);
            if (connection_aborted()) {
                break;
            }
            $record = $this->store()->load($sessionId);
            if ($record === null) {
                break; // session ended
            }
            $record['stream_polled_at'] = microtime(true);
            $this->store()->save($sessionId, $record);
            echo ": keepalive\n\n";
            flush();
            if (connection_aborted()) {
                break;
            }
        }
    }

    private function delete(?string $sessionId): void
    {
        if ($this->existingSession($sessionId) === null) {
            return;
        }
        $this->work();
        $this->store()->delete($sessionId);
        http_response_code(204);
    }

    /**
     * The stored record of the request's session, or null after answering
     * 400 (no Mcp-Session-Id) or 404 (unknown session).
     */
    private function existingSession(?string $sessionId): ?array
    {
        if ($sessionId === null) {
            $this->httpError(400, -32600, 'Bad Request: Mcp-Session-Id header is required');
            return null;
        }
        $record = $this->store()->load($sessionId);
        if ($record === null) {
            $this->httpError(404, -32001, 'Session not found');
        }
        return $record;
    }

    private function methodNotAllowed(): void
    {
        header('Allow: GET, POST, DELETE');
        $this->httpError(405, -32600, 'Method not allowed');
    }

    private function store(): SessionStore
    {
        return $this->store ??= new SessionStore($this->config->storePath);
    }

    private function sessionHeader(): ?string
    {
        $value = $_SERVER['HTTP_MCP_SESSION_ID'] ?? null;
        return is_string($value) && $value !== '' ? $value : null;
    }

    /** The few milliseconds of application work a real request does between load and save. */
    private function work(): void
    {
        if ($this->config->workMaxMs > 0) {
            usleep(random_int($this->config->workMinMs, $this->config->workMaxMs) * 1000);
        }
    }

    private function startStream(): void
    {
        if ($this->streaming) {
            return;
        }
        $this->streaming = true;
        while (ob_get_level() > 0) {
            ob_end_flush();
        }
        header('Content-Type: text/event-stream');
        header('Cache-Control: no-cache');
        header('X-Accel-Buffering: no');
    }

    private function event(string $json): void
    {
        echo "event: message\ndata: {$json}\n\n";
        flush();
    }

    private function result(mixed $id, array|stdClass $result): string
    {
        return json_encode(['jsonrpc' => '2.0', 'id' => $id, 'result' => $result], JSON_UNESCAPED_SLASHES | JSON_THROW_ON_ERROR);
    }

    private function errorReply(mixed $id, int $code, string $message): string
    {
        return json_encode(
            ['jsonrpc' => '2.0', 'id' => $id, 'error' => ['code' => $code, 'message' => $message]],
            JSON_UNESCAPED_SLASHES | JSON_THROW_ON_ERROR
        );
    }

    private function httpError(int $status, int $code, string $message): void
    {
        http_response_code($status);
        header('Content-Type: application/json');
        echo json_encode(
            ['jsonrpc' => '2.0', 'id' => null, 'error' => ['code' => $code, 'message' => $message]],
            JSON_UNESCAPED_SLASHES
        );
    }
}
