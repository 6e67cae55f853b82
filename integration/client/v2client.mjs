#!/usr/bin/env node
// MCP client driver for the integration tests, built on the v2 TypeScript
// SDK (@modelcontextprotocol/client 2.4.0), which speaks MCP 2026-07-28 and
// falls back to the 2025 era.
//
//   node v2client.mjs connects --url URL [--negotiation auto|pin] [--n 10] [--concurrency 4] [--adds 16]
//   node v2client.mjs listen   --url URL [--streams 2] [--probe-timeout 3000]
//
// --negotiation auto: `versionNegotiation: { mode: 'auto' }`: connect()
//   sends a session-less `server/discover` probe and falls back to
//   `initialize` when the server gives no modern evidence (a 400 whose body
//   is not a modern JSON-RPC error, among others).
// --negotiation pin: `versionNegotiation: { mode: { pin: '2026-07-28' } }`:
//   the probe must offer 2026-07-28, no fallback.
//
// Human-readable progress goes to stderr; the last line on stdout is one JSON
// object with the results, for the Go tests to parse.
//
// connects: N connects, --concurrency at a time, each: connect, tools/list,
//   tools/call `echo` (checked), close (a DELETE first when the connection
//   fell back to a 2025 session). Counts failed connects by the step that
//   failed, and eras. The first connect reports every HTTP exchange it made
//   (method, the MCP request headers sent, status) and the probe's bytes:
//   the request body and headers, the response status, headers and body.
//   When the server lists `cart_add`, the first connect also runs the handle
//   race: cart_create, then --adds cart_add calls on that one cart all at
//   once (Promise.all, each its own POST), then cart_get; an item missing
//   from the cart is a lost update. It counts the cart_add POSTs that
//   carried an Mcp-Param-Cart header equal to the handle (the SDK mirrors
//   parameters marked "x-mcp-header" from the tools/list schema).
//
// listen: opens --streams `subscriptions/listen` streams (one client each,
//   pinned to 2026-07-28) and keeps them open; then, on another client,
//   calls tools/list with a --probe-timeout ms timeout and reports whether it
//   was answered while the streams were open, and how long it took; then
//   closes one stream and calls tools/list again (sinceCloseMs: from the
//   close until that answer). A long-lived POST holds
//   whatever serves it (a PHP-FPM worker) for as long as it is open.

import { performance } from 'node:perf_hooks';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';

const MODERN = '2026-07-28';
const REQUEST_TIMEOUT_MS = 20000;
const MAX_SAMPLES = 20;

function parseArgs(argv) {
  const [mode, ...rest] = argv;
  const opts = { mode, url: '', negotiation: 'auto', n: 10, concurrency: 4, adds: 16, streams: 2, probeTimeoutMs: 3000 };
  for (let i = 0; i < rest.length; i++) {
    const arg = rest[i];
    const next = () => {
      if (i + 1 >= rest.length) throw new Error(`${arg} needs a value`);
      return rest[++i];
    };
    const int = () => Number.parseInt(next(), 10);
    switch (arg) {
      case '--url': opts.url = next(); break;
      case '--negotiation': opts.negotiation = next(); break;
      case '--n': opts.n = int(); break;
      case '--concurrency': opts.concurrency = int(); break;
      case '--adds': opts.adds = int(); break;
      case '--streams': opts.streams = int(); break;
      case '--probe-timeout': opts.probeTimeoutMs = int(); break;
      default: throw new Error(`unknown argument ${arg}`);
    }
  }
  if (!['connects', 'listen'].includes(mode)) throw new Error('mode must be connects or listen');
  if (!opts.url) throw new Error('--url is required');
  if (!['auto', 'pin'].includes(opts.negotiation)) throw new Error('--negotiation must be auto or pin');
  for (const k of ['n', 'concurrency', 'streams', 'probeTimeoutMs']) {
    if (!(opts[k] >= 1)) throw new Error(`--${k} must be >= 1`);
  }
  if (!(opts.adds >= 0)) throw new Error('--adds must be >= 0');
  return opts;
}

