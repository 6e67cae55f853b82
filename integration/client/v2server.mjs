#!/usr/bin/env node
// A dual-era MCP server for the integration tests, built on the v2
// TypeScript SDK (@modelcontextprotocol/server 2.4.0): MCP 2026-07-28
// (session-less, `server/discover`, per-request `_meta`) and the 2025 era
// (`initialize`) on one Streamable HTTP endpoint, /mcp.
//
//   node v2server.mjs --port PORT [--legacy sessions|stateless] [--delay-ms 30] [--progress-ms 100]
//
// --legacy stateless: what `createMcpHandler` does by default; a 2025-era
//   request is served by a fresh stateless instance (no Mcp-Session-Id,
//   GET and DELETE answered 405).
// --legacy sessions (the default): a 2025-era deployment kept beside the
//   modern leg, as the SDK's `isLegacyRequest` documentation shows: an
//   `initialize` mints an Mcp-Session-Id, the session's requests go to its
//   own transport, DELETE ends it; modern requests go to `createMcpHandler`
//   with `legacy: 'reject'`.
//
// Tools (the same on both eras): `echo` (text), `slow_count` (n; one
// notifications/progress per step, --progress-ms apart, on an SSE response
// when the call carries a progressToken), `cart_create` (returns a
// handle), `cart_add` (cart, item; cart carries "x-mcp-header": "Cart"),
// `cart_get` (cart). A cart is one whole record in memory: cart_add loads it,
// waits --delay-ms (the app's work between load and save), appends the item
// and saves the whole record back, so parallel calls on one cart lose
// updates unless something runs them one at a time.
//
// Once listening it prints one JSON line on stdout: {"url": ".../mcp"}; every
// request is logged on stderr as one line: HTTP method, Mcp-Method, Mcp-Name,
// Mcp-Param-Cart, MCP-Protocol-Version, whether it named a session, the
// SHA-256 of its body (what arrived, byte for byte) and the status.

import { createHash, randomBytes, randomUUID } from 'node:crypto';
import http from 'node:http';
import {
  McpServer,
  WebStandardStreamableHTTPServerTransport,
  createMcpHandler,
  fromJsonSchema,
  isLegacyRequest,
} from '@modelcontextprotocol/server';

function parseArgs(argv) {
  const opts = { port: 0, legacy: 'sessions', delayMs: 30, progressMs: 100 };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const next = () => {
      if (i + 1 >= argv.length) throw new Error(`${arg} needs a value`);
      return argv[++i];
    };
    switch (arg) {
      case '--port': opts.port = Number.parseInt(next(), 10); break;
      case '--legacy': opts.legacy = next(); break;
      case '--delay-ms': opts.delayMs = Number.parseInt(next(), 10); break;
      case '--progress-ms': opts.progressMs = Number.parseInt(next(), 10); break;
      default: throw new Error(`unknown argument ${arg}`);
    }
  }
  if (!['sessions', 'stateless'].includes(opts.legacy)) throw new Error('--legacy must be sessions or stateless');
  if (!(opts.port >= 0) || !(opts.delayMs >= 0) || !(opts.progressMs >= 0)) throw new Error('--port, --delay-ms and --progress-ms must be >= 0');
  return opts;
}

const opts = parseArgs(process.argv.slice(2));
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// The carts: handle -> whole record. A copy is loaded and a copy saved, as a
// cache store does, so the last save wins.
const carts = new Map();
const load = (cart) => (carts.has(cart) ? JSON.parse(carts.get(cart)) : null);
const save = (cart, record) => carts.set(cart, JSON.stringify(record));

const text = (value) => ({ content: [{ type: 'text', text: typeof value === 'string' ? value : JSON.stringify(value) }] });
const toolError = (message) => ({ content: [{ type: 'text', text: message }], isError: true });

