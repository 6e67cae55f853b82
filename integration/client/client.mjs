#!/usr/bin/env node
// MCP client driver for the integration tests, built on the official
// TypeScript SDK (@modelcontextprotocol/sdk).
//
//   node client.mjs flow     --url URL [--n 5] [--expect-get]
//   node client.mjs pipeline --url URL [--n 200] [--concurrency 8] [--get open|skip]
//   node client.mjs sessions --url URL [--n 500] [--concurrency 8] [--timeout 20000]
//   node client.mjs inflight --url URL [--n 6] [--concurrency N] [--lanes 2] [--rounds 3] [--steps 2 --steps-max 6] [--events]
//   node client.mjs hold     --url URL [--n 30] [--timeout 20000]
//
// Human-readable progress goes to stderr; the last line on stdout is one JSON
// object with the results, for the Go tests to parse.
//
// flow: the SDK's ordinary client: connect, tools/list, tools/call on `echo`
//   and on `slow_count` (an SSE response with progress notifications, timed
//   on arrival), then DELETE (terminateSession) and close. The SDK opens the
//   GET stream by itself once `notifications/initialized` got its 202; with
//   --expect-get the flow waits until that GET has been answered and reports
//   its status (a 405 is tolerated by the SDK).
//
// pipeline: N connects, `--concurrency` of them in flight, each driving the
//   SDK's StreamableHTTPClientTransport directly, the way the MCP Inspector's
//   proxy does: `initialize` (awaited); then `notifications/initialized`,
//   `logging/setLevel` and `tools/list`, each sent without awaiting the one
//   before; once all are answered, a later `tools/list` on the same session;
//   then DELETE. Counts rejections (-32600), HTTP errors by method and status,
//   replies whose ids differ from their request's ids, and broken sessions
//   (the later tools/list fails), and replies still missing after 20 s
//   (timeouts: a request stuck somewhere). --get skip answers the SDK's GET locally
//   with 405 (as a server without a GET stream would), so that GET streams
//   do not pin PHP-FPM workers.
//   Connect latency (connectP50Ms, connectP99Ms over connectTimed connects,
//   each in connectMs): from sending `initialize` until the later tools/list
//   has its reply (or has given up on it), for every connect whose
//   `initialize` returned a session; DELETE and closing the transport are
//   not included.
//   --hold-at K[,K2…]: once K connects have ended, hold each connect
//   whose initialize answers from then on, before its follow-ups, until a
//   line arrives on stdin (or stdin closes). Once every connect in flight
//   is held, say so with `held K` on stdout. A test injects its fault
//   then, so the fault lands mid-run on any machine, however fast, with
//   `--concurrency` sessions begun and their follow-ups still to come.
//
// sessions: N ordinary SDK clients, `--concurrency` of them at a time, each
//   doing what an application's client does: connect (initialize, then
//   `notifications/initialized` awaited, after whose 202 the SDK opens the
//   GET stream by itself), logging/setLevel, tools/list, tools/call `echo`,
//   then a later tools/list and tools/call as a check that the session still
//   works, then DELETE and close. Each request times out after --timeout ms.
//   Counts failed sessions by the step that failed, and the GET statuses
//   ("none" when the GET had no answer before the session ended).
//
// calls: N ordinary SDK sessions, `--concurrency` at a time; each connects,
//   then sends `--calls` (3) tools/call `echo` with texts of its own at once,
//   as an agent does with the calls of one turn, `--rounds` (1) times, then
//   DELETE. `--tool slow_count --steps N` sends `slow_count` calls instead
//   (each streams N progress steps, MCP_PHP_PROGRESS_MS apart), to time
//   calls that take a while. Counts calls answered with another call's text or not answered
//   (an error, or no reply within --timeout), replies carrying another
//   request's id, and HTTP errors by status; roundP50Ms is the median time
//   from sending a round's calls to the last answer. The SDK's GET is
//   answered 405 locally, so that it pins no PHP-FPM worker.
//
// inflight: `--n` (6) SDK sessions, `--concurrency` (all) at a time, each
//   keeping `--lanes` (2) tools/call `slow_count` in flight, as an agent
//   with parallel tool calls does: each lane sends its next call as soon as
//   its last one ended, `--rounds` (3) calls a lane, then the session is
//   deleted and the next one opens. Each call counts a random number of
//   steps from `--steps` to `--steps-max` (2 to 6), MCP_PHP_PROGRESS_MS
//   apart. Counts failed calls (an error, a wrong answer, or none within
//   --timeout) by reason, each with when it began and ended, failed
//   connects and HTTP errors by status; callMaxMs is the longest call.
//   --events prints `opened K` on stdout once K sessions have connected and
//   `ended K` once K calls have ended, so a test can inject a fault on
//   those events with calls in flight, and reads stdin: `mark NAME`
//   records the time under NAME (marks, in ms like the calls' times) and
//   says `marked NAME` on stdout once it has, and
//   `stop` (or stdin closing) ends the run early: no session opens and no
//   lane sends a call after it; the calls in flight end and the sessions
//   are deleted.
//
// users: `--users` (2) users, each with `--clients` (4) SDK clients at once
//   on Basic credentials of their own user, `--rounds` (1) times, as several
//   AI clients of one person connect to one site: connect, then tools/list,
//   prompts/list and resources/list at once, then tools/list again, then
//   DELETE. A session is lost when a request of it is answered 404 ("Session
//   not found"): the server dropped it while the client still had it.
//   Counts lost sessions and other failures. `--email-client` signs client
//   0 of each user in by e-mail address (<user>@example.test). `--passwords distinct` gives
//   each client of a user a password of its own (as WordPress's Application
//   Passwords are made, one per client); `shared` (the default), one.
//
// hold: `--n` (30) sessions, all at once, each opened with a pipelined
//   connect as the pipeline mode's (initialize awaited, then
//   `notifications/initialized`, `logging/setLevel` and `tools/list` without
//   waiting), then held open and used in rounds on the test's word, so that
//   a test can stop or kill what serves them between rounds or during one.
//   Reads stdin: `round` sends one tools/call `echo` on every session at
//   once, `round slow N` one `slow_count` to N with a progressToken; `stop`
//   (or stdin closing) deletes every session (DELETE) and ends the run.
//   Says on stdout, as it happens: `session I ID` when slot I has a
//   (new) session, `ready N` once every slot has tried to open,
//   `progress R I` at the first progress of slot I's call in round R,
//   `failed R I REASON` when a call fails, `answered R I` when it is
//   answered right, `done R` once every slot has ended round R. A call
//   answered 404 means the session is gone: the slot opens a new session at
//   once (`session I ID`) and sends the call again there. The final line
//   has each session's requests that carried its id (GET excepted) and their
//   statuses, and every failure with the start of its answer's body.

