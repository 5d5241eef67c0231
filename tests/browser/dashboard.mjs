// The dashboard checks, run in headless Chromium against whatever cluster
// `startCluster` brings up (the real one in dashboard.test.mjs), plus the
// runner that owns the overall timeout, signals, cleanup and exit code.
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';
import { Processes } from './processes.mjs';

export const CHROMIUM = process.env.CHROMIUM_BIN || '/usr/bin/chromium';
// Without the background-networking flags Chromium stalls on a closed network.
export const CHROMIUM_ARGS = [
  '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
];

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const LIVE_STATES = ['running', 'straggling'];

// Runs `condition(arg)` in the page until it is truthy; on timeout throws
// `what`, followed by what the page shows now (`describe(arg)` in the page).
async function waitInPage(page, what, timeoutMs, condition, describe, arg) {
  try {
    await page.waitForFunction(condition, arg, { timeout: timeoutMs, polling: 100 });
  } catch (e) {
    let seen = '';
    try { seen = await page.evaluate(describe, arg); } catch { /* page gone */ }
    throw new Error(`${what} within ${timeoutMs / 1000} s; the page shows: ${seen}`);
  }
}

// In-page helpers (serialised into the page, so they must be self-contained).
const workerStates = () => [...document.querySelectorAll('#workers tbody tr[data-rank]')]
  .map((r) => `rank ${r.dataset.rank}: ${r.querySelector('td.state')?.textContent}`).join(', ') || 'no worker rows';
const connText = () => JSON.stringify(document.getElementById('conn').textContent);

// The checks of the brief, in order. `cluster` is { url, tls, killOneWorker(),
// killCoordinator() }; `note` logs one progress line.
export async function checkDashboard(page, cluster, artifactDir, note) {
  const sockets = [];
  page.on('websocket', (ws) => sockets.push(ws.url()));
  await page.goto(cluster.url, { waitUntil: 'load', timeout: 15000 });

  await waitInPage(page, '#conn did not say "live"', 10000,
    () => document.getElementById('conn').textContent === 'live', connText);
  note('connected: #conn says live');
  if (cluster.tls) await checkTls(page, cluster.url, sockets, note);

  await waitInPage(page, 'the workers table did not show 3 workers running or straggling', 30000,
    (states) => {
      const rows = [...document.querySelectorAll('#workers tbody tr[data-rank]')];
      return rows.length === 3 && rows.every((r) => states.includes(r.querySelector('td.state')?.textContent));
    }, workerStates, LIVE_STATES);
  note(`workers: ${await page.evaluate(workerStates)}`);

  const lossPoints = () => page.$eval('#loss-chart', (c) => Number(c.dataset.points || 0));
  const before = await lossPoints();
  await sleep(3000);
  await waitInPage(page, `#loss-chart data-points did not grow from ${before}`, 10000,
    (n) => Number(document.getElementById('loss-chart').dataset.points || 0) > n,
    () => `data-points=${document.getElementById('loss-chart').dataset.points}`, before);
  note(`loss chart: ${before} -> ${await lossPoints()} points`);

  await waitInPage(page, 'the shards table did not show 2 shards', 10000,
    () => document.querySelectorAll('#shards tbody tr[data-shard]').length === 2,
    () => `${document.querySelectorAll('#shards tbody tr[data-shard]').length} shard rows`);
  await checkSeed(page, cluster.url);
  await checkCommand(page, note);
  await checkManifest(page, note);

  await checkTooltips(page, note);
  await checkWorkerDeath(page, cluster, note);
  await checkCheckpointButton(page, cluster, note);
  await checkStopButton(page, cluster, note);

  const shot = path.join(artifactDir, 'dashboard.png');
  await page.screenshot({ path: shot, fullPage: true });
  note(`screenshot: ${shot}`);

  await cluster.killCoordinator();
  await waitInPage(page, '#conn did not start with "disconnected" after shard 0 was killed', 10000,
    () => {
      const c = document.getElementById('conn');
      return c.textContent.startsWith('disconnected') && c.classList.contains('down');
    }, connText);
  note(`shard 0 killed: #conn says ${await page.evaluate(connText)}`);
}

