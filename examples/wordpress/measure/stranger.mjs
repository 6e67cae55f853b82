// A stranger who knows only the measured user's login, run beside the
// user's MCP clients (run's STRANGER=1). Until SIGTERM it
//
//   - keeps SLOW POSTs to the MCP route open, each with a wrong password of
//     its own and Content-Length 2 MiB, its first 5 KiB sent at once and
//     then one byte a second; one that is answered or closed is replaced
//     by a new one with a new wrong password;
//   - floods initialize from FLOOD concurrent loops, each request with a
//     new wrong password, each loop sending its next request once the last
//     is answered.
//
// Once all SLOW bodies have their first 5 KiB written and READY_ANSWERS
// flood requests have been answered (any status), it writes "ready" to
// READY_FIFO, so that the clients start beside a flood that is on. On
// SIGTERM it stops, prints a summary and, last, one line "RESULT <json>".
//
// Environment: MCP_URL, STRANGER_USER (the login), SLOW (4), FLOOD (4),
// READY_ANSWERS (8), READY_FIFO (optional), TIMEOUT_MS (30000).
// Plain node:net and fetch() (Node 20+); no dependencies.

import net from 'node:net';
import fs from 'node:fs';
import { randomInt } from 'node:crypto';

const url = new URL(process.env.MCP_URL || '');
const user = process.env.STRANGER_USER;
if (!user) {
  console.error('MCP_URL and STRANGER_USER are required');
  process.exit(2);
}
const SLOW = Number(process.env.SLOW ?? 4);
const FLOOD = Number(process.env.FLOOD ?? 4);
const READY_ANSWERS = Number(process.env.READY_ANSWERS ?? 8);
const TIMEOUT_MS = Number(process.env.TIMEOUT_MS || 30000);
const SLOW_LENGTH = 2 << 20; // declared Content-Length
const SLOW_PREFIX = 5 << 10; // sent at once

const alnum = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789';
// A new wrong password, shaped like an Application Password (24 letters
// and digits).
function wrongPassword() {
  let s = '';
  for (let i = 0; i < 24; i++) s += alnum[randomInt(alnum.length)];
  return s;
}
const basic = (password) => 'Basic ' + Buffer.from(`${user}:${password}`).toString('base64');

const totals = {
  flood: { sent: 0, statuses: {}, errors: 0, timeouts: 0 },
  slow: { opened: 0, statuses: {}, closedUnanswered: 0, bytes: 0 },
  readyAfterMs: null,
  elapsedMs: 0,
};
const t0 = Date.now();
let stopping = false;
let ready = false;

function checkReady() {
  if (ready || stopping) return;
  const answered = Object.values(totals.flood.statuses).reduce((a, b) => a + b, 0);
  if (prefixedSlots.size < SLOW || answered < READY_ANSWERS) return;
  ready = true;
  totals.readyAfterMs = Date.now() - t0;
  if (process.env.READY_FIFO) fs.writeFileSync(process.env.READY_FIFO, 'ready\n');
}

// --- slow bodies ---------------------------------------------------------
const port = Number(url.port || 80);
const path = url.pathname + url.search;
const prefixedSlots = new Set(); // slots whose body had its first 5 KiB written
const sockets = new Set();

function openSlow(slot) {
  if (stopping) return;
  totals.slow.opened++;
  const sock = net.connect(port, url.hostname);
  sockets.add(sock);
  let answered = false;
  let head = '';
  let timer;
  sock.on('connect', () => {
    const prefix = '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"pad":"';
    const body = prefix + 'x'.repeat(SLOW_PREFIX - prefix.length);
    sock.write(
      `POST ${path} HTTP/1.1\r\nHost: ${url.host}\r\nAuthorization: ${basic(wrongPassword())}\r\n` +
        `Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n` +
        `Content-Length: ${SLOW_LENGTH}\r\n\r\n${body}`,
      () => {
        totals.slow.bytes += SLOW_PREFIX;
        prefixedSlots.add(slot);
        checkReady();
      },
    );
    let sent = SLOW_PREFIX;
    timer = setInterval(() => {
      if (sent < SLOW_LENGTH && sock.writable) {
        sock.write('x');
        sent++;
        totals.slow.bytes++;
      }
    }, 1000);
  });
  sock.on('data', (d) => {
    if (answered) return;
    head += d.toString('latin1');
    const m = /^HTTP\/1\.[01] (\d{3})/.exec(head);
    if (m) {
      answered = true;
      totals.slow.statuses[m[1]] = (totals.slow.statuses[m[1]] || 0) + 1;
      sock.destroy();
    }
  });
  sock.on('error', () => {});
  sock.on('close', () => {
    clearInterval(timer);
    sockets.delete(sock);
    if (stopping) return;
    if (!answered) totals.slow.closedUnanswered++;
    openSlow(slot);
  });
}

// --- flood -----------------------------------------------------------------
const stopper = new AbortController();
const initialize = JSON.stringify({
  jsonrpc: '2.0',
  id: 1,
  method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'stranger', version: '1' } },
});

async function floodLoop() {
  while (!stopping) {
    totals.flood.sent++;
    try {
      const res = await fetch(url, {
        method: 'POST',
        headers: {
          Authorization: basic(wrongPassword()),
          'Content-Type': 'application/json',
          Accept: 'application/json, text/event-stream',
        },
        body: initialize,
        signal: AbortSignal.any([stopper.signal, AbortSignal.timeout(TIMEOUT_MS)]),
      });
      await res.arrayBuffer();
      totals.flood.statuses[res.status] = (totals.flood.statuses[res.status] || 0) + 1;
      checkReady();
    } catch (e) {
      if (stopping) {
        totals.flood.sent--; // cut off by the stop, not answered
      } else if (e && e.name === 'TimeoutError') {
        totals.flood.timeouts++;
      } else {
        totals.flood.errors++;
      }
    }
  }
}

for (let i = 0; i < SLOW; i++) openSlow(i);
const loops = Array.from({ length: FLOOD }, floodLoop);

process.on('SIGTERM', async () => {
  if (stopping) return;
  stopping = true;
  totals.elapsedMs = Date.now() - t0;
  stopper.abort();
  for (const s of sockets) s.destroy();
  await Promise.allSettled(loops);
  const f = totals.flood;
  const s = totals.slow;
  const n401 = (f.statuses['401'] || 0) + (s.statuses['401'] || 0);
  const all = [f.statuses, s.statuses].flatMap((m) => Object.values(m)).reduce((a, b) => a + b, 0);
  totals.answered401 = n401;
  totals.answeredOther = all - n401;
  console.log(
    `stranger (${user}): flood ${f.sent} initialize sent, answered ${JSON.stringify(f.statuses)}, ` +
      `timeouts ${f.timeouts}, errors ${f.errors}; slow bodies ${s.opened} opened, answered ${JSON.stringify(s.statuses)}, ` +
      `closed unanswered ${s.closedUnanswered}, ${s.bytes} bytes sent; ready after ${totals.readyAfterMs} ms; ` +
      `${(totals.elapsedMs / 1000).toFixed(1)} s in all`,
  );
  console.log('RESULT ' + JSON.stringify(totals));
  process.exit(0);
});
