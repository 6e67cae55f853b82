<?php

declare(strict_types=1);

/**
 * The MCP 2026-07-28 era of the endpoint, served beside the 2025 era on the
 * same URL as the official PHP SDK does: no session, no `initialize`; each
 * POST carries one JSON-RPC message whose `params._meta` names the protocol
 * version, client info and capabilities, and mirrors the method, the name
 * and any `x-mcp-header` tool parameters into MCP-Protocol-Version,
 * Mcp-Method, Mcp-Name and Mcp-Param-{Name} headers, which are checked
 * against the body (400, -32020 HeaderMismatch).
 *
 * State lives in handles, not sessions: `cart_create` mints a cart handle,
 * `cart_add` (whose `cart` parameter carries "x-mcp-header": "Cart") loads
 * the whole cart from the shared store, works MCP_PHP_CART_MS, and saves the
 * whole cart back, like a Laravel app keeping it in its cache. Nothing here
 * orders two calls on one cart: parallel calls lose updates unless whatever
 * runs in front of PHP-FPM runs them one at a time.
 *
 * `subscriptions/listen` answers with an SSE stream that stays open (a
 * keepalive comment every MCP_PHP_GET_POLL_MS) until the client leaves or
 * MCP_PHP_LISTEN_SECONDS pass, holding its PHP-FPM worker all that time.
 */
final class ModernEndpoint
{
    public const VERSIONS = ['2026-07-28'];
    private const META_VERSION = 'io.modelcontextprotocol/protocolVersion';
    private const META_SUBSCRIPTION = 'io.modelcontextprotocol/subscriptionId';
    private const HEADER_MISMATCH = -32020;
    private const UNSUPPORTED_VERSION = -32022;
    /** The methods whose params.name (or uri) the Mcp-Name header mirrors. */
    private const NAMED = ['tools/call' => 'name', 'prompts/get' => 'name', 'resources/read' => 'uri'];
    /** The cache hint a cacheable result must carry: stale at once, for this caller only. */
    private const UNCACHED = ['ttlMs' => 0, 'cacheScope' => 'private'];

    private ?CartStore $carts = null;
    private bool $streaming = false;

    public function __construct(private readonly Config $config)
    {
    }

    /**
     * Whether a decoded POST body belongs to this era: a single message
     * whose _meta claims a protocol version, or any POST whose
     * MCP-Protocol-Version header names a 2026-07-28-or-later revision.
     * A batch, an `initialize` and every 2025-era message have neither.
     */
    public static function claims(mixed $decoded, bool $isBatch): bool
    {
        $header = self::header('MCP_PROTOCOL_VERSION');
        if ($header !== null && self::isModernVersion($header)) {
            return true;
        }
        return !$isBatch && is_array($decoded)
            && is_string($decoded['params']['_meta'][self::META_VERSION] ?? null);
    }

    private static function isModernVersion(string $version): bool
    {
        return preg_match('/^\d{4}-\d{2}-\d{2}$/', $version) === 1 && strcmp($version, self::VERSIONS[0]) >= 0;
    }

    /** Serves one decoded 2026-07-28 POST body. */
    public function handle(mixed $message, bool $isBatch): void
    {
        if ($isBatch || !is_array($message) || ($message['jsonrpc'] ?? null) !== '2.0') {
            $this->reply(400, $this->error(null, -32600, 'Invalid Request: one JSON-RPC message per POST'));
            return;
        }
        $method = $message['method'] ?? null;
        if (!is_string($method)) {
            $this->reply(400, $this->error(null, -32600, 'Invalid Request: a client sends no responses in 2026-07-28'));
            return;
        }
        if (!array_key_exists('id', $message)) {
            // notifications/cancelled and the like: nothing to do here.
            http_response_code(202);
            return;
        }
        $id = $message['id'];
        $params = is_array($message['params'] ?? null) ? $message['params'] : [];
        $claimed = $params['_meta'][self::META_VERSION] ?? null;
        if (!is_string($claimed)) {
            $this->reply(400, $this->error($id, -32602, 'Invalid params: _meta carries no ' . self::META_VERSION));
            return;
        }
        if (!in_array($claimed, self::VERSIONS, true)) {
            $this->reply(400, $this->error($id, self::UNSUPPORTED_VERSION, 'Unsupported protocol version', [
                'supported' => [...self::VERSIONS, ...McpEndpoint::PROTOCOL_VERSIONS],
                'requested' => $claimed,
            ]));
            return;
        }
        $mismatch = $this->headerMismatch($method, $params, $claimed);
        if ($mismatch !== null) {
            $this->reply(400, $this->error($id, self::HEADER_MISMATCH, 'Header mismatch: ' . $mismatch));
            return;
        }

        switch ($method) {
            case 'server/discover':
                $this->reply(200, $this->result($id, [
                    'supportedVersions' => self::VERSIONS,
                    'capabilities' => ['tools' => ['listChanged' => true]],
                    '_meta' => ['io.modelcontextprotocol/serverInfo' => ['name' => 'mcp-php-fpm-backend', 'version' => '1.0.0']],
                ] + self::UNCACHED));
                return;
            case 'ping':
            case 'logging/setLevel': // deprecated in 2026-07-28, still accepted
                $this->reply(200, $this->result($id, []));
                return;
            case 'tools/list':
                $this->reply(200, $this->result($id, ['tools' => self::tools()] + self::UNCACHED));
                return;
            case 'tools/call':
                $this->callTool($id, $params);
                return;
            case 'subscriptions/listen':
                $this->listen($id, $params);
                return;
            default:
                $this->reply(404, $this->error($id, -32601, 'Method not found'));
        }
    }