import { performance } from 'node:perf_hooks';
import readline from 'node:readline';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { LATEST_PROTOCOL_VERSION } from '@modelcontextprotocol/sdk/types.js';

const REPLY_TIMEOUT_MS = 20000;
const MAX_SAMPLES = 20;

function parseArgs(argv) {
  const [mode, ...rest] = argv;
  const opts = { mode, url: '', n: undefined, concurrency: 8, get: 'open', expectGet: false, timeoutMs: REPLY_TIMEOUT_MS, calls: 3, rounds: 1, tool: 'echo', steps: 5, stepsMax: undefined, lanes: 2, events: false, users: 2, clients: 4, passwords: 'shared', holdAt: [] };
  for (let i = 0; i < rest.length; i++) {
    const arg = rest[i];
    const next = () => {
      if (i + 1 >= rest.length) throw new Error(`${arg} needs a value`);
      return rest[++i];
    };
    switch (arg) {
      case '--url': opts.url = next(); break;
      case '--n': opts.n = Number.parseInt(next(), 10); break;
      case '--concurrency': opts.concurrency = Number.parseInt(next(), 10); break;
      case '--get': opts.get = next(); break;
      case '--expect-get': opts.expectGet = true; break;
      case '--timeout': opts.timeoutMs = Number.parseInt(next(), 10); break;
      case '--calls': opts.calls = Number.parseInt(next(), 10); break;
      case '--tool': opts.tool = next(); break;
      case '--steps': opts.steps = Number.parseInt(next(), 10); break;
      case '--steps-max': opts.stepsMax = Number.parseInt(next(), 10); break;
      case '--lanes': opts.lanes = Number.parseInt(next(), 10); break;
      case '--events': opts.events = true; break;
      case '--rounds': opts.rounds = Number.parseInt(next(), 10); break;
      case '--users': opts.users = Number.parseInt(next(), 10); break;
      case '--clients': opts.clients = Number.parseInt(next(), 10); break;
      case '--passwords': opts.passwords = next(); break;
      case '--email-client': opts.emailClient = true; break;
      case '--hold-at': opts.holdAt = next().split(',').map((k) => Number.parseInt(k, 10)); break;
      default: throw new Error(`unknown argument ${arg}`);
    }
  }
  if (!['flow', 'pipeline', 'sessions', 'calls', 'users', 'inflight', 'hold'].includes(mode)) throw new Error('mode must be flow, pipeline, sessions, calls, users, inflight or hold');
  opts.stepsMax ??= mode === 'inflight' ? 6 : opts.steps;
  if (mode === 'inflight') {
    if (!rest.includes('--steps')) opts.steps = 2;
    if (!rest.includes('--concurrency')) opts.concurrency = Infinity; // every session at once
    if (!rest.includes('--rounds')) opts.rounds = 3;
  }
  if (!(opts.stepsMax >= opts.steps) || opts.stepsMax > 20) throw new Error('--steps-max must be from --steps to 20');
  if (!(opts.lanes >= 1)) throw new Error('--lanes must be >= 1');
  if (!(opts.users >= 1) || !(opts.clients >= 1)) throw new Error('--users and --clients must be >= 1');
  if (opts.passwords !== 'shared' && opts.passwords !== 'distinct') throw new Error('--passwords must be shared or distinct');
  if (!(opts.calls >= 1) || !(opts.rounds >= 1) || !(opts.steps >= 1) || opts.steps > 20) throw new Error('--calls and --rounds must be >= 1, --steps from 1 to 20');
  if (opts.tool !== 'echo' && opts.tool !== 'slow_count') throw new Error('--tool must be echo or slow_count');
  if (!(opts.timeoutMs >= 1)) throw new Error('--timeout must be >= 1 (ms)');
  if (!opts.url) throw new Error('--url is required');
  if (opts.get !== 'open' && opts.get !== 'skip') throw new Error('--get must be open or skip');
  if (!(opts.concurrency >= 1)) throw new Error('--concurrency must be >= 1');
  if (!opts.holdAt.every((k, i) => k >= 1 && (i === 0 || k > opts.holdAt[i - 1]))) throw new Error('--hold-at takes rising counts >= 1');
  return opts;
}

const t0 = performance.now();
const now = () => Math.round((performance.now() - t0) * 10) / 10;
const log = (...parts) => process.stderr.write(`[${now().toFixed(1).padStart(9)} ms] ${parts.join(' ')}\n`);

function idsOf(message) {
  const list = Array.isArray(message) ? message : [message];
  return list.filter((m) => m && typeof m === 'object' && 'id' in m && m.id !== null && m.id !== undefined).map((m) => m.id);
}

function requestIdsOf(body) {
  let parsed;
  try {
    parsed = JSON.parse(body);
  } catch {
    return [];
  }
  const list = Array.isArray(parsed) ? parsed : [parsed];
  return list.filter((m) => m && typeof m === 'object' && typeof m.method === 'string' && 'id' in m).map((m) => m.id);
}

const sameIds = (a, b) => {
  const x = a.map(String).sort();
  const y = b.map(String).sort();
  return x.length === y.length && x.every((v, i) => v === y[i]);
};

