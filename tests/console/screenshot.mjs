// Makes docs/console.md's picture of the console (docs/console.png): a real server on a temp data
// dir, a session with a thinking step, a tool call and a reply, shown in Chromium.
//   cargo build && node tests/console/screenshot.mjs
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { chromium } from 'playwright-core';
import { BIN, REPO } from './helpers.mjs';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'turnlog-shot-'));
const server = spawn(BIN, ['serve', '--addr', '127.0.0.1:0', '--data-dir', path.join(dir, 'data')], { stdio: ['ignore', 'pipe', 'ignore'] });
const url = await new Promise((resolve, reject) => {
  readline.createInterface({ input: server.stdout }).on('line', (line) => {
    if (line.startsWith('listening on ')) resolve(line.slice('listening on '.length).trim());
  });
  server.on('exit', () => reject(new Error('turnlog exited')));
});

async function call(method, urlPath, body) {
  const response = await fetch(url + urlPath, { method, headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  if (!response.ok) throw new Error(`${method} ${urlPath}: ${response.status} ${await response.text()}`);
  return response.json();
}

async function turn(session, text) {
  await call('POST', `/sessions/${session}/events`, { events: [{ type: 'user.message', content: text }] });
  for (;;) {
    const page = await (await fetch(`${url}/sessions/${session}/events?limit=1000`)).json();
    const last = page.data.at(-1);
    if (last.type === 'session.status_idle') return;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

try {
  const { sessionId } = await call('POST', '/sessions', { agent: { name: 'default', tools: [{ name: 'calculator', trust: true }] } });
  await turn(sessionId, '/think The user wants the product; the calculator will do it.\n/tool calculator {"expression": "6*7"}');
  await turn(sessionId, 'Thanks, that is all I needed.');
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  const page = await browser.newPage({ viewport: { width: 1200, height: 1000 } });
  await page.goto(`${url}/console#/sessions/${sessionId}`);
  await page.waitForSelector('#conn[data-state=live]');
  await page.waitForSelector('.stop[data-stop=end_turn] >> nth=1');
  fs.mkdirSync(path.join(REPO, 'docs'), { recursive: true });
  await page.screenshot({ path: path.join(REPO, 'docs/console.png') });
  await browser.close();
  console.log('wrote docs/console.png');
} finally {
  server.kill('SIGTERM');
  fs.rmSync(dir, { recursive: true, force: true });
}
