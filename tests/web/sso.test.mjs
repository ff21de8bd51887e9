// sso.test.mjs - single sign-on in headless Chromium (Debian's, driven by
// playwright-core): a real `trainyard server --oidc-*` and the real OpenID
// Provider of tests/oidc/provider.mjs on loopback. Open the dashboard, press
// "Sign in with single sign-on", fill the provider's login form as ada, land
// back on the dashboard with her name and the team switcher (vision, from
// her groups claim), read the jobs, cancel one of vision's jobs (a change:
// the session's CSRF token in X-CSRF-Token), see that cancel on the Audit
// page (and its CSV), open a shell in a task of vision's (an agent joins for
// it: the exec WebSocket with the session's cookie, the team as ?team=, no
// token), sign out. Screenshots go to $WEB_TEST_OUT.
import {test, before, after} from 'node:test';
import assert from 'node:assert/strict';
import {spawn} from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import {chromium} from 'playwright-core';

const OUT = process.env.WEB_TEST_OUT || 'build/web-test';
const BIN = process.env.TRAINYARD_BIN || 'build/asan/trainyard';
const sleep = ms => new Promise(r => setTimeout(r, ms));
let dir, op, server, agent, url, admin, visionToken, ctx, page, profile, jobId;
const pageErrors = [];

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => resolve(p)); });
  });
}

async function stop(p) {
  if (!p || p.exitCode !== null || p.signalCode !== null) return;
  const done = new Promise(r => p.once('exit', r));
  p.kill('SIGTERM');
  const t = setTimeout(() => p.kill('SIGKILL'), 10000);
  await done;
  clearTimeout(t);
}

async function api(p, {method = 'GET', token = admin, body} = {}) {
  const r = await fetch(url + '/api/v1' + p, {method, body, headers: {Authorization: 'Bearer ' + token, 'Content-Type': 'application/json'}});
  const text = await r.text();
  return {status: r.status, body: text && (r.headers.get('content-type') || '').startsWith('application/json') ? JSON.parse(text) : text};
}

async function shot(name) {
  await page.screenshot({path: path.join(OUT, name + '.png'), fullPage: true});
}

before(async () => {
  fs.mkdirSync(OUT, {recursive: true});
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ty_sso_web_'));
  const secret = path.join(dir, 'secret');
  fs.writeFileSync(secret, 's3cret-of-trainyard\n', {mode: 0o600});
  const port = await freePort();
  // the provider first: its issuer is the server's flag
  op = spawn('node', ['tests/oidc/provider.mjs', '--redirect-uri', `http://127.0.0.1:${port}/auth/callback`,
                      '--client-secret-file', secret, '--key-file', path.join(dir, 'key.json')],
             {stdio: ['ignore', 'pipe', fs.openSync(path.join(dir, 'provider.log'), 'a')]});
  const line = await new Promise((resolve, reject) => {
    const rl = readline.createInterface({input: op.stdout});
    rl.once('line', resolve);
    op.once('exit', () => reject(new Error(`the provider exited; see ${dir}/provider.log`)));
  });
  const {issuer} = JSON.parse(line);
  const log = fs.openSync(path.join(dir, 'server.log'), 'a');
  server = spawn(BIN, ['server', '--listen', `127.0.0.1:${port}`, '--data', path.join(dir, 'data'), '--oidc-issuer', issuer,
                       '--oidc-client-id', 'trainyard', '--oidc-client-secret-file', secret],
                 {stdio: ['ignore', log, log]});
  const urlFile = path.join(dir, 'data', 'server.url');
  for (let i = 0; i < 300 && !fs.existsSync(urlFile); i++) {
    if (server.exitCode !== null) throw new Error(`trainyard server exited; see ${dir}/server.log`);
    await sleep(50);
  }
  url = fs.readFileSync(urlFile, 'utf8').trim();
  admin = fs.readFileSync(path.join(dir, 'data', 'admin.token'), 'utf8').trim();
  // team vision (ada's groups claim makes her its admin) with a job waiting (no agent here)
  const team = await api('/teams', {method: 'POST', body: JSON.stringify({name: 'vision'})});
  assert.equal(team.status, 201);
  visionToken = team.body.token;
  const spec = {name: 'vision-waits', model: {layers: [{type: 'flatten', input_shape: [28, 28]}, {type: 'dense', units: 10, activation: 'softmax'}]},
    compile: {optimizer: {type: 'adam', learning_rate: 0.001}, loss: 'sparse_categorical_crossentropy', metrics: ['accuracy']},
    data: {source: 'fashion-mnist', limit: 200}, fit: {epochs: 1, batch_size: 64}};
  const job = await api('/jobs', {method: 'POST', token: team.body.token, body: JSON.stringify(spec)});
  assert.equal(job.status, 201, JSON.stringify(job.body));
  jobId = job.body.id;
  profile = fs.mkdtempSync(path.join(os.tmpdir(), 'ty_chromium_'));
  ctx = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium', headless: true, viewport: {width: 1280, height: 900},
    acceptDownloads: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
           '--disable-component-update', '--disable-sync'],
  });
  page = ctx.pages()[0] || await ctx.newPage();
  page.setDefaultTimeout(30000);
  page.on('pageerror', (e) => pageErrors.push(e.message));
});

