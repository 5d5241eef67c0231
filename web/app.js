// tether's live dashboard: keeps a WebSocket to shard 0's /ws (web/API.md),
// holds the latest snapshot plus appended updates, and redraws at most once
// per animation frame. Every string from the server goes in via textContent.
'use strict';

const MAX_EVENTS = 200;
const MAX_POINTS = 4000;  // the server keeps 2,000; thin ours past twice that
const RETRY_MIN_MS = 1000;
const RETRY_MAX_MS = 10000;
const DASH = '–';

// ---- state -----------------------------------------------------------------

const state = {
  status: null, workers: [], shards: [], checkpoints: null, config: null,
  history: [], events: [],
  xAxis: 'clock',  // 'clock' or 't'
};

// What changed since the last frame; render() redraws only those parts.
const dirty = new Set();
let frameRequested = false;

function invalidate(...parts) {
  for (const p of parts) dirty.add(p);
  if (!frameRequested) {
    frameRequested = true;
    requestAnimationFrame(render);
  }
}

function applySnapshot(m) {
  state.status = m.status || null;
  state.workers = m.workers || [];
  state.shards = m.shards || [];
  state.checkpoints = m.checkpoints || null;
  state.config = m.config || null;
  state.history = (m.history || []).slice(-MAX_POINTS);
  state.events = (m.events || []).slice(-MAX_EVENTS);
  invalidate('status', 'workers', 'shards', 'checkpoints', 'config',
             'charts', 'events');
}

function applyUpdate(m) {
  if (m.status) state.status = m.status;
  if (m.workers) state.workers = m.workers;
  if (m.shards) state.shards = m.shards;
  if (m.checkpoints) state.checkpoints = m.checkpoints;
  invalidate('status', 'workers', 'shards', 'checkpoints');
  // Sent when it changed: a process said how it was started.
  if (m.config) { state.config = m.config; invalidate('config'); }
  if (m.history && m.history.length) {
    state.history.push(...m.history);
    // Like the server: when full, keep every other point.
    if (state.history.length > MAX_POINTS) {
      state.history = state.history.filter((_, i) => i % 2 === 1);
    }
    invalidate('charts');
  }
  if (m.events && m.events.length) {
    state.events.push(...m.events);
    state.events.splice(0, state.events.length - MAX_EVENTS);
    invalidate('events');
  }
}

// ---- connection ------------------------------------------------------------

const conn = { ws: null, gotSnapshot: false, retryMs: RETRY_MIN_MS,
               retryAt: 0, timer: null };

function connect() {
  clearInterval(conn.timer);
  conn.timer = null;
  conn.gotSnapshot = false;
  showConn(false, 'disconnected — connecting…');
  const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
  let ws;
  try {
    ws = new WebSocket(`${scheme}//${location.host}/ws`);
  } catch (e) {
    scheduleReconnect();
    return;
  }
  conn.ws = ws;
  ws.onopen = () => { if (conn.ws === ws) showConn(true, 'live'); };
  ws.onmessage = (e) => { if (conn.ws === ws) onMessage(e.data); };
  // 'error' is always followed by 'close'; one handler is enough.
  ws.onclose = () => {
    if (conn.ws !== ws) return;
    conn.ws = null;
    scheduleReconnect();
  };
}

function onMessage(data) {
  let m;
  try {
    m = JSON.parse(data);
  } catch (e) {
    console.warn('tether: ignoring a message that is not JSON');
    return;
  }
  if (m.type === 'snapshot') {
    conn.gotSnapshot = true;
    conn.retryMs = RETRY_MIN_MS;  // a healthy session resets the backoff
    applySnapshot(m);
  } else if (m.type === 'update' && conn.gotSnapshot) {
    applyUpdate(m);
  }
}

// Waits retryMs (1 s doubling to 10 s), counting down in #conn.
function scheduleReconnect() {
  const wait = conn.retryMs;
  conn.retryMs = Math.min(conn.retryMs * 2, RETRY_MAX_MS);
  conn.retryAt = Date.now() + wait;
  const tick = () => {
    const left = conn.retryAt - Date.now();
    if (left <= 0) {
      connect();
    } else {
      showConn(false, `disconnected — reconnecting in ${Math.ceil(left / 1000)} s`);
    }
  };
  tick();
  conn.timer = setInterval(tick, 250);
}