// With TLS the page came over HTTPS, its live data over WSS, and the same
// port does not speak plain HTTP: a plain GET gets no HTTP answer.
async function checkTls(page, url, sockets, note) {
  const protocol = await page.evaluate(() => location.protocol);
  if (protocol !== 'https:') throw new Error(`the page was loaded over ${protocol}, not https:`);
  if (!sockets.length || !sockets.every((s) => s.startsWith('wss://'))) {
    throw new Error(`the page's WebSockets were not all wss:// ones: ${JSON.stringify(sockets)}`);
  }
  const plain = new URL(url);
  plain.protocol = 'http:';
  const outcome = await new Promise((resolve) => {
    const req = http.get(plain, { timeout: 5000 }, (res) => {
      res.resume();
      resolve(`answered HTTP ${res.statusCode}`);
    });
    req.on('timeout', () => { req.destroy(); resolve('got no answer within 5 s'); });
    req.on('error', (e) => resolve(`failed (${e.code || e.message})`));
  });
  if (!outcome.startsWith('failed')) throw new Error(`a plain GET of ${plain.href} ${outcome}`);
  note(`over TLS: page ${protocol}, WebSocket ${sockets[0]}; plain GET of ${plain.href} ${outcome}`);
}

// "Stop run" asks for confirmation (accepted here) and needs the dashboard
// token: the page asks for it on the first 401, says so again for a wrong
// one, and goes through with the right one (read from the token file, as a
// user would). Then the run state turns "stopped" and the live workers
// finish.
async function checkStopButton(page, cluster, note) {
  let asked = '';
  page.once('dialog', (d) => { asked = d.message(); d.accept(); });
  let answer = await answerTo(page, () => page.click('#stop-run'));
  if (!/Stop the run\?/.test(asked)) throw new Error(`no confirmation asked (${JSON.stringify(asked)})`);
  if (!/token/.test(answer) || !(await page.isVisible('#token-form'))) {
    throw new Error(`without a token "stop run" answered ${JSON.stringify(answer)} and no token form`);
  }
  answer = await answerTo(page, () => submitToken(page, 'f'.repeat(64)));
  if (!/wrong dashboard token/.test(answer) || !(await page.isVisible('#token-form'))) {
    throw new Error(`a wrong token got ${JSON.stringify(answer)}`);
  }
  const token = fs.readFileSync(cluster.tokenFile, 'utf8').trim();
  answer = await answerTo(page, () => submitToken(page, token));
  if (!/^Run stopped: 2 worker\(s\) told/.test(answer) || await page.isVisible('#token-form')) {
    throw new Error(`"stop run" with the right token answered ${JSON.stringify(answer)}`);
  }
  const html = await page.content();
  if (html.includes(token)) throw new Error('the token shows in the page');
  await waitInPage(page, '#run-state did not turn "stopped"', 10000,
    () => document.getElementById('run-state').textContent === 'stopped',
    () => document.getElementById('run-state').textContent);
  // A stopped worker reports done and exits: finished, then left once shard
  // 0 frees its rank.
  await waitInPage(page, 'the stopped workers did not turn finished (or left)', 30000,
    () => [...document.querySelectorAll('#workers tbody tr[data-rank] td.state')]
      .filter((td) => ['finished', 'left'].includes(td.textContent)).length === 2,
    workerStates);
  note(`stop run: ${JSON.stringify(answer)}; ${await page.evaluate(workerStates)}`);
}

// The columns and the chart that show lag and staleness say what they mean
// (web/API.md), the bound + 1 included; this run's bound is 3.
async function checkTooltips(page, note) {
  const titles = await page.evaluate(() => ({
    lag: [...document.querySelectorAll('#workers th')].find((th) => th.textContent === 'lag')?.title || '',
    bound: [...document.querySelectorAll('#workers th')]
      .find((th) => th.textContent === 'staleness bound')?.title || '',
    chart: document.getElementById('staleness-chart').title,
  }));
  for (const [what, title] of Object.entries(titles)) {
    if (!title.includes('s + 1')) throw new Error(`the ${what} tooltip does not say "s + 1": ${JSON.stringify(title)}`);
  }
  if (!titles.chart.includes("This run's bound is 3: at most 4.")) {
    throw new Error(`the staleness chart's tooltip does not give this run's limit: ${JSON.stringify(titles.chart)}`);
  }
  note('tooltips define lag, the bound and staleness');
}