    /**
     * What the request headers get wrong about the body, or null: the
     * version, the method, the name, and every parameter the named tool
     * marks with x-mcp-header, compared after decoding the Base64 sentinel.
     */
    private function headerMismatch(string $method, array $params, string $claimed): ?string
    {
        $version = self::header('MCP_PROTOCOL_VERSION');
        if ($version !== $claimed) {
            return 'MCP-Protocol-Version header ' . json_encode($version) . ' does not match _meta ' . json_encode($claimed);
        }
        if (self::header('MCP_METHOD') !== $method) {
            return 'Mcp-Method header ' . json_encode(self::header('MCP_METHOD')) . ' does not match method ' . json_encode($method);
        }
        if (isset(self::NAMED[$method])) {
            $name = $params[self::NAMED[$method]] ?? null;
            $header = self::header('MCP_NAME');
            if (!is_string($name) || $header === null || self::decode($header) !== $name) {
                return 'Mcp-Name header ' . json_encode($header) . ' does not match ' . json_encode($name);
            }
        }
        if ($method !== 'tools/call') {
            return null;
        }
        $arguments = is_array($params['arguments'] ?? null) ? $params['arguments'] : [];
        foreach (self::tools() as $tool) {
            if ($tool['name'] !== ($params['name'] ?? null)) {
                continue;
            }
            foreach ($tool['inputSchema']['properties'] as $property => $schema) {
                $headerName = $schema['x-mcp-header'] ?? null;
                if ($headerName === null || !isset($arguments[$property])) {
                    continue;
                }
                $value = $arguments[$property];
                $want = is_bool($value) ? ($value ? 'true' : 'false') : (is_scalar($value) ? (string) $value : null);
                $header = self::header('MCP_PARAM_' . strtoupper(str_replace('-', '_', $headerName)));
                if ($want === null || $header === null || self::decode($header) !== $want) {
                    return "Mcp-Param-{$headerName} header " . json_encode($header) . " does not match argument {$property}";
                }
            }
        }
        return null;
    }

    private function callTool(mixed $id, array $params): void
    {
        $arguments = is_array($params['arguments'] ?? null) ? $params['arguments'] : [];
        switch ($params['name'] ?? null) {
            case 'echo':
                $this->reply(200, $this->result($id, self::text((string) ($arguments['text'] ?? ''))));
                return;
            case 'slow_count':
                $n = min(20, max(1, (int) ($arguments['n'] ?? 5)));
                $token = $params['_meta']['progressToken'] ?? null;
                $this->startStream();
                for ($i = 1; $i <= $n; $i++) {
                    if ($token !== null) {
                        $this->event(self::json(['jsonrpc' => '2.0', 'method' => 'notifications/progress', 'params' => [
                            'progressToken' => $token, 'progress' => $i, 'total' => $n, 'message' => "counted {$i} of {$n}",
                        ]]));
                    }
                    usleep($this->config->progressPauseMs * 1000);
                }
                $this->reply(200, $this->result($id, self::text("counted to {$n}")));
                return;
            case 'cart_create':
                $cart = 'cart-' . bin2hex(random_bytes(12));
                $this->carts()->save($cart, ['items' => [], 'created_at' => microtime(true)]);
                $this->reply(200, $this->result($id, self::text($cart)));
                return;
            case 'cart_add':
                $cart = $arguments['cart'] ?? null;
                $item = $arguments['item'] ?? null;
                if (!is_string($cart) || !is_string($item)) {
                    $this->reply(200, $this->error($id, -32602, 'Invalid params: cart_add needs cart and item strings'));
                    return;
                }
                // Load the whole record, work on it, save the whole record back.
                $record = $this->carts()->load($cart);
                if ($record === null) {
                    $this->reply(200, $this->result($id, self::text("unknown cart {$cart}") + ['isError' => true]));
                    return;
                }
                if ($this->config->cartWorkMaxMs > 0) {
                    usleep(random_int($this->config->cartWorkMinMs, $this->config->cartWorkMaxMs) * 1000);
                }
                $record['items'][] = $item;
                $this->carts()->save($cart, $record);
                $this->reply(200, $this->result($id, self::text(self::json(['cart' => $cart, 'count' => count($record['items'])]))));
                return;
            case 'cart_get':
                $cart = $arguments['cart'] ?? null;
                $record = is_string($cart) ? $this->carts()->load($cart) : null;
                if ($record === null) {
                    $this->reply(200, $this->result($id, self::text('unknown cart ' . json_encode($cart)) + ['isError' => true]));
                    return;
                }
                $this->reply(200, $this->result($id, self::text(self::json(['cart' => $cart, 'items' => $record['items']]))));
                return;
            default:
                $this->reply(200, $this->error($id, -32602, 'Unknown tool: ' . json_encode($params['name'] ?? null)));
        }
    }

