// sweep.test.mjs - the dashboard's sweep pages in headless Chromium (Debian's,
// driven by playwright-core) against the real `trainyard up`: a 2x2 grid
// sweep of a small Fashion-MNIST job (learning rate x batch size, 2 epochs
// each) is submitted through the API and watched on its page until it ends;
// the trials' table shows every trial with the metric the API answers,
// ranked, the best marked; the chart has a line per trial in that trial's
// color; the Sweeps list shows trials done and the best; desktop and phone
// widths without sideways scrolling. An ASHA sweep's trials that were not
// promoted read "stopped early". Then a command-job sweep whose
// parameter values are markup shows them as text, and is cancelled with its
// page's button. Screenshots go to $WEB_TEST_OUT (default build/web-test).
import {test, before, after} from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {chromium} from 'playwright-core';
import {startUp} from './server.mjs';

const OUT = process.env.WEB_TEST_OUT || 'build/web-test';
const DESKTOP = {width: 1280, height: 900};
const PHONE = {width: 390, height: 844};
const EVIL = '<img src=x onerror="window.pwned=1">';
let srv, ctx, page, profile;
const pageErrors = [];

/* examples/fashion_mnist_quick.json on a 2,000-example slice with a smaller hidden layer */
const JOB = {name: 'fashion-quick', model: {layers: [{type: 'flatten', input_shape: [28, 28]}, {type: 'dense', units: 32, activation: 'relu'},
  {type: 'dense', units: 10, activation: 'softmax'}]}, compile: {optimizer: {type: 'adam', learning_rate: 0.001},
  loss: 'sparse_categorical_crossentropy', metrics: ['accuracy']}, data: {source: 'fashion-mnist', limit: 2000, validation_split: 0.2, seed: 7},
  fit: {epochs: 2, batch_size: 64}, max_runtime_s: 300};
const GRID = {name: 'lr-bs', job: JOB, search: {method: 'grid', metric: 'val_accuracy', mode: 'max', max_concurrent: 2,
  parameters: {'compile.optimizer.learning_rate': {values: [0.003, 0.0003]}, 'fit.batch_size': {values: [32, 128]}}}};

async function shot(name) {
  await page.screenshot({path: path.join(OUT, name + '.png'), fullPage: true});
}
const noSideways = () => page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth + 1);

/* Pixels of the chart's canvas close to a color (a trial's line and points). */
async function pixelsOf(sel, hex) {
  return page.$eval(sel + ' canvas', (c, hex) => {
    const want = [1, 3, 5].map(i => parseInt(hex.slice(i, i + 2), 16));
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    let n = 0;
    for (let i = 0; i < d.length; i += 4)
      if (d[i + 3] > 200 && Math.abs(d[i] - want[0]) < 24 && Math.abs(d[i + 1] - want[1]) < 24 && Math.abs(d[i + 2] - want[2]) < 24) n++;
    return n;
  }, hex);
}

/* A new document each time: a change of the hash alone would leave the
 * page before it on screen until the router has run. */
async function openSweep(id) {
  await page.goto(`${srv.url}/?s=${Date.now()}#/sweeps/${id}`);
  await page.waitForSelector('#sweep-state .badge');
}

async function sweepOf(id) {
  const r = await srv.api('/sweeps/' + id);
  assert.equal(r.status, 200);
  return r.body;
}

before(async () => {
  fs.mkdirSync(OUT, {recursive: true});
  srv = await startUp({cpuSlots: 2});
  profile = fs.mkdtempSync(path.join(os.tmpdir(), 'ty_chromium_'));
  ctx = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium', headless: true, viewport: DESKTOP,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
           '--disable-component-update', '--disable-sync'],
  });
  page = ctx.pages()[0] || await ctx.newPage();
  page.setDefaultTimeout(30000);
  page.on('pageerror', (e) => pageErrors.push(e.message));
  await page.goto(srv.url + '/');
  await page.evaluate((t) => { localStorage.setItem('trainyard.token', t); }, srv.token);
});

after(async () => {
  if (ctx) await ctx.close();
  if (srv) await srv.stop();
  if (profile) fs.rmSync(profile, {recursive: true, force: true});
});

