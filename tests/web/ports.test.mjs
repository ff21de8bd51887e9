// ports.test.mjs - a job's web port from the dashboard, in headless Chromium
// (Debian's, driven by playwright-core) against the real `trainyard up`: a
// command job serves a page on its port; the port's link on the job page
// calls POST /jobs/{id}/proxy-session, then opens the port in a new tab,
// which the proxy's cookie (HttpOnly, its job's path only) lets in without
// the token; the app sees neither. The notebook's button does the same
// (notebook.test.mjs). With `--apps-listen` the tab is on the apps' own
// origin, where the app's page cannot read the dashboard's token.
import {test, before, after} from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
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

test('a port link opens the job\'s page in a new tab through a proxy session', async () => {
  /* the app answers any GET with a page saying the path and the credentials it got */
  const app = [
    'import html, http.server, os',
    'class H(http.server.BaseHTTPRequestHandler):',
    '    def do_GET(self):',
    '        seen = lambda k: html.escape(self.headers.get(k) or "none")',
    '        b = ("<!doctype html><title>job site</title><p id=from-job>served by the job</p><p id=path>%s</p>"',
    '             "<p id=cookie>%s</p><p id=auth>%s</p>" % (html.escape(self.path), seen("Cookie"), seen("Authorization"))).encode()',
    '        self.send_response(200)',
    '        self.send_header("Content-Type", "text/html; charset=utf-8")',
    '        self.send_header("Content-Length", str(len(b)))',
    '        self.end_headers()',
    '        self.wfile.write(b)',
    'http.server.HTTPServer(("", int(os.environ["TRAINYARD_PORT_WEB"])), H).serve_forever()',
  ].join('\n');
  const sub = await srv.api('/jobs', {method: 'POST', body: JSON.stringify({name: 'site', max_restarts: 0,
    ports: [{name: 'web', port: 8000}], command: {argv: ['python3', '-c', app]}})});
  assert.equal(sub.status, 201, JSON.stringify(sub.body));
  const id = sub.body.id;
  const job = await waitJob(id, j => j.state === 'running' && (j.ports || []).some(p => p.name === 'web' && p.port), 'served its port');
  const web = job.ports.find(p => p.name === 'web');
  /* the app answers (through the proxy, with the token) before the browser tries */
  for (let i = 0; i < 100; i++) {
    const r = await fetch(srv.url + web.url, {headers: {Authorization: 'Bearer ' + srv.token}});
    if (r.status === 200) break;
    await new Promise(res => setTimeout(res, 100));
  }
  /* a tab without the proxy's cookie is refused */
  await page.goto(srv.url + '/?t=' + Date.now() + '#/jobs/' + id);
  assert.equal(await page.evaluate(async (u) => (await fetch(u)).status, web.url), 401);
  await page.waitForSelector('#job-ports a[data-port="web"]');
  const sessionCall = page.waitForResponse(r => r.url().endsWith(`/api/v1/jobs/${id}/proxy-session`) && r.request().method() === 'POST');
  const [tab] = await Promise.all([ctx.waitForEvent('page'), page.click('#job-ports a[data-port="web"]')]);
  assert.equal((await sessionCall).status(), 201);
  /* the tab traded the one-time ticket for the cookie, and its URL kept no ticket */
  await tab.waitForURL(srv.url + web.url);
  const cookie = (await ctx.cookies(srv.url + web.url)).find(c => c.name === 'trainyard_proxy');
  assert.ok(cookie, 'the proxy-session cookie is set');
  assert.equal(cookie.httpOnly, true);
  assert.equal(cookie.sameSite, 'Lax');
  assert.equal(cookie.path, `/proxy/jobs/${id}/`);
  assert.equal(await tab.textContent('#from-job'), 'served by the job');
  assert.equal(await tab.textContent('#path'), web.url);
  assert.equal(await tab.textContent('#auth'), 'none', 'the app never sees a credential');
  assert.ok(!(await tab.textContent('#cookie')).includes('trainyard_proxy'), 'nor the proxy\'s cookie');
  assert.equal(await tab.evaluate(() => window.opener), null, 'the tab has no opener');
  await tab.close();
  await srv.api(`/jobs/${id}/cancel`, {method: 'POST'});
  await waitJob(id, j => j.state === 'cancelled', 'was cancelled');
  assert.deepEqual(pageErrors, []);
});