// A fetch for the SDK transport that records every HTTP exchange and checks
// that a JSON reply carries exactly the ids of the requests it answers.
// With errorBodies, an answer that is not a 2xx keeps the start of its body.
function recordingFetch(stats, { skipGet = false, errorBodies = false } = {}) {
  return async (input, init = {}) => {
    const method = (init.method ?? 'GET').toUpperCase();
    if (method === 'GET' && skipGet) {
      const response = new Response(null, { status: 405, statusText: 'Method Not Allowed' });
      stats.exchanges.push({ method, status: 405, at: now(), local: true });
      return response;
    }
    const requestIds = method === 'POST' && typeof init.body === 'string' ? requestIdsOf(init.body) : [];
    const session = new Headers(init.headers ?? {}).get('mcp-session-id');
    let response;
    try {
      response = await fetch(input, init);
    } catch (err) {
      if (err?.name !== 'AbortError') {
        stats.exchanges.push({ method, status: 'network', at: now(), error: String(err?.message ?? err) });
      }
      throw err;
    }
    const contentType = response.headers.get('content-type') ?? '';
    const exchange = { method, status: response.status, at: now(), contentType: contentType.split(';')[0].trim() };
    if (requestIds.length > 0) exchange.requestIds = requestIds;
    if (session) exchange.session = session;
    stats.exchanges.push(exchange);
    if (!response.ok && errorBodies) {
      exchange.body = (await response.clone().text().catch((err) => String(err?.message ?? err))).slice(0, 300);
    }
    if (requestIds.length > 0 && response.ok && contentType.startsWith('application/json')) {
      try {
        const replyIds = idsOf(await response.clone().json());
        if (!sameIds(requestIds, replyIds)) {
          exchange.idMismatch = { requestIds, replyIds };
        }
      } catch (err) {
        exchange.idMismatch = { requestIds, replyIds: [], error: String(err?.message ?? err) };
      }
    }
    return response;
  };
}

const noReconnect = {
  initialReconnectionDelay: 1000,
  maxReconnectionDelay: 1000,
  reconnectionDelayGrowFactor: 1,
  maxRetries: 0,
};

async function waitFor(predicate, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  while (!predicate()) {
    if (Date.now() > deadline) return false;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  return true;
}

async function flow(opts) {
  const n = opts.n ?? 5;
  const stats = { exchanges: [] };
  const transportErrors = [];
  const transport = new StreamableHTTPClientTransport(new URL(opts.url), {
    fetch: recordingFetch(stats),
    reconnectionOptions: noReconnect,
  });
  const client = new Client({ name: 'mcp-serializer-flow', version: '1.0.0' });
  client.onerror = (err) => {
    // Closing the client aborts an open GET stream; that is not an error of the flow.
    const text = String(err?.message ?? err);
    if (!/abort/i.test(text)) transportErrors.push(text);
  };

  const out = { mode: 'flow', ok: false };
  await client.connect(transport);
  out.sessionId = transport.sessionId ?? '';
  out.protocolVersion = transport.protocolVersion ?? '';
  log('connected, session', out.sessionId ? `${out.sessionId.slice(0, 6)}…` : '(none)');

  const tools = await client.listTools();
  out.tools = tools.tools.map((tool) => tool.name);
  log('tools/list:', out.tools.join(', '));

  const echo = await client.callTool({ name: 'echo', arguments: { text: 'hello through caddy' } });
  out.echo = echo.content?.[0]?.text ?? '';
  log('echo ->', JSON.stringify(out.echo));

  const progress = [];
  out.callStartedAt = now();
  log(`slow_count n=${n} started`);
  const slow = await client.callTool({ name: 'slow_count', arguments: { n } }, undefined, {
    timeout: 30000,
    onprogress: (p) => {
      const entry = { progress: p.progress, total: p.total, message: p.message ?? '', at: now() };
      progress.push(entry);
      log(`progress ${p.progress}/${p.total}`);
    },
  });
  out.resultAt = now();
  out.slowResult = slow.content?.[0]?.text ?? '';
  out.progress = progress;
  log('slow_count result ->', JSON.stringify(out.slowResult));

  if (opts.expectGet) {
    const seen = await waitFor(() => stats.exchanges.some((e) => e.method === 'GET'), 10000);
    if (!seen) transportErrors.push('the SDK did not open the GET stream within 10s');
  }
  out.getStatuses = stats.exchanges.filter((e) => e.method === 'GET').map((e) => e.status);
  log('GET stream statuses:', JSON.stringify(out.getStatuses));

  await transport.terminateSession();
  log('session terminated (DELETE)');
  await client.close();

  out.exchanges = stats.exchanges;
  out.transportErrors = transportErrors;
  out.idMismatches = stats.exchanges.filter((e) => e.idMismatch).length;
  out.ok = transportErrors.length === 0 && out.idMismatches === 0;
  return out;
}

// rawRequests drives an SDK transport by hand, as the Inspector's proxy
// does: request(id, method, params) sends one JSON-RPC request without
// waiting for any other and returns { sent, reply }. reply resolves with
// the reply, or with undefined when none will come (an HTTP error, a JSON
// answer without this id, or nothing within timeoutMs, counted in
// run.timeouts); a reply nobody waits for counts in run.unexpectedReplies.
// onNotification gets the server's notifications. Call it before
// transport.start().
function rawRequests(transport, stats, run, { timeoutMs = REPLY_TIMEOUT_MS, onNotification = () => {} } = {}) {
  const waiters = new Map();
  transport.onmessage = (message) => {
    if (message && 'id' in message && ('result' in message || 'error' in message)) {
      const resolve = waiters.get(message.id);
      if (resolve) {
        waiters.delete(message.id);
        resolve(message);
      } else {
        run.unexpectedReplies += 1;
      }
    } else if (message && typeof message.method === 'string' && !('id' in message)) {
      onNotification(message);
    }
  };
  return (id, method, params) => {
    const reply = new Promise((resolve) => {
      // The timer also keeps the process alive while a lost reply is awaited.
      const timer = setTimeout(() => {
        if (waiters.delete(id)) {
          run.timeouts += 1;
          resolve(undefined);
        }
      }, timeoutMs);
      waiters.set(id, (message) => {
        clearTimeout(timer);
        resolve(message);
      });
    });
    const sent = transport.send({ jsonrpc: '2.0', id, method, params });
    const giveUp = () => {
      const resolve = waiters.get(id);
      if (resolve) {
        waiters.delete(id);
        resolve(undefined);
      }
    };
    sent.then(
      () => {
        // A JSON reply has been delivered before send() resolves: if it did
        // not carry this id, the reply went elsewhere. (SSE replies come later.)
        const ex = stats.exchanges.find((e) => e.requestIds?.includes(id));
        if (ex && ex.contentType === 'application/json') giveUp();
      },
      giveUp, // an HTTP error: no reply will come for this id
    );
    return { sent, reply };
  };
}

// One pipelined connect; returns its outcome and adds to the run's counters.
// afterInitialize is awaited between initialize's answer and the
// follow-ups.
async function pipelineConnect(opts, run, afterInitialize = async () => {}) {
  const stats = { exchanges: [] };
  const transport = new StreamableHTTPClientTransport(new URL(opts.url), {
    fetch: recordingFetch(stats, { skipGet: opts.get === 'skip' }),
    reconnectionOptions: noReconnect,
  });
  const request = rawRequests(transport, stats, run);
  transport.onerror = () => {}; // failures are counted from the exchanges and replies below
  await transport.start();

  const problems = [];
  const noteReply = (what, reply) => {
    if (reply === undefined) {
      problems.push(`${what}: no reply`);
      return false;
    }
    if (reply.error) {
      if (reply.error.code === -32600) run.rejections += 1;
      problems.push(`${what}: error ${reply.error.code} ${reply.error.message}`);
      return false;
    }
    return true;
  };

  try {
    const connectStarted = performance.now();
    const init = request(0, 'initialize', {
      protocolVersion: LATEST_PROTOCOL_VERSION,
      capabilities: {},
      clientInfo: { name: 'mcp-serializer-pipeline', version: '1.0.0' },
    });
    await init.sent.catch(() => {});
    const initReply = await init.reply;
    if (!noteReply('initialize', initReply) || !transport.sessionId) {
      run.failedConnects += 1;
      return problems.length ? problems : ['initialize: no session id'];
    }
    transport.setProtocolVersion(initReply.result.protocolVersion);
    const heldFrom = performance.now();
    await afterInitialize();
    const held = performance.now() - heldFrom; // not part of the connect's latency
    run.connects += 1;

    // What the Inspector's proxy does: forward `initialized` without waiting
    // for it, and the client's next requests right behind it.
    const initialized = transport.send({ jsonrpc: '2.0', method: 'notifications/initialized' });
    const setLevel = request(1, 'logging/setLevel', { level: 'info' });
    const firstList = request(2, 'tools/list', {});
    await Promise.allSettled([initialized, setLevel.sent, firstList.sent]);
    noteReply('logging/setLevel', await setLevel.reply);
    noteReply('tools/list', await firstList.reply);

    // A later request on the same session, once all of the above has been
    // answered: fails if the session was left broken.
    const list = request(3, 'tools/list', {});
    await list.sent.catch(() => {});
    const listReply = await list.reply;
    run.connectMs.push(performance.now() - connectStarted - held);
    if (!noteReply('later tools/list', listReply) || !Array.isArray(listReply.result?.tools)) {
      run.broken += 1;
    }

    await transport.terminateSession().catch(() => {});
  } finally {
    await transport.close().catch(() => {});
    for (const e of stats.exchanges) {
      if (e.idMismatch) {
        run.idMismatches += 1;
        problems.push(`${e.method} reply ids ${JSON.stringify(e.idMismatch.replyIds)} for request ids ${JSON.stringify(e.idMismatch.requestIds)}`);
      }
      const ok = typeof e.status === 'number' && e.status >= 200 && e.status < 300;
      if (!ok && !(e.method === 'GET' && e.status === 405)) {
        const key = `${e.method} ${e.status}`;
        run.httpErrors[key] = (run.httpErrors[key] ?? 0) + 1;
        problems.push(`HTTP ${key}`);
      }
      if (e.method === 'GET') {
        const key = String(e.status);
        run.getStatuses[key] = (run.getStatuses[key] ?? 0) + 1;
      }
    }
  }
  return problems;
}

// Nearest-rank percentile in ms, one decimal; 0 for no values.
function percentile(values, p) {
  if (values.length === 0) return 0;
  const sorted = [...values].sort((a, b) => a - b);
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil(p * sorted.length) - 1));
  return Math.round(sorted[i] * 10) / 10;
}

