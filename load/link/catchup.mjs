#!/usr/bin/env node
// Catch-up as a client on a real link sees it: N readers each read one seeded log whole,
// by its GET pages or over SSE, asking for a compressed answer (Accept-Encoding) or not,
// against either server of the side-by-side bench (turnlog's native API, or the Durable
// Streams peer). It counts the bytes that crossed the wire and the bytes they decoded to,
// and checks every reader got every event once, in order. No dependencies (Node >= 20).
//
//   node catchup_seed.mjs turnlog PORT > tl.pages     (../shared/bench: seeds 2,000 events)
//   node load/link/catchup.mjs --protocol turnlog --port PORT --pages tl.pages \
//     --mode get|sse --encoding identity|gzip|br|zstd [--readers 100] [--events 2000]
//
// Prints one JSON line: wall, per-reader times, wire and decoded bytes per reader, the codings
// the server answered in (a small last page may come as it is), errors.
// zstd needs a Node whose zlib has it (22.15 and later).

import http from 'node:http';
import fs from 'node:fs';
import zlib from 'node:zlib';
import { performance } from 'node:perf_hooks';

const opt = { protocol: 'turnlog', host: '127.0.0.1', port: 0, pages: '', mode: 'get', encoding: 'identity', readers: 100, events: 2000, timeout: 300 };
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i += 2) {
  const key = argv[i].replace(/^--/, '');
  if (!(key in opt)) usage(`unknown option ${argv[i]}`);
  opt[key] = typeof opt[key] === 'number' ? Number(argv[i + 1]) : argv[i + 1];
}
if (!['turnlog', 'ds'].includes(opt.protocol) || !opt.port || !opt.pages) usage('--protocol, --port and --pages are needed');
if (!['get', 'sse'].includes(opt.mode)) usage('--mode is get or sse');
const DECODERS = { gzip: zlib.createGunzip, br: zlib.createBrotliDecompress, zstd: zlib.createZstdDecompress };
if (opt.encoding !== 'identity' && !DECODERS[opt.encoding]) usage(`this Node cannot decode ${opt.encoding}`);

function usage(why) {
  console.error(`${why}\nusage: catchup.mjs --protocol turnlog|ds --port PORT --pages FILE --mode get|sse --encoding identity|gzip|br|zstd [--readers N] [--events N]`);
  process.exit(2);
}

const pages = fs.readFileSync(opt.pages, 'utf8').split('\n').filter(Boolean);
// The SSE path from the first page: turnlog's session stream, or the peer's `live=sse` read.
const ssePath = opt.protocol === 'turnlog' ? pages[0].replace(/\/events\?.*$/, '/events/stream') : `${pages[0]}&live=sse`;

/**
 * One GET: resolves with the status, the headers, the bytes on the wire and the decoded
 * body; `onText` (if given) gets the decoded text as it comes, and may end the request by
 * returning true.
 */
function get(path, onText) {
  return new Promise((resolve, reject) => {
    const headers = opt.encoding === 'identity' ? {} : { 'accept-encoding': opt.encoding };
    const req = http.get({ host: opt.host, port: opt.port, path, headers, agent: false }, (res) => {
      let wire = 0;
      const parts = [];
      res.on('data', (chunk) => { wire += chunk.length; });
      const coding = res.headers['content-encoding'];
      if (coding && !DECODERS[coding]) {
        req.destroy();
        reject(new Error(`unexpected content-encoding ${coding}`));
        return;
      }
      const body = coding ? res.pipe(DECODERS[coding]()) : res;
      let done = false;
      const finish = () => { if (!done) { done = true; resolve({ status: res.statusCode, coding: coding ?? 'identity', wire, body: Buffer.concat(parts) }); } };
      body.on('data', (chunk) => {
        parts.push(chunk);
        if (onText && onText(chunk.toString('utf8'))) { finish(); req.destroy(); }
      });
      body.on('end', finish);
      body.on('error', (e) => { if (!done) reject(e); });
    });
    req.setTimeout(opt.timeout * 1000, () => req.destroy(new Error('timeout')));
    req.on('error', (e) => reject(e));
  });
}

/** The position each seeded event carries (catchup_seed.mjs: `{w, s, t, p}`), in order. */
function positions(events, into) {
  for (const e of events) into.push(e.s);
}

async function readByPages() {
  const seen = [];
  let wire = 0, decoded = 0;
  const codings = [];
  for (const path of pages) {
    const r = await get(path);
    if (r.status !== 200) throw new Error(`GET ${path}: ${r.status}`);
    wire += r.wire; decoded += r.body.length; codings.push(r.coding);
    const json = JSON.parse(r.body.toString('utf8'));
    if (opt.protocol === 'turnlog') positions(json.data.filter((e) => e.type === 'user.define_outcome').map((e) => e.outcome), seen);
    else positions(json, seen);
  }
  return { seen, wire, decoded, codings };
}

async function readBySse() {
  const seen = [];
  let buffer = '', type = '', data = '';
  const r = await get(ssePath, (text) => {
    buffer += text;
    let end;
    while ((end = buffer.indexOf('\n')) >= 0) {
      const line = buffer.slice(0, end).replace(/\r$/, '');
      buffer = buffer.slice(end + 1);
      if (line.startsWith('event:')) type = line.slice(6).trim();
      else if (line.startsWith('data:')) data += (data ? '\n' : '') + line.slice(5).replace(/^ /, '');
      else if (line === '') {
        if (opt.protocol === 'turnlog' && type === 'user.define_outcome') positions([JSON.parse(data).outcome], seen);
        else if (opt.protocol === 'ds' && type === 'data') positions(JSON.parse(data), seen);
        type = ''; data = '';
        if (seen.length >= opt.events) return true;
      }
    }
    return false;
  });
  if (r.status !== 200) throw new Error(`GET ${ssePath}: ${r.status}`);
  return { seen, wire: r.wire, decoded: r.body.length, codings: [r.coding] };
}

const times = [];
let wire = 0, decoded = 0, errors = 0, incomplete = 0, outOfOrder = 0;
const codings = new Set();
const samples = [];
const start = performance.now();
await Promise.all(Array.from({ length: opt.readers }, async () => {
  const from = performance.now();
  try {
    const r = opt.mode === 'get' ? await readByPages() : await readBySse();
    times.push(performance.now() - from);
    wire += r.wire; decoded += r.decoded; r.codings.forEach((c) => codings.add(c));
    if (r.seen.length !== opt.events) incomplete++;
    if (r.seen.some((s, i) => s !== i)) outOfOrder++;
  } catch (e) {
    errors++;
    if (samples.length < 3) samples.push(String(e));
  }
}));
const wall = performance.now() - start;
times.sort((a, b) => a - b);
const at = (q) => Math.round(times[Math.min(times.length - 1, Math.floor(q * times.length))] ?? 0);
console.log(JSON.stringify({
  protocol: opt.protocol, mode: opt.mode, asked: opt.encoding, got: [...codings].join(','), readers: opt.readers,
  wall_ms: Math.round(wall), reader_ms_p50: at(0.5), reader_ms_max: at(1),
  wire_kb_per_reader: Math.round(wire / opt.readers / 1000), decoded_kb_per_reader: Math.round(decoded / opt.readers / 1000),
  errors, incomplete, out_of_order: outOfOrder, error_samples: samples,
}));
process.exit(errors || incomplete || outOfOrder ? 1 : 0);
