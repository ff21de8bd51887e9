/* app.js - the trainyard dashboard: sign-in with a team token, the jobs table,
 * a job's page (live loss/accuracy charts over server-sent events, the
 * model's layers as Keras' model.summary() shows them, timeline, log tail,
 * checkpoints, cancel, its web ports and notebook in a new tab), a shell in
 * a running task (an xterm.js terminal over the exec WebSocket), the submit
 * form, hyperparameter sweeps (every trial's validation curve on one chart,
 * the trials ranked by the sweep's metric), the queue, the cluster and the
 * usage of each team (device hours per day, totals).
 *
 * Every page is built with h() below, which puts data into text nodes and
 * attributes (never innerHTML), so nothing the server or a user sent is ever
 * parsed as markup. The token is kept in localStorage and sent as
 * "Authorization: Bearer"; server-sent events are read with fetch() streaming
 * so the token travels in that header too, never in a URL (docs/dashboard.md).
 *
 * Or a person signs in with single sign-on (/auth/login): the session is an
 * HttpOnly cookie the page never sees; GET /api/v1/me says who they are,
 * their teams (the chosen one goes into every request as Trainyard-Team,
 * remembered in localStorage) and the CSRF token every change sends as
 * X-CSRF-Token (docs/sso.md). The audit page lists who changed what. */
'use strict';

const TOKEN_KEY = 'trainyard.token';
const TEAM_KEY = 'trainyard.team';
let session = null;       /* GET /api/v1/me of a signed-in person (cookie), or null */
const FINISHED = new Set(['succeeded', 'failed', 'cancelled']);
const main = document.getElementById('main');
let pageTimers = [];      /* cleared when the page changes */
let pageAbort = null;     /* AbortController of the page's fetches and streams */

/* ------------------------------------------------------------ helpers */

/* h('td', {class: 'num'}, 'text', child...) - an element; strings become text nodes. */
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function token() { return localStorage.getItem(TOKEN_KEY) || ''; }
function chosenTeam() { return localStorage.getItem(TEAM_KEY) || ''; }

/* The credential's headers: the pasted token, or the session's team and
 * (for a change) its CSRF token; the cookie goes by itself. */
function authHeaders(method = 'GET') {
  if (token()) return {Authorization: 'Bearer ' + token()};
  const hd = {};
  if (session && chosenTeam()) hd['Trainyard-Team'] = chosenTeam();
  if (session && !['GET', 'HEAD'].includes(method)) hd['X-CSRF-Token'] = session.csrf || '';
  return hd;
}

class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || `HTTP ${status}`);
    this.status = status;
    this.code = e.code || '';
    this.field = e.field || null;
  }
}

/* One API call with the bearer token; resolves to the parsed JSON (or text). */
async function api(path, opts = {}) {
  const headers = Object.assign(authHeaders(opts.method || 'GET'), opts.headers || {});
  if (opts.body !== undefined) headers['Content-Type'] = 'application/json';
  const r = await fetch('/api/v1' + path, {method: opts.method || 'GET', headers, body: opts.body,
                                           signal: opts.signal || (pageAbort && pageAbort.signal)});
  const text = await r.text();
  let body = null;
  if ((r.headers.get('Content-Type') || '').startsWith('application/json') && text) body = JSON.parse(text);
  if (r.status === 401 && !opts.noSignout) {
    const expired = body && body.error && body.error.code === 'token_expired';
    if (session) { session = null; signOut('Your session ended; sign in again.'); throw new ApiError(401, body); }
    signOut(expired ? 'Your token expired (' + body.error.message.replace(/: ask.*$/, '') + '); sign in with a new one.'
                    : 'Your token was refused; sign in again.');
    throw new ApiError(401, body);
  }
  if (r.status === 503 && body && body.error && body.error.code === 'standby') showStandby(body.leader);
  if (!r.ok) throw new ApiError(r.status, body);
  return opts.raw ? {text, headers: r.headers} : body;
}

/* This server is a standby (several servers on one PostgreSQL, docs/ha.md):
 * it answers every call 503 naming the leader. Said at the top with a link
 * to the same page on the leader (another origin: sign in there again). */
function showStandby(leader) {
  const el = document.getElementById('standby');
  if (!el) return;
  el.textContent = '';
  el.append('This server is a standby: it keeps no jobs of its own. ');
  if (leader && /^https?:\/\//.test(leader)) {
    const a = document.createElement('a');
    a.href = leader.replace(/\/+$/, '') + '/' + location.hash;
    a.textContent = 'Go to the leader, ' + leader;
    el.append(a, '.');
  } else {
    el.append('No server leads right now; one takes over within seconds.');
  }
  el.hidden = false;
}

function fmtDuration(s) {
  if (s === null || s === undefined || !isFinite(s)) return '–';
  s = Math.max(0, Math.round(s));
  if (s < 60) return s + 's';
  if (s < 3600) return Math.floor(s / 60) + 'm ' + String(s % 60).padStart(2, '0') + 's';
  return Math.floor(s / 3600) + 'h ' + String(Math.floor(s % 3600 / 60)).padStart(2, '0') + 'm';
}
function fmtTime(iso) { return iso ? new Date(iso).toLocaleTimeString() : '–'; }
function fmtNum(v, digits = 4) { return typeof v === 'number' ? v.toFixed(digits) : '–'; }
// A running job's current speed; a finished one's mean over its run (its
// completed epochs' samples over their training time), or its last figure
// when no epoch ended.
function speedText(state, p) {
  if (!p) return '–';
  const n = v => Math.round(v).toLocaleString();
  if (FINISHED.has(state) && p.mean_samples_per_sec > 0)
    return `${n(p.mean_samples_per_sec)} (mean over ${p.train_seconds < 60 ? p.train_seconds.toFixed(1) + 's' : fmtDuration(p.train_seconds)} of training)`;
  if (p.samples_per_sec > 0) return FINISHED.has(state) ? `${n(p.samples_per_sec)} (the last reported)` : n(p.samples_per_sec);
  return '–';
}
function badge(state) { return h('span', {class: 'badge ' + state, 'data-state': state}, state); }
function elapsed(job) {
  if (!job.started_at) return null;
  const end = job.finished_at ? Date.parse(job.finished_at) : Date.now();
  return (end - Date.parse(job.started_at)) / 1000;
}
function devices(job) {
  const r = job.resources || {};
  /* an elastic job: its workers now and its range, "2 (1-4)" */
  const w = r.workers_min > 0 && r.workers_min < r.workers ? `${r.workers_now || '–'} (${r.workers_min}-${r.workers})` : r.workers;
  return `${w}×${r.devices_per_worker} ${r.device}` + (r.ps ? ` +${r.ps} ps` : '');
}
function progressCell(job) {
  const p = job.progress;
  const frac = FINISHED.has(job.state) && job.state === 'succeeded' ? 1 : (p && typeof p.fraction === 'number' ? p.fraction : 0);
  const label = p && p.epochs ? `epoch ${Math.min((p.latest_epoch && p.latest_epoch.epoch) || p.epoch || 0, p.epochs)}/${p.epochs} · ${Math.round(frac * 100)}%`
                              : `${Math.round(frac * 100)}%`;
  return h('td', {class: 'progress-cell'}, h('progress', {max: 1, value: frac, 'aria-label': 'progress ' + label}),
           h('span', {class: 'small muted'}, label));
}
function every(ms, fn) { const t = setInterval(fn, ms); pageTimers.push(t); return t; }
function setMain(...nodes) { main.replaceChildren(...nodes); }
function errorBox(e) { return h('div', {class: 'alert', role: 'alert'}, e.message || String(e)); }

/* ------------------------------------------------------------ sign-in */

function signOut(msg) {
  localStorage.removeItem(TOKEN_KEY);
  if (session) { /* the session revoked on the server, the cookie cleared */
    const hd = {'X-CSRF-Token': session.csrf || ''};
    session = null;
    fetch('/auth/logout', {method: 'POST', headers: hd}).catch(() => {}).finally(() => { if (msg) sessionStorage.setItem('trainyard.msg', msg); location.hash = '#/signin'; route(); });
    return;
  }
  location.hash = '#/signin';
  if (msg) sessionStorage.setItem('trainyard.msg', msg);
  route();
}

function pageSignin() {
  const err = h('p', {class: 'field-error', id: 'signin-error', role: 'alert'});
  const msg = sessionStorage.getItem('trainyard.msg');
  sessionStorage.removeItem('trainyard.msg');
  if (msg) err.textContent = msg;
  const input = h('input', {id: 'token', name: 'token', type: 'password', autocomplete: 'off', required: true,
                            placeholder: 'ty_…', spellcheck: 'false'});
  const form = h('form', {class: 'card', id: 'signin', onsubmit: async (ev) => {
    ev.preventDefault();
    err.textContent = '';
    const t = input.value.trim();
    localStorage.setItem(TOKEN_KEY, t);
    try {
      await api('/jobs?limit=1', {noSignout: true});
      location.hash = '#/jobs';
    } catch (e) {
      localStorage.removeItem(TOKEN_KEY);
      err.textContent = e.status === 401 ? (e.code === 'token_expired' ? 'This token expired: ask for a new one.'
                                                                        : 'This token is not valid.') : e.message;
    }
  }},
    h('h1', {}, 'Sign in'),
    h('p', {}, h('a', {class: 'button primary', id: 'sso-signin', href: '/auth/login?return_to=/'}, 'Sign in with single sign-on')),
    h('p', {class: 'muted'}, 'Or paste your team token (with "trainyard up" it is in .trainyard/token). It stays in this browser only.'),
    h('label', {for: 'token'}, 'Team token', input), err,
    h('button', {class: 'primary', type: 'submit'}, 'Sign in'));
  setMain(h('div', {class: 'signin'}, form));
  input.focus();
}

/* ------------------------------------------------------------ jobs table */

function pageJobs() {
  const filter = h('select', {id: 'state-filter', 'aria-label': 'state'},
    ['all', 'queued', 'starting', 'running', 'succeeded', 'failed', 'cancelled'].map(s => h('option', {value: s}, s)));
  const body = h('tbody');
  const status = h('span', {class: 'small muted', id: 'jobs-updated'});
  const table = h('div', {class: 'table-wrap'}, h('table', {id: 'jobs'},
    h('thead', {}, h('tr', {}, h('th', {}, 'ID'), h('th', {}, 'Name'), h('th', {}, 'State'),
      h('th', {class: 'hide-narrow'}, 'Team'), h('th', {class: 'hide-narrow'}, 'Strategy'),
      h('th', {class: 'hide-narrow'}, 'Devices'), h('th', {}, 'Progress'), h('th', {class: 'num'}, 'Elapsed'),
      h('th', {class: 'num'}, 'ETA'))), body));
  const refresh = async () => {
    try {
      const q = filter.value === 'all' ? '' : '&state=' + encodeURIComponent(filter.value);
      const r = await api('/jobs?limit=100' + q);
      body.replaceChildren(...(r.jobs.length ? r.jobs.map(jobRow) : [h('tr', {}, h('td', {colspan: 9, class: 'empty'}, 'No jobs yet: submit one.'))]));
      status.textContent = 'updated ' + new Date().toLocaleTimeString();
    } catch (e) { if (e.name !== 'AbortError') status.textContent = e.message; }
  };
  filter.addEventListener('change', refresh);
  setMain(h('h1', {}, 'Jobs', h('a', {class: 'button small', href: '#/submit'}, 'Submit a job')),
          h('div', {class: 'row'}, h('label', {class: 'grow'}, 'Show', filter), status), table);
  refresh();
  every(2000, refresh);
}