// barriers returns the run's holds for workers workers: hold(done) resolves
// at once until done reaches the next of counts, then only once stdin
// gives a line for that count (or closes); leave() says a worker has
// ended. Each count is announced once, on stdout, as `held K`, when every
// worker still running is held.
function barriers(counts, workers) {
  if (counts.length === 0) return { hold: async () => {}, leave: () => {} };
  const gates = counts.map((count) => {
    let open;
    const opened = new Promise((resolve) => { open = resolve; });
    return { count, opened, open, held: 0, announced: false };
  });
  let running = workers;
  let released = 0;
  const lines = readline.createInterface({ input: process.stdin });
  const releaseNext = () => {
    if (released < gates.length) gates[released++].open();
    if (released === gates.length) lines.close();
  };
  lines.on('line', releaseNext);
  lines.on('close', () => { while (released < gates.length) releaseNext(); });
  const announce = (gate) => {
    if (gate.announced || gate.held < running) return;
    gate.announced = true;
    log(`held at ${gate.count} connects`);
    process.stdout.write(`held ${gate.count}\n`);
  };
  const hold = async (done) => {
    for (const [i, gate] of gates.entries()) {
      if (done < gate.count) return;
      if (i < released) continue;
      gate.held += 1;
      announce(gate);
      await gate.opened;
      gate.held -= 1;
    }
  };
  const leave = () => {
    running -= 1;
    for (const gate of gates) if (gate.held > 0) announce(gate);
  };
  return { hold, leave };
}

async function pipeline(opts) {
  const n = opts.n ?? 200;
  const workers = Math.min(opts.concurrency, n);
  const { hold, leave } = barriers(opts.holdAt.filter((k) => k < n), workers);
  const run = {
    mode: 'pipeline',
    n,
    concurrency: opts.concurrency,
    get: opts.get,
    connects: 0,
    failedConnects: 0,
    rejections: 0,
    httpErrors: {},
    idMismatches: 0,
    broken: 0,
    unexpectedReplies: 0,
    timeouts: 0,
    failedSessions: 0,
    getStatuses: {},
    samples: [],
    connectMs: [],
  };
  let next = 0;
  let done = 0;
  const started = performance.now();
  const worker = async () => {
    for (;;) {
      if (next >= n) {
        leave();
        return;
      }
      const index = next++;
      let problems;
      try {
        problems = await pipelineConnect(opts, run, () => hold(done));
      } catch (err) {
        run.failedConnects += 1;
        problems = [`connect ${index}: ${err?.message ?? err}`];
      }
      if (problems.length > 0) {
        run.failedSessions += 1;
        if (run.samples.length < MAX_SAMPLES) run.samples.push(`#${index}: ${problems.join('; ')}`);
      }
      done += 1;
      if (done % 100 === 0 || done === n) log(`${done}/${n} connects, ${run.failedSessions} with failures`);
    }
  };
  await Promise.all(Array.from({ length: workers }, worker));
  run.elapsedMs = Math.round(performance.now() - started);
  run.httpErrorCount = Object.values(run.httpErrors).reduce((a, b) => a + b, 0);
  run.failures = run.rejections + run.httpErrorCount + run.idMismatches + run.broken + run.failedConnects + run.unexpectedReplies + run.timeouts;
  run.ok = run.failures === 0 && run.connects === n;
  run.connectTimed = run.connectMs.length;
  run.connectP50Ms = percentile(run.connectMs, 0.5);
  run.connectP99Ms = percentile(run.connectMs, 0.99);
  run.connectMs = run.connectMs.map((ms) => Math.round(ms * 10) / 10);
  return run;
}