after(async () => {
  if (ctx) await ctx.close();
  await stop(agent);
  await stop(server);
  await stop(op);
  if (profile) fs.rmSync(profile, {recursive: true, force: true});
  if (dir && !process.env.WEB_KEEP) fs.rmSync(dir, {recursive: true, force: true});
});

test('sign in at the provider as ada; her name and team', async () => {
  await page.goto(url + '/');
  await page.waitForSelector('#sso-signin');
  await shot('sso-signin');
  await page.click('#sso-signin');
  // the provider's own login page
  await page.waitForSelector('input[name=login]');
  assert.ok(page.url().startsWith('http://127.0.0.1:') && page.url().includes('/interaction/'), page.url());
  await page.fill('input[name=login]', 'ada');
  await page.fill('input[name=password]', 'ada-password');
  await page.click('button[type=submit]');
  // back on the dashboard, signed in by the session cookie (never readable by the page)
  await page.waitForURL(u => u.toString().startsWith(url + '/'));
  await page.waitForSelector('#who-name:has-text("ada")');
  assert.equal(await page.evaluate(() => document.cookie), '', 'the session cookie is HttpOnly');
  assert.equal(await page.evaluate(() => localStorage.getItem('trainyard.token')), null, 'no token was pasted');
  const options = await page.$$eval('#team-switch option', os => os.map(o => [o.value, o.textContent]));
  assert.deepEqual(options, [['vision', 'vision (admin)']]);
  assert.equal(await page.inputValue('#team-switch'), 'vision');
  await page.waitForSelector(`#jobs tr[data-job-id="${jobId}"]`);
  await shot('sso-jobs');
});

test("cancel one of the team's jobs (the CSRF token with the change)", async () => {
  await page.click(`#jobs tr[data-job-id="${jobId}"] a`);
  await page.waitForSelector('#cancel');
  await page.click('#cancel');
  await page.click('#cancel'); // confirm
  await page.waitForSelector('#cancel-msg:has-text("Cancelled")');
  const j = await api(`/jobs/${jobId}`);
  assert.equal(j.body.state, 'cancelled');
  // the same change with the cookie alone (as another site's page could send it) is refused
  const r = await page.evaluate(async (id) => (await fetch(`/api/v1/jobs/${id}/cancel`, {method: 'POST', headers: {'Trainyard-Team': 'vision'}})).status, jobId);
  assert.equal(r, 403);
});