function jobRow(j) {
  const p = j.progress;
  const eta = FINISHED.has(j.state) ? null : (p && typeof p.eta_s === 'number' ? p.eta_s : null);
  return h('tr', {dataset: {jobId: j.id, state: j.state}},
    h('td', {}, h('a', {href: '#/jobs/' + j.id}, '#' + j.id)),
    h('td', {}, h('a', {href: '#/jobs/' + j.id}, j.name)),
    h('td', {}, badge(j.state), j.state === 'queued' && j.reason ? h('div', {class: 'small muted'}, j.reason) : null),
    h('td', {class: 'hide-narrow'}, j.team),
    h('td', {class: 'hide-narrow'}, j.strategy || 'default'),
    h('td', {class: 'hide-narrow'}, devices(j)),
    progressCell(j),
    h('td', {class: 'num'}, fmtDuration(elapsed(j))),
    h('td', {class: 'num'}, eta === null ? '–' : fmtDuration(eta)));
}

/* ------------------------------------------------------------ charts */

/* A uPlot line chart over steps; series added by name, points by step. */
class StepChart {
  constructor(el, title, names, colors, height = 240, yMax = null) {
    this.el = el; this.names = names; this.points = new Map(); /* step -> [v per series] */
    this.count = 0;
    const series = [{label: 'step'}].concat(names.map((n, i) => ({label: n, stroke: colors[i], width: 2, spanGaps: true,
      points: {show: true, size: 4}})));
    this.height = height;
    this.plot = new uPlot({title, width: this.width(), height, series,
      scales: yMax ? {x: {time: false}, y: {auto: false, range: () => [0, yMax]}} : {x: {time: false}},
      axes: [{label: 'step'}, yMax ? {splits: () => Array.from({length: Math.floor(yMax) + 1}, (_, i) => i)} : {}],
      legend: {live: true}}, [[], ...names.map(() => [])], el);
    el.dataset.points = '0';
  }
  width() { return Math.max(260, this.el.clientWidth || this.el.parentElement.clientWidth || 600); }
  add(step, name, value) {
    const i = this.names.indexOf(name);
    if (i < 0 || typeof value !== 'number' || !isFinite(value)) return;
    if (!this.points.has(step)) this.points.set(step, this.names.map(() => null));
    if (this.points.get(step)[i] === null) {
      this.count++;
      /* per series too, e.g. data-points-eval_loss (the browser tests read them) */
      const key = 'points-' + name.replace(/[^a-z_]/g, '');
      this.el.setAttribute('data-' + key, String(Number(this.el.getAttribute('data-' + key) || 0) + 1));
    }
    this.points.get(step)[i] = value;
    this.dirty = true;
  }
  draw() {
    if (!this.dirty) return;
    this.dirty = false;
    const steps = [...this.points.keys()].sort((a, b) => a - b);
    this.plot.setData([steps, ...this.names.map((_, i) => steps.map(s => this.points.get(s)[i]))]);
    this.el.dataset.points = String(this.count);
  }
  resize() { this.plot.setSize({width: this.width(), height: this.height}); }
}

/* Feeds one metric (as GET /metrics or the event stream gives it) to the charts. */
function chartMetric(charts, m) {
  if (charts.workers && typeof m.workers === 'number' && typeof m.step === 'number') charts.workers.add(m.step, 'workers', m.workers);
  const step = typeof m.step === 'number' ? m.step : 0;
  if (m.kind === 'step' || !m.kind) {
    charts.loss.add(step, 'loss (step)', m.loss);
    charts.acc.add(step, 'accuracy (step)', m.accuracy);
  } else if (m.kind === 'epoch') {
    charts.loss.add(step, 'loss (epoch)', m.loss);
    charts.loss.add(step, 'val_loss', m.val_loss);
    charts.acc.add(step, 'accuracy (epoch)', m.accuracy);
    charts.acc.add(step, 'val_accuracy', m.val_accuracy);
  } else if (m.kind === 'test') {
    charts.loss.add(step, 'test_loss', m.test_loss);
    charts.acc.add(step, 'test_accuracy', m.test_accuracy);
  } else if (m.kind === 'eval') {
    /* the evaluator's, at the step of the checkpoint it evaluated */
    charts.loss.add(step, 'eval_loss', m.eval_loss);
    charts.acc.add(step, 'eval_accuracy', m.eval_accuracy);
  }
}

/* Reads GET /jobs/{id}/events as server-sent events through fetch(), so the
 * Authorization header goes with it; calls on(type, data, id) per event.
 * Resolves when the server ends the stream (the job finished). */
async function readEvents(path, on, signal) {
  const r = await fetch('/api/v1' + path, {headers: Object.assign(authHeaders(), {Accept: 'text/event-stream'}), signal});
  if (!r.ok) throw new ApiError(r.status, null);
  const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
  let pending = '';
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    pending += value;
    let cut;
    while ((cut = pending.indexOf('\n\n')) >= 0) {
      const block = pending.slice(0, cut);
      pending = pending.slice(cut + 2);
      let type = 'message', data = '', id = null;
      for (const line of block.split('\n')) {
        if (line.startsWith(':')) continue;
        const c = line.indexOf(':');
        const k = c < 0 ? line : line.slice(0, c);
        const v = c < 0 ? '' : line.slice(c + 1).replace(/^ /, '');
        if (k === 'event') type = v; else if (k === 'data') data += (data ? '\n' : '') + v; else if (k === 'id') id = v;
      }
      if (data) { try { on(type, JSON.parse(data), id); } catch (e) { console.warn('bad event', e); } }
    }
  }
}

/* ------------------------------------------------------------ job page */

/* The model as Keras' model.summary() shows it, from the job's
 * model_summary (GET /jobs/{id}): a row a layer, "name (Class)", its output
 * shape with the batch dimension as None, its Param #, then the totals
 * (float32: 4 bytes a parameter). null (a command job): no card. */
const KERAS_CLASS = {dense: 'Dense', dropout: 'Dropout', flatten: 'Flatten', activation: 'Activation', conv2d: 'Conv2D',
  max_pooling2d: 'MaxPooling2D', average_pooling2d: 'AveragePooling2D', global_average_pooling2d: 'GlobalAveragePooling2D',
  batch_normalization: 'BatchNormalization', reshape: 'Reshape'};
function shapeText(shape) { return '(' + ['None', ...(shape || [])].join(', ') + ')'; }
function fmtCount(n) { return typeof n === 'number' ? n.toLocaleString('en-US') : '–'; }
function modelCard(m) {
  if (!m || !Array.isArray(m.layers)) return null;
  const total = (label, n, id) => h('tr', {}, h('td', {colspan: 2}, label),
    h('td', {class: 'num', id}, fmtCount(n), h('span', {class: 'bytes muted small'}, ` (${fmtBytes(4 * n)})`)));
  return h('section', {id: 'model-card'},
    h('div', {class: 'row'}, h('h2', {class: 'grow'}, 'Model'),
      h('span', {class: 'small muted', id: 'model-input'}, 'input ' + shapeText(m.input_shape))),
    h('div', {class: 'table-wrap'}, h('table', {id: 'model', class: 'model compact'},
      h('thead', {}, h('tr', {}, h('th', {}, 'Layer (type)'), h('th', {}, 'Output shape'), h('th', {class: 'num'}, 'Param #'))),
      h('tbody', {}, ...m.layers.map(l => h('tr', {dataset: {layer: l.name}},
        h('td', {class: 'layer'}, h('span', {class: 'name'}, l.name), ' ',
          h('span', {class: 'type muted'}, `(${KERAS_CLASS[l.type] || l.type})`)),
        h('td', {class: 'shape'}, shapeText(l.output_shape)),
        h('td', {class: 'num', title: l.params !== l.trainable_params ? `${fmtCount(l.trainable_params)} trainable` : null},
          fmtCount(l.params))))),
      h('tfoot', {},
        total('Total params', m.total_params, 'model-total'),
        total('Trainable params', m.trainable_params, 'model-trainable'),
        total('Non-trainable params', m.non_trainable_params, 'model-non-trainable')))));
}