// One ordinary SDK client session; returns its problems (empty when all
// went well) and adds to the run's counters.
async function sdkSession(opts, run, index) {
  const stats = { exchanges: [] };
  const transport = new StreamableHTTPClientTransport(new URL(opts.url), {
    fetch: recordingFetch(stats),
    reconnectionOptions: noReconnect,
  });
  const client = new Client({ name: 'mcp-serializer-sessions', version: '1.0.0' });
  client.onerror = () => {}; // failures are counted per step below
  const requestOptions = { timeout: opts.timeoutMs };
  const text = `session ${index}`;
  const checkEcho = (result) => {
    const got = result.content?.[0]?.text;
    if (got !== text) throw new Error(`echo answered ${JSON.stringify(got)}`);
  };
  const checkTools = (result) => {
    if (!result.tools?.some((tool) => tool.name === 'echo')) throw new Error('no echo tool listed');
  };
  const steps = [
    ['connect', () => client.connect(transport, requestOptions)],
    ['logging/setLevel', () => client.setLoggingLevel('info', requestOptions)],
    ['tools/list', async () => checkTools(await client.listTools(undefined, requestOptions))],
    ['tools/call', async () => checkEcho(await client.callTool({ name: 'echo', arguments: { text } }, undefined, requestOptions))],
    ['later tools/list', async () => checkTools(await client.listTools(undefined, requestOptions))],
    ['later tools/call', async () => checkEcho(await client.callTool({ name: 'echo', arguments: { text } }, undefined, requestOptions))],
    ['delete', () => transport.terminateSession()],
  ];
  const problems = [];
  try {
    for (const [step, action] of steps) {
      try {
        await action();
      } catch (err) {
        run.failedSteps[step] = (run.failedSteps[step] ?? 0) + 1;
        problems.push(`${step}: ${err?.message ?? err}`);
        break;
      }
    }
  } finally {
    await client.close().catch(() => {});
    const gets = stats.exchanges.filter((e) => e.method === 'GET');
    for (const key of gets.length ? gets.map((e) => String(e.status)) : ['none']) {
      run.getStatuses[key] = (run.getStatuses[key] ?? 0) + 1;
    }
  }
  return problems;
}

async function sessions(opts) {
  const n = opts.n ?? 500;
  const run = {
    mode: 'sessions',
    n,
    concurrency: opts.concurrency,
    completed: 0,
    failedSessions: 0,
    failedSteps: {},
    getStatuses: {},
    samples: [],
  };
  let next = 0;
  const started = performance.now();
  const worker = async () => {
    while (next < n) {
      const index = next++;
      const problems = await sdkSession(opts, run, index);
      if (problems.length > 0) {
        run.failedSessions += 1;
        if (run.samples.length < MAX_SAMPLES) run.samples.push(`#${index}: ${problems.join('; ')}`);
      } else {
        run.completed += 1;
      }
      const done = run.completed + run.failedSessions;
      if (done % 100 === 0 || done === n) log(`${done}/${n} sessions, ${run.failedSessions} failed`);
    }
  };
  await Promise.all(Array.from({ length: Math.min(opts.concurrency, n) }, worker));
  run.elapsedMs = Math.round(performance.now() - started);
  run.ok = run.failedSessions === 0 && run.completed === n;
  return run;
}

// One SDK session sending its calls in rounds, each round's at once.
async function callsSession(opts, run, index) {
  const stats = { exchanges: [] };
  const transport = new StreamableHTTPClientTransport(new URL(opts.url), {
    fetch: recordingFetch(stats, { skipGet: true }),
    reconnectionOptions: noReconnect,
  });
  const client = new Client({ name: 'mcp-serializer-calls', version: '1.0.0' });
  client.onerror = () => {}; // a reply for a request already answered: counted below
  const requestOptions = { timeout: opts.timeoutMs };
  const problems = [];
  try {
    await client.connect(transport, requestOptions);
  } catch (err) {
    run.failedConnects += 1;
    return [`connect: ${err?.message ?? err}`];
  }
  try {
    for (let round = 0; round < opts.rounds; round++) {
      const started = performance.now();
      const echo = opts.tool === 'echo';
      const texts = Array.from({ length: opts.calls }, (_, j) => (echo ? `session ${index} round ${round} call ${j}` : `counted to ${opts.steps}`));
      const answers = await Promise.allSettled(
        texts.map((text) => client.callTool({ name: opts.tool, arguments: echo ? { text } : { n: opts.steps } }, undefined, requestOptions)),
      );
      run.roundMs.push(performance.now() - started);
      answers.forEach((answer, j) => {
        run.calls += 1;
        const got = answer.status === 'fulfilled' ? answer.value.content?.[0]?.text : undefined;
        if (got === texts[j]) return;
        run.wrongCalls += 1;
        problems.push(answer.status === 'fulfilled' ? `call ${j} answered ${JSON.stringify(got)}` : `call ${j}: ${answer.reason?.message ?? answer.reason}`);
      });
    }
    await transport.terminateSession().catch((err) => problems.push(`delete: ${err?.message ?? err}`));
  } finally {
    await client.close().catch(() => {});
    for (const e of stats.exchanges) {
      if (e.idMismatch) run.idMismatches += 1;
      if (typeof e.status === 'number' && (e.status < 200 || e.status > 299) && !e.local) {
        run.httpErrors[e.status] = (run.httpErrors[e.status] ?? 0) + 1;
      }
    }
  }
  return problems;
}

