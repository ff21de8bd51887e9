// usage.test.mjs - the dashboard's Usage page in headless Chromium (Debian's,
// driven by playwright-core) against the real `trainyard up` with real jobs:
// two teams run short command jobs, then the admin opens #/usage and sees, per
// team and in total, the GPU- and CPU-slot-hours, jobs and preemptions that
// GET /api/v1/usage answers for the same days; the two charts are drawn; a
// team token sees only its own team; desktop and phone widths without
// sideways scrolling. Screenshots go to $WEB_TEST_OUT (default build/web-test).
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
let srv, ctx, page, profile, admin, vision;
const pageErrors = [];

const sleepJob = (name, secs, extra = {}) => JSON.stringify({name, command: {argv: ['sleep', String(secs)]}, max_restarts: 0, ...extra});

async function waitState(id, want, token) {
  for (let i = 0; i < 600; i++) {
    const r = await srv.api('/jobs/' + id, {token});
    if (r.body.state === want) return;
    if (['succeeded', 'failed', 'cancelled'].includes(r.body.state)) throw new Error(`job ${id} is ${r.body.state}, not ${want}`);
    await new Promise(res => setTimeout(res, 100));
  }
  throw new Error(`job ${id} never reached ${want}`);
}

/* The page's window: the last 14 UTC days, today included. */
function pageWindow() {
  const today = new Date().toISOString().slice(0, 10);
  const from = new Date(Date.parse(today + 'T00:00:00Z') - 13 * 86400000).toISOString();
  const to = new Date(Date.parse(today + 'T00:00:00Z') + 86400000).toISOString();
  return `from=${encodeURIComponent(from)}&to=${encodeURIComponent(to)}`;
}

async function signIn(token) {
  await page.goto(srv.url + '/');
  await page.evaluate((t) => { localStorage.setItem('trainyard.token', t); }, token);
  await page.goto(srv.url + '/?signin=' + Date.now() + '#/usage'); /* a new document, with the token */
  await page.waitForFunction(() => Number(document.getElementById('main').dataset.usageLoaded || 0) >= 1);
}

/* What the table shows, per team (and 'Total'). */
async function tableCells() {
  return page.$$eval('#usage-teams tr[data-team]', rows => Object.fromEntries(rows.map(r =>
    [r.dataset.team, Object.fromEntries([...r.querySelectorAll('td[data-k]')].map(td => [td.dataset.k, td.textContent]))])));
}

async function coloredPixels(sel) {
  return page.$eval(sel + ' canvas', (c) => {
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    let n = 0;
    for (let i = 0; i < d.length; i += 4) {
      const mx = Math.max(d[i], d[i + 1], d[i + 2]), mn = Math.min(d[i], d[i + 1], d[i + 2]);
      if (d[i + 3] > 0 && mx - mn > 60) n++;
    }
    return n;
  });
}

function expectRow(shown, r, what) {
  assert.ok(shown, `${what}: no row in the table`);
  assert.equal(shown.gpu_hours, (r.gpu_seconds / 3600).toFixed(3), `${what}: GPU-hours`);
  assert.equal(shown.cpu_slot_hours, (r.cpu_slot_seconds / 3600).toFixed(3), `${what}: CPU-slot-hours`);
  assert.equal(shown.run, String(r.jobs.run), `${what}: jobs run`);
  assert.equal(shown.succeeded, String(r.jobs.succeeded), `${what}: succeeded`);
  assert.equal(shown.cancelled, String(r.jobs.cancelled), `${what}: cancelled`);
  assert.equal(shown.preempted, String(r.jobs.preempted), `${what}: preempted`);
}