test('a grid sweep: every trial, its metric and curve, the best marked, live until it ends', async () => {
  // a job holds both CPU slots, so the sweep is still running when its page opens
  const hold = await srv.api('/jobs', {method: 'POST', body: JSON.stringify({name: 'hold', max_restarts: 0,
    command: {argv: ['sleep', '600']}, strategy: {type: 'multi_worker_mirrored'}, resources: {workers: 2}})});
  assert.equal(hold.status, 201, JSON.stringify(hold.body));
  const r = await srv.api('/sweeps', {method: 'POST', body: JSON.stringify(GRID)});
  assert.equal(r.status, 201, JSON.stringify(r.body));
  const id = r.body.id;
  // opened while it runs: the page follows it to its end without a reload
  await openSweep(id);
  assert.equal(await page.getAttribute('#sweep-state .badge', 'data-state'), 'running');
  assert.match(await page.textContent('#sweep-summary'), /0\/4 done/);
  assert.equal((await srv.api(`/jobs/${hold.body.id}/cancel`, {method: 'POST'})).status, 200);
  await page.waitForSelector('#sweep-state [data-state="succeeded"]', {timeout: 240000});
  await page.waitForFunction(() => Number(document.querySelector('#sweep-chart')?.dataset.points) === 8);
  const api = await sweepOf(id);
  assert.equal(api.state, 'succeeded');
  assert.equal(api.trials.length, 4);

  // the table: every trial with the API's state, epochs and metric, best first
  const rows = await page.$$eval('#trials tbody tr', trs => trs.map(tr => ({
    trial: Number(tr.dataset.trial), state: tr.dataset.state, best: tr.dataset.best === '1',
    params: tr.querySelector('td.params').textContent, epochs: tr.querySelector('[data-k="epochs"]').textContent,
    metricText: tr.querySelector('[data-k="metric"]').textContent, metric: tr.querySelector('[data-k="metric"]').dataset.metric,
    mark: !!tr.querySelector('.best-mark')})));
  assert.equal(rows.length, 4, 'a row per trial');
  const byTrial = new Map(api.trials.map(t => [t.trial, t]));
  for (const row of rows) {
    const t = byTrial.get(row.trial);
    assert.ok(t, `trial ${row.trial} is the API's`);
    assert.equal(row.state, t.state);
    assert.equal(t.state, 'succeeded');
    assert.equal(row.epochs, String(t.epochs));
    assert.equal(t.epochs, 2);
    assert.equal(typeof t.metric, 'number');
    assert.equal(row.metric, String(t.metric), `trial ${t.trial}: the API's metric`);
    assert.equal(row.metricText, t.metric.toFixed(4));
    assert.ok(row.params.includes('learning_rate ' + JSON.stringify(t.params['compile.optimizer.learning_rate'])), row.params);
    assert.ok(row.params.includes('batch_size ' + JSON.stringify(t.params['fit.batch_size'])), row.params);
  }
  const shown = rows.map(x => x.metric).map(Number);
  assert.deepEqual(shown, [...shown].sort((a, b) => b - a), 'ranked by val_accuracy, larger first');
  assert.ok(api.best, 'the API names a best trial');
  assert.equal(rows[0].trial, api.best.trial, 'the best on top');
  assert.deepEqual(rows.filter(x => x.best).map(x => x.trial), [api.best.trial], 'one row marked best: the API\'s');
  assert.ok(rows[0].mark, 'the best row says so');
  assert.equal(await page.getAttribute('#best-metric', 'data-metric'), String(api.best.metric));

  // the chart: one line per trial, each in its trial's color, the best thicker and named
  assert.equal(await page.getAttribute('#sweep-chart', 'data-series'), '4');
  assert.equal(await page.getAttribute('#sweep-chart', 'data-best'), String(api.best.trial));
  const legend = await page.$$eval('#sweep-chart .u-legend .u-series .u-label', ls => ls.map(l => l.textContent));
  assert.deepEqual(legend.slice(1).sort(), api.trials.map(t => `trial ${t.trial}` + (t.trial === api.best.trial ? ' (best)' : '')).sort());
  const colors = await page.$$eval('#trials tbody tr', trs => trs.map(tr => [Number(tr.dataset.trial), getComputedStyle(tr.querySelector('.swatch')).backgroundColor]));
  for (const [trial, rgb] of colors) {
    const hex = '#' + rgb.match(/\d+/g).slice(0, 3).map(v => Number(v).toString(16).padStart(2, '0')).join('');
    assert.ok(await pixelsOf('#sweep-chart', hex) > 20, `trial ${trial}'s line is drawn in its color ${hex}`);
  }
  // each point the chart holds is the metric of that trial's job at that epoch
  for (const t of api.trials) {
    const m = await srv.api(`/jobs/${t.job_id}/metrics?kind=epoch`);
    const vals = m.body.metrics.map(x => x.val_accuracy);
    assert.equal(vals.length, 2, `trial ${t.trial}: 2 epochs`);
    assert.equal(Math.max(...vals), t.metric, `trial ${t.trial}: its metric is its best epoch`);
  }

  // the job of a trial links back to its sweep
  await page.click(`#trials tr[data-trial="${api.best.trial}"] td.trial a`);
  await page.waitForSelector('#job-sweep');
  assert.equal(await page.textContent('#job-sweep'), `sweep #${id}, trial ${api.best.trial}`);

  // the list: trials done/total and the best metric
  await page.goto(`${srv.url}/#/sweeps`);
  const row = `#sweeps tr[data-sweep-id="${id}"]`;
  await page.waitForSelector(row);
  assert.equal(await page.textContent(`${row} [data-k="trials"]`), '4/4');
  assert.match(await page.textContent(`${row} [data-k="best"]`), new RegExp('^' + api.best.metric.toFixed(4).replace('.', '\\.') + 'val_accuracy$'));
  assert.equal(await page.getAttribute(row, 'data-state'), 'succeeded');

  for (const [vp, tag] of [[DESKTOP, 'desktop'], [PHONE, 'phone']]) {
    await page.setViewportSize(vp);
    await page.goto(`${srv.url}/#/sweeps`);
    await page.waitForSelector(row);
    assert.ok(await noSideways(), `no sideways scrolling on the sweeps list at the ${tag}'s width`);
    await shot('sweeps-' + tag);
    await page.goto(`${srv.url}/#/sweeps/${id}`);
    await page.waitForFunction(() => Number(document.querySelector('#sweep-chart')?.dataset.points) === 8);
    await page.waitForTimeout(300);
    await shot('sweep-' + tag);
    assert.ok(await noSideways(), `no sideways scrolling on the sweep page at the ${tag}'s width`);
    const wrap = await page.$eval('#trials', t => t.parentElement.scrollWidth <= t.parentElement.clientWidth + 1);
    assert.ok(wrap, `the trials' table fits the ${tag}'s width`);
  }
  await page.setViewportSize(DESKTOP);
});