async function calls(opts) {
  const n = opts.n ?? 20;
  const run = {
    mode: 'calls',
    n,
    concurrency: opts.concurrency,
    callsPerRound: opts.calls,
    rounds: opts.rounds,
    calls: 0,
    wrongCalls: 0,
    idMismatches: 0,
    httpErrors: {},
    failedConnects: 0,
    failedSessions: 0,
    samples: [],
    roundMs: [],
  };
  let next = 0;
  const started = performance.now();
  const worker = async () => {
    while (next < n) {
      const index = next++;
      const problems = await callsSession(opts, run, index);
      if (problems.length > 0) {
        run.failedSessions += 1;
        if (run.samples.length < MAX_SAMPLES) run.samples.push(`#${index}: ${problems.join('; ')}`);
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(opts.concurrency, n) }, worker));
  run.elapsedMs = Math.round(performance.now() - started);
  run.httpErrorCount = Object.values(run.httpErrors).reduce((a, b) => a + b, 0);
  run.roundP50Ms = percentile(run.roundMs, 0.5);
  delete run.roundMs;
  log(`${n} sessions, ${run.calls} calls: ${run.wrongCalls} wrong or unanswered, ${run.idMismatches} replies with another id, HTTP errors ${JSON.stringify(run.httpErrors)}`);
  run.ok = run.failedSessions === 0 && run.failedConnects === 0 && run.calls === n * opts.calls * opts.rounds;
  return run;
}

// The reason a call failed, without what differs between calls: the
// front's or an instance's HTTP status, a timeout, or the error's text.
function failureReason(err) {
  const text = String(err?.message ?? err);
  if (/timed out/i.test(text)) return 'timeout';
  // The SDK's StreamableHTTPError carries the HTTP status as its code.
  if (Number.isInteger(err?.code) && err.code >= 100 && err.code < 600) return `HTTP ${err.code}`;
  const status = /HTTP (\d{3})/.exec(text);
  if (status) return `HTTP ${status[1]}`;
  return text.replace(/\s+/g, ' ').slice(0, 80);
}

// inflightControl reads the test's lines on stdin (with --events): `mark
// NAME` and `stop`. stopped() says whether the run was told to stop.
function inflightControl(opts, marks) {
  let stopped = false;
  if (opts.events) {
    const lines = readline.createInterface({ input: process.stdin });
    lines.on('line', (line) => {
      const [word, name] = line.trim().split(/\s+/, 2);
      if (word === 'stop') {
        stopped = true;
        log('told to stop');
      } else if (word === 'mark' && name) {
        marks[name] = now();
        log(`mark ${name}`);
        process.stdout.write(`marked ${name}\n`);
      }
    });
    lines.on('close', () => { stopped = true; });
  }
  return { stopped: () => stopped, close: () => process.stdin.destroy() };
}

// One session of the inflight mode: connect, then its lanes, then DELETE.
async function inflightSession(opts, run, index, control, onEnded) {
  const stats = { exchanges: [] };
  const transport = new StreamableHTTPClientTransport(new URL(opts.url), {
    fetch: recordingFetch(stats, { skipGet: true }),
    reconnectionOptions: noReconnect,
  });
  const client = new Client({ name: 'mcp-serializer-inflight', version: '1.0.0' });
  client.onerror = () => {}; // failed calls are counted below
  const requestOptions = { timeout: opts.timeoutMs };
  try {
    try {
      await client.connect(transport, requestOptions);
    } catch (err) {
      run.failedConnects += 1;
      if (run.samples.length < MAX_SAMPLES) run.samples.push(`#${index} connect: ${err?.message ?? err}`);
      return;
    }
    run.opened += 1;
    if (opts.events) process.stdout.write(`opened ${run.opened}\n`);
    const lane = async (l) => {
      for (let round = 0; round < opts.rounds && !control.stopped(); round++) {
        const steps = opts.steps + Math.floor(Math.random() * (opts.stepsMax - opts.steps + 1));
        const beganAt = now();
        let failure;
        try {
          const result = await client.callTool({ name: 'slow_count', arguments: { n: steps } }, undefined, requestOptions);
          const got = result.content?.[0]?.text;
          if (got !== `counted to ${steps}`) failure = { reason: 'wrong answer', detail: `answered ${JSON.stringify(got)}` };
        } catch (err) {
          failure = { reason: failureReason(err), detail: String(err?.message ?? err) };
        }
        const endedAt = now();
        run.callMs.push(endedAt - beganAt);
        run.calls += 1;
        if (failure) {
          run.failedCalls += 1;
          run.failures[failure.reason] = (run.failures[failure.reason] ?? 0) + 1;
          // nginx's own 502 page: the front answered, not an instance.
          const byNginx = /502 Bad Gateway[\s\S]*<center>nginx[^<]*<\/center>/.test(failure.detail ?? '');
          run.failedCallTimes.push({ beganAt, endedAt, reason: failure.reason, byNginx });
          if (run.samples.length < MAX_SAMPLES) run.samples.push(`#${index} lane ${l} call ${round}: ${failure.detail.slice(0, 300)}`);
        }
        onEnded();
      }
    };
    await Promise.all(Array.from({ length: opts.lanes }, (_, l) => lane(l)));
    await transport.terminateSession().catch((err) => {
      run.failedDeletes += 1;
      if (run.samples.length < MAX_SAMPLES) run.samples.push(`#${index} delete: ${err?.message ?? err}`);
    });
  } finally {
    await client.close().catch(() => {});
    for (const e of stats.exchanges) {
      if (e.idMismatch) run.idMismatches += 1;
      if (typeof e.status === 'number' && (e.status < 200 || e.status > 299) && !e.local) {
        run.httpErrors[e.status] = (run.httpErrors[e.status] ?? 0) + 1;
      }
    }
  }
}