async function pageJob(id) {
  const signal = pageAbort.signal;
  let job;
  try { job = await api('/jobs/' + id); } catch (e) { setMain(h('h1', {}, 'Job #' + id), errorBox(e)); return; }
  const stateEl = h('span', {id: 'job-state'});
  const cancelBtn = h('button', {class: 'danger', id: 'cancel', type: 'button'}, 'Cancel job');
  const cancelMsg = h('span', {class: 'small', id: 'cancel-msg', role: 'status'});
  const summary = h('dl', {class: 'kv', id: 'job-summary'});
  const prog = h('div', {id: 'job-progress'});
  const lossEl = h('div', {class: 'chart', id: 'chart-loss'});
  const accEl = h('div', {class: 'chart', id: 'chart-accuracy'});
  /* an elastic job (resources.workers a range): its size over the steps */
  const specW = job.spec && job.spec.resources && job.spec.resources.workers;
  const elastic = specW !== null && typeof specW === 'object';
  const workersEl = elastic ? h('div', {class: 'chart', id: 'chart-workers'}) : null;
  const modelEl = modelCard(job.model_summary);
  const timeline = h('ol', {class: 'timeline', id: 'timeline'});
  const tasks = h('tbody');
  const logSel = h('select', {id: 'log-task', 'aria-label': 'task'});
  const log = h('pre', {class: 'log', id: 'log'}, '');
  const ckpts = h('tbody');
  /* a notebook job: its notebook in a new tab, once the server's proxy lets this browser in */
  const portMsg = h('span', {class: 'small', id: 'port-msg', role: 'status'});
  const nbBtn = h('button', {class: 'primary', id: 'open-notebook', type: 'button', hidden: true,
                             onclick: () => openPort(job.id, (job.ports || []).find(p => p.name === 'notebook' && p.port), portMsg)}, 'Open notebook');
  /* a shell in one of the running tasks (#/jobs/ID/shell/TASK) */
  const shellSel = h('select', {id: 'shell-task', 'aria-label': 'task for a shell'});
  const shellBtn = h('button', {id: 'open-shell', type: 'button',
                                onclick: () => { location.hash = `#/jobs/${job.id}/shell/${encodeURIComponent(shellSel.value)}`; }}, 'Shell');
  const shellBox = h('span', {class: 'row shell-pick', hidden: true}, shellSel, shellBtn);
  setMain(
    h('h1', {}, h('span', {}, `#${job.id} ${job.name}`), stateEl, h('span', {class: 'grow'}), portMsg, nbBtn, cancelMsg, cancelBtn),
    h('div', {class: 'grid2'}, h('div', {class: 'card'}, summary), h('div', {class: 'card'}, prog)),
    /* an interactive job (a notebook, a shell) trains nothing of ours: no charts */
    h('div', {class: 'grid2', hidden: !!(job.spec && job.spec.interactive)}, h('div', {class: 'card'}, lossEl), h('div', {class: 'card'}, accEl)),
    ...(workersEl ? [h('div', {class: 'card'}, workersEl)] : []),
    ...(modelEl ? [modelEl] : []),
    h('div', {class: 'grid2'},
      h('div', {}, h('h2', {}, 'Timeline'), h('div', {class: 'card'}, timeline)),
      h('div', {}, h('div', {class: 'row'}, h('h2', {class: 'grow'}, 'Tasks'), shellBox), h('div', {class: 'table-wrap'}, h('table', {id: 'tasks'},
        h('thead', {}, h('tr', {}, h('th', {}, 'Task'), h('th', {}, 'Node'), h('th', {}, 'State'), h('th', {}, 'Exit'))), tasks)))),
    h('div', {class: 'row'}, h('h2', {class: 'grow'}, 'Log'), logSel), log,
    h('h2', {}, 'Checkpoints'),
    h('div', {class: 'table-wrap'}, h('table', {id: 'checkpoints'}, h('thead', {}, h('tr', {},
      h('th', {}, 'ID'), h('th', {class: 'num'}, 'Epoch'), h('th', {class: 'num'}, 'Step'), h('th', {class: 'num hide-narrow'}, 'Size'),
      h('th', {class: 'hide-narrow'}, 'sha256'), h('th', {}, 'Created'), h('th', {}, ''))), ckpts)));

  const charts = {
    loss: new StepChart(lossEl, 'Loss', ['loss (step)', 'loss (epoch)', 'val_loss', 'test_loss', 'eval_loss'], ['#8c959f', '#0969da', '#cf222e', '#8250df', '#bf8700']),
    acc: new StepChart(accEl, 'Accuracy', ['accuracy (step)', 'accuracy (epoch)', 'val_accuracy', 'test_accuracy', 'eval_accuracy'], ['#8c959f', '#0969da', '#1a7f37', '#8250df', '#bf8700']),
  };
  if (workersEl) charts.workers = new StepChart(workersEl, `Workers (elastic ${specW.min}-${specW.max})`, ['workers'], ['#1a7f37'], 180, specW.max + 0.5);
  const drawAll = () => { Object.values(charts).forEach(c => c.draw()); };
  const onResize = () => { Object.values(charts).forEach(c => c.resize()); };
  window.addEventListener('resize', onResize);
  pageTimers.push({off: () => window.removeEventListener('resize', onResize)});

  const render = () => {
    stateEl.replaceChildren(badge(job.state));
    cancelBtn.hidden = FINISHED.has(job.state);
    const spec = job.spec || {};
    const kv = [['Team', job.team], ['Strategy', (spec.strategy && spec.strategy.type) || 'default'],
      ['Devices', devices(job)], ['Priority', job.priority], ['Attempt', `${job.attempt} of ${job.max_restarts + 1}`],
      ['Created', new Date(job.created_at).toLocaleString()], ['Started', job.started_at ? fmtTime(job.started_at) : '–'],
      ['Finished', job.finished_at ? fmtTime(job.finished_at) : '–'], ['Elapsed', fmtDuration(elapsed(job))],
      ['Reason', job.reason || '–']];
    /* a job's web ports (TensorBoard, a notebook): through the server's proxy while a task serves them */
    if (job.ports && job.ports.length)
      kv.push(['Ports', h('span', {id: 'job-ports'}, ...job.ports.flatMap((p, i) => [i ? ' · ' : '',
        p.port ? h('a', {href: p.url, target: '_blank', rel: 'noopener', dataset: {port: p.name},
                         onclick: (ev) => { ev.preventDefault(); openPort(job.id, p, portMsg); }}, p.name)
               : h('span', {class: 'small', title: 'not served now'}, p.name)]))]);
    if (spec.interactive) { /* the spec as submitted: its idle_timeout as written, if it gave one */
      const idle = spec.idle_timeout;
      kv.splice(1, 0, ['Interactive', h('span', {id: 'job-interactive'}, spec.interactive.type +
        (idle === undefined ? '' : idle === 0 ? ' · never stopped when idle'
                                   : ` · stopped after ${typeof idle === 'number' ? fmtDuration(idle) : idle} idle`))]);
    }
    if (typeof job.sweep === 'number') kv.splice(1, 0, ['Sweep', h('a', {href: '#/sweeps/' + job.sweep, id: 'job-sweep'}, `sweep #${job.sweep}, trial ${job.trial}`)]);
    summary.replaceChildren(...kv.flatMap(([k, v]) => [h('dt', {}, k), h('dd', {}, v instanceof Node ? v : String(v))]));
    const p = job.progress;
    const frac = job.state === 'succeeded' ? 1 : (p && p.fraction) || 0;
    const le = p && p.latest_epoch, t = p && p.test, ev = p && p.eval;
    prog.replaceChildren(
      h('div', {class: 'chart-title'}, 'Progress'),
      h('progress', {max: 1, value: frac, id: 'progress-bar'}),
      h('dl', {class: 'kv'},
        h('dt', {}, 'Epoch'), h('dd', {}, p ? `${(le && le.epoch) || p.epoch || 0} / ${p.epochs || '?'}` : '–'),
        h('dt', {}, 'Step'), h('dd', {}, p ? `${p.step} / ${p.total_steps || '?'}` : '–'),
        h('dt', {}, 'Loss'), h('dd', {id: 'latest-loss'}, p && p.latest ? fmtNum(p.latest.loss) : '–'),
        h('dt', {}, 'Validation'), h('dd', {}, le ? `loss ${fmtNum(le.val_loss)} · accuracy ${fmtNum(le.val_accuracy)}` : '–'),
        h('dt', {}, 'Test'), h('dd', {}, t ? `loss ${fmtNum(t.test_loss)} · accuracy ${fmtNum(t.test_accuracy)}` : '–'),
        ...(ev || (spec.resources && spec.resources.evaluator) ? [h('dt', {}, 'Evaluator'), h('dd', {id: 'eval-summary'},
          ev ? `loss ${fmtNum(ev.eval_loss)} · accuracy ${fmtNum(ev.eval_accuracy)} (epoch ${ev.epoch}, step ${ev.step})` : '–')] : []),
        h('dt', {}, 'Samples/s'), h('dd', {id: 'samples-per-sec'}, speedText(job.state, p)),
        h('dt', {}, 'ETA'), h('dd', {}, FINISHED.has(job.state) ? '–' : fmtDuration(p && p.eta_s))));
    tasks.replaceChildren(...(job.tasks || []).map(tk => h('tr', {},
      h('td', {}, tk.name), h('td', {}, tk.node || '–'), h('td', {}, tk.state),
      h('td', {}, tk.exit_code === null || tk.exit_code === undefined ? '–' : String(tk.exit_code)))));
    const nb = (job.ports || []).find(p => p.name === 'notebook');
    nbBtn.hidden = !(spec.interactive && spec.interactive.type === 'notebook') || FINISHED.has(job.state);
    nbBtn.disabled = !(nb && nb.port);
    nbBtn.title = nbBtn.disabled ? 'the notebook is not served yet' : '';
    const running = job.state === 'running' ? (job.tasks || []).filter(tk => tk.state === 'running').map(tk => tk.name) : [];
    shellBox.hidden = !running.length;
    if ([...shellSel.options].map(o => o.value).join() !== running.join()) {
      const keep = shellSel.value;
      shellSel.replaceChildren(...running.map(n => h('option', {value: n}, n)));
      if (running.includes(keep)) shellSel.value = keep;
    }
    const names = (job.tasks || []).map(tk => tk.name);
    if (!names.length) names.push('worker-0');
    if ([...logSel.options].map(o => o.value).join() !== names.join()) {
      const keep = logSel.value;
      logSel.replaceChildren(...names.map(n => h('option', {value: n}, n)));
      if (names.includes(keep)) logSel.value = keep;
    }
  };
  const refreshJob = async () => { try { job = await api('/jobs/' + id); render(); } catch (e) { /* keep what we have */ } };

  /* the evaluator's metrics: a sequence of their own (kind=eval), read
   * beside the live stream of the chief's */
  let evalSeq = 0;
  const refreshEval = async () => {
    try {
      for (;;) {
        const r = await api(`/jobs/${id}/metrics?kind=eval&since=${evalSeq}&limit=1000`);
        r.metrics.forEach(m => chartMetric(charts, m));
        if (!r.metrics.length) break;
        evalSeq = r.metrics[r.metrics.length - 1].seq;
      }
    } catch (e) { /* next time */ }
  };

  const addEvent = (e) => {
    timeline.append(h('li', {}, h('span', {class: 'small muted'}, fmtTime(e.time)),
      h('span', {}, e.to ? badge(e.to) : h('strong', {}, e.kind), ' ', h('span', {class: 'small muted'}, e.actor), ' ',
        e.reason || '')));
  };

  const refreshCkpts = async () => {
    try {
      const r = await api(`/jobs/${id}/checkpoints`);
      ckpts.replaceChildren(...(r.checkpoints.length ? r.checkpoints.map(c => h('tr', {dataset: {checkpoint: c.id}},
        h('td', {}, String(c.id)), h('td', {class: 'num'}, String(c.epoch)), h('td', {class: 'num'}, String(c.step)),
        h('td', {class: 'num hide-narrow'}, (c.size / 1024).toFixed(1) + ' KiB'),
        h('td', {class: 'hide-narrow small'}, h('code', {}, c.sha256.slice(0, 16) + '…')),
        h('td', {}, fmtTime(c.created_at)),
        h('td', {}, h('button', {type: 'button', class: 'download', onclick: () => download(id, c)}, 'Download'))))
        : [h('tr', {}, h('td', {colspan: 7, class: 'empty'}, 'No checkpoint yet.'))]));
    } catch (e) { /* next time */ }
  };

  let logOffset = 0, logTask = null;
  const refreshLog = async () => {
    const task = logSel.value || 'worker-0';
    if (task !== logTask) { logTask = task; logOffset = 0; log.textContent = ''; }
    try {
      const r = await api(`/jobs/${id}/logs?task=${encodeURIComponent(task)}&since=${logOffset}&limit=65536`, {raw: true});
      const next = Number(r.headers.get('X-Next-Offset'));
      logOffset = isFinite(next) && next > 0 ? next : logOffset + new TextEncoder().encode(r.text).length;
      if (r.text) {
        const atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
        const lines = (log.textContent + r.text).split('\n');
        log.textContent = lines.slice(-400).join('\n');
        if (atEnd) log.scrollTop = log.scrollHeight;
      }
    } catch (e) { if (e.status !== 404) console.warn(e); }
  };
  logSel.addEventListener('change', refreshLog);

  cancelBtn.addEventListener('click', async () => {
    if (!cancelBtn.classList.contains('confirm')) {
      cancelBtn.classList.add('confirm');
      cancelBtn.textContent = `Yes, cancel job #${id}`;
      cancelMsg.textContent = 'Its workers checkpoint and stop.';
      return;
    }
    cancelBtn.disabled = true;
    try {
      job = Object.assign(job, await api(`/jobs/${id}/cancel`, {method: 'POST'}));
      cancelMsg.textContent = 'Cancelled.';
      render();
    } catch (e) { cancelMsg.textContent = e.message; }
    cancelBtn.disabled = false;
    cancelBtn.classList.remove('confirm');
    cancelBtn.textContent = 'Cancel job';
  });

  render();
  /* history first, then the live stream from where the history ends */
  let lastSeq = 0, lastEvent = 0;
  try {
    for (;;) {
      const r = await api(`/jobs/${id}/metrics?since=${lastSeq}&limit=10000`);
      r.metrics.forEach(m => chartMetric(charts, m));
      if (!r.metrics.length || r.metrics[r.metrics.length - 1].seq >= r.last_seq) { lastSeq = r.last_seq || lastSeq; break; }
      lastSeq = r.metrics[r.metrics.length - 1].seq;
    }
    const ev = await api(`/jobs/${id}/events?limit=1000`);
    ev.events.forEach(e => { addEvent(e); lastEvent = e.id; });
  } catch (e) { if (e.name === 'AbortError') return; main.prepend(errorBox(e)); }
  await refreshEval();
  drawAll();
  refreshCkpts(); refreshLog();
  every(400, () => { drawAll(); });
  every(2000, () => { if (!FINISHED.has(job.state)) { refreshLog(); refreshJob(); refreshEval(); } });

  let lastCkptRefresh = 0;
  const live = async () => {
    while (!signal.aborted) {
      try {
        await readEvents(`/jobs/${id}/events?after=${lastEvent}&since=${lastSeq}`, (type, data, evId) => {
          if (type === 'metric') {
            chartMetric(charts, data);
            if (typeof data.seq === 'number') lastSeq = Math.max(lastSeq, data.seq);
            if (data.kind !== 'step' && Date.now() - lastCkptRefresh > 1000) { lastCkptRefresh = Date.now(); refreshCkpts(); refreshJob(); }
          } else {
            addEvent(data);
            lastEvent = Number(evId) || data.id || lastEvent;
            if (data.to) { job.state = data.to; refreshJob(); }
          }
        }, signal);
      } catch (e) { if (signal.aborted) return; }
      if (FINISHED.has(job.state)) break;
      await new Promise(res => setTimeout(res, 2000));
    }
    await refreshJob(); refreshCkpts(); refreshLog(); await refreshEval();
    drawAll();
  };
  live();
}

