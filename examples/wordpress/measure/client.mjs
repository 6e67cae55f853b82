// MCP Streamable HTTP workload against the WordPress MCP Adapter: K clients
// of ONE WordPress user connect at once, N rounds. They share one
// Application Password, or, when MCP_AUTH holds several, client c of every
// round uses the c-th.
//
// Each client: initialize (await; take Mcp-Session-Id) -> notifications/
// initialized + tools/list + prompts/list + resources/list sent together
// without waiting -> after those answer, tools/list again -> DELETE.
// A session is LOST when any follow-up is answered 404 or with JSON-RPC error
// -32005 / "Session not found".
//
// Environment: MCP_URL, MCP_AUTH ("user:application password", or several
// such lines, one per client), ROUNDS (50),
// CLIENTS (4), TIMEOUT_MS (30000), LABEL, DUMP (print the first session's
// answers). Prints a summary and, last, one
// line "RESULT <json>".
//
// Plain fetch() (Node 20+); no dependencies.

const url = process.env.MCP_URL;
const auth = process.env.MCP_AUTH;
if (!url || !auth) {
  console.error('MCP_URL and MCP_AUTH are required');
  process.exit(2);
}
const ROUNDS = Number(process.env.ROUNDS || 50);
const K = Number(process.env.CLIENTS || 4);
const TIMEOUT_MS = Number(process.env.TIMEOUT_MS || 30000);
const LABEL = process.env.LABEL || '';
// One credential per line: client c (1-based) uses line ((c - 1) mod count).
const authorizations = auth
  .split('\n')
  .filter((l) => l !== '')
  .map((l) => 'Basic ' + Buffer.from(l).toString('base64'));
const PROTOCOL = '2025-06-18';

const totals = {
  label: LABEL,
  sessions: 0, // initialize attempts
  initialized: 0, // got a session id
  lost: 0, // sessions with a 404 / -32005 follow-up
  lostAtFirstBatch: 0, // first seen on the pipelined notification/lists
  lostAtSecondList: 0, // first seen only on the second tools/list
  initFailed: 0,
  http5xx: 0,
  http4xxOther: 0, // 4xx other than the 404 of a lost session
  timeouts: 0,
  networkErrors: 0,
  rpcErrorsOther: 0, // JSON-RPC errors other than session-not-found
  wrongId: 0,
  deleteNon2xx: 0,
  requests: 0,
  statuses: {},
  samples: [], // a few bodies of failures, for the log
  lostSample: '',
  elapsedMs: 0,
};

function sample(what) {
  if (totals.samples.length < 8) totals.samples.push(what);
}

// One HTTP exchange. Returns {status, headers, msgs: [jsonrpc...], error}.
async function sendAs(authorization, method, body, sessionId, protocolVersion) {
  const headers = {
    Authorization: authorization,
    Accept: 'application/json, text/event-stream',
  };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  if (sessionId) headers['Mcp-Session-Id'] = sessionId;
  if (protocolVersion) headers['MCP-Protocol-Version'] = protocolVersion;
  totals.requests++;
  let res;
  try {
    res = await fetch(url, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: AbortSignal.timeout(TIMEOUT_MS),
    });
  } catch (e) {
    if (e && (e.name === 'TimeoutError' || e.name === 'AbortError')) {
      totals.timeouts++;
      return { status: 0, error: 'timeout' };
    }
    totals.networkErrors++;
    sample(`${method} ${body?.method ?? ''}: ${e}`);
    return { status: 0, error: String(e) };
  }
  let text;
  try {
    text = await res.text();
  } catch (e) {
    totals.timeouts++;
    return { status: res.status, error: 'body timeout' };
  }
  totals.statuses[res.status] = (totals.statuses[res.status] || 0) + 1;
  const ctype = res.headers.get('content-type') || '';
  const msgs = [];
  if (ctype.includes('text/event-stream')) {
    for (const block of text.split(/\r?\n\r?\n/)) {
      const data = block
        .split(/\r?\n/)
        .filter((l) => l.startsWith('data:'))
        .map((l) => l.slice(5).trimStart())
        .join('\n');
      if (data) {
        try {
          msgs.push(JSON.parse(data));
        } catch {}
      }
    }
  } else if (text.trim() !== '') {
    try {
      const v = JSON.parse(text);
      if (Array.isArray(v)) msgs.push(...v);
      else if (v !== null) msgs.push(v);
    } catch {
      if (res.status >= 200 && res.status < 300 && res.status !== 202) sample(`${body?.method}: non-JSON ${res.status}: ${text.slice(0, 200)}`);
    }
  }
  return { status: res.status, headers: res.headers, msgs, text };
}

function isSessionLost(r) {
  if (r.status === 404) return true;
  return r.msgs?.some(
    (m) => m?.error && (m.error.code === -32005 || /session not found/i.test(String(m.error.message))),
  );
}

