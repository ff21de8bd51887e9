// terminal.test.mjs - a task's shell in the dashboard, in headless Chromium
// (Debian's, driven by playwright-core) against the real `trainyard up`: the
// job page's Shell action opens #/jobs/ID/shell/TASK, an xterm.js terminal
// over the exec WebSocket (docs/exec.md) into the running task; `id -u` reads
// the task's own uid (the one the task itself printed to its log, not 0),
// `stty size` the terminal's size after the window shrank (resize frames),
// and `exit 3` shows "exited with status 3". A task that no longer runs and
// a task the job has not are refused with a message saying so. xterm.js is
// loaded by the terminal page only, and nothing breaks the page's CSP.
// Screenshots go to $WEB_TEST_OUT (default build/web-test).
import {test, before, after} from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {startUp} from './server.mjs';
import {openDashboard, DESKTOP} from './browser.mjs';

const OUT = process.env.WEB_TEST_OUT || 'build/web-test';
const PHONE = {width: 390, height: 844};
let srv, ctx, page, pageErrors, close;

async function waitJob(id, ok, what) {
  for (let i = 0; i < 600; i++) {
    const r = await srv.api('/jobs/' + id);
    if (ok(r.body)) return r.body;
    await new Promise(res => setTimeout(res, 100));
  }
  throw new Error(`job ${id} never ${what}`);
}

/* The terminal's screen as text, a line a row (xterm.js's DOM renderer). */
function screenText() {
  return page.$eval('#terminal .xterm-rows', el => [...el.children].map(r => r.textContent.replace(/\u00a0/g, ' ').trimEnd()).join('\n'));
}

async function waitScreen(re, what) {
  for (let i = 0; i < 300; i++) {
    const t = await screenText();
    const m = t.match(re);
    if (m) return m;
    await new Promise(res => setTimeout(res, 100));
  }
  throw new Error(`the terminal never showed ${what}; it shows:\n${await screenText()}`);
}

async function typeLine(text) {
  await page.keyboard.type(text);
  await page.keyboard.press('Enter');
}

async function cspViolations() { return page.evaluate(() => window.__csp || []); }

before(async () => {
  fs.mkdirSync(OUT, {recursive: true});
  srv = await startUp({cpuSlots: 2});
  /* every document records what its Content-Security-Policy refused */
  ({ctx, page, pageErrors, close} = await openDashboard(srv, {initScript: () => {
    window.__csp = [];
    document.addEventListener('securitypolicyviolation', e => window.__csp.push(`${e.violatedDirective} ${e.blockedURI}`));
  }}));
});

after(async () => {
  if (close) await close();
  if (srv) await srv.stop();
});