/* Opens a job's web port (its proxy URL) in a new tab. The tab is opened at
 * once, in the click, so no popup blocker stops it; then
 * POST /jobs/{id}/proxy-session (the usual credential headers) gives a
 * one-time ticket and the origin the apps are served at (the server's
 * --apps-listen, or this one). The tab goes to the port with the ticket
 * (?trainyard_grant=), which the server trades for the trainyard_proxy
 * cookie for /proxy/jobs/{id}/ there: a tab's requests carry it where they
 * could not carry the pasted token. An app that has just started (a
 * notebook takes seconds) may not listen yet: while the proxy answers 502,
 * the tab says it waits (up to a minute); then it goes to the port. */
async function openPort(id, port, msgEl) {
  msgEl.textContent = '';
  if (!port || !port.url) { msgEl.textContent = 'No task serves this port now.'; return; }
  const tab = window.open('', '_blank');
  if (!tab) { msgEl.textContent = 'The browser did not open a tab: allow pop-ups for this page.'; return; }
  const say = (text) => { try { tab.document.title = `${port.name} of job #${id}`; tab.document.body.textContent = text; } catch (e) { /* gone */ } };
  say(`Opening ${port.name} of job #${id}…`);
  const fail = (text) => { tab.close(); msgEl.textContent = `${port.name}: ${text}`; };
  const signal = new AbortController().signal; /* the tab's, not the page's: leaving the page does not stop it */
  let grant;
  try {
    grant = await api(`/jobs/${id}/proxy-session`, {method: 'POST', signal});
    for (let waited = 0; ; waited += 500) {
      const r = await fetch(port.url, {headers: authHeaders(), redirect: 'manual', signal});
      if (r.status !== 502) break;
      if (waited >= 60000) { fail(`it does not answer (${(await r.json().catch(() => ({}))).error?.message || 'HTTP 502'})`); return; }
      if (tab.closed) return;
      say(`Opening ${port.name} of job #${id}: waiting for it to answer…`);
      await new Promise(res => setTimeout(res, 500));
    }
  } catch (e) {
    fail(e.message);
    return;
  }
  tab.opener = null;
  const to = new URL(port.url, grant.apps_url || location.href);
  to.searchParams.set(grant.param, grant.ticket);
  tab.location.href = to.href;
}

/* Downloads a checkpoint with the bearer token (a plain link could not send
 * it) and checks its sha256 against the listed one before saving it. */
