// server.mjs - starts the real `trainyard up` (server + local agent) for the
// browser tests: a temporary data directory, a free loopback port, the
// binary named by TRAINYARD_BIN (tests/run_all.sh sets it to the ASan build).
import {spawn} from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

export async function startUp({cpuSlots = 2, args = []} = {}) {
  const bin = process.env.TRAINYARD_BIN || 'build/asan/trainyard';
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ty_web_'));
  const log = fs.openSync(path.join(dir, 'server.log'), 'a');
  const proc = spawn(bin, ['up', '--listen', '127.0.0.1:0', '--data', dir, '--cpu-slots', String(cpuSlots), ...args],
                     {stdio: ['ignore', log, log], env: {...process.env, OPENBLAS_NUM_THREADS: '1'}});
  const urlFile = path.join(dir, 'server.url');
  for (let i = 0; i < 300 && !fs.existsSync(urlFile); i++) {
    if (proc.exitCode !== null) throw new Error(`trainyard up exited; see ${dir}/server.log`);
    await new Promise(r => setTimeout(r, 50));
  }
  const url = fs.readFileSync(urlFile, 'utf8').trim();
  const token = fs.readFileSync(path.join(dir, 'token'), 'utf8').trim();
  /* --apps-listen: the origin a job's apps are served at */
  const appsFile = path.join(dir, 'apps.url');
  const appsUrl = fs.existsSync(appsFile) ? fs.readFileSync(appsFile, 'utf8').trim() : '';
  const api = async (p, opts = {}) => {
    const r = await fetch(url + '/api/v1' + p, {method: opts.method || 'GET', body: opts.body,
      headers: {Authorization: 'Bearer ' + (opts.token || token), 'Content-Type': 'application/json'}});
    const text = await r.text();
    return {status: r.status, body: text && (r.headers.get('content-type') || '').startsWith('application/json') ? JSON.parse(text) : text};
  };
  const stop = async () => {
    if (proc.exitCode === null) {
      const done = new Promise(r => proc.once('exit', r));
      proc.kill('SIGTERM');
      const t = setTimeout(() => proc.kill('SIGKILL'), 10000);
      await done;
      clearTimeout(t);
    }
    fs.closeSync(log);
    if (!process.env.WEB_KEEP) fs.rmSync(dir, {recursive: true, force: true});
  };
  return {url, appsUrl, token, dir, api, stop};
}