async function inflight(opts) {
  const n = opts.n ?? 6;
  const run = {
    mode: 'inflight',
    n,
    concurrency: Math.min(opts.concurrency, n),
    lanes: opts.lanes,
    rounds: opts.rounds,
    opened: 0,
    calls: 0,
    failedCalls: 0,
    failures: {},
    failedCallTimes: [],
    failedConnects: 0,
    failedDeletes: 0,
    idMismatches: 0,
    httpErrors: {},
    marks: {},
    samples: [],
    callMs: [],
  };
  const control = inflightControl(opts, run.marks);
  const onEnded = () => {
    if (opts.events) process.stdout.write(`ended ${run.calls}\n`);
    if (run.calls % 20 === 0) log(`${run.calls} calls ended, ${run.failedCalls} failed`);
  };
  let next = 0;
  const started = performance.now();
  const worker = async () => {
    while (next < n && !control.stopped()) {
      const index = next++;
      await inflightSession(opts, run, index, control, onEnded);
    }
  };
  await Promise.all(Array.from({ length: run.concurrency }, worker));
  control.close();
  run.elapsedMs = Math.round(performance.now() - started);
  run.stopped = control.stopped() && next < n;
  run.httpErrorCount = Object.values(run.httpErrors).reduce((a, b) => a + b, 0);
  run.callP50Ms = percentile(run.callMs, 0.5);
  run.callMaxMs = run.callMs.length ? Math.round(Math.max(...run.callMs)) : 0;
  delete run.callMs;
  log(`${run.opened} sessions, ${run.calls} calls: ${run.failedCalls} failed ${JSON.stringify(run.failures)}, failed connects ${run.failedConnects}, HTTP errors ${JSON.stringify(run.httpErrors)}, longest call ${run.callMaxMs} ms`);
  run.ok = run.failedCalls === 0 && run.failedConnects === 0 && run.failedDeletes === 0 && run.idMismatches === 0;
  return run;
}

// One client of a user: its session's steps, and whether the server lost it.
async function userSession(opts, run, user, clientIndex) {
  const stats = { exchanges: [] };
  const password = opts.passwords === 'distinct' ? `password-${clientIndex}` : 'password';
  // With --email-client, client 0 signs in by the user's e-mail address.
  const name = opts.emailClient && clientIndex === 0 ? `${user}@example.test` : user;
  const authorization = `Basic ${Buffer.from(`${name}:${password}`).toString('base64')}`;
  const transport = new StreamableHTTPClientTransport(new URL(opts.url), {
    fetch: recordingFetch(stats, { skipGet: true }),
    requestInit: { headers: { Authorization: authorization } },
    reconnectionOptions: noReconnect,
  });
  const client = new Client({ name: 'mcp-serializer-users', version: '1.0.0' });
  client.onerror = () => {};
  const requestOptions = { timeout: opts.timeoutMs };
  const problems = [];
  let step = 'connect';
  try {
    await client.connect(transport, requestOptions);
    step = 'lists';
    const lists = await Promise.allSettled([
      client.listTools(undefined, requestOptions),
      client.listPrompts(undefined, requestOptions),
      client.listResources(undefined, requestOptions),
    ]);
    for (const l of lists) if (l.status === 'rejected') problems.push(`${step}: ${l.reason?.message ?? l.reason}`);
    step = 'later tools/list';
    if (problems.length === 0) await client.listTools(undefined, requestOptions);
    step = 'delete';
    if (problems.length === 0) await transport.terminateSession();
  } catch (err) {
    problems.push(`${step}: ${err?.message ?? err}`);
  } finally {
    await client.close().catch(() => {});
  }
  run.sessions += 1;
  const statuses = stats.exchanges.map((e) => e.status);
  if (statuses.includes(404)) {
    run.lostSessions += 1;
  } else if (problems.length > 0) {
    run.failedSessions += 1;
  }
  for (const e of stats.exchanges) {
    if (typeof e.status === 'number' && (e.status < 200 || e.status > 299) && !e.local) {
      run.httpErrors[e.status] = (run.httpErrors[e.status] ?? 0) + 1;
    }
  }
  return problems;
}

async function users(opts) {
  const run = { mode: 'users', users: opts.users, clients: opts.clients, rounds: opts.rounds, passwords: opts.passwords, sessions: 0, lostSessions: 0, failedSessions: 0, httpErrors: {}, samples: [] };
  const started = performance.now();
  for (let round = 0; round < opts.rounds; round++) {
    const all = [];
    for (let u = 0; u < opts.users; u++) {
      for (let c = 0; c < opts.clients; c++) {
        all.push(userSession(opts, run, `user${u}`, c).then((problems) => {
          if (problems.length > 0 && run.samples.length < MAX_SAMPLES) run.samples.push(`round ${round} user${u} client ${c}: ${problems.join('; ')}`);
        }));
      }
    }
    await Promise.all(all);
  }
  run.elapsedMs = Math.round(performance.now() - started);
  log(`${run.sessions} sessions: ${run.lostSessions} lost, ${run.failedSessions} failed otherwise, HTTP errors ${JSON.stringify(run.httpErrors)}`);
  run.ok = run.lostSessions === 0 && run.failedSessions === 0 && run.sessions === opts.users * opts.clients * opts.rounds;
  return run;
}

// One session of the hold mode, opened with a pipelined connect.
async function holdOpen(opts, run, slot) {
  const stats = { exchanges: [] };
  const transport = new StreamableHTTPClientTransport(new URL(opts.url), {
    fetch: recordingFetch(stats, { errorBodies: true }),
    reconnectionOptions: noReconnect,
  });
  const s = { slot, transport, stats, next: 0, progress: new Map(), opened: now() };
  s.request = rawRequests(transport, stats, run, {
    timeoutMs: opts.timeoutMs,
    onNotification: (message) => {
      const report = message.method === 'notifications/progress' && s.progress.get(message.params?.progressToken);
      if (report) report();
    },
  });
  transport.onerror = () => {}; // failures are judged from the replies and exchanges
  run.holds.push(s);
  await transport.start();
  const expect = async (what, r, check = (reply) => reply.result !== undefined) => {
    await r.sent.catch(() => {});
    const reply = await r.reply;
    if (reply === undefined || !check(reply)) throw new Error(`${what}: ${reply ? JSON.stringify(reply).slice(0, 200) : describeExchange(stats, r.id)}`);
    return reply;
  };
  const init = s.request(s.next++, 'initialize', {
    protocolVersion: LATEST_PROTOCOL_VERSION,
    capabilities: {},
    clientInfo: { name: 'mcp-serializer-hold', version: '1.0.0' },
  });
  init.id = s.next - 1;
  const initReply = await expect('initialize', init);
  if (!transport.sessionId) throw new Error('initialize: no session id');
  transport.setProtocolVersion(initReply.result.protocolVersion);
  s.sessionId = transport.sessionId;
  const initialized = transport.send({ jsonrpc: '2.0', method: 'notifications/initialized' });
  const setLevel = s.request(s.next++, 'logging/setLevel', { level: 'info' });
  setLevel.id = s.next - 1;
  const list = s.request(s.next++, 'tools/list', {});
  list.id = s.next - 1;
  const [sentInitialized] = await Promise.allSettled([initialized, setLevel.sent, list.sent]);
  if (sentInitialized.status === 'rejected') throw new Error(`notifications/initialized: ${sentInitialized.reason?.message ?? sentInitialized.reason}`);
  await expect('logging/setLevel', setLevel);
  await expect('tools/list', list, (reply) => Array.isArray(reply.result?.tools));
  process.stdout.write(`session ${slot} ${s.sessionId}\n`);
  return s;
}