function showConn(live, text) {
  const el = $('conn');
  if (el.textContent !== text) el.textContent = text;
  el.classList.toggle('ok', live);
  el.classList.toggle('down', !live);
  document.body.classList.toggle('stale', !live);
}

// ---- formatting (every helper turns null/undefined/NaN into a dash) ------

const known = (x) => x !== null && x !== undefined && !Number.isNaN(x);
const intFormat = new Intl.NumberFormat(undefined, { maximumFractionDigits: 0 });

function fmtInt(x) { return known(x) ? intFormat.format(x) : DASH; }
function fmtFixed(x, digits) { return known(x) ? Number(x).toFixed(digits) : DASH; }
function fmtPercent(x) { return known(x) ? `${(x * 100).toFixed(1)} %` : DASH; }

function fmtBytes(x) {
  if (!known(x)) return DASH;
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (Math.abs(x) >= 1024 && i < units.length - 1) { x /= 1024; i++; }
  return i === 0 ? `${Math.round(x)} B` : `${x.toFixed(x < 10 ? 2 : 1)} ${units[i]}`;
}

function fmtRate(x) { return known(x) ? `${fmtBytes(x)}/s` : DASH; }

function fmtDuration(s) {
  if (!known(s)) return DASH;
  s = Math.max(0, Math.floor(s));
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
  if (h > 0) return `${h} h ${String(m).padStart(2, '0')} m`;
  if (m > 0) return `${m} m ${String(sec).padStart(2, '0')} s`;
  return `${sec} s`;
}

// Seconds as m:ss or h:mm:ss, for event times.
function fmtClockTime(s) {
  if (!known(s)) return DASH;
  s = Math.max(0, Math.floor(s));
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
  const ss = String(s % 60).padStart(2, '0');
  return h > 0 ? `${h}:${String(m).padStart(2, '0')}:${ss}` : `${m}:${ss}`;
}

// A tick label with as many decimals as the tick step needs.
function fmtTick(v, step) {
  return v.toFixed(Math.max(0, Math.min(6, -Math.floor(Math.log10(step) + 1e-9))));
}

// Local time; with the date too unless it is today.
function fmtTime(unixMs) {
  if (!known(unixMs) || unixMs <= 0) return DASH;
  const d = new Date(unixMs);
  return d.toDateString() === new Date().toDateString()
    ? d.toLocaleTimeString() : d.toLocaleString();
}

// ---- DOM helpers -----------------------------------------------------------

function $(id) { return document.getElementById(id); }

function setText(id, text) {
  const el = $(id);
  if (el.textContent !== text) el.textContent = text;
}

// A <td> holding `content` (a string or a Node); "num" right-aligns it.
function td(content, cls) {
  const el = document.createElement('td');
  if (content instanceof Node) el.append(content); else el.textContent = content;
  if (cls) el.className = cls;
  return el;
}

function tr(cells, attrs = {}) {
  const el = document.createElement('tr');
  el.append(...cells);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') el.className = v; else el.setAttribute(k, v);
  }
  return el;
}

function badge(text, cls, title) {
  const el = document.createElement('span');
  el.className = `badge ${cls}`;
  el.textContent = text;
  if (title) el.title = title;
  return el;
}

// Replaces a table's body; `empty` is shown when there are no rows.
function fillTable(id, rows, empty) {
  const table = $(id);
  if (rows.length === 0) {
    const cols = table.tHead.rows[0].cells.length;
    const cell = td(empty, 'empty');
    cell.colSpan = cols;
    rows = [tr([cell])];
  }
  table.tBodies[0].replaceChildren(...rows);
}

// ---- rendering -------------------------------------------------------------

function render() {
  frameRequested = false;
  const parts = new Set(dirty);
  dirty.clear();
  if (parts.has('status')) { renderStatus(); renderStaleness(); }
  if (parts.has('workers')) renderWorkers();
  if (parts.has('shards')) renderShards();
  if (parts.has('checkpoints')) renderCheckpoints();
  if (parts.has('config')) renderConfig();
  if (parts.has('events')) renderEvents();
  if (parts.has('charts')) renderCharts();
}