const t0 = performance.now();
const now = () => Math.round((performance.now() - t0) * 10) / 10;
const log = (...parts) => process.stderr.write(`[${now().toFixed(1).padStart(9)} ms] ${parts.join(' ')}\n`);

const MCP_HEADERS = ['mcp-protocol-version', 'mcp-method', 'mcp-name', 'mcp-param-cart'];

function headerObject(headers) {
  const out = {};
  new Headers(headers).forEach((value, name) => { out[name] = value; });
  return out;
}

// A fetch for the SDK transport that records every HTTP exchange: the MCP
// request headers it carried, whether it named a session, its status; and
// for the first POST (the probe, under negotiation) the bytes both ways.
function recordingFetch(stats) {
  return async (input, init = {}) => {
    const method = (init.method ?? 'GET').toUpperCase();
    const sent = headerObject(init.headers);
    const exchange = { method, at: now(), session: 'mcp-session-id' in sent };
    for (const name of MCP_HEADERS) if (name in sent) exchange[name] = sent[name];
    if (method === 'POST' && typeof init.body === 'string') {
      try {
        const body = JSON.parse(init.body);
        if (!Array.isArray(body)) {
          exchange.rpcMethod = body.method ?? '(response)';
          if (body.method === 'tools/call') exchange.argCart = body.params?.arguments?.cart;
        }
      } catch { /* not JSON: recorded as is */ }
    }
    const first = method === 'POST' && !stats.probe;
    if (first) {
      stats.probe = { request: { headers: sent, body: init.body } };
    }
    let response;
    try {
      response = await fetch(input, init);
    } catch (err) {
      exchange.status = 'network';
      exchange.error = String(err?.message ?? err);
      stats.exchanges.push(exchange);
      throw err;
    }
    exchange.status = response.status;
    exchange.contentType = (response.headers.get('content-type') ?? '').split(';')[0].trim();
    stats.exchanges.push(exchange);
    if (first) {
      const contentType = response.headers.get('content-type') ?? '';
      stats.probe.response = { status: response.status, headers: headerObject(response.headers) };
      if (!contentType.startsWith('text/event-stream')) {
        stats.probe.response.body = await response.clone().text();
      }
    }
    return response;
  };
}

function negotiationOptions(negotiation) {
  return negotiation === 'pin' ? { mode: { pin: MODERN } } : { mode: 'auto' };
}

function newClient(opts, stats, name) {
  const transport = new StreamableHTTPClientTransport(new URL(opts.url), {
    fetch: recordingFetch(stats),
    reconnectionOptions: { initialReconnectionDelay: 1000, maxReconnectionDelay: 1000, reconnectionDelayGrowFactor: 1, maxRetries: 0 },
  });
  const client = new Client({ name, version: '1.0.0' }, { versionNegotiation: negotiationOptions(opts.negotiation) });
  client.onerror = () => {}; // failures are counted per step
  return { client, transport };
}

const textOf = (result) => result?.content?.[0]?.text ?? '';
const requestOptions = { timeout: REQUEST_TIMEOUT_MS };

// The handle race on one cart: adds cart_add calls at once, then what is left.
async function cartRace(client, adds, stats) {
  const cart = textOf(await client.callTool({ name: 'cart_create', arguments: {} }, requestOptions));
  if (!cart) throw new Error('cart_create returned no handle');
  const before = stats.exchanges.length;
  const calls = Array.from({ length: adds }, (_, i) =>
    client.callTool({ name: 'cart_add', arguments: { cart, item: `item-${i}` } }, requestOptions));
  const settled = await Promise.allSettled(calls);
  const failedCalls = settled.filter((s) => s.status === 'rejected' || s.value?.isError);
  const got = JSON.parse(textOf(await client.callTool({ name: 'cart_get', arguments: { cart } }, requestOptions)));
  const posts = stats.exchanges.slice(before).filter((e) => e.rpcMethod === 'tools/call' && e['mcp-name'] === 'cart_add');
  return {
    adds,
    failedCalls: failedCalls.length,
    failedSamples: failedCalls.slice(0, 3).map((s) => String(s.reason?.message ?? textOf(s.value))),
    items: got.items.length,
    lost: adds - failedCalls.length - got.items.length,
    posts: posts.length,
    postsWithParamHeader: posts.filter((e) => e['mcp-param-cart'] === cart).length,
  };
}