// describeExchange is what became of the request with this id: its HTTP
// status and the start of the body, or that it had no answer.
function describeExchange(stats, id) {
  const ex = stats.exchanges.find((e) => e.requestIds?.includes(id));
  if (!ex) return 'no answer';
  return `HTTP ${ex.status}${ex.body ? ` ${ex.body}` : ''}`;
}

// One call of a round on slot's session; a 404 opens a new session and
// sends the call again there.
async function holdCall(opts, run, slots, slot, round, tool, steps) {
  for (let attempt = 0; ; attempt++) {
    const s = slots[slot];
    const id = s.next++;
    const text = `slot ${slot} round ${round}`;
    const token = `r${round}-s${slot}-${attempt}`;
    const params = tool === 'slow' ? { name: 'slow_count', arguments: { n: steps }, _meta: { progressToken: token } } : { name: 'echo', arguments: { text } };
    const want = tool === 'slow' ? `counted to ${steps}` : text;
    let reported = false;
    s.progress.set(token, () => {
      if (!reported) process.stdout.write(`progress ${round} ${slot}\n`);
      reported = true;
    });
    const started = now();
    const r = s.request(id, 'tools/call', params);
    await r.sent.catch(() => {});
    const reply = await r.reply;
    s.progress.delete(token);
    const got = reply?.result?.content?.[0]?.text;
    if (got === want) {
      process.stdout.write(`answered ${round} ${slot}\n`);
      return;
    }
    const ex = s.stats.exchanges.find((e) => e.requestIds?.includes(id));
    const reason = reply ? `answered ${JSON.stringify(reply).slice(0, 200)}` : describeExchange(s.stats, id);
    run.failures.push({ round, slot, sessionId: s.sessionId, status: ex?.status ?? 'none', body: ex?.body ?? '', reason, startedAt: started, at: now() });
    process.stdout.write(`failed ${round} ${slot} ${reason.replace(/\s+/g, ' ')}\n`);
    if (ex?.status !== 404 || attempt > 0) return;
    try {
      slots[slot] = await holdOpen(opts, run, slot);
      run.renewed += 1;
    } catch (err) {
      run.failedOpens += 1;
      process.stdout.write(`failed ${round} ${slot} new session: ${String(err?.message ?? err).replace(/\s+/g, ' ')}\n`);
      return;
    }
  }
}

async function hold(opts) {
  const n = opts.n ?? 30;
  const run = { mode: 'hold', n, rounds: 0, renewed: 0, failedOpens: 0, failures: [], unexpectedReplies: 0, timeouts: 0, holds: [] };
  const started = performance.now();
  const slots = await Promise.all(Array.from({ length: n }, (_, slot) => holdOpen(opts, run, slot).catch((err) => {
    run.failedOpens += 1;
    process.stdout.write(`failed 0 ${slot} open: ${String(err?.message ?? err).replace(/\s+/g, ' ')}\n`);
    return undefined;
  })));
  process.stdout.write(`ready ${n}\n`);
  log(`${n - run.failedOpens} of ${n} sessions open`);
  const lines = readline.createInterface({ input: process.stdin });
  for await (const line of lines) {
    const [word, tool = 'echo', arg] = line.trim().split(/\s+/);
    if (word === 'stop') break;
    if (word !== 'round') continue;
    const round = ++run.rounds;
    const steps = Number.parseInt(arg ?? '5', 10);
    await Promise.all(slots.map((s, slot) => (s ? holdCall(opts, run, slots, slot, round, tool, steps) : undefined)));
    log(`round ${round} (${tool}): ${run.failures.filter((f) => f.round === round).length} calls failed`);
    process.stdout.write(`done ${round}\n`);
  }
  lines.close();
  process.stdin.destroy();
  run.failedDeletes = 0;
  await Promise.all(slots.map(async (s) => {
    if (!s) return;
    try {
      await s.transport.terminateSession();
    } catch (err) {
      run.failedDeletes += 1;
      run.failures.push({ round: 'delete', slot: s.slot, sessionId: s.sessionId, reason: String(err?.message ?? err).slice(0, 300) });
    }
  }));
  await Promise.all(run.holds.map((s) => s.transport.close().catch(() => {})));
  // Every session ever opened, with the requests that carried its id.
  run.sessions = run.holds.filter((s) => s.sessionId).map((s) => {
    const statuses = {};
    let requests = 0;
    let answered = 0;
    for (const e of s.stats.exchanges) {
      if (e.session !== s.sessionId || e.method === 'GET') continue;
      requests += 1;
      if (typeof e.status === 'number' && e.status >= 200 && e.status < 300) answered += 1;
      statuses[`${e.method} ${e.status}`] = (statuses[`${e.method} ${e.status}`] ?? 0) + 1;
    }
    const gets = s.stats.exchanges.filter((e) => e.method === 'GET').map((e) => String(e.status));
    return { slot: s.slot, sessionId: s.sessionId, opened: s.opened, requests, answered, statuses, gets };
  });
  delete run.holds;
  run.elapsedMs = Math.round(performance.now() - started);
  run.ok = run.failures.length === 0 && run.failedOpens === 0 && run.timeouts === 0 && run.unexpectedReplies === 0;
  return run;
}

const modes = { flow, pipeline, sessions, calls, users, inflight, hold };

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