test('with --apps-listen, a job\'s page runs on an origin of its own and cannot read the token', async () => {
  const srv2 = await startUp({cpuSlots: 1, args: ['--apps-listen', '127.0.0.1:0']});
  try {
    assert.ok(srv2.appsUrl && srv2.appsUrl !== srv2.url, `apps.url: ${srv2.appsUrl}`);
    /* the app's page tries to read the dashboard's token, as a hostile app would */
    const app = [
      'import http.server, os',
      'PAGE = b"""<!doctype html><title>job site</title><p id=origin></p><p id=stolen>-</p><script>',
      'document.getElementById("origin").textContent = location.origin;',
      'document.getElementById("stolen").textContent = String(localStorage.getItem("trainyard.token"));',
      '</script>"""',
      'class H(http.server.BaseHTTPRequestHandler):',
      '    def do_GET(self):',
      '        self.send_response(200)',
      '        self.send_header("Content-Type", "text/html; charset=utf-8")',
      '        self.send_header("Content-Length", str(len(PAGE)))',
      '        self.end_headers()',
      '        self.wfile.write(PAGE)',
      'http.server.HTTPServer(("", int(os.environ["TRAINYARD_PORT_WEB"])), H).serve_forever()',
    ].join('\n');
    const sub = await srv2.api('/jobs', {method: 'POST', body: JSON.stringify({name: 'hostile', max_restarts: 0,
      ports: [{name: 'web', port: 8000}], command: {argv: ['python3', '-c', app]}})});
    assert.equal(sub.status, 201, JSON.stringify(sub.body));
    const id = sub.body.id;
    let job = null;
    for (let i = 0; i < 1200; i++) {
      job = (await srv2.api('/jobs/' + id)).body;
      if ((job.ports || []).some(p => p.name === 'web' && p.port)) break;
      await new Promise(res => setTimeout(res, 100));
    }
    const web = job.ports.find(p => p.name === 'web');
    for (let i = 0; i < 100; i++) {
      if ((await fetch(srv2.url + web.url, {headers: {Authorization: 'Bearer ' + srv2.token}})).status === 200) break;
      await new Promise(res => setTimeout(res, 100));
    }
    await page.goto(srv2.url + '/');
    await page.evaluate((t) => { localStorage.setItem('trainyard.token', t); }, srv2.token);
    await page.goto(srv2.url + '/?t=' + Date.now() + '#/jobs/' + id);
    await page.waitForSelector('#job-ports a[data-port="web"]');
    const [tab] = await Promise.all([ctx.waitForEvent('page'), page.click('#job-ports a[data-port="web"]')]);
    await tab.waitForURL(srv2.appsUrl + web.url);
    await tab.waitForSelector('#stolen:not(:text("-"))');
    assert.equal(await tab.textContent('#origin'), srv2.appsUrl);
    assert.equal(await tab.textContent('#stolen'), 'null', 'the dashboard\'s token is not readable there');
    /* a link to the proxy at the dashboard's origin lands on the apps' too */
    const direct = await ctx.newPage();
    await direct.goto(srv2.url + web.url);
    assert.ok(direct.url().startsWith(srv2.appsUrl + '/'), direct.url());
    await direct.close();
    await tab.close();
    await srv2.api(`/jobs/${id}/cancel`, {method: 'POST'});
  } finally {
    await srv2.stop();
  }
  assert.deepEqual(pageErrors, []);
});