// Tally what an answer says apart from "session lost". Returns true if fine.
function tally(r, id, what) {
  if (r.status === 0) return false; // counted in sendAs()
  if (isSessionLost(r)) return false; // counted per session by the caller
  let ok = true;
  if (r.status >= 500) {
    totals.http5xx++;
    sample(`${what}: HTTP ${r.status} ${String(r.text).slice(0, 200)}`);
    ok = false;
  } else if (r.status >= 400) {
    totals.http4xxOther++;
    sample(`${what}: HTTP ${r.status} ${String(r.text).slice(0, 200)}`);
    ok = false;
  }
  if (id !== undefined && r.status < 400) {
    const m = r.msgs[0];
    if (!m) {
      totals.rpcErrorsOther++;
      sample(`${what}: no JSON-RPC answer, HTTP ${r.status} ${String(r.text).slice(0, 200)}`);
      return false;
    }
    if (m.id !== id) {
      totals.wrongId++;
      ok = false;
    }
    if (m.error) {
      totals.rpcErrorsOther++;
      sample(`${what}: ${JSON.stringify(m.error).slice(0, 200)}`);
      ok = false;
    }
  }
  return ok;
}

async function client(round, n) {
  totals.sessions++;
  const send = sendAs.bind(null, authorizations[(n - 1) % authorizations.length]);
  const init = await send('POST', {
    jsonrpc: '2.0',
    id: 1,
    method: 'initialize',
    params: {
      protocolVersion: PROTOCOL,
      capabilities: {},
      clientInfo: { name: `measure-r${round}-c${n}`, version: '1.0.0' },
    },
  });
  const sid = init.headers?.get('mcp-session-id');
  const initMsg = init.msgs?.[0];
  if (init.status !== 200 || !sid || !initMsg?.result) {
    totals.initFailed++;
    if (init.status >= 500) totals.http5xx++;
    sample(`initialize: HTTP ${init.status} sid=${sid} ${String(init.text).slice(0, 200)}`);
    return;
  }
  totals.initialized++;
  const pv = initMsg.result.protocolVersion || PROTOCOL;

  // Pipelined: the notification and three lists at once.
  const first = await Promise.all([
    send('POST', { jsonrpc: '2.0', method: 'notifications/initialized' }, sid, pv),
    send('POST', { jsonrpc: '2.0', id: 2, method: 'tools/list', params: {} }, sid, pv),
    send('POST', { jsonrpc: '2.0', id: 3, method: 'prompts/list', params: {} }, sid, pv),
    send('POST', { jsonrpc: '2.0', id: 4, method: 'resources/list', params: {} }, sid, pv),
  ]);
  if (process.env.DUMP && round === 1 && n === 1) {
    console.log(`initialize: ${init.status} ${init.text}`);
    for (const r of first) console.log(`pipelined: ${r.status} ${String(r.text).slice(0, 600)}`);
  }
  tally(first[0], undefined, 'notifications/initialized');
  tally(first[1], 2, 'tools/list');
  tally(first[2], 3, 'prompts/list');
  tally(first[3], 4, 'resources/list');
  const lostFirst = first.some(isSessionLost);

  const second = await send('POST', { jsonrpc: '2.0', id: 5, method: 'tools/list', params: {} }, sid, pv);
  tally(second, 5, 'tools/list (2nd)');
  const lostSecond = isSessionLost(second);

  if (lostFirst || lostSecond) {
    totals.lost++;
    if (!totals.lostSample) {
      const r = [...first, second].find(isSessionLost);
      totals.lostSample = `HTTP ${r.status} ${String(r.text).slice(0, 200)}`;
    }
    if (lostFirst) totals.lostAtFirstBatch++;
    else totals.lostAtSecondList++;
  }

  const del = await send('DELETE', undefined, sid, pv);
  if (del.status === 0) return;
  if (del.status < 200 || del.status >= 300) {
    totals.deleteNon2xx++;
    if (del.status >= 500) totals.http5xx++;
    sample(`DELETE: HTTP ${del.status} ${String(del.text).slice(0, 200)}`);
  }
}

const t0 = Date.now();
for (let r = 1; r <= ROUNDS; r++) {
  await Promise.all(Array.from({ length: K }, (_, i) => client(r, i + 1)));
}
totals.elapsedMs = Date.now() - t0;

const pct = (a, b) => (b ? ((100 * a) / b).toFixed(1) : '0.0');
console.log(
  `${LABEL}: lost ${totals.lost} of ${totals.sessions} sessions (${pct(totals.lost, totals.sessions)}%); ` +
    `first seen on the pipelined batch ${totals.lostAtFirstBatch}, on the 2nd tools/list ${totals.lostAtSecondList}; ` +
    `initialize failed ${totals.initFailed}; 5xx ${totals.http5xx}; other 4xx ${totals.http4xxOther}; ` +
    `timeouts ${totals.timeouts}; network errors ${totals.networkErrors}; other JSON-RPC errors ${totals.rpcErrorsOther}; ` +
    `wrong ids ${totals.wrongId}; DELETE non-2xx ${totals.deleteNon2xx}; ` +
    `${totals.requests} requests in ${(totals.elapsedMs / 1000).toFixed(1)}s; statuses ${JSON.stringify(totals.statuses)}`,
);
if (totals.lostSample) console.log(`  a lost session's answer: ${totals.lostSample}`);
for (const s of totals.samples) console.log(`  sample: ${s}`);
console.log('RESULT ' + JSON.stringify(totals));