test('an ASHA sweep: trials not promoted read "stopped early", the chart holds each trial\'s epochs', async () => {
  const asha = {name: 'asha', job: JOB, search: {method: 'asha', metric: 'val_loss', mode: 'min', max_trials: 4, max_concurrent: 2,
    max_epochs: 3, reduction_factor: 3, seed: 3, parameters: {'compile.optimizer.learning_rate': {log_uniform: [0.0001, 0.03]}}}};
  const r = await srv.api('/sweeps', {method: 'POST', body: JSON.stringify(asha)});
  assert.equal(r.status, 201, JSON.stringify(r.body));
  await openSweep(r.body.id);
  await page.waitForSelector('#sweep-state [data-state="succeeded"]', {timeout: 240000});
  const api = await sweepOf(r.body.id);
  const epochs = api.trials.reduce((n, t) => n + t.epochs, 0);
  await page.waitForFunction((n) => Number(document.querySelector('#sweep-chart')?.dataset.points) === n, epochs);
  const stopped = api.trials.filter(t => t.state === 'stopped');
  assert.ok(stopped.length >= 1, 'ASHA stopped a trial early: ' + JSON.stringify(api.trials.map(t => [t.state, t.epochs, t.rung, t.reason])));
  for (const t of stopped)
    assert.equal(await page.textContent(`#trials tr[data-trial="${t.trial}"] .badge`), 'stopped early');
  assert.equal(await page.getAttribute('#sweep-chart', 'data-series'), '4');
  assert.match(await page.textContent('#sweep-summary'), /asha: rungs of 1, 3 epochs, η 3/);
  const first = await page.getAttribute('#trials tbody tr:first-child', 'data-trial');
  assert.equal(Number(first), api.best.trial, 'the smallest val_loss on top');
});

test('parameter values are shown as text, and a running sweep is cancelled from its page', async () => {
  const spec = {name: 'markup', job: {name: 'markup', max_restarts: 0, command: {argv: ['/bin/sh', '-c',
    'echo "trainyard-metric {\\"kind\\": \\"epoch\\", \\"epoch\\": 1, \\"val_loss\\": 0.5}"; sleep "$NAP"']}},
    search: {method: 'grid', metric: 'val_loss', mode: 'min', max_concurrent: 1,
      parameters: {'command.env.NOTE': {values: [EVIL]}, 'command.env.NAP': {values: [0, 120]}}}};
  const r = await srv.api('/sweeps', {method: 'POST', body: JSON.stringify(spec)});
  assert.equal(r.status, 201, JSON.stringify(r.body));
  const id = r.body.id;
  for (let i = 0; i < 600; i++) {
    const s = await sweepOf(id);
    if (s.trials[0].state === 'succeeded' && s.trials[1].state === 'running') break;
    assert.equal(s.state, 'running');
    await new Promise(res => setTimeout(res, 100));
  }
  await openSweep(id);
  await page.waitForSelector('#trials tr[data-trial="1"][data-state="running"]');
  await page.waitForFunction(() => Number(document.querySelector('#sweep-chart')?.dataset.points) >= 1);
  assert.match(await page.textContent('#trials tr[data-trial="0"] td.params'), /<img src=x onerror="window\.pwned=1">/);
  assert.match(await page.textContent('#sweep-best'), /<img src=x onerror/);
  assert.equal(await page.locator('#main img').count(), 0, 'no element made of a parameter');
  assert.equal(await page.evaluate(() => window.pwned), undefined);

  await page.click('#cancel-sweep');
  assert.match(await page.textContent('#cancel-sweep'), /Yes, cancel sweep/);
  await page.click('#cancel-sweep');
  await page.waitForSelector('#sweep-state [data-state="cancelled"]');
  await page.waitForSelector('#trials tr[data-trial="1"][data-state="cancelled"]');
  assert.ok(await page.isHidden('#cancel-sweep'), 'no cancel button once it ended');
  const s = await sweepOf(id);
  assert.equal(s.state, 'cancelled');
  const job = await srv.api('/jobs/' + s.trials[1].job_id);
  assert.equal(job.body.state, 'cancelled', 'the running trial\'s job is cancelled');
  assert.deepEqual(pageErrors, [], 'no script errors in the page');
});
