// standby.test.mjs - the dashboard on a standby, in headless Chromium (Debian's,
// driven by playwright-core): two real `trainyard server`s on one real
// PostgreSQL 15 (scripts/pg-dev.sh), one leading. The standby's dashboard says
// it is a standby and links to the same page on the leader, which shows the
// jobs; once the leader is killed (-9) and the standby leads, the same page
// there shows the jobs and no notice. Screenshots go to $WEB_TEST_OUT. Without
// PostgreSQL 15 the test says SKIP (a failure under PG_TEST_REQUIRED=1).
import {test, before, after} from 'node:test';
import assert from 'node:assert/strict';
import {spawn, spawnSync} from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import {chromium} from 'playwright-core';

const OUT = process.env.WEB_TEST_OUT || 'build/web-test';
const BIN = process.env.TRAINYARD_BIN || 'build/asan/trainyard';
const HAVE_PG = fs.existsSync('/usr/lib/postgresql/15/bin/postgres');
let dir, pgdir, dbUrl, servers = [], ctx, page, profile, token;
const pageErrors = [];

async function freePort() {
  return new Promise((res, rej) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => res(p)); });
    s.on('error', rej);
  });
}

async function role(url) {
  try {
    const r = await fetch(url + '/api/v1/health');
    return r.status === 200 ? (await r.json()).role : '';
  } catch { return ''; }
}

async function waitRole(url, want, ms = 30000) {
  for (const end = Date.now() + ms; Date.now() < end;) {
    if (await role(url) === want) return;
    await new Promise(r => setTimeout(r, 100));
  }
  throw new Error(`${url} did not become ${want}`);
}

async function startServer(name) {
  const data = path.join(dir, name);
  fs.mkdirSync(data, {mode: 0o700});
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const log = fs.openSync(path.join(data, 'server.log'), 'a');
  const proc = spawn(BIN, ['server', '--listen', `127.0.0.1:${port}`, '--data', data, '--db', dbUrl],
                     {stdio: ['ignore', log, log]});
  servers.push(proc);
  return {url, data, proc};
}

before(async () => {
  if (!HAVE_PG) return;
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ty_web_standby_'));
  fs.chmodSync(dir, 0o755);
  pgdir = path.join(dir, 'pg');
  const r = spawnSync('scripts/pg-dev.sh', ['start', pgdir], {env: {...process.env, PG_DEV_FAST: '1'}, encoding: 'utf8'});
  assert.equal(r.status, 0, 'scripts/pg-dev.sh start: ' + r.stderr);
  dbUrl = /^DATABASE_URL=(.*)$/m.exec(r.stdout)[1];
  profile = fs.mkdtempSync(path.join(os.tmpdir(), 'ty_chromium_'));
  ctx = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium', headless: true, viewport: {width: 1280, height: 900},
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
           '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  page = ctx.pages()[0] || await ctx.newPage();
  page.setDefaultTimeout(30000);
  page.on('pageerror', (e) => pageErrors.push(e.message));
});

after(async () => {
  if (ctx) await ctx.close();
  if (profile) fs.rmSync(profile, {recursive: true, force: true});
  for (const p of servers) if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
  if (pgdir) spawnSync('scripts/pg-dev.sh', ['stop', pgdir]);
  if (dir && !process.env.WEB_KEEP) fs.rmSync(dir, {recursive: true, force: true});
});

/* The dashboard of url, signed in with the team token, on the jobs page. */
async function openJobs(url) {
  await page.goto(url + '/');
  await page.evaluate((t) => { localStorage.setItem('trainyard.token', t); }, token);
  await page.goto(url + '/?signin=' + Date.now() + '#/jobs');
}

test('a standby says so and links to the leader, which then leads no more', async (t) => {
  if (!HAVE_PG) {
    assert.ok(process.env.PG_TEST_REQUIRED !== '1', 'PG_TEST_REQUIRED=1 and no PostgreSQL 15');
    t.skip('SKIP: no PostgreSQL 15 (/usr/lib/postgresql/15/bin)');
    return;
  }
  const a = await startServer('a');
  await waitRole(a.url, 'leader');
  const b = await startServer('b');
  await waitRole(b.url, 'standby');
  token = fs.readFileSync(path.join(a.data, 'token'), 'utf8').trim();
  const sub = await fetch(a.url + '/api/v1/jobs', {method: 'POST',
    headers: {Authorization: 'Bearer ' + token, 'Content-Type': 'application/json'},
    body: JSON.stringify({name: 'on-the-leader', command: {argv: ['sleep', '1']}, max_restarts: 0})});
  assert.equal(sub.status, 201);

  // the standby's dashboard: the notice, a link to the same page on the leader
  await openJobs(b.url);
  const notice = page.locator('#standby');
  await notice.waitFor({state: 'visible'});
  assert.match(await notice.textContent(), /standby/);
  const link = notice.locator('a');
  assert.equal(await link.getAttribute('href'), a.url + '/#/jobs');
  fs.mkdirSync(OUT, {recursive: true});
  await page.screenshot({path: path.join(OUT, 'standby-notice.png')});

  // the leader's: the job, no notice
  await openJobs(a.url);
  await page.getByText('on-the-leader').first().waitFor();
  assert.equal(await page.locator('#standby').isHidden(), true);

  // the leader dies; the standby leads; its page shows the job, no notice
  a.proc.kill('SIGKILL');
  await waitRole(b.url, 'leader');
  await openJobs(b.url);
  await page.getByText('on-the-leader').first().waitFor();
  assert.equal(await page.locator('#standby').isHidden(), true);
  await page.screenshot({path: path.join(OUT, 'standby-took-over.png')});
  assert.deepEqual(pageErrors, []);
});