async function oneConnect(opts, run, index) {
  const stats = { exchanges: [] };
  const { client, transport } = newClient(opts, stats, 'mcp-serializer-v2');
  const detail = index === 0 ? {} : undefined;
  let step = 'connect';
  const problems = [];
  try {
    await client.connect(transport, requestOptions);
    const era = client.getProtocolEra() ?? 'none';
    run.eras[era] = (run.eras[era] ?? 0) + 1;
    if (detail) {
      detail.era = era;
      detail.protocolVersion = client.getNegotiatedProtocolVersion() ?? '';
      detail.sessionId = transport.sessionId ? 'yes' : '';
    }
    step = 'tools/list';
    const tools = (await client.listTools(undefined, requestOptions)).tools.map((t) => t.name);
    if (!tools.includes('echo')) throw new Error(`no echo tool listed: ${tools.join(',')}`);
    if (detail) detail.tools = tools;
    step = 'tools/call';
    const text = `v2 connect ${index}`;
    const echo = textOf(await client.callTool({ name: 'echo', arguments: { text } }, requestOptions));
    if (echo !== text) throw new Error(`echo answered ${JSON.stringify(echo)}`);
    if (detail && tools.includes('cart_add') && opts.adds > 0) {
      step = 'cart race';
      detail.cart = await cartRace(client, opts.adds, stats);
      log(`cart race: ${JSON.stringify(detail.cart)}`);
    }
    step = 'close';
    if (transport.sessionId) await transport.terminateSession();
  } catch (err) {
    run.failedSteps[step] = (run.failedSteps[step] ?? 0) + 1;
    problems.push(`${step}: ${err?.message ?? err}`);
  } finally {
    await client.close().catch(() => {});
    for (const e of stats.exchanges) {
      const ok = typeof e.status === 'number' && ((e.status >= 200 && e.status < 300) || (e.method === 'GET' && e.status === 405));
      // The probe's 400 is the legacy server's answer the SDK falls back on.
      const probe400 = e.rpcMethod === 'server/discover' && e.status === 400 && opts.negotiation === 'auto';
      if (!ok && !probe400) {
        const key = `${e.method} ${e.rpcMethod ?? ''} ${e.status}`.replace(/\s+/g, ' ');
        run.httpErrors[key] = (run.httpErrors[key] ?? 0) + 1;
      }
      run.posts += e.method === 'POST' ? 1 : 0;
    }
    if (detail) {
      detail.probe = stats.probe;
      detail.exchanges = stats.exchanges;
      run.first = detail;
    }
  }
  return problems;
}

async function connects(opts) {
  const run = { mode: 'connects', negotiation: opts.negotiation, n: opts.n, concurrency: opts.concurrency, connects: 0, failedConnects: 0, failedSteps: {}, eras: {}, httpErrors: {}, posts: 0, samples: [] };
  let next = 0;
  const started = performance.now();
  const worker = async () => {
    while (next < opts.n) {
      const index = next++;
      // The first connect runs alone, so that its exchanges are its own.
      if (index > 0) await firstDone;
      const problems = await oneConnect(opts, run, index);
      if (index === 0) releaseFirst();
      if (problems.length > 0) {
        run.failedConnects += 1;
        if (run.samples.length < MAX_SAMPLES) run.samples.push(`#${index}: ${problems.join('; ')}`);
      } else {
        run.connects += 1;
      }
    }
  };
  let releaseFirst;
  const firstDone = new Promise((resolve) => { releaseFirst = resolve; });
  await Promise.all(Array.from({ length: Math.min(opts.concurrency, opts.n) }, worker));
  run.elapsedMs = Math.round(performance.now() - started);
  run.httpErrorCount = Object.values(run.httpErrors).reduce((a, b) => a + b, 0);
  run.failures = run.failedConnects + run.httpErrorCount + (run.first?.cart ? run.first.cart.failedCalls : 0);
  run.ok = run.failures === 0 && run.connects === opts.n;
  log(`${run.connects}/${opts.n} connects, ${run.failedConnects} failed, eras ${JSON.stringify(run.eras)}, http errors ${JSON.stringify(run.httpErrors)}`);
  return run;
}