function renderStatus() {
  const s = state.status || {};
  const run = $('run-state');
  run.textContent = s.state || DASH;
  run.className = `run-state ${s.state || ''}`;
  setText('uptime', fmtDuration(s.uptime_s));
  setText('clock', known(s.min_clock) || known(s.max_clock)
    ? `${fmtInt(s.min_clock)} / ${fmtInt(s.max_clock)}` : DASH);
  setText('samples-per-s', fmtInt(s.samples_per_s));
  setText('loss', fmtFixed(s.loss, 4));
  setText('accuracy', fmtPercent(s.test_accuracy));
  renderWorkerCount(s);
  setText('shards-reporting', known(s.shards) ? `${fmtInt(s.shards_reporting)} of ${fmtInt(s.shards)}` : DASH);
  setText('push-counts', `pushes ${fmtInt(s.pushes)} · pulls ${fmtInt(s.pulls)} · ` +
                         `rejected ${fmtInt(s.rejected_pushes)}`);
}

// Live of joined now; workers may join beyond --workers (s.workers, the
// quorum the run starts with), up to s.workers_max (0: no limit).
function renderWorkerCount(s) {
  const joined = known(s.workers_joined) ? s.workers_joined : s.workers;
  setText('workers-live', known(s.workers) ? `${fmtInt(s.workers_live)} / ${fmtInt(joined)}` : DASH);
  const max = s.workers_max > 0 ? `at most ${fmtInt(s.workers_max)} at once` : 'no limit on more';
  const title = known(s.workers)
    ? `Live workers / workers joined now. The run starts once ${fmtInt(s.workers)} have joined; ` +
      `more may join later (${max}).` : '';
  const el = $('workers-live');
  if (el.title !== title) el.title = title;
}

function renderWorkers() {
  const workers = [...state.workers].sort((a, b) => a.rank - b.rank);
  const rows = workers.map((w) => {
    const device = String(w.device || '');
    const gpu = device.startsWith('cuda');
    const bound = w.staleness_bound === -1 ? 'async' : fmtInt(w.staleness_bound);
    const rowClass = ['straggling', 'dead', 'joining', 'finished', 'left'].includes(w.state) ? w.state : '';
    return tr([
      td(fmtInt(w.rank), 'num'),
      td(w.host || DASH),
      td(badge(gpu ? 'GPU' : 'CPU', gpu ? 'gpu' : 'cpu', device)),
      td(fmtInt(w.clock), 'num'),
      td(fmtInt(w.lag), 'num'),
      td(bound, 'num'),
      td(fmtInt(w.samples_per_s), 'num'),
      td(fmtFixed(w.loss, 4), 'num'),
      // Reports count epochs from 0; shown from 1, as tether-worker prints
      // "epoch 6/6" after its sixth. Nothing before the first report.
      td(w.samples > 0 ? fmtInt(w.epoch + 1) : DASH, 'num'),
      td(String(w.state || ''), 'state'),
    ], { 'data-rank': String(w.rank), class: rowClass });
  });
  fillTable('workers', rows, 'no workers yet');
}

function renderShards() {
  const shards = [...state.shards].sort((a, b) => a.shard_id - b.shard_id);
  const rows = shards.map((s) => tr([
    td(fmtInt(s.shard_id), 'num'),
    td(s.reporting ? badge('yes', 'good') : badge('no', 'bad',
       known(s.age_s) ? `last report ${s.age_s.toFixed(1)} s ago` : '')),
    td(fmtInt(s.tensors), 'num'),
    td(fmtBytes(s.bytes), 'num'),
    td(fmtFixed(s.pushes_per_s, 1), 'num'),
    td(fmtRate(s.bytes_in_per_s), 'num'),
    td(fmtRate(s.bytes_out_per_s), 'num'),
    td(fmtInt(s.min_clock), 'num'),
    td(fmtInt(s.waiting_pulls), 'num'),
  ], { 'data-shard': String(s.shard_id), class: s.reporting ? '' : 'silent' }));
  fillTable('shards', rows, 'no shards yet');
}

const CHECKPOINTS_OFF = 'Checkpoints are off: shard 0 was started without --data-dir, ' +
  'so there is nowhere to write a round.';

function renderCheckpoints() {
  const c = state.checkpoints || {};
  setText('checkpoint-policy', !c.enabled ? CHECKPOINTS_OFF
    : c.every > 0 ? `A round every ${fmtInt(c.every)} clocks.` : 'Rounds on demand.');
  // Off: a round cannot be taken, so the button cannot be pressed.
  const button = $('checkpoint-now');
  button.disabled = !c.enabled;
  button.title = c.enabled ? 'Write a checkpoint round now' : CHECKPOINTS_OFF;
  const pruned = `deleted: only the newest ${fmtInt(c.keep)} complete rounds are kept ` +
    '(--keep-checkpoints)';
  const rounds = [...(c.rounds || [])].sort((a, b) => b.round - a.round);
  const rows = rounds.map((r) => tr([
    td(fmtInt(r.round), 'num'),
    td(badge(r.status || DASH, r.status || '', r.status === 'pruned' ? pruned : '')),
    td(fmtTime(r.finished_unix_ms)),
    td(fmtBytes(r.bytes), 'num'),
    td(fmtFixed(r.seconds, 2), 'num'),
    td(r.error || '', 'error-text'),
  ], { 'data-round': String(r.round) }));
  fillTable('checkpoints', rows, 'no rounds yet');
}

