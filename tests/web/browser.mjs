// browser.mjs - Debian's Chromium (headless, driven by playwright-core) with a
// profile of its own, on the dashboard of a server from server.mjs, signed in
// with its team token, for the tests of a job's page (ports, notebook,
// terminal). Every page error is kept in pageErrors.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {chromium} from 'playwright-core';

export const DESKTOP = {width: 1280, height: 900};

/* initScript: run in every document before its own scripts (or null). */
export async function openDashboard(srv, {initScript = null} = {}) {
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'ty_chromium_'));
  const ctx = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium', headless: true, viewport: DESKTOP,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
           '--disable-component-update', '--disable-sync'],
  });
  if (initScript) await ctx.addInitScript(initScript);
  const page = ctx.pages()[0] || await ctx.newPage();
  const pageErrors = [];
  page.setDefaultTimeout(30000);
  page.on('pageerror', (e) => pageErrors.push(e.message));
  await page.goto(srv.url + '/');
  await page.evaluate((t) => { localStorage.setItem('trainyard.token', t); }, srv.token);
  const close = async () => {
    await ctx.close();
    fs.rmSync(profile, {recursive: true, force: true});
  };
  return {ctx, page, pageErrors, close};
}