async function download(id, c) {
  const r = await fetch(`/api/v1/jobs/${id}/checkpoints/${c.id}`, {headers: authHeaders()});
  if (!r.ok) { alert('download failed: HTTP ' + r.status); return; }
  const blob = await r.blob();
  const url = URL.createObjectURL(blob);
  const a = h('a', {href: url, download: `job-${id}-checkpoint-${c.id}.safetensors`});
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

/* ------------------------------------------------------------ a task's shell */

/* xterm.js and its fit addon (web/vendor/, docs/dashboard.md): loaded by the
 * terminal page only, once, so no other page pays for them. */
const XTERM = {css: 'vendor/xterm-5.5.0.css', js: 'vendor/xterm-5.5.0.min.js', fit: 'vendor/xterm-addon-fit-0.10.0.min.js'};
let xtermLoading = null;
function loadXterm() {
  const script = (src) => new Promise((ok, bad) => document.head.append(
    h('script', {src, onload: ok, onerror: () => bad(new Error(`could not load ${src}`))})));
  if (!xtermLoading) {
    document.head.append(h('link', {rel: 'stylesheet', href: XTERM.css}));
    xtermLoading = script(XTERM.js).then(() => script(XTERM.fit));
    xtermLoading.catch(() => { xtermLoading = null; });
  }
  return xtermLoading;
}

/* Opens an xterm.js terminal in el under the page's CSP. Its DOM renderer
 * keeps its colors and cell sizes in two <style> elements it writes, which
 * style-src 'self' refuses; while it opens it is handed <template>s instead
 * (never rendered) whose text goes into constructed style sheets adopted by
 * the document (CSSOM, which the policy allows). Returns the function that
 * drops those sheets. */
function openTerminal(term, el) {
  const sheets = [];
  const create = Document.prototype.createElement;
  document.createElement = function (tag, opts) {
    if (String(tag).toLowerCase() !== 'style') return create.call(document, tag, opts);
    const holder = create.call(document, 'template');
    const sheet = new CSSStyleSheet();
    sheets.push(sheet);
    document.adoptedStyleSheets = [...document.adoptedStyleSheets, sheet];
    let text = '';
    Object.defineProperty(holder, 'textContent', {get: () => text, set: (v) => { text = String(v); sheet.replaceSync(text); }});
    return holder;
  };
  try { term.open(el); } finally { delete document.createElement; }
  return () => { document.adoptedStyleSheets = document.adoptedStyleSheets.filter(x => !sheets.includes(x)); };
}

/* What a status frame (channel 3) says, in words. */
function exitText(st) {
  if (st.error) return `could not start: ${st.error} (status ${st.exit})`;
  if (st.signal) return `killed by signal ${st.signal} (status ${st.exit})`;
  return `exited with status ${st.exit}`;
}

/* Why a shell's WebSocket was refused or failed. A browser is not told
 * (no status reaches the page), so the same URL is asked again as a plain
 * GET with the credential's headers: the server checks the job and the
 * role as for the WebSocket and answers their error, or 400 on the missing
 * upgrade when they pass; then the job says whether the task is there and
 * running, and if it is, the node or the server's load was the cause. */
async function shellRefusal(url, id, task) {
  const u = new URL(url);
  u.protocol = location.protocol;
  try {
    const r = await fetch(u.href, {headers: authHeaders()});
    const body = (r.headers.get('Content-Type') || '').startsWith('application/json') ? await r.json() : null;
    const e = (body && body.error) || {};
    if (r.status !== 400 || e.field !== 'Upgrade') return `The server refused the shell (HTTP ${r.status}): ${e.message || r.statusText}`;
    const job = await api('/jobs/' + id);
    const tk = (job.tasks || []).find(t => t.name === task || String(t.id) === task);
    if (!tk) return `Job #${id} has no task ${task} (its tasks: ${(job.tasks || []).map(t => t.name).join(', ') || 'none'}).`;
    if (tk.state !== 'running') return `Task ${task} is ${tk.state}, not running: a shell needs a running task.`;
    return 'The shell did not open: the task\'s node must answer within 10 s, and the server may have been busy (its log says which). Try again.';
  } catch (e) {
    return `The server cannot be reached (${e.message}).`;
  }
}

/* #/jobs/ID/shell/TASK: a terminal on a command in the task (its login
 * shell) over the exec WebSocket (the exec protocol): binary frames whose first
 * byte is the channel (0 stdin, 1 stdout, 3 the exit status, 4 a resize). */
async function pageShell(id, task) {
  const signal = pageAbort.signal;
  const status = h('span', {id: 'shell-status', class: 'grow', role: 'status', dataset: {state: 'loading'}}, 'Loading the terminal…');
  const again = h('button', {type: 'button', id: 'shell-again', hidden: true, onclick: () => route()}, 'New shell');
  const screen = h('div', {id: 'terminal', class: 'terminal'});
  setMain(h('h1', {}, h('span', {}, `Shell in ${task} of job #${id}`), h('span', {class: 'grow'}),
            h('a', {class: 'button small', href: '#/jobs/' + id}, 'Back to the job')),
          h('div', {class: 'row shell-bar'}, status, again), screen);
  const say = (state, text) => { status.dataset.state = state; status.textContent = text; };
  try { await loadXterm(); } catch (e) { say('failed', e.message); return; }
  if (signal.aborted) return;

  const term = new window.Terminal({cursorBlink: true, fontSize: 14, scrollback: 5000, convertEol: false,
    fontFamily: 'ui-monospace, SFMono-Regular, Menlo, Consolas, monospace',
    theme: {background: '#0d1117', foreground: '#e6edf3', cursor: '#e6edf3'}});
  const fit = new window.FitAddon.FitAddon();
  term.loadAddon(fit);
  const unstyle = openTerminal(term, screen);
  try { fit.fit(); } catch (e) { /* a hidden page: 80x24 */ }
  const sized = () => { screen.dataset.cols = String(term.cols); screen.dataset.rows = String(term.rows); };
  sized();

  const enc = new TextEncoder();
  const frame = (ch, bytes) => { const f = new Uint8Array(1 + bytes.length); f[0] = ch; f.set(bytes, 1); return f; };
  const url = new URL(`/api/v1/jobs/${id}/tasks/${encodeURIComponent(task)}/exec`, location.href);
  url.protocol = location.protocol === 'https:' ? 'wss:' : 'ws:';
  url.searchParams.set('tty', '1');
  url.searchParams.set('cols', String(term.cols));
  url.searchParams.set('rows', String(term.rows));
  if (!token() && session && chosenTeam()) url.searchParams.set('team', chosenTeam());
  /* a pasted token rides as a subprotocol (a browser's WebSocket cannot set
   * headers; the server answers with trainyard.exec.v1 alone); a session's
   * cookie goes by itself */
  const protocols = ['trainyard.exec.v1'];
  if (token()) protocols.push('trainyard.bearer.' + token());
  let ws, opened = false, ended = false, leaving = false;
  try { ws = new WebSocket(url.href, protocols); } catch (e) {
    say('failed', `Cannot open a shell: ${e.message}`);
    term.dispose(); unstyle();
    return;
  }
  ws.binaryType = 'arraybuffer';
  const send = (ch, bytes) => { if (ws.readyState === WebSocket.OPEN) ws.send(frame(ch, bytes)); };
  say('connecting', `Connecting to ${task}…`);

  ws.addEventListener('open', () => {
    opened = true;
    say('open', `Connected to ${task} of job #${id}.`);
    term.focus();
  });
  ws.addEventListener('message', (ev) => {
    if (typeof ev.data === 'string') { term.write(ev.data); return; }
    const b = new Uint8Array(ev.data);
    if (!b.length) return;
    if (b[0] === 1 || b[0] === 2) term.write(b.subarray(1));
    else if (b[0] === 3) {
      let st;
      try { st = JSON.parse(new TextDecoder().decode(b.subarray(1))); } catch (e) { st = {exit: '?'}; }
      ended = true;
      const text = exitText(st);
      say('exited', text);
      status.dataset.exit = String(st.exit);
      term.write(`\r\n\x1b[2m[${text}]\x1b[0m\r\n`);
      again.hidden = false;
    }
  });
  ws.addEventListener('close', async (ev) => {
    if (leaving || ended) return;
    ended = true;
    again.hidden = false;
    if (!opened) { say('refused', await shellRefusal(url.href, id, task)); return; }
    say('closed', `The connection closed before the command ended (code ${ev.code}${ev.reason ? ': ' + ev.reason : ''}).`);
  });

  term.onData((d) => send(0, enc.encode(d)));
  term.onBinary((d) => send(0, Uint8Array.from(d, c => c.charCodeAt(0) & 255)));
  term.onResize(({cols, rows}) => { sized(); send(4, enc.encode(JSON.stringify({cols, rows}))); });
  let pending = 0;
  const ro = new ResizeObserver(() => {
    if (pending) return;
    pending = requestAnimationFrame(() => { pending = 0; try { fit.fit(); } catch (e) { /* detached */ } });
  });
  ro.observe(screen);
  pageTimers.push({off: () => {
    leaving = true;
    ro.disconnect();
    if (pending) cancelAnimationFrame(pending);
    if (ws.readyState === WebSocket.CONNECTING || ws.readyState === WebSocket.OPEN) ws.close(1000);
    term.dispose();
    unstyle();
  }});
}

/* ------------------------------------------------------------ submit */

const FORM_FIELDS = [
  ['name', 'Name', 'text'], ['priority', 'Priority', 'number'],
  ['strategy.type', 'Strategy', ['default', 'one_device', 'mirrored', 'central_storage', 'multi_worker_mirrored', 'parameter_server']],
  ['resources.workers', 'Workers', 'number'], ['resources.devices_per_worker', 'Devices per worker', 'number'],
  ['resources.device', 'Device', ['cpu', 'gpu']],
  ['fit.epochs', 'Epochs', 'number'], ['fit.batch_size', 'Batch size (global)', 'number'],
  ['compile.optimizer.learning_rate', 'Learning rate', 'number'],
];

function getPath(o, path) { return path.split('.').reduce((x, k) => (x && typeof x === 'object' ? x[k] : undefined), o); }
function setPath(o, path, v) {
  const ks = path.split('.');
  let x = o;
  for (const k of ks.slice(0, -1)) { if (!x[k] || typeof x[k] !== 'object') x[k] = {}; x = x[k]; }
  if (v === undefined) delete x[ks[ks.length - 1]]; else x[ks[ks.length - 1]] = v;
}

async function pageSubmit() {
  const exSel = h('select', {id: 'example', 'aria-label': 'example'});
  const editor = h('textarea', {id: 'spec', name: 'spec', spellcheck: 'false', 'data-field': '', 'aria-label': 'job spec (JSON)'});
  const editorErr = h('p', {class: 'field-error', id: 'spec-error', role: 'alert'});
  const topErr = h('div', {id: 'submit-error', role: 'alert'});
  const inputs = {};
  const fields = h('div', {class: 'fields'}, FORM_FIELDS.map(([path, label, kind]) => {
    const id = 'f-' + path.replace(/\./g, '-');
    const el = Array.isArray(kind)
      ? h('select', {id, 'data-field': path}, kind.map(v => h('option', {value: v}, v)))
      : h('input', {id, 'data-field': path, type: kind, step: kind === 'number' ? 'any' : null, placeholder: 'default'});
    inputs[path] = el;
    el.addEventListener('input', () => {
      let spec;
      try { spec = JSON.parse(editor.value); } catch (e) { editorErr.textContent = 'The spec below is not valid JSON: ' + e.message; return; }
      const raw = el.value.trim();
      setPath(spec, path, raw === '' ? undefined : (kind === 'number' && !isNaN(Number(raw)) ? Number(raw) : raw));
      editor.value = JSON.stringify(spec, null, 2);
    });
    return h('div', {class: 'field', 'data-for': path}, h('label', {for: id}, label, el));
  }));
  const fromEditor = () => {
    let spec;
    try { spec = JSON.parse(editor.value); editorErr.textContent = ''; } catch (e) { return; }
    for (const [path] of FORM_FIELDS) {
      const v = getPath(spec, path);
      inputs[path].value = v === undefined || v === null ? '' : String(v);
    }
  };
  editor.addEventListener('input', fromEditor);
  const clearErrors = () => {
    topErr.replaceChildren();
    editorErr.textContent = '';
    main.querySelectorAll('.field-error.at-field').forEach(e => e.remove());
    main.querySelectorAll('.invalid').forEach(e => e.classList.remove('invalid'));
    main.querySelectorAll('[aria-invalid]').forEach(e => e.removeAttribute('aria-invalid'));
  };
  const btn = h('button', {class: 'primary', id: 'submit', type: 'submit'}, 'Submit job');
  const form = h('form', {id: 'submit-form', novalidate: true, onsubmit: async (ev) => {
    ev.preventDefault();
    clearErrors();
    btn.disabled = true;
    try {
      const job = await api('/jobs', {method: 'POST', body: editor.value});
      location.hash = '#/jobs/' + job.id;
    } catch (e) {
      showError(e);
    } finally { btn.disabled = false; }
  }},
    h('div', {class: 'card'}, h('label', {for: 'example'}, 'Start from an example', exSel), fields),
    h('div', {class: 'card'}, h('label', {for: 'spec'}, 'Job spec (JSON: every field, see docs/jobspec.md)', editor), editorErr),
    topErr, h('div', {class: 'row'}, btn));
  /* An error that names a field is shown at that field's input, or at the
   * JSON editor for fields the form does not have. */
  const showError = (e) => {
    const where = e.field ? main.querySelector(`[data-field="${CSS.escape(e.field)}"]`) : null;
    const text = e.field ? `${e.field}: ${e.message}` : e.message;
    if (where && where !== editor) {
      where.setAttribute('aria-invalid', 'true');
      where.closest('.field').classList.add('invalid');
      where.closest('.field').append(h('p', {class: 'field-error at-field', role: 'alert', 'data-error-for': e.field}, e.message));
      where.focus();
    } else if (e.field || e.status === 400) {
      editor.setAttribute('aria-invalid', 'true');
      editorErr.textContent = text;
      editorErr.dataset.errorFor = e.field || '';
      editor.focus();
    }
    topErr.replaceChildren(h('div', {class: 'alert'}, `Not submitted (HTTP ${e.status || '?'} ${e.code || ''}): ${text}`));
  };
  setMain(h('h1', {}, 'Submit a job'), form);
  try {
    const r = await api('/examples');
    exSel.replaceChildren(...r.examples.map(x => h('option', {value: x.file}, x.file)));
    const load = () => {
      const x = r.examples.find(y => y.file === exSel.value);
      if (x) { editor.value = JSON.stringify(x.spec, null, 2); clearErrors(); fromEditor(); }
    };
    exSel.addEventListener('change', load);
    const pick = r.examples.find(x => x.file === 'fashion_mnist_quick.json') || r.examples[0];
    if (pick) { exSel.value = pick.file; load(); }
  } catch (e) { if (e.name !== 'AbortError') topErr.replaceChildren(errorBox(e)); }
}

/* ------------------------------------------------------------ queue */

function pageQueue() {
  const body = h('tbody');
  const count = h('span', {class: 'muted small', id: 'queue-count'});
  const refresh = async () => {
    try {
      const r = await api('/queue');
      count.textContent = `${r.queued} queued in the cluster, ${r.jobs.length} of them yours`;
      body.replaceChildren(...(r.jobs.length ? r.jobs.map(j => h('tr', {dataset: {jobId: j.id}},
        h('td', {class: 'num'}, String(j.position)),
        h('td', {}, h('a', {href: '#/jobs/' + j.id}, '#' + j.id)),
        h('td', {class: 'hide-narrow'}, j.team),
        h('td', {class: 'num hide-narrow'}, `${j.priority}` + (j.effective_priority !== j.priority ? ` (${j.effective_priority})` : '')),
        h('td', {class: 'num'}, fmtDuration((Date.now() - Date.parse(j.queued_at)) / 1000)),
        h('td', {class: 'reason'}, j.reason),
        h('td', {}, j.estimated_start ? (Date.parse(j.estimated_start) <= Date.now() ? 'now' : 'in ' + fmtDuration((Date.parse(j.estimated_start) - Date.now()) / 1000)) : 'unknown')))
        : [h('tr', {}, h('td', {colspan: 7, class: 'empty'}, 'Nothing waits.'))]));
    } catch (e) { if (e.name !== 'AbortError') count.textContent = e.message; }
  };
  setMain(h('h1', {}, 'Queue'), h('p', {}, count),
    h('div', {class: 'table-wrap'}, h('table', {id: 'queue'}, h('thead', {}, h('tr', {},
      h('th', {class: 'num'}, '#'), h('th', {}, 'Job'), h('th', {class: 'hide-narrow'}, 'Team'), h('th', {class: 'num hide-narrow'}, 'Priority'),
      h('th', {class: 'num'}, 'Waiting'), h('th', {}, 'Why it waits'), h('th', {}, 'Estimated start'))), body)));
  refresh();
  every(3000, refresh);
}

/* ------------------------------------------------------------ cluster */

function pageCluster() {
  const util = h('p', {id: 'utilisation'});
  const nodes = h('div', {class: 'nodes', id: 'nodes'});
  const teams = h('tbody');
  const holderLabel = (job) => typeof job === 'number' ? h('a', {href: '#/jobs/' + job}, 'job #' + job) : String(job);
  const refresh = async () => {
    try {
      const [c, t] = await Promise.all([api('/cluster'), api('/teams')]);
      const u = c.utilisation;
      util.textContent = `${u.nodes_ready} of ${u.nodes} nodes ready · GPUs ${u.gpus_used}/${u.gpus} in use · CPU slots ${u.cpu_slots_used}/${u.cpu_slots} in use`;
      nodes.replaceChildren(...(c.nodes.length ? c.nodes.map(n => {
        const cpuCells = [];
        for (const hd of n.cpu_slots.holders || []) for (let k = 0; k < hd.slots; k++)
          cpuCells.push(h('div', {class: 'slot ' + (typeof hd.job === 'number' ? 'held' : 'other')}, holderLabel(hd.job)));
        while (cpuCells.length < n.cpu_slots.total) cpuCells.push(h('div', {class: 'slot'}, 'free'));
        return h('div', {class: 'card node', dataset: {node: n.hostname}},
          h('div', {class: 'row'}, h('strong', {class: 'grow'}, n.hostname), badge(n.state === 'ready' ? 'succeeded' : 'failed'), h('span', {class: 'small muted'}, n.state)),
          h('div', {class: 'small muted'}, `${n.address} · last heartbeat ${fmtTime(n.last_heartbeat_at)}`),
          n.gpus.length ? [h('div', {class: 'small'}, `GPUs (${n.gpus_used}/${n.gpus.length} in use)`),
            h('div', {class: 'slots'}, n.gpus.map(g => h('div', {class: 'slot ' + (g.job === null ? '' : typeof g.job === 'number' ? 'held' : 'other'),
              title: `${g.model || 'gpu'} ${g.memory_mb} MiB`}, `gpu:${g.index}`, h('br'), g.job === null ? 'free' : holderLabel(g.job))))] : null,
          h('div', {class: 'small'}, `CPU slots (${n.cpu_slots.used}/${n.cpu_slots.total} in use)`),
          h('div', {class: 'slots'}, cpuCells));
      }) : [h('div', {class: 'card empty'}, 'No node has joined: start an agent (trainyard agent).')]));
      teams.replaceChildren(...t.teams.map(x => h('tr', {}, h('td', {}, x.name), h('td', {class: 'num'}, String(x.jobs_queued)),
        h('td', {class: 'num'}, String(x.jobs_running)), h('td', {class: 'num'}, String(x.devices_in_use)),
        h('td', {class: 'num hide-narrow'}, String(x.weight)), h('td', {class: 'num hide-narrow'}, x.quota === null ? '–' : String(x.quota)))));
    } catch (e) { if (e.name !== 'AbortError') util.textContent = e.message; }
  };
  setMain(h('h1', {}, 'Cluster'), util, nodes, h('h2', {}, 'Teams'),
    h('div', {class: 'table-wrap'}, h('table', {id: 'teams'}, h('thead', {}, h('tr', {}, h('th', {}, 'Team'), h('th', {class: 'num'}, 'Queued'),
      h('th', {class: 'num'}, 'Running'), h('th', {class: 'num'}, 'Devices'), h('th', {class: 'num hide-narrow'}, 'Weight'),
      h('th', {class: 'num hide-narrow'}, 'Quota'))), teams)));
  refresh();
  every(3000, refresh);
}

/* ------------------------------------------------------------ usage */

const TEAM_COLORS = ['#1f6feb', '#cf222e', '#1a7f37', '#9a6700', '#8250df', '#bf3989', '#0a7b83', '#57606a'];
/* Hours from seconds, to the thousandth (the API's seconds are to the millisecond). */
function fmtHours(s) { return (s / 3600).toFixed(3); }
function fmtBytes(b) {
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return (i ? b.toFixed(1) : String(b)) + ' ' + u[i];
}
function isoDay(d) { return d.toISOString().slice(0, 10); }

/* A uPlot chart of one number per team per UTC day (hours). */
function dayChart(el, title, days, teams, valueOf) {
  const xs = days.map(d => Date.parse(d + 'T00:00:00Z') / 1000);
  const series = [{label: 'day'}].concat(teams.map((t, i) => ({label: t, stroke: TEAM_COLORS[i % TEAM_COLORS.length], width: 2,
    points: {show: true, size: 6}, value: (u, v) => v === null ? '–' : v.toFixed(3)})));
  const data = [xs, ...teams.map(t => days.map(d => valueOf(d, t)))];
  el.replaceChildren();
  const width = Math.max(260, el.clientWidth || el.parentElement.clientWidth || 600);
  const plot = new uPlot({title, width, height: 220, series, scales: {x: {time: true}},
    axes: [{}, {label: 'hours', size: 60, values: (u, vals) => vals.map(v => String(+v.toPrecision(3)))}], legend: {live: true}}, data, el);
  el.dataset.points = String(teams.length * days.length);
  return plot;
}

function pageUsage() {
  const today = new Date();
  const fromIn = h('input', {id: 'usage-from', type: 'date', value: isoDay(new Date(today.getTime() - 13 * 86400000))});
  const toIn = h('input', {id: 'usage-to', type: 'date', value: isoDay(today)});
  const status = h('p', {class: 'muted small', id: 'usage-range'});
  const err = h('div', {id: 'usage-error'});
  const gpuEl = h('div', {class: 'chart', id: 'usage-gpu'}), cpuEl = h('div', {class: 'chart', id: 'usage-cpu'});
  const body = h('tbody'), foot = h('tfoot');
  let plots = [];
  main.dataset.usageLoaded = '0'; /* loads of this page so far (the browser test waits on it) */
  const load = async () => {
    err.replaceChildren();
    /* the chosen days, in UTC: from the first's midnight to the end of the last */
    const from = fromIn.value + 'T00:00:00Z';
    const to = new Date(Date.parse(toIn.value + 'T00:00:00Z') + 86400000);
    const q = `from=${encodeURIComponent(from)}&to=${encodeURIComponent(to.toISOString())}`;
    try {
      const [byDay, byTeam] = await Promise.all([api('/usage?by=day&' + q), api('/usage?by=team&' + q)]);
      status.textContent = `${byTeam.from.slice(0, 10)} to ${toIn.value} (UTC days) · device time in hours · storage held now`;
      const teams = byTeam.rows.map(r => r.team);
      const days = [];
      for (let t = Date.parse(from); t < to.getTime(); t += 86400000) days.push(isoDay(new Date(t)));
      const cell = new Map(byDay.rows.map(r => [r.day + '\n' + r.team, r]));
      const val = (k) => (d, t) => { const r = cell.get(d + '\n' + t); return r ? r[k] / 3600 : 0; };
      plots.forEach(p => p.destroy());
      plots = [dayChart(gpuEl, 'GPU-hours per day', days, teams, val('gpu_seconds')),
               dayChart(cpuEl, 'CPU-slot-hours per day', days, teams, val('cpu_slot_seconds'))];
      const row = (r, name) => h('tr', {dataset: {team: name}},
        h('td', {}, name),
        h('td', {class: 'num', dataset: {k: 'gpu_hours'}, title: `${r.gpu_seconds} s`}, fmtHours(r.gpu_seconds)),
        h('td', {class: 'num', dataset: {k: 'cpu_slot_hours'}, title: `${r.cpu_slot_seconds} s`}, fmtHours(r.cpu_slot_seconds)),
        h('td', {class: 'num', dataset: {k: 'run'}}, String(r.jobs.run)),
        h('td', {class: 'num hide-narrow', dataset: {k: 'succeeded'}}, String(r.jobs.succeeded)),
        h('td', {class: 'num hide-narrow', dataset: {k: 'failed'}}, String(r.jobs.failed)),
        h('td', {class: 'num hide-narrow', dataset: {k: 'cancelled'}}, String(r.jobs.cancelled)),
        h('td', {class: 'num', dataset: {k: 'preempted'}}, String(r.jobs.preempted)),
        h('td', {class: 'num hide-narrow', dataset: {k: 'wait_median'}}, r.wait_s.median === null ? '–' : fmtDuration(r.wait_s.median)),
        h('td', {class: 'num hide-narrow', dataset: {k: 'wait_p95'}}, r.wait_s.p95 === null ? '–' : fmtDuration(r.wait_s.p95)),
        h('td', {class: 'num hide-narrow', dataset: {k: 'storage'},
                 title: `logs ${fmtBytes(r.storage_bytes.logs)}, checkpoints ${fmtBytes(r.storage_bytes.checkpoints)}, contexts ${fmtBytes(r.storage_bytes.contexts)}`},
          fmtBytes(r.storage_bytes.logs + r.storage_bytes.checkpoints + r.storage_bytes.contexts)));
      body.replaceChildren(...(byTeam.rows.length ? byTeam.rows.map(r => row(r, r.team))
                                                 : [h('tr', {}, h('td', {colspan: 11, class: 'empty'}, 'No team.'))]));
      foot.replaceChildren(row(byTeam.totals, 'Total'));
      main.dataset.usageLoaded = String(Number(main.dataset.usageLoaded || 0) + 1);
    } catch (e) { if (e.name !== 'AbortError') err.replaceChildren(errorBox(e)); }
  };
  const form = h('form', {class: 'card row', id: 'usage-form', onsubmit: (ev) => { ev.preventDefault(); load(); }},
    h('label', {class: 'grow'}, 'From (UTC day)', fromIn), h('label', {class: 'grow'}, 'To (UTC day, included)', toIn),
    h('button', {class: 'primary', type: 'submit'}, 'Show'));
  setMain(h('h1', {}, 'Usage'), form, err, status,
    h('div', {class: 'grid2'}, h('div', {class: 'card'}, gpuEl), h('div', {class: 'card'}, cpuEl)),
    h('h2', {}, 'Totals per team'),
    h('div', {class: 'table-wrap'}, h('table', {id: 'usage-teams'}, h('thead', {}, h('tr', {},
      h('th', {}, 'Team'), h('th', {class: 'num'}, 'GPU-h'), h('th', {class: 'num'}, 'CPU-slot-h'), h('th', {class: 'num'}, 'Jobs run'),
      h('th', {class: 'num hide-narrow'}, 'Succeeded'), h('th', {class: 'num hide-narrow'}, 'Failed'), h('th', {class: 'num hide-narrow'}, 'Cancelled'),
      h('th', {class: 'num'}, 'Preempted'), h('th', {class: 'num hide-narrow'}, 'Wait (median)'), h('th', {class: 'num hide-narrow'}, 'Wait (p95)'),
      h('th', {class: 'num hide-narrow'}, 'Storage'))), body, foot)));
  load();
}

/* ------------------------------------------------------------ sweeps */

/* A trial's states that no longer change (ASHA's "paused" does: it may be promoted). */
const TRIAL_ENDED = new Set(['succeeded', 'failed', 'stopped', 'cancelled']);
const TRIAL_COLORS = ['#1f6feb', '#cf222e', '#1a7f37', '#9a6700', '#8250df', '#bf3989', '#0a7b83', '#fb8500',
                      '#57606a', '#6639ba', '#116329', '#a40e26'];
function trialColor(t) { return TRIAL_COLORS[t % TRIAL_COLORS.length]; }
/* ASHA's "stopped" means it was not promoted past a rung: say so. */
function trialBadge(state) { return h('span', {class: 'badge ' + state, 'data-state': state}, state === 'stopped' ? 'stopped early' : state); }
/* A parameter's value: a drawn float to 4 significant digits (the exact
 * value is the cell's title), anything else as the API writes it. */
function fmtValue(v) {
  if (typeof v === 'number' && !Number.isInteger(v)) return String(Number(v.toPrecision(4)));
  return typeof v === 'string' ? v : JSON.stringify(v);
}

/* Trials best first by the sweep's metric in its mode; those with no metric
 * yet last; equal metrics to the lower trial, as the server ranks them. */
function rankTrials(sw) {
  const max = !sw.search || sw.search.mode !== 'min';
  return [...sw.trials].sort((a, b) => {
    const am = typeof a.metric === 'number', bm = typeof b.metric === 'number';
    if (am !== bm) return am ? -1 : 1;
    if (am && a.metric !== b.metric) return max ? b.metric - a.metric : a.metric - b.metric;
    return a.trial - b.trial;
  });
}

/* Short names for a sweep's parameters: the last part of each path
 * (learning_rate, batch_size), or the whole path where two would read alike. */
function paramNames(sw) {
  const paths = Object.keys((sw.search && sw.search.parameters) || {});
  const last = (p) => p.replace(/^.*\./, '');
  const n = new Map();
  paths.forEach(p => n.set(last(p), (n.get(last(p)) || 0) + 1));
  return (p) => (n.get(last(p)) === 1 ? last(p) : p);
}
/* A name with a line break allowed after each "_" and ".", so that
 * val_accuracy or learning_rate fits a phone's narrow column. */
function breakable(name) {
  return name.split(/(?<=[_.])/).flatMap((w, i, a) => (i < a.length - 1 ? [w, h('wbr')] : [w]));
}
function paramList(params, nameOf) {
  return Object.entries(params || {}).map(([k, v]) => h('div', {class: 'param', title: `${k} = ${typeof v === 'string' ? v : JSON.stringify(v)}`},
    h('span', {class: 'muted name'}, breakable(nameOf(k)), ' '), h('span', {class: 'value'}, fmtValue(v))));
}

/* ASHA's rungs, as scheduler/sweep.c makes them: min_epochs × η^k while below max_epochs, then max_epochs. */
function ashaRungs(s) {
  const r = [];
  for (let e = s.min_epochs || 1; e < s.max_epochs && r.length < 32; e *= s.reduction_factor || 3) r.push(e);
  r.push(s.max_epochs);
  return r;
}
function searchText(s) {
  if (!s) return '–';
  if (s.method === 'asha') return `asha: rungs of ${ashaRungs(s).join(', ')} epochs, η ${s.reduction_factor}`;
  return s.method;
}

function pageSweeps() {
  const body = h('tbody');
  const status = h('span', {class: 'small muted', id: 'sweeps-updated'});
  /* An ended sweep no longer changes: its details are fetched once. The list
   * answer has no trials, so the done count and best come from each sweep's own. */
  const ended = new Map();
  const refresh = async () => {
    try {
      const r = await api('/sweeps?limit=50');
      const details = await Promise.all(r.sweeps.map(s => ended.get(s.id) ||
        api('/sweeps/' + s.id).catch(e => { if (e.name === 'AbortError') throw e; return null; })));
      details.forEach(d => { if (d && FINISHED.has(d.state)) ended.set(d.id, d); });
      body.replaceChildren(...(r.sweeps.length ? r.sweeps.map((s, i) => sweepRow(s, details[i]))
        : [h('tr', {}, h('td', {colspan: 7, class: 'empty'}, 'No sweeps yet: POST /api/v1/sweeps or "trainyard sweep" (docs/sweeps.md).'))]));
      status.textContent = 'updated ' + new Date().toLocaleTimeString();
    } catch (e) { if (e.name !== 'AbortError') status.textContent = e.message; }
  };
  setMain(h('h1', {}, 'Sweeps'), h('p', {}, status),
    h('div', {class: 'table-wrap'}, h('table', {id: 'sweeps', class: 'compact'}, h('thead', {}, h('tr', {},
      h('th', {}, 'ID'), h('th', {}, 'Name'), h('th', {}, 'Method'), h('th', {}, 'State'), h('th', {class: 'num'}, 'Trials'),
      h('th', {class: 'num'}, 'Best'), h('th', {class: 'hide-narrow'}, 'Created'))), body)));
  refresh();
  every(3000, refresh);
}

function sweepRow(s, d) {
  const link = (text) => h('a', {href: '#/sweeps/' + s.id}, text);
  const done = d ? d.trials.filter(t => TRIAL_ENDED.has(t.state)).length : null;
  const running = d ? d.trials.filter(t => t.state === 'running').length : 0;
  const metric = s.search ? s.search.metric : '';
  return h('tr', {dataset: {sweepId: s.id, state: s.state}},
    h('td', {}, link('#' + s.id)),
    h('td', {class: 'name'}, link(s.name)),
    h('td', {}, s.search ? s.search.method : '–'),
    h('td', {}, badge(s.state)),
    h('td', {class: 'num', dataset: {k: 'trials'}}, `${done === null ? '–' : done}/${s.n_trials}`,
      running ? h('span', {class: 'small muted block'}, `${running} running`) : null),
    h('td', {class: 'num', dataset: {k: 'best'}}, d && d.best ? fmtNum(d.best.metric) : '–',
      h('span', {class: 'small muted block'}, metric)),
    h('td', {class: 'hide-narrow small'}, new Date(s.created_at).toLocaleString()));
}

/* Every trial's curve of the sweep's metric over epochs on one uPlot chart,
 * a line per trial in the trial's color; the best drawn thicker, trials
 * stopped early dashed. Rebuilt when the trials or their states change,
 * otherwise only its data is replaced. */
class SweepChart {
  constructor(el, metric) {
    this.el = el; this.metric = metric;
    this.curves = new Map();   /* trial -> Map(epoch -> value) */
    this.plot = null; this.shape = ''; this.dirty = true;
  }
  add(trial, epoch, value) {
    if (typeof epoch !== 'number' || typeof value !== 'number' || !isFinite(value)) return;
    if (!this.curves.has(trial)) this.curves.set(trial, new Map());
    this.curves.get(trial).set(epoch, value);
    this.dirty = true;
  }
  width() { return Math.max(260, this.el.clientWidth || this.el.parentElement.clientWidth || 600); }
  draw(sw) {
    const trials = sw.trials.filter(t => t.job_id !== null || this.curves.has(t.trial));
    const best = sw.best ? sw.best.trial : -1;
    const shape = trials.map(t => t.trial + ':' + t.state).join() + '|' + best + '|' + this.width();
    if (!this.dirty && shape === this.shape) return;
    const epochs = [...new Set(trials.flatMap(t => [...(this.curves.get(t.trial) || new Map()).keys()]))].sort((a, b) => a - b);
    const data = [epochs, ...trials.map(t => { const c = this.curves.get(t.trial); return epochs.map(e => (c && c.has(e) ? c.get(e) : null)); })];
    if (shape !== this.shape || !this.plot) {
      if (this.plot) this.plot.destroy();
      this.el.replaceChildren();
      const series = [{label: 'epoch'}].concat(trials.map(t => Object.assign({
        label: `trial ${t.trial}` + (t.trial === best ? ' (best)' : ''), stroke: trialColor(t.trial),
        width: t.trial === best ? 3.5 : 1.5, spanGaps: true, points: {show: true, size: t.trial === best ? 7 : 4},
        value: (u, v) => (v === null || v === undefined ? '–' : v.toFixed(4))}, t.state === 'stopped' ? {dash: [6, 4]} : {})));
      this.plot = new uPlot({title: `${this.metric} per epoch, a line a trial`, width: this.width(), height: 300, series,
        scales: {x: {time: false}}, legend: {live: true},
        axes: [{label: 'epoch', incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000]}, {label: this.metric, size: 60}]}, data, this.el);
      this.shape = shape;
    } else {
      this.plot.setData(data);
    }
    this.dirty = false;
    this.el.dataset.series = String(trials.length);
    this.el.dataset.points = String(data.slice(1).reduce((n, s) => n + s.filter(v => v !== null).length, 0));
    this.el.dataset.best = String(best);
  }
  resize() { this.shape = ''; this.dirty = true; }
}