// #config holds the config as JSON; its seed must be /api/config's.
async function checkSeed(page, url) {
  const text = await page.textContent('#config');
  let shown;
  try { shown = JSON.parse(text); } catch {
    throw new Error(`#config is not the config as JSON: ${text.slice(0, 200)}`);
  }
  if (!Number.isInteger(shown.seed)) throw new Error(`#config shows no integer seed: ${text.slice(0, 200)}`);
  const res = await page.request.get(new URL('api/config', url).href);
  const api = await res.json();
  if (api.seed !== shown.seed) throw new Error(`#config shows seed ${shown.seed}, /api/config says ${api.seed}`);
}

// "Copy command + seeds" copies #command: every process of the run on a
// line of its own (2 shards, 3 workers, the slowed one with --slowdown 3),
// each started in the background, then `wait` and the seeds.
async function checkCommand(page, note) {
  const commandText = () => document.getElementById('command').textContent.slice(0, 3000);
  await waitInPage(page, '#command did not list 2 shards and 3 workers (one with --slowdown 3)', 15000,
    () => {
      const lines = document.getElementById('command').textContent.split('\n');
      const started = lines.filter((l) => l.endsWith(' &'));
      const shards = started.filter((l) => l.includes(' --shard-id '));
      const workers = started.filter((l) => !l.includes(' --shard-id ') && l.includes(' --coordinator '));
      return started.length === 5 && shards.length === 2 && workers.length === 3
        && workers.filter((l) => l.includes(' --slowdown 3')).length === 1
        && lines.includes('wait') && lines.some((l) => l.startsWith('# seed run: '));
    }, commandText);
  note('#command lists 2 shards and 3 workers, one with --slowdown 3');
}

// #config holds the run manifest too: every worker with its host, build and
// data files by SHA-256, as the workers told shard 0 when they joined.
async function checkManifest(page, note) {
  const configText = () => document.getElementById('config').textContent.slice(0, 3000);
  await waitInPage(page, '#config did not show a run manifest with 3 workers and their data files by SHA-256', 15000,
    () => {
      let m;
      try { m = JSON.parse(document.getElementById('config').textContent).manifest; } catch { return false; }
      const workers = (m && Array.isArray(m.workers)) ? m.workers.filter((w) => w && w.program === 'tether-worker') : [];
      return workers.length === 3 && typeof m.tether.commit === 'string'
        && workers.every((w) => w.host && Array.isArray(w.data_files)
          && w.data_files.length > 0 && w.data_files.every((f) => /^[0-9a-f]{64}$/.test(f.sha256 || '')));
    }, configText);
  note('#config shows the run manifest: 3 workers, their data files by SHA-256');
}

async function checkWorkerDeath(page, cluster, note) {
  await cluster.killOneWorker();
  await waitInPage(page, 'after SIGKILL of one worker, not exactly one row turned dead with the others running or straggling',
    15000, (states) => {
      const s = [...document.querySelectorAll('#workers tbody tr[data-rank]')]
        .map((r) => ({ state: r.querySelector('td.state')?.textContent, dead: r.classList.contains('dead') }));
      const dead = s.filter((x) => x.state === 'dead');
      return s.length === 3 && dead.length === 1 && dead[0].dead &&
             s.filter((x) => states.includes(x.state)).length === 2;
    }, workerStates, LIVE_STATES);
  note(`one worker killed: ${await page.evaluate(workerStates)}`);
}

// Clicks "checkpoint now" (or submits the token form) and returns the answer
// the page shows.
async function answerTo(page, act) {
  await page.evaluate(() => { document.getElementById('checkpoint-result').textContent = ''; });
  await act();
  await waitInPage(page, '#checkpoint-result showed no answer', 10000,
    () => {
      const t = document.getElementById('checkpoint-result').textContent.trim();
      return t !== '' && t !== 'asking…';
    }, () => JSON.stringify(document.getElementById('checkpoint-result').textContent));
  return page.textContent('#checkpoint-result');
}

async function submitToken(page, token) {
  await page.fill('#token-input', token);
  await page.click('#token-form button[type=submit]');
}