    /**
     * A subscriptions/listen stream: the acknowledgment first, then a
     * keepalive comment every MCP_PHP_GET_POLL_MS; the tool list never
     * changes, so no notification follows. It ends when a write to the
     * departed client fails, or after MCP_PHP_LISTEN_SECONDS with the
     * graceful-close response.
     */
    private function listen(mixed $id, array $params): void
    {
        $wanted = is_array($params['notifications'] ?? null) ? $params['notifications'] : [];
        $honored = ($wanted['toolsListChanged'] ?? false) === true ? ['toolsListChanged' => true] : new stdClass();
        ignore_user_abort(true);
        set_time_limit(0);
        $this->startStream();
        $this->event(self::json(['jsonrpc' => '2.0', 'method' => 'notifications/subscriptions/acknowledged', 'params' => [
            '_meta' => [self::META_SUBSCRIPTION => $id],
            'notifications' => $honored,
        ]]));
        $deadline = $this->config->listenSeconds > 0 ? microtime(true) + $this->config->listenSeconds : INF;
        while (microtime(true) < $deadline) {
            usleep($this->config->getPollMs * 1000);
            echo ": keepalive\n\n";
            flush();
            if (connection_aborted()) {
                return;
            }
        }
        $this->event($this->result($id, ['_meta' => [self::META_SUBSCRIPTION => $id]]));
    }

    /** @return list<array{name: string, description: string, inputSchema: array}> */
    private static function tools(): array
    {
        $cart = ['type' => 'string', 'description' => 'A cart handle from cart_create', 'x-mcp-header' => 'Cart'];
        return [
            ['name' => 'echo', 'description' => 'Returns its text argument at once.', 'inputSchema' => [
                'type' => 'object', 'properties' => ['text' => ['type' => 'string']], 'required' => ['text'],
            ]],
            ['name' => 'slow_count', 'description' => 'Counts to n, sending a progress notification per step over an SSE response.', 'inputSchema' => [
                'type' => 'object', 'properties' => ['n' => ['type' => 'integer', 'minimum' => 1, 'maximum' => 20]],
            ]],
            ['name' => 'cart_create', 'description' => 'Creates an empty cart and returns its handle.', 'inputSchema' => [
                'type' => 'object', 'properties' => new stdClass(),
            ]],
            ['name' => 'cart_add', 'description' => 'Adds an item to a cart (loads the whole cart, changes it, saves it back).', 'inputSchema' => [
                'type' => 'object', 'properties' => ['cart' => $cart, 'item' => ['type' => 'string']], 'required' => ['cart', 'item'],
            ]],
            ['name' => 'cart_get', 'description' => 'Returns the items of a cart.', 'inputSchema' => [
                'type' => 'object', 'properties' => ['cart' => $cart], 'required' => ['cart'],
            ]],
        ];
    }

    private function carts(): CartStore
    {
        return $this->carts ??= new CartStore($this->config->storePath);
    }

    /** A request header by its CGI name (MCP_METHOD for Mcp-Method), or null. */
    private static function header(string $cgiName): ?string
    {
        $value = $_SERVER['HTTP_' . $cgiName] ?? null;
        return is_string($value) ? $value : null;
    }

    /** A header value with the `=?base64?…?=` sentinel decoded. */
    private static function decode(string $value): ?string
    {
        if (str_starts_with($value, '=?base64?') && str_ends_with($value, '?=') && strlen($value) >= 11) {
            $decoded = base64_decode(substr($value, 9, -2), true);
            return $decoded === false ? null : $decoded;
        }
        return $value;
    }

    /** Sends one JSON-RPC message: as an SSE event on a started stream, else as the JSON body. */
    private function reply(int $status, string $json): void
    {
        if ($this->streaming) {
            $this->event($json);
            return;
        }
        http_response_code($status);
        header('Content-Type: application/json');
        echo $json;
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

    private static function text(string $text): array
    {
        return ['content' => [['type' => 'text', 'text' => $text]]];
    }

    private function result(mixed $id, array $result): string
    {
        return self::json(['jsonrpc' => '2.0', 'id' => $id, 'result' => ['resultType' => 'complete'] + $result]);
    }

    private function error(mixed $id, int $code, string $message, ?array $data = null): string
    {
        $error = ['code' => $code, 'message' => $message];
        if ($data !== null) {
            $error['data'] = $data;
        }
        return self::json(['jsonrpc' => '2.0', 'id' => $id, 'error' => $error]);
    }

    private static function json(array $value): string
    {
        return json_encode($value, JSON_UNESCAPED_SLASHES | JSON_THROW_ON_ERROR);
    }
}