async function pageSweep(id) {
  let sw;
  try { sw = await api('/sweeps/' + id); } catch (e) { setMain(h('h1', {}, 'Sweep #' + id), errorBox(e)); return; }
  const metric = sw.search.metric;
  const stateEl = h('span', {id: 'sweep-state'});
  const cancelBtn = h('button', {class: 'danger', id: 'cancel-sweep', type: 'button'}, 'Cancel sweep');
  const cancelMsg = h('span', {class: 'small', id: 'cancel-msg', role: 'status'});
  const summary = h('dl', {class: 'kv', id: 'sweep-summary'});
  const bestEl = h('div', {id: 'sweep-best'});
  const chartEl = h('div', {class: 'chart', id: 'sweep-chart'});
  const trialsBody = h('tbody');
  const metricTh = h('th', {class: 'num'}, breakable(metric));
  setMain(
    h('h1', {}, h('span', {}, `Sweep #${sw.id} ${sw.name}`), stateEl, h('span', {class: 'grow'}), cancelMsg, cancelBtn),
    h('div', {class: 'grid2'}, h('div', {class: 'card'}, summary), h('div', {class: 'card'}, bestEl)),
    h('div', {class: 'grid2 sweep-main'},
      h('div', {class: 'card'}, chartEl),
      h('div', {class: 'table-wrap'}, h('table', {id: 'trials', class: 'compact'}, h('thead', {}, h('tr', {},
        h('th', {}, 'Trial'), h('th', {}, 'Params'), h('th', {}, 'State'), h('th', {class: 'num'}, 'Epochs'), metricTh)), trialsBody))));
  const chart = new SweepChart(chartEl, metric);
  const nameOf = paramNames(sw);

  const render = () => {
    stateEl.replaceChildren(badge(sw.state));
    cancelBtn.hidden = FINISHED.has(sw.state);
    const s = sw.search;
    const count = (st) => sw.trials.filter(t => t.state === st).length;
    const done = sw.trials.filter(t => TRIAL_ENDED.has(t.state)).length;
    const more = ['running', 'paused', 'pending', 'stopped', 'failed', 'cancelled'].filter(count)
      .map(st => `${count(st)} ${st === 'stopped' ? 'stopped early' : st}`);
    const kv = [['Team', sw.team], ['Search', searchText(s)],
      ['Metric', `${metric} (${s.mode === 'max' ? 'larger' : 'smaller'} is better)`],
      ['Trials', `${done}/${sw.n_trials} done` + (more.length ? ' · ' + more.join(' · ') : '')],
      ['At once', `at most ${s.max_concurrent}`], ['Created', new Date(sw.created_at).toLocaleString()],
      ['Finished', sw.finished_at ? new Date(sw.finished_at).toLocaleString() : '–'],
      ['Elapsed', fmtDuration(((sw.finished_at ? Date.parse(sw.finished_at) : Date.now()) - Date.parse(sw.created_at)) / 1000)],
      ['Reason', sw.reason || '–']];
    summary.replaceChildren(...kv.flatMap(([k, v]) => [h('dt', {}, k), h('dd', {}, String(v))]));
    const b = sw.best;
    bestEl.replaceChildren(h('div', {class: 'chart-title'}, 'Best trial'), b ? h('dl', {class: 'kv'},
      h('dt', {}, 'Trial'), h('dd', {}, h('span', {class: 'swatch', style: null, dataset: {trial: b.trial}}), `trial ${b.trial} · `,
        h('a', {href: '#/jobs/' + b.job_id}, 'job #' + b.job_id)),
      h('dt', {}, metric), h('dd', {id: 'best-metric', dataset: {metric: String(b.metric)}}, fmtNum(b.metric)),
      h('dt', {}, 'Params'), h('dd', {}, paramList(b.params, nameOf)),
      h('dt', {}, 'Checkpoint'), h('dd', {}, b.checkpoint ? h('a', {href: '#/jobs/' + b.job_id}, `#${b.checkpoint} (on the job's page)`) : '–'))
      : h('p', {class: 'muted'}, 'No trial has reported its metric yet.'));
    bestEl.querySelectorAll('.swatch').forEach(el => { el.style.background = trialColor(Number(el.dataset.trial)); });
    const best = b ? b.trial : -1;
    trialsBody.replaceChildren(...rankTrials(sw).map(t => {
      const sw_ = h('span', {class: 'swatch'});
      sw_.style.background = trialColor(t.trial);   /* a style property, not markup: the CSP allows it */
      return h('tr', {class: t.trial === best ? 'best' : null, dataset: {trial: t.trial, state: t.state, best: t.trial === best ? '1' : null}},
        h('td', {class: 'trial'}, sw_, t.job_id !== null ? h('a', {href: '#/jobs/' + t.job_id, title: 'job #' + t.job_id}, 't' + t.trial) : 't' + t.trial,
          t.trial === best ? h('span', {class: 'best-mark', title: `the best ${metric}`}, '★ best') : null),
        h('td', {class: 'params'}, paramList(t.params, nameOf)),
        h('td', {}, trialBadge(t.state), t.reason && t.state !== 'succeeded' && t.state !== 'stopped' ? h('div', {class: 'small muted reason'}, t.reason) : null),
        h('td', {class: 'num', dataset: {k: 'epochs'}}, String(t.epochs), s.method === 'asha' ? h('span', {class: 'small muted block'}, 'rung ' + t.rung) : null),
        h('td', {class: 'num', dataset: {k: 'metric', metric: t.metric === null ? '' : String(t.metric)}}, fmtNum(t.metric)));
    }));
    chart.draw(sw);
  };

  /* Each trial's epoch rows, from where the last read ended; a trial is read
   * while it runs and once more when its state changes (its last epochs). */
  const seq = new Map(), readIn = new Map();
  const readCurves = async () => {
    await Promise.all(sw.trials.filter(t => t.job_id !== null && (t.state === 'running' || readIn.get(t.trial) !== t.state)).map(async (t) => {
      const state = t.state;
      try {
        for (;;) {
          const r = await api(`/jobs/${t.job_id}/metrics?kind=epoch&since=${seq.get(t.trial) || 0}&limit=1000`);
          r.metrics.forEach(m => chart.add(t.trial, m.epoch, m[metric]));
          if (!r.metrics.length) break;
          seq.set(t.trial, r.metrics[r.metrics.length - 1].seq);
        }
        readIn.set(t.trial, state);
      } catch (e) { if (e.name === 'AbortError') throw e; /* next time */ }
    }));
  };

  let busy = false, settled = false;   /* settled: read in full after it ended */
  const refresh = async (force) => {
    if (busy || (settled && !force)) return;
    busy = true;
    try {
      sw = await api('/sweeps/' + id);
      await readCurves();
      render();
      settled = FINISHED.has(sw.state);
      main.dataset.sweepLoaded = String(Number(main.dataset.sweepLoaded || 0) + 1);
    } catch (e) { if (e.name !== 'AbortError') cancelMsg.textContent = e.message; }
    busy = false;
  };

  cancelBtn.addEventListener('click', async () => {
    if (!cancelBtn.classList.contains('confirm')) {
      cancelBtn.classList.add('confirm');
      cancelBtn.textContent = `Yes, cancel sweep #${id}`;
      cancelMsg.textContent = 'Its running trials stop; results so far are kept.';
      return;
    }
    cancelBtn.disabled = true;
    try {
      await api(`/sweeps/${id}/cancel`, {method: 'POST'});
      cancelMsg.textContent = 'Cancelled.';
      await refresh(true);
    } catch (e) { cancelMsg.textContent = e.message; }
    cancelBtn.disabled = false;
    cancelBtn.classList.remove('confirm');
    cancelBtn.textContent = 'Cancel sweep';
  });

  const onResize = () => { chart.resize(); chart.draw(sw); };
  window.addEventListener('resize', onResize);
  pageTimers.push({off: () => window.removeEventListener('resize', onResize)});
  main.dataset.sweepLoaded = '0';
  render();
  await refresh(true);
  /* live while it runs; an ended sweep's page is read once */
  every(2000, () => refresh(false));
}