function buildServer() {
  // logging: the 2025-era clients of these tests call logging/setLevel.
  const server = new McpServer({ name: 'mcp-serializer-v2-server', version: '1.0.0' }, { capabilities: { logging: {} } });
  server.registerTool('echo', {
    description: 'Returns its text argument at once.',
    inputSchema: fromJsonSchema({ type: 'object', properties: { text: { type: 'string' } }, required: ['text'] }),
  }, async ({ text: value }) => text(String(value ?? '')));
  server.registerTool('slow_count', {
    description: 'Counts to n, sending a progress notification per step.',
    inputSchema: fromJsonSchema({ type: 'object', properties: { n: { type: 'integer', minimum: 1, maximum: 20 } } }),
  }, async ({ n }, ctx) => {
    const steps = Math.min(20, Math.max(1, Number(n ?? 5)));
    const token = ctx.mcpReq._meta?.progressToken;
    for (let i = 1; i <= steps; i++) {
      if (token !== undefined) {
        await ctx.mcpReq.notify({ method: 'notifications/progress', params: { progressToken: token, progress: i, total: steps, message: `counted ${i} of ${steps}` } });
      }
      await sleep(opts.progressMs);
    }
    return text(`counted to ${steps}`);
  });
  server.registerTool('cart_create', {
    description: 'Creates an empty cart and returns its handle.',
    inputSchema: fromJsonSchema({ type: 'object', properties: {} }),
  }, async () => {
    const cart = `cart-${randomBytes(8).toString('hex')}`;
    save(cart, { items: [], created_at: Date.now() });
    return text(cart);
  });
  server.registerTool('cart_add', {
    description: 'Adds an item to a cart: loads the whole cart, changes it, saves it back.',
    inputSchema: fromJsonSchema({
      type: 'object',
      properties: {
        cart: { type: 'string', description: 'The cart handle from cart_create', 'x-mcp-header': 'Cart' },
        item: { type: 'string' },
      },
      required: ['cart', 'item'],
    }),
  }, async ({ cart, item }) => {
    const record = load(cart);
    if (record === null) return toolError(`unknown cart ${cart}`);
    await sleep(opts.delayMs);
    record.items.push(item);
    save(cart, record);
    return text({ cart, count: record.items.length });
  });
  server.registerTool('cart_get', {
    description: 'Returns the items of a cart.',
    inputSchema: fromJsonSchema({
      type: 'object',
      properties: { cart: { type: 'string', 'x-mcp-header': 'Cart' } },
      required: ['cart'],
    }),
  }, async ({ cart }) => {
    const record = load(cart);
    if (record === null) return toolError(`unknown cart ${cart}`);
    return text({ cart, items: record.items });
  });
  return server;
}

const modern = createMcpHandler(() => buildServer(), { legacy: opts.legacy === 'stateless' ? 'stateless' : 'reject' });

// The sessionful 2025-era leg: one transport and server per session.
const sessions = new Map();
async function legacy(request) {
  const sid = request.headers.get('mcp-session-id');
  if (sid) {
    const transport = sessions.get(sid);
    if (!transport) {
      return Response.json({ jsonrpc: '2.0', id: null, error: { code: -32001, message: 'Session not found' } }, { status: 404 });
    }
    return transport.handleRequest(request);
  }
  const transport = new WebStandardStreamableHTTPServerTransport({
    sessionIdGenerator: () => randomUUID(),
    onsessioninitialized: (id) => { sessions.set(id, transport); },
    onsessionclosed: (id) => { sessions.delete(id); },
  });
  await buildServer().connect(transport);
  return transport.handleRequest(request);
}

async function route(request) {
  if (opts.legacy === 'sessions' && (await isLegacyRequest(request))) return legacy(request);
  return modern.fetch(request);
}

// node:http -> web Request, and the web Response back, streaming its body.
function toWebRequest(req, res, body) {
  const headers = new Headers();
  for (const [name, value] of Object.entries(req.headers)) {
    if (Array.isArray(value)) value.forEach((v) => headers.append(name, v));
    else if (value !== undefined) headers.set(name, value);
  }
  // A client that leaves ends the exchange (and a listen stream) upstream too.
  const controller = new AbortController();
  res.once('close', () => controller.abort());
  return new Request(`http://${req.headers.host ?? '127.0.0.1'}${req.url}`, {
    method: req.method,
    headers,
    body: req.method === 'GET' || req.method === 'HEAD' ? undefined : body,
    signal: controller.signal,
  });
}

async function readBody(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return Buffer.concat(chunks);
}

const server = http.createServer(async (req, res) => {
  let status = 0;
  let body = Buffer.alloc(0);
  try {
    body = await readBody(req);
    const response = await route(toWebRequest(req, res, body));
    status = response.status;
    const headers = {};
    response.headers.forEach((value, name) => { headers[name] = value; });
    res.writeHead(response.status, headers);
    res.flushHeaders(); // an SSE stream may write nothing for a while
    if (response.body) {
      const reader = response.body.getReader();
      res.on('close', () => reader.cancel().catch(() => {}));
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        res.write(value);
      }
    }
    res.end();
  } catch (err) {
    process.stderr.write(`error: ${err?.stack ?? err}\n`);
    if (!res.headersSent) {
      status = 500;
      res.writeHead(500, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32603, message: 'Internal error' } }));
    } else {
      res.destroy();
    }
  } finally {
    const h = req.headers;
    process.stderr.write(`${req.method} mcp-method=${h['mcp-method'] ?? '-'} mcp-name=${h['mcp-name'] ?? '-'} mcp-param-cart=${h['mcp-param-cart'] ?? '-'} protocol=${h['mcp-protocol-version'] ?? '-'} session=${h['mcp-session-id'] ? 'yes' : 'no'} body-sha256=${createHash('sha256').update(body).digest('hex')} -> ${status}\n`);
  }
});

server.listen(opts.port, '127.0.0.1', () => {
  const { port } = server.address();
  process.stdout.write(`${JSON.stringify({ url: `http://127.0.0.1:${port}/mcp`, legacy: opts.legacy })}\n`);
});

const stop = () => {
  server.close();
  modern.close().catch(() => {});
  setTimeout(() => process.exit(0), 200).unref();
};
process.on('SIGINT', stop);
process.on('SIGTERM', stop);