test('the Audit page shows the cancel; its CSV downloads', async () => {
  await page.click('a[data-nav="audit"]');
  await page.waitForSelector('#audit tbody tr');
  const row = page.locator('#audit tbody tr', {hasText: 'POST /api/v1/jobs/{id}/cancel'}).filter({hasText: 'user:ada'}).filter({hasText: '200'});
  await row.first().waitFor();
  // filters: ada's rows whose action names cancel
  await page.fill('#audit-user', 'ada');
  await page.fill('#audit-action', 'cancel');
  await page.click('#audit-filters button[type=submit]');
  await page.waitForFunction(() => {
    const rows = [...document.querySelectorAll('#audit tbody tr')];
    return rows.length > 0 && rows.every(r => r.textContent.includes('cancel') && r.textContent.includes('user:ada'));
  });
  await shot('sso-audit');
  const dl = page.waitForEvent('download');
  await page.click('#audit-csv');
  const file = await (await dl).path();
  const csv = fs.readFileSync(file, 'utf8');
  assert.ok(csv.startsWith('id,time,actor,user'), csv.slice(0, 200));
  assert.ok(csv.includes('user:ada') && csv.includes('/api/v1/jobs/{id}/cancel'), csv.slice(0, 500));
});

test("a shell in a task of the team's, with the session's cookie", async () => {
  const log = fs.openSync(path.join(dir, 'agent.log'), 'a');
  agent = spawn(BIN, ['agent', '--server', url, '--token-file', path.join(dir, 'data', 'node.token'), '--cpu-slots', '1',
                      '--hostname', 'sso-node', '--state-file', path.join(dir, 'agent.state'), '--podman', 'none'],
                {stdio: ['ignore', log, log]});
  const job = await api('/jobs', {method: 'POST', token: visionToken,
    body: JSON.stringify({name: 'vision-holds', max_restarts: 0, command: {argv: ['sleep', '600']}})});
  assert.equal(job.status, 201, JSON.stringify(job.body));
  const id = job.body.id;
  for (let i = 0; ; i++) {
    const j = await api('/jobs/' + id, {token: visionToken});
    if (j.body.state === 'running' && j.body.tasks.some(t => t.state === 'running')) break;
    assert.ok(i < 600 && j.body.state !== 'failed', `the job did not run (${dir}/agent.log): ${JSON.stringify(j.body)}`);
    await sleep(100);
  }
  const sockets = [];
  page.on('websocket', ws => sockets.push(ws.url()));
  await page.goto(url + '/#/jobs/' + id);
  await page.waitForSelector('.shell-pick:not([hidden]) #shell-task');
  await page.click('#open-shell');
  await page.waitForSelector('#shell-status[data-state="open"]');
  assert.ok(sockets.some(u => u.includes(`/api/v1/jobs/${id}/tasks/worker-0/exec?`) && u.includes('team=vision')), sockets.join(' '));
  await page.click('#terminal');
  await page.keyboard.type('echo "$((6*7))-as-ada"');
  await page.keyboard.press('Enter');
  await page.waitForFunction(() => [...document.querySelectorAll('#terminal .xterm-rows > div')]
    .some(r => r.textContent.replace(/\u00a0/g, ' ').trim() === '42-as-ada'));
  await page.keyboard.type('exit 3');
  await page.keyboard.press('Enter');
  await page.waitForSelector('#shell-status[data-state="exited"]');
  assert.equal(await page.textContent('#shell-status'), 'exited with status 3');
  /* the timeline says who: ada, not the team */
  const ev = await api(`/jobs/${id}/events?limit=100`, {token: visionToken});
  assert.ok(ev.body.events.some(e => e.actor === 'user:ada' && /shell in worker-0 ended: exit 3/.test(e.reason || '')), JSON.stringify(ev.body.events));
  await api(`/jobs/${id}/cancel`, {method: 'POST', token: visionToken});
});

test('sign out ends the session', async () => {
  await page.click('#signout');
  await page.waitForSelector('#sso-signin');
  assert.equal(await page.isHidden('#who'), true);
  // the cookie was cleared and its session revoked: a reload stays signed out
  await page.reload();
  await page.waitForSelector('#sso-signin');
  const me = await page.evaluate(async () => (await fetch('/api/v1/me')).status);
  assert.equal(me, 401);
  await shot('sso-signed-out');
  assert.deepEqual(pageErrors, []);
});