function renderConfig() {
  const c = state.config;
  setText('config', c ? JSON.stringify(c, null, 2) : DASH);
  if (!c) { setText('command', DASH); return; }
  const seeds = c.seeds || {};
  const lines = [c.command || '(no command given)'];
  for (const [k, v] of Object.entries(seeds)) lines.push(`# seed ${k}: ${v}`);
  setText('command', lines.join('\n'));
}

function renderEvents() {
  const items = state.events.slice().reverse().map((e) => {
    const li = document.createElement('li');
    li.className = ['info', 'warning', 'error'].includes(e.level) ? e.level : 'info';
    const time = document.createElement('time');
    time.textContent = fmtClockTime(e.t);
    const text = document.createElement('span');
    text.textContent = e.text;
    li.append(time, text);
    return li;
  });
  $('events').replaceChildren(...items);
}

function renderCharts() {
  const byTime = state.xAxis === 't';
  const x = byTime ? (p) => p.t : (p) => p.clock;
  const series = (key) => state.history
    .filter((p) => known(p[key]) && known(x(p)))
    .map((p) => ({ x: x(p), y: p[key] }));
  const xFormat = byTime ? fmtDuration : fmtInt;
  drawLineChart($('loss-chart'), series('loss'), {
    color: '#2563eb', xFormat, yFormat: fmtTick,
    xLabel: byTime ? 'time' : 'clock',
  });
  drawLineChart($('accuracy-chart'), series('test_accuracy'), {
    color: '#16a34a', xFormat, yFormat: (v, step) => `${fmtTick(v * 100, step * 100)}%`,
    xLabel: byTime ? 'time' : 'clock',
  });
}

function renderStaleness() {
  const h = (state.status && state.status.staleness_histogram) || [];
  const n = h.length;
  const labels = h.map((_, i) => (i === n - 1 ? `${n - 1}+` : String(i)));
  const chart = $('staleness-chart');
  drawBarChart(chart, h, labels, { color: '#7c3aed' });
  // The definition (index.html), with what this run's bound allows.
  const bounds = new Set(state.workers.map((w) => w.staleness_bound));
  const [bound] = bounds;
  const allowed = bounds.size === 1 && bound >= 0
    ? ` This run's bound is ${bound}: at most ${bound + 1}.` : '';
  chart.dataset.definition ??= chart.title;
  chart.title = chart.dataset.definition + allowed;
}

// ---- charts ----------------------------------------------------------------

const CHART_FONT = '11px system-ui, -apple-system, "Segoe UI", Roboto, sans-serif';
const PAD = { left: 52, right: 14, top: 10, bottom: 34 };

// Sizes the canvas backing store to its CSS box times devicePixelRatio and
// returns a context that draws in CSS pixels.
function prepareCanvas(canvas) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
  }
  const ctx = canvas.getContext('2d');
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  ctx.font = CHART_FONT;
  return { ctx, w, h };
}

// About `count` round tick values (steps of 1, 2 or 5 times 10^k, at least
// minStep) in [lo, hi]: { step, values }.
function niceTicks(lo, hi, count, minStep = 0) {
  const raw = Math.max((hi - lo) / Math.max(1, count), minStep, 1e-12);
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((f) => f * mag).find((s) => s >= raw * (1 - 1e-9));
  const values = [];
  for (let i = Math.ceil(lo / step - 1e-9); i * step <= hi + step * 1e-9; i++) {
    values.push(i * step + 0);  // + 0: no "-0" labels
  }
  return { step, values };
}

function drawEmpty(ctx, w, h, text) {
  ctx.fillStyle = '#8a94a6';
  ctx.textAlign = 'center';
  ctx.textBaseline = 'middle';
  ctx.fillText(text, w / 2, h / 2);
}

