// notebook.test.mjs - a notebook job from the dashboard, in headless Chromium
// (Debian's, driven by playwright-core) against the real `trainyard up` and
// Debian's real jupyter-notebook: a notebook job submitted over the API, its
// page's "Open notebook" button (POST /jobs/{id}/proxy-session, then a new
// tab on /proxy/jobs/{id}/notebook/), Jupyter's own UI in that tab makes a
// notebook, a cell runs print(6*7) and 42 comes back over the kernel's
// WebSocket through the server's proxy. The tab never carries the token:
// the proxy's cookie lets it in. Screenshots go to $WEB_TEST_OUT.
import {test, before, after} from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import {startUp} from './server.mjs';
import {openDashboard} from './browser.mjs';

const OUT = process.env.WEB_TEST_OUT || 'build/web-test';
let srv, ctx, page, pageErrors, close;

async function waitJob(id, ok, what, tries = 1200) {
  let last = null;
  for (let i = 0; i < tries; i++) {
    last = (await srv.api('/jobs/' + id)).body;
    if (ok(last)) return last;
    if (['succeeded', 'failed', 'cancelled'].includes(last.state)) break;
    await new Promise(res => setTimeout(res, 100));
  }
  throw new Error(`job ${id} never ${what}: ${JSON.stringify(last)}`);
}

before(async () => {
  fs.mkdirSync(OUT, {recursive: true});
  srv = await startUp({cpuSlots: 2});
  ({ctx, page, pageErrors, close} = await openDashboard(srv));
});

after(async () => {
  if (close) await close();
  if (srv) await srv.stop();
});

test('Open notebook: Jupyter through the proxy runs a cell', async () => {
  const sub = await srv.api('/jobs', {method: 'POST', body: JSON.stringify({name: 'explore', interactive: {type: 'notebook'}, idle_timeout: '2h'})});
  assert.equal(sub.status, 201, JSON.stringify(sub.body));
  const id = sub.body.id;
  const job = await waitJob(id, j => j.state === 'running' && (j.ports || []).some(p => p.name === 'notebook' && p.port), 'served its notebook');
  const nb = job.ports.find(p => p.name === 'notebook');
  assert.equal(nb.url, `/proxy/jobs/${id}/notebook/`);
  await page.goto(srv.url + '/?t=' + Date.now() + '#/jobs/' + id);
  await page.waitForSelector('#open-notebook:not([hidden]):not([disabled])');
  assert.equal(await page.textContent('#job-interactive'), 'notebook · stopped after 2h idle');
  assert.ok(await page.isHidden('#chart-loss'), 'no training charts for a notebook');
  await page.screenshot({path: path.join(OUT, 'dashboard-notebook-job-desktop.png')});
  const sessionCall = page.waitForResponse(r => r.url().endsWith(`/api/v1/jobs/${id}/proxy-session`) && r.request().method() === 'POST');
  const [tab] = await Promise.all([ctx.waitForEvent('page'), page.click('#open-notebook')]);
  assert.equal((await sessionCall).status(), 201);
  tab.setDefaultTimeout(60000);
  tab.on('pageerror', (e) => pageErrors.push('jupyter tab: ' + e.message));
  await tab.waitForURL(new RegExp(`/proxy/jobs/${id}/notebook/tree`));
  assert.ok((await ctx.cookies(srv.url + nb.url)).some(c => c.name === 'trainyard_proxy' && c.path === `/proxy/jobs/${id}/`));
  assert.ok(!tab.url().includes('trainyard_grant'), 'the ticket is gone from the URL');
  assert.ok(!tab.url().includes(srv.token) && !tab.url().includes('token='), 'no token in the tab\'s URL');

  /* Jupyter's own UI: New -> Python 3 opens the new notebook in a tab of its own */
  await tab.click('#new-dropdown-button');
  const [nbTab] = await Promise.all([ctx.waitForEvent('page'), tab.click('#new-menu li[id^="kernel-"] a')]);
  nbTab.setDefaultTimeout(60000);
  nbTab.on('pageerror', (e) => pageErrors.push('notebook tab: ' + e.message));
  const sockets = [];
  nbTab.on('websocket', ws => sockets.push(ws.url()));
  await nbTab.waitForURL(new RegExp(`/proxy/jobs/${id}/notebook/notebooks/.+\\.ipynb`));
  await nbTab.waitForSelector('#kernel_indicator_icon.kernel_idle_icon');
  await nbTab.click('.cell .CodeMirror');
  await nbTab.keyboard.type('print(6*7)');
  await nbTab.keyboard.press('Shift+Enter');
  await nbTab.waitForSelector('.output_area .output_text:has-text("42")');
  assert.equal((await nbTab.textContent('.output_area .output_text')).trim(), '42');
  assert.ok(sockets.some(u => new RegExp(`/proxy/jobs/${id}/notebook/api/kernels/[^/]+/channels`).test(u)),
            `the kernel's WebSocket goes through the proxy: ${sockets.join(' ')}`);
  await nbTab.screenshot({path: path.join(OUT, 'jupyter-through-the-proxy.png')});

  await srv.api(`/jobs/${id}/cancel`, {method: 'POST'});
  await waitJob(id, j => j.state === 'cancelled', 'was cancelled');
  assert.deepEqual(pageErrors.filter(e => !e.startsWith('jupyter tab') && !e.startsWith('notebook tab')), []);
});