test('a shell in a running task: its uid, its size, its exit status', async () => {
  /* the task prints its own uid, then holds its slot */
  const sub = await srv.api('/jobs', {method: 'POST', body: JSON.stringify({name: 'hold', max_restarts: 0,
    command: {argv: ['sh', '-c', 'echo "uid=$(id -u)"; exec sleep 600']}})});
  assert.equal(sub.status, 201, JSON.stringify(sub.body));
  const id = sub.body.id;
  await waitJob(id, j => j.state === 'running' && (j.tasks || []).some(t => t.state === 'running'), 'ran');
  let uid = null;
  for (let i = 0; i < 200 && !uid; i++) {
    const log = await srv.api(`/jobs/${id}/logs?task=worker-0`);
    const m = typeof log.body === 'string' && log.body.match(/^uid=(\d+)$/m);
    if (m) uid = m[1]; else await new Promise(res => setTimeout(res, 100));
  }
  assert.ok(uid, 'the task printed its uid');
  assert.notEqual(uid, '0', 'the task does not run as root');

  /* the job page (a new document): a Shell action, and no xterm.js loaded */
  await page.goto(srv.url + '/?t=' + Date.now() + '#/jobs/' + id);
  await page.waitForSelector('.shell-pick:not([hidden]) #shell-task');
  assert.deepEqual(await page.$$eval('#shell-task option', os => os.map(o => o.value)), ['worker-0']);
  assert.equal(await page.evaluate(() => typeof window.Terminal), 'undefined', 'xterm.js is not loaded by the job page');
  assert.ok(!(await page.evaluate(() => performance.getEntriesByType('resource').some(e => e.name.includes('xterm')))));

  const sockets = [];
  page.on('websocket', ws => sockets.push(ws.url()));
  await page.click('#open-shell');
  await page.waitForURL(new RegExp(`#/jobs/${id}/shell/worker-0$`));
  await page.waitForSelector('#shell-status[data-state="open"]');
  assert.ok(sockets.some(u => u.includes(`/api/v1/jobs/${id}/tasks/worker-0/exec?`) && u.includes('tty=1')), sockets.join(' '));
  assert.ok(!sockets.some(u => u.includes(srv.token)), 'the token is never in the URL');
  await page.click('#terminal');
  await typeLine('id -u');
  const got = await waitScreen(/^(\d+)$/m, 'a uid');
  assert.equal(got[1], uid, 'the shell runs as the task');

  /* the window shrinks: the terminal refits and the PTY learns its new size */
  const before = await page.$eval('#terminal', el => [el.dataset.cols, el.dataset.rows].map(Number));
  await page.setViewportSize({width: 900, height: 600});
  await page.waitForFunction(c => Number(document.getElementById('terminal').dataset.cols) < c, before[0]);
  const size = await page.$eval('#terminal', el => [el.dataset.cols, el.dataset.rows].map(Number));
  assert.ok(size[1] < before[1], `rows ${size[1]} < ${before[1]}`);
  await typeLine('stty size');
  await waitScreen(new RegExp(`^${size[1]} ${size[0]}$`, 'm'), `"${size[1]} ${size[0]}" from stty size`);
  await page.setViewportSize(DESKTOP);
  await typeLine('exit 3');
  await page.waitForSelector('#shell-status[data-state="exited"]');
  assert.equal(await page.textContent('#shell-status'), 'exited with status 3');
  assert.equal(await page.getAttribute('#shell-status', 'data-exit'), '3');
  await waitScreen(/\[exited with status 3\]/, 'the exit status');
  assert.ok(await page.isVisible('#shell-again'), 'a new shell can be opened');
  await page.screenshot({path: path.join(OUT, 'dashboard-shell-desktop.png')});
  /* the task itself goes on */
  assert.equal((await srv.api('/jobs/' + id)).body.state, 'running');

  /* a phone's width: the terminal fits, nothing scrolls sideways */
  await page.setViewportSize(PHONE);
  await page.click('#shell-again');
  await page.waitForSelector('#shell-status[data-state="open"]');
  assert.ok(await page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth + 1), 'no sideways scrolling on a phone');
  await page.click('#terminal');
  await typeLine('echo "$((6*7))-from-the-phone"');
  await waitScreen(/^42-from-the-phone$/m, 'the echo');
  await page.screenshot({path: path.join(OUT, 'dashboard-shell-phone.png')});
  await page.setViewportSize(DESKTOP);

  /* leaving the page closes the shell; an unknown task is refused, saying so */
  await page.goto(srv.url + `/#/jobs/${id}/shell/worker-7`);
  await page.waitForSelector('#shell-status[data-state="refused"]');
  assert.match(await page.textContent('#shell-status'), /has no task worker-7 \(its tasks: worker-0\)/);

  /* a task that no longer runs: refused, saying so */
  await srv.api(`/jobs/${id}/cancel`, {method: 'POST'});
  await waitJob(id, j => j.state === 'cancelled' && j.tasks.every(t => t.state !== 'running'), 'was cancelled');
  await page.goto(srv.url + `/#/jobs/${id}`);
  await page.waitForSelector('#job-state [data-state="cancelled"]');
  assert.ok(await page.isHidden('.shell-pick'), 'no Shell action once the job ended');
  await page.goto(srv.url + `/#/jobs/${id}/shell/worker-0`);
  await page.waitForSelector('#shell-status[data-state="refused"]');
  assert.match(await page.textContent('#shell-status'), /Task worker-0 is \w+, not running/);

  assert.deepEqual(await cspViolations(), [], 'nothing broke the Content-Security-Policy');
  assert.deepEqual(pageErrors, []);
});

test('a shell job: its page opens a terminal in its one task', async () => {
  const sub = await srv.api('/jobs', {method: 'POST', body: JSON.stringify({name: 'shell', interactive: {type: 'shell'}})});
  assert.equal(sub.status, 201, JSON.stringify(sub.body));
  const id = sub.body.id;
  const job = await waitJob(id, j => j.state === 'running' && (j.tasks || []).some(t => t.state === 'running'), 'ran');
  const task = job.tasks.find(t => t.state === 'running').name;
  await page.goto(srv.url + '/#/jobs/' + id);
  await page.waitForSelector('.shell-pick:not([hidden]) #shell-task');
  assert.equal(await page.inputValue('#shell-task'), task);
  await page.click('#open-shell');
  await page.waitForSelector('#shell-status[data-state="open"]');
  await page.click('#terminal');
  await typeLine('id -u');
  const got = await waitScreen(/^(\d+)$/m, 'a uid');
  assert.notEqual(got[1], '0', 'the shell does not run as root');
  await typeLine('exit 3');
  await page.waitForSelector('#shell-status[data-state="exited"]');
  assert.equal(await page.textContent('#shell-status'), 'exited with status 3');
  /* the job's timeline has the shell, opened and ended */
  const ev = await srv.api(`/jobs/${id}/events?limit=100`);
  assert.ok(ev.body.events.some(e => /shell in .* ended: exit 3/.test(e.reason || '')), JSON.stringify(ev.body.events));
  await srv.api(`/jobs/${id}/cancel`, {method: 'POST'});
  await waitJob(id, j => j.state === 'cancelled', 'was cancelled');
  assert.deepEqual(await cspViolations(), [], 'nothing broke the Content-Security-Policy');
  assert.deepEqual(pageErrors, []);
});