// tools/list on a fresh pinned client, bounded by timeoutMs.
async function timedList(opts, timeoutMs) {
  const stats = { exchanges: [] };
  const { client, transport } = newClient({ ...opts, negotiation: 'pin' }, stats, 'mcp-serializer-v2-prober');
  const started = performance.now();
  try {
    await client.connect(transport, { timeout: timeoutMs });
    await client.listTools(undefined, { timeout: timeoutMs });
    return { answered: true, ms: Math.round(performance.now() - started) };
  } catch (err) {
    return { answered: false, ms: Math.round(performance.now() - started), error: String(err?.message ?? err) };
  } finally {
    await client.close().catch(() => {});
  }
}

async function listen(opts) {
  const out = { mode: 'listen', streams: opts.streams, opened: 0, failedOpens: 0, openMs: [], samples: [] };
  const held = [];
  await Promise.all(Array.from({ length: opts.streams }, async (_, i) => {
    const stats = { exchanges: [] };
    const { client, transport } = newClient({ ...opts, negotiation: 'pin' }, stats, `mcp-serializer-v2-listener-${i}`);
    const started = performance.now();
    try {
      await client.connect(transport, requestOptions);
      const subscription = await client.listen({ toolsListChanged: true }, requestOptions);
      out.opened += 1;
      out.openMs.push(Math.round(performance.now() - started));
      held.push({ client, subscription });
      log(`listen stream ${i} acknowledged: ${JSON.stringify(subscription.honoredFilter)}`);
    } catch (err) {
      out.failedOpens += 1;
      out.samples.push(`stream ${i}: ${err?.message ?? err}`);
      await client.close().catch(() => {});
    }
  }));
  out.whileHeld = await timedList(opts, opts.probeTimeoutMs);
  log(`tools/list while ${out.opened} streams are open: ${JSON.stringify(out.whileHeld)}`);
  // Closing a stream aborts its POST and POSTs notifications/cancelled; the
  // server notices the departed client when it next writes to it.
  const closing = performance.now();
  if (held.length > 0) {
    const { client, subscription } = held.pop();
    await subscription.close();
    out.closedHow = await Promise.race([subscription.closed, new Promise((r) => setTimeout(() => r('still open'), 5000))]);
    await client.close().catch(() => {});
  }
  out.afterOneClosed = await timedList(opts, Math.max(opts.probeTimeoutMs, 10000));
  out.afterOneClosed.sinceCloseMs = Math.round(performance.now() - closing);
  log(`tools/list after one stream closed: ${JSON.stringify(out.afterOneClosed)}`);
  for (const { client, subscription } of held) {
    await subscription.close().catch(() => {});
    await client.close().catch(() => {});
  }
  out.ok = out.failedOpens === 0;
  return out;
}

const modes = { connects, listen };

async function main() {
  let opts;
  try {
    opts = parseArgs(process.argv.slice(2));
  } catch (err) {
    process.stderr.write(`usage error: ${err.message}\n`);
    process.stdout.write(`${JSON.stringify({ ok: false, error: err.message })}\n`);
    process.exit(2);
  }
  try {
    const result = await modes[opts.mode](opts);
    process.stdout.write(`${JSON.stringify(result)}\n`);
    process.exit(result.ok ? 0 : 1);
  } catch (err) {
    log('failed:', err?.stack ?? String(err));
    process.stdout.write(`${JSON.stringify({ mode: opts.mode, ok: false, error: String(err?.message ?? err) })}\n`);
    process.exit(1);
  }
}

main();