before(async () => {
  fs.mkdirSync(OUT, {recursive: true});
  srv = await startUp({cpuSlots: 2});
  admin = fs.readFileSync(path.join(srv.dir, 'admin.token'), 'utf8').trim();
  const t = await srv.api('/teams', {method: 'POST', token: admin, body: JSON.stringify({name: 'vision'})});
  assert.equal(t.status, 201);
  vision = t.body.token;
  /* default: two short jobs; vision: a preemptible job preempted by default's higher priority, then cancelled */
  const j1 = (await srv.api('/jobs', {method: 'POST', body: sleepJob('d-short', 3)})).body.id;
  const j2 = (await srv.api('/jobs', {method: 'POST', token: vision, body: sleepJob('v-short', 2)})).body.id;
  await waitState(j1, 'succeeded');
  await waitState(j2, 'succeeded', vision);
  const both = {strategy: {type: 'multi_worker_mirrored'}, resources: {workers: 2}};
  const low = (await srv.api('/jobs', {method: 'POST', token: vision, body: sleepJob('v-low', 120, {...both, priority: 10, preemptible: true})})).body.id;
  await waitState(low, 'running', vision);
  const high = (await srv.api('/jobs', {method: 'POST', body: sleepJob('d-high', 2, {...both, priority: 90})})).body.id;
  await waitState(high, 'succeeded');
  await waitState(low, 'running', vision);
  await srv.api(`/jobs/${low}/cancel`, {method: 'POST', token: vision});
  await waitState(low, 'cancelled', vision);
  await new Promise(res => setTimeout(res, 1500)); /* its tasks report their exit */
  profile = fs.mkdtempSync(path.join(os.tmpdir(), 'ty_chromium_'));
  ctx = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium', headless: true, viewport: DESKTOP,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
           '--disable-component-update', '--disable-sync'],
  });
  page = ctx.pages()[0] || await ctx.newPage();
  page.setDefaultTimeout(30000);
  page.on('pageerror', (e) => pageErrors.push(e.message));
});

after(async () => {
  if (ctx) await ctx.close();
  if (srv) await srv.stop();
  if (profile) fs.rmSync(profile, {recursive: true, force: true});
});

test('the admin sees each team\'s usage as the API tells it', async () => {
  await signIn(admin);
  const api = await srv.api('/usage?by=team&' + pageWindow(), {token: admin});
  assert.equal(api.status, 200);
  const shown = await tableCells();
  assert.deepEqual(Object.keys(shown).sort(), ['Total', 'default', 'vision']);
  for (const r of api.body.rows) expectRow(shown[r.team], r, r.team);
  expectRow(shown.Total, api.body.totals, 'Total');
  /* what the jobs did: vision's low job was preempted once and cancelled */
  const v = api.body.rows.find(r => r.team === 'vision');
  assert.equal(v.jobs.preempted, 1);
  assert.equal(v.jobs.cancelled, 1);
  assert.ok(Number(shown.default.cpu_slot_hours) > 0 && Number(shown.vision.cpu_slot_hours) > 0);
  /* the charts: one series a team, drawn */
  assert.ok(await coloredPixels('#usage-cpu') > 50, 'the CPU-slot-hours chart is drawn');
  assert.ok(await page.$('#usage-gpu canvas'), 'the GPU-hours chart is there');
  const legend = await page.$$eval('#usage-cpu .u-legend .u-label', els => els.map(e => e.textContent));
  assert.ok(legend.includes('default') && legend.includes('vision'), `legend: ${legend}`);
  for (const [vp, tag] of [[DESKTOP, 'desktop'], [PHONE, 'phone']]) {
    await page.setViewportSize(vp);
    await page.goto(srv.url + '/#/jobs');
    await page.goto(srv.url + '/#/usage');
    await page.waitForFunction(() => Number(document.getElementById('main').dataset.usageLoaded || 0) >= 1);
    assert.ok(await page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth + 1), `no sideways scrolling on the ${tag}`);
    await page.screenshot({path: path.join(OUT, `dashboard-usage-${tag}.png`), fullPage: true});
  }
  await page.setViewportSize(DESKTOP);
});

test('a team sees its own team only', async () => {
  await signIn(vision);
  const shown = await tableCells();
  assert.deepEqual(Object.keys(shown).sort(), ['Total', 'vision']);
  const api = await srv.api('/usage?by=team&' + pageWindow(), {token: vision});
  expectRow(shown.vision, api.body.rows[0], 'vision');
  /* a range with nothing in it: zeros, and the same as the API */
  await page.fill('#usage-from', '2026-01-01');
  await page.fill('#usage-to', '2026-01-02');
  await page.click('#usage-form button[type=submit]');
  await page.waitForFunction(() => Number(document.getElementById('main').dataset.usageLoaded || 0) >= 2);
  const empty = await tableCells();
  assert.equal(empty.vision.cpu_slot_hours, '0.000');
  assert.equal(empty.vision.run, '0');
  assert.deepEqual(pageErrors, []);
});