// This cluster has no --data-dir: checkpoints are off, as the config and
// checkpoints documents say, and "Checkpoint now" is disabled with the
// reason beside it and on it.
async function checkCheckpointButton(page, cluster, note) {
  const api = async (name) => (await page.request.get(new URL(`api/${name}`, cluster.url).href)).json();
  const [config, checkpoints] = [await api('config'), await api('checkpoints')];
  if (config.checkpoints_enabled !== false || checkpoints.enabled !== false) {
    throw new Error(`without --data-dir, /api/config says checkpoints_enabled ${config.checkpoints_enabled} ` +
                    `and /api/checkpoints enabled ${checkpoints.enabled}`);
  }
  const shown = await page.evaluate(() => {
    const b = document.getElementById('checkpoint-now');
    return { disabled: b.disabled, title: b.title,
             policy: document.getElementById('checkpoint-policy').textContent };
  });
  if (!shown.disabled || !/--data-dir/.test(shown.title) || !/off.*--data-dir/.test(shown.policy)) {
    throw new Error(`with checkpoints off, "checkpoint now" shows ${JSON.stringify(shown)}`);
  }
  note(`checkpoint now: disabled; ${JSON.stringify(shown.policy)}`);
}

// Runs the whole test and exits: 0 when every check passed, 1 otherwise.
// `startCluster(procs)` starts the processes and resolves with the cluster
// object for checkDashboard (plus `killed`, the Set of children it killed).
export async function runDashboardTest({ name, startCluster, timeoutMs = 150000 }) {
  const t0 = Date.now();
  const artifactDir = process.env.ARTIFACT_DIR
    ? path.resolve(process.env.ARTIFACT_DIR)
    : fs.mkdtempSync(path.join(os.tmpdir(), 'tether-dashboard-'));
  fs.mkdirSync(artifactDir, { recursive: true });
  const procs = new Processes(artifactDir);
  const note = (line) => console.log(`[${((Date.now() - t0) / 1000).toFixed(1)} s] ${line}`);
  let finished = false;
  const finish = (error) => {
    if (finished) return;
    finished = true;
    procs.killAll();
    const secs = ((Date.now() - t0) / 1000).toFixed(1);
    if (error) {
      console.error(`${name}: FAIL after ${secs} s: ${error.message}`);
      console.error(`  artifacts in ${artifactDir}`);
    } else {
      console.log(`${name}: PASS in ${secs} s (artifacts in ${artifactDir})`);
    }
    // Playwright kills the browser it launched on exit.
    process.exit(error ? 1 : 0);
  };
  process.on('exit', () => procs.killAll());
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
    process.on(sig, () => finish(new Error(`interrupted by ${sig}`)));
  }
  setTimeout(() => finish(new Error(`overall timeout of ${timeoutMs / 1000} s`)), timeoutMs).unref();

  const pageErrors = [];
  let cluster = null;
  let browser = null;
  try {
    cluster = await startCluster(procs, note);
    browser = await chromium.launch({
      executablePath: CHROMIUM, headless: true, args: CHROMIUM_ARGS,
      handleSIGINT: false, handleSIGTERM: false, handleSIGHUP: false,
    });
    // A TLS run's certificate is signed by the test's own CA, which
    // Chromium does not know.
    const page = await browser.newPage({
      viewport: { width: 1400, height: 1000 }, ignoreHTTPSErrors: Boolean(cluster.tls),
    });
    page.on('pageerror', (e) => { pageErrors.push(e.message); note(`page error: ${e.message}`); });
    // Console errors are reported, not failures: Chromium logs the refused
    // WebSocket and the checkpoint answer's HTTP error status there.
    page.on('console', (m) => { if (m.type() === 'error') note(`console error: ${m.text()}`); });
    await checkDashboard(page, cluster, artifactDir, note);
    if (pageErrors.length) throw new Error(`uncaught page errors: ${pageErrors.join(' | ')}`);
  } catch (e) {
    const exits = procs.unexpectedExits(cluster?.killed || new Set(), e.message);
    if (exits) e.message += `\nprocesses that ended on their own:\n${exits}`;
    if (pageErrors.length) e.message += `\nuncaught page errors: ${pageErrors.join(' | ')}`;
    await closeQuietly(browser);
    return finish(e);
  }
  await closeQuietly(browser);
  finish(null);
}

async function closeQuietly(browser) {
  if (!browser) return;
  await Promise.race([browser.close().catch(() => {}), sleep(5000)]);
}