// Frame, horizontal grid lines and y labels for a plot area; returns the
// function mapping a y value to a pixel row.
function drawYAxis(ctx, w, h, lo, hi, yFormat, minStep = 0) {
  const plotH = h - PAD.top - PAD.bottom;
  const yPx = (v) => PAD.top + plotH - ((v - lo) / (hi - lo)) * plotH;
  ctx.strokeStyle = '#e5e8ee';
  ctx.fillStyle = '#5b6478';
  ctx.lineWidth = 1;
  ctx.textAlign = 'right';
  ctx.textBaseline = 'middle';
  const ticks = niceTicks(lo, hi, Math.max(2, Math.floor(plotH / 40)), minStep);
  for (const v of ticks.values) {
    const y = Math.round(yPx(v)) + 0.5;
    ctx.beginPath();
    ctx.moveTo(PAD.left, y);
    ctx.lineTo(w - PAD.right, y);
    ctx.stroke();
    ctx.fillText(yFormat(v, ticks.step), PAD.left - 6, y);
  }
  return yPx;
}

// A line chart of points [{x, y}] (in x order). Sets canvas.dataset.points.
function drawLineChart(canvas, points, { color, xFormat, yFormat, xLabel }) {
  const { ctx, w, h } = prepareCanvas(canvas);
  canvas.dataset.points = String(points.length);
  if (points.length === 0) { drawEmpty(ctx, w, h, 'waiting for data'); return; }

  let [x0, x1] = [points[0].x, points[points.length - 1].x];
  let y0 = Math.min(...points.map((p) => p.y));
  let y1 = Math.max(...points.map((p) => p.y));
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  const ySpan = y1 - y0 || Math.abs(y1) || 1;
  y0 -= ySpan * 0.05;
  y1 += ySpan * 0.05;

  const plotW = w - PAD.left - PAD.right;
  const xPx = (v) => PAD.left + ((v - x0) / (x1 - x0)) * plotW;
  const yPx = drawYAxis(ctx, w, h, y0, y1, yFormat);

  ctx.fillStyle = '#5b6478';
  ctx.textAlign = 'center';
  ctx.textBaseline = 'top';
  // Clocks and seconds: whole steps only, so that labels never repeat.
  for (const v of niceTicks(x0, x1, Math.max(2, Math.floor(plotW / 90)), 1).values) {
    ctx.fillText(xFormat(v), xPx(v), h - PAD.bottom + 6);
  }
  ctx.fillText(xLabel, PAD.left + plotW / 2, h - 14);

  ctx.strokeStyle = color;
  ctx.lineWidth = 1.75;
  ctx.lineJoin = 'round';
  ctx.beginPath();
  points.forEach((p, i) => (i ? ctx.lineTo(xPx(p.x), yPx(p.y)) : ctx.moveTo(xPx(p.x), yPx(p.y))));
  ctx.stroke();

  const last = points[points.length - 1];
  ctx.fillStyle = color;
  ctx.beginPath();
  ctx.arc(xPx(last.x), yPx(last.y), 3, 0, 2 * Math.PI);
  ctx.fill();
}

// A bar chart of `values` with one label per bar. Sets canvas.dataset.points.
function drawBarChart(canvas, values, labels, { color }) {
  const { ctx, w, h } = prepareCanvas(canvas);
  canvas.dataset.points = String(values.length);
  if (values.length === 0 || values.every((v) => !v)) {
    drawEmpty(ctx, w, h, 'no pushes yet');
    return;
  }
  const top = Math.max(...values) * 1.08;
  const yPx = drawYAxis(ctx, w, h, 0, top, compact, 1);  // counts
  const plotW = w - PAD.left - PAD.right;
  const slot = plotW / values.length;
  const labelEvery = Math.ceil(28 / slot);  // keep labels from overlapping
  ctx.textAlign = 'center';
  ctx.textBaseline = 'top';
  values.forEach((v, i) => {
    const x = PAD.left + i * slot;
    ctx.fillStyle = color;
    const y = yPx(v || 0);
    ctx.fillRect(x + slot * 0.15, y, slot * 0.7, PAD.top + (h - PAD.top - PAD.bottom) - y);
    if (i % labelEvery === 0 || i === values.length - 1) {
      ctx.fillStyle = '#5b6478';
      ctx.fillText(labels[i], x + slot / 2, h - PAD.bottom + 6);
    }
  });
  ctx.fillText('staleness (clocks)', PAD.left + plotW / 2, h - 14);
}