/* ------------------------------------------------------------ audit */

/* GET /api/v1/audit: the chosen team's (its admins) or all (the admin token),
 * filtered by user, action and since; CSV through fetch (a link could not
 * send the credential's headers), saved as a blob. */
function pageAudit() {
  const user = h('input', {id: 'audit-user', name: 'user', placeholder: 'ada', autocomplete: 'off'});
  const action = h('input', {id: 'audit-action', name: 'action', placeholder: 'cancel', autocomplete: 'off'});
  const since = h('input', {id: 'audit-since', name: 'since', type: 'datetime-local'});
  const body = h('tbody');
  const msg = h('p', {class: 'small muted', id: 'audit-status', role: 'status'});
  const query = () => {
    const q = new URLSearchParams({limit: '200'});
    if (session && !session.cluster_admin && chosenTeam()) q.set('team', chosenTeam());
    if (user.value.trim()) q.set('user', user.value.trim());
    if (action.value.trim()) q.set('action', action.value.trim());
    if (since.value) q.set('since', new Date(since.value).toISOString());
    return '/audit?' + q.toString();
  };
  const refresh = async () => {
    try {
      const r = await api(query());
      body.replaceChildren(...(r.audit.length ? r.audit.map(a => h('tr', {dataset: {id: a.id}},
        h('td', {}, new Date(a.time).toLocaleString()), h('td', {}, a.actor),
        h('td', {class: 'route'}, `${a.method} ${a.route}`), h('td', {class: 'hide-narrow'}, a.target || ''),
        h('td', {class: 'hide-narrow'}, a.team || ''), h('td', {class: 'num'}, String(a.status)),
        h('td', {class: 'hide-narrow'}, a.client || '')))
        : [h('tr', {}, h('td', {colspan: 7, class: 'empty'}, 'Nothing matches.'))]));
      msg.textContent = `${r.audit.length} row${r.audit.length === 1 ? '' : 's'}` + (r.next_before ? ' (the newest; narrow the filters for older ones)' : '');
    } catch (e) { if (e.name !== 'AbortError') msg.textContent = e.message; }
  };
  const csv = h('button', {type: 'button', id: 'audit-csv'}, 'Download CSV');
  csv.addEventListener('click', async () => {
    try {
      const r = await fetch('/api/v1' + query(), {headers: Object.assign(authHeaders(), {Accept: 'text/csv'})});
      if (!r.ok) throw new Error(`HTTP ${r.status}`);
      const url = URL.createObjectURL(await r.blob());
      const a = h('a', {href: url, download: 'audit.csv'});
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 1000);
    } catch (e) { msg.textContent = 'CSV: ' + e.message; }
  });
  const form = h('form', {class: 'card filters', id: 'audit-filters', onsubmit: (ev) => { ev.preventDefault(); refresh(); }},
    h('label', {}, 'User', user), h('label', {}, 'Action', action), h('label', {}, 'Since', since),
    h('label', {}, '\u00a0', h('button', {class: 'primary', type: 'submit'}, 'Filter')), h('label', {}, '\u00a0', csv));
  const scope = session && !session.cluster_admin ? `team ${chosenTeam() || '(none)'}` : 'all teams';
  setMain(h('h1', {}, 'Audit', h('span', {class: 'small muted'}, scope)), form, msg,
    h('div', {class: 'table-wrap'}, h('table', {id: 'audit', class: 'audit'},
      h('thead', {}, h('tr', {}, h('th', {}, 'Time'), h('th', {}, 'Who'), h('th', {}, 'Action'),
        h('th', {class: 'hide-narrow'}, 'Target'), h('th', {class: 'hide-narrow'}, 'Team'), h('th', {class: 'num'}, 'Status'),
        h('th', {class: 'hide-narrow'}, 'From'))), body)));
  refresh();
}

/* ------------------------------------------------------------ who, and the team */

/* The header's name and team switcher for a signed-in person. */
function showWho() {
  const who = document.getElementById('who');
  const sel = document.getElementById('team-switch');
  who.hidden = !session;
  if (!session) return;
  document.getElementById('who-name').textContent = session.name;
  const teams = (session.teams || []).map(t => t.team);
  if (teams.length && !teams.includes(chosenTeam())) localStorage.setItem(TEAM_KEY, teams[0]);
  sel.replaceChildren(...(session.teams || []).map(t => h('option', {value: t.team}, `${t.team} (${t.role})`)));
  sel.value = chosenTeam();
  sel.hidden = !teams.length;
}

/* ------------------------------------------------------------ router */

function route() {
  pageTimers.forEach(t => (t && t.off ? t.off() : clearInterval(t)));
  pageTimers = [];
  if (pageAbort) pageAbort.abort();
  pageAbort = new AbortController();
  const hash = location.hash.replace(/^#/, '') || '/jobs';
  const signedIn = !!token() || !!session;
  document.getElementById('nav').hidden = !signedIn;
  document.getElementById('signout').hidden = !signedIn;
  showWho();
  if (!signedIn) { pageSignin(); return; }
  const parts = hash.split('/').filter(Boolean);
  document.querySelectorAll('[data-nav]').forEach(a => a.classList.toggle('active', a.dataset.nav === parts[0]));
  window.scrollTo(0, 0);
  if (parts[0] === 'jobs' && /^[0-9]+$/.test(parts[1] || '') && parts[2] === 'shell' && parts[3])
    pageShell(parts[1], (() => { try { return decodeURIComponent(parts[3]); } catch (e) { return parts[3]; } })());
  else if (parts[0] === 'jobs' && /^[0-9]+$/.test(parts[1] || '')) pageJob(parts[1]);
  else if (parts[0] === 'submit') pageSubmit();
  else if (parts[0] === 'queue') pageQueue();
  else if (parts[0] === 'cluster') pageCluster();
  else if (parts[0] === 'usage') pageUsage();
  else if (parts[0] === 'audit') pageAudit();
  else if (parts[0] === 'sweeps' && /^[0-9]+$/.test(parts[1] || '')) pageSweep(parts[1]);
  else if (parts[0] === 'sweeps') pageSweeps();
  else if (parts[0] === 'signin') { location.hash = '#/jobs'; }
  else pageJobs();
}

document.getElementById('signout').addEventListener('click', () => signOut());
document.getElementById('team-switch').addEventListener('change', (ev) => {
  localStorage.setItem(TEAM_KEY, ev.target.value);
  route();
});
window.addEventListener('hashchange', route);

/* A pasted token, else a session cookie (a sign-in came back here): /me says
 * whether there is one, and who. */
async function boot() {
  if (!token()) {
    try {
      const r = await fetch('/api/v1/me');
      if (r.ok) {
        const me = await r.json();
        if (me.kind === 'user' && me.csrf) session = me;
      }
    } catch (e) { /* no session: the sign-in page */ }
  }
  route();
}
boot();