// 1234567 -> "1.2M": short axis labels.
function compact(v) {
  if (v >= 1e6) return `${+(v / 1e6).toFixed(1)}M`;
  if (v >= 1e3) return `${+(v / 1e3).toFixed(1)}k`;
  return String(+v.toFixed(1));
}

// ---- controls --------------------------------------------------------------

// The dashboard token that POST endpoints need: asked for when the server
// answers 401, kept for this tab only (sessionStorage), never shown.
const TOKEN_KEY = 'tether-dashboard-token';

function storedToken() {
  try { return sessionStorage.getItem(TOKEN_KEY) || ''; } catch (e) { return ''; }
}

function storeToken(token) {
  try {
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    else sessionStorage.removeItem(TOKEN_KEY);
  } catch (e) { /* storage off: the token lasts until the next 401 */ }
}

// The action the token form retries once a token is given.
let pendingAction = null;

// POSTs to `path` with the token; `success(body)` words a 2xx answer.
async function postAction(path, button, success) {
  const out = $('checkpoint-result');
  pendingAction = () => postAction(path, button, success);
  button.disabled = true;
  out.className = '';
  out.textContent = 'asking…';
  try {
    const headers = {};
    const token = storedToken();
    if (token) headers.Authorization = `Bearer ${token}`;
    const res = await fetch(path, { method: 'POST', headers });
    let body = null;
    try { body = await res.json(); } catch (e) { /* not JSON: use the status line */ }
    if (res.ok && body) {
      out.textContent = success(body);
      out.className = 'ok';
    } else {
      out.textContent = (body && body.error) || `HTTP ${res.status} ${res.statusText}`.trim();
      out.className = 'err';
    }
    if (res.status === 401) {
      storeToken('');
      $('token-form').hidden = false;
      $('token-input').focus();
    }
  } catch (e) {
    out.textContent = `request failed: ${e.message}`;
    out.className = 'err';
  } finally {
    button.disabled = false;
  }
}

async function copyConfig() {
  const out = $('copy-result');
  const text = $('command').textContent;
  try {
    if (!navigator.clipboard) throw new Error('no clipboard');
    await navigator.clipboard.writeText(text);
    out.textContent = '(copied)';
  } catch (e) {
    // Without clipboard access (plain http on another host), select the text
    // so that the user can copy it by hand.
    const range = document.createRange();
    range.selectNodeContents($('command'));
    const sel = window.getSelection();
    sel.removeAllRanges();
    sel.addRange(range);
    out.textContent = '(selected: press Ctrl+C)';
  }
}

function setXAxis(axis) {
  state.xAxis = axis;
  for (const b of document.querySelectorAll('#x-axis button')) {
    b.setAttribute('aria-pressed', String(b.dataset.x === axis));
  }
  invalidate('charts');
}

function checkpointNow() {
  return postAction('/api/checkpoint', $('checkpoint-now'),
                    (body) => `Round ${body.round} started.`);
}

function stopRun() {
  if (!window.confirm('Stop the run? Every worker stops after its current step; '
                      + 'a checkpoint round is written first when checkpoints are on.')) {
    return;
  }
  return postAction('/api/stop', $('stop-run'), (body) => {
    const round = known(body.round) ? ` Round ${body.round} started.` : '';
    return `Run stopped: ${body.workers} worker(s) told.${round}`;
  });
}

function useToken(event) {
  event.preventDefault();
  const input = $('token-input');
  storeToken(input.value.trim());
  input.value = '';
  $('token-form').hidden = true;
  if (pendingAction) pendingAction();
}

function start() {
  $('checkpoint-now').addEventListener('click', checkpointNow);
  $('stop-run').addEventListener('click', stopRun);
  $('token-form').addEventListener('submit', useToken);
  $('copy-config').addEventListener('click', copyConfig);
  for (const b of document.querySelectorAll('#x-axis button')) {
    b.addEventListener('click', () => setXAxis(b.dataset.x));
  }
  // Canvases follow their CSS size (window resize, layout, zoom/DPR change).
  const redraw = () => invalidate('charts', 'status');
  if (window.ResizeObserver) {
    const ro = new ResizeObserver(redraw);
    for (const id of ['loss-chart', 'accuracy-chart', 'staleness-chart']) ro.observe($(id));
  }
  window.addEventListener('resize', redraw);
  invalidate('status', 'workers', 'shards', 'checkpoints', 'charts');
  connect();
}

start();
