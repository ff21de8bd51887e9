// contract.test.mjs - every answer of every route, on real traffic, against
// api/openapi.json. A validating proxy (contract-proxy.mjs) stands between
// a real `trainyard server` and all its clients: this test's requests (the
// README's curl examples: the example jobs, metrics, logs, checkpoints,
// events, queue, cluster, teams, Prometheus), the CLI (TRAINYARD_URL is
// the proxy), the agent (`--server` the proxy) and its workers (the server's
// `--public-url` is the proxy, so every worker's config.api is too):
// registration, heartbeats, long-polled assignments, task status, logs,
// metrics, checkpoint uploads and rendezvous all pass through it. Then the
// error answers. At the end: no violation, and every operation of the
// document was exercised, but those of NOT_REACHED (each with its reason).
import {test, before, after} from 'node:test';
import assert from 'node:assert/strict';
import {spawn, execFile, execFileSync} from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {ContractProxy, parseEventStream} from './contract-proxy.mjs';

const BIN = process.env.TRAINYARD_BIN || 'build/asan/trainyard';
const sleep = ms => new Promise(r => setTimeout(r, ms));

// Operations no traffic here reaches, and why. Everything else must be seen.
// Empty: every operation of the document is exercised. (Statuses not
// provoked: 503 and 507, the database busy or the disk full; 414 and 431,
// which libmicrohttpd may answer itself; 500. No route answers 429.)
const NOT_REACHED = new Map([
  // ['GET /api/v1/example', 'why no traffic can reach it here'],
]);

let proxy, dir, server, agent, tokens = {};
const logs = [];

function start(args, name) {
  const log = fs.openSync(path.join(dir, name + '.log'), 'a');
  const env = {...process.env, OPENBLAS_NUM_THREADS: '1'};
  delete env.TRAINYARD_TOKEN;
  delete env.TRAINYARD_URL;
  const p = spawn(BIN, args, {stdio: ['ignore', log, log], env});
  logs.push(log);
  return p;
}

async function stop(p) {
  if (!p || p.exitCode !== null || p.signalCode !== null) return;
  const done = new Promise(r => p.once('exit', r));
  p.kill('SIGTERM');
  const t = setTimeout(() => p.kill('SIGKILL'), 15000);
  await done;
  clearTimeout(t);
}

// A request through the proxy, as curl sends it (`-d` is x-www-form-urlencoded,
// which the server reads as JSON, docs/server.md).
async function call(p, {method = 'GET', token = tokens.team, body, headers = {}, raw = false} = {}) {
  const h = {...headers};
  if (token) h.Authorization = 'Bearer ' + token;
  if (body !== undefined && !h['Content-Type']) h['Content-Type'] = 'application/x-www-form-urlencoded';
  const r = await fetch(proxy.url + p, {method, headers: h, body});
  const buf = Buffer.from(await r.arrayBuffer());
  const ct = r.headers.get('content-type') || '';
  return {status: r.status, headers: r.headers, bytes: buf,
          body: !raw && ct.startsWith('application/json') && buf.length ? JSON.parse(buf) : buf.toString()};
}

const U = '/api/v1';

function example(name, edit = s => s) {
  return JSON.stringify(edit(JSON.parse(fs.readFileSync(`examples/${name}.json`, 'utf8'))));
}

async function submit(spec) {
  const r = await call(U + '/jobs', {method: 'POST', body: spec});
  assert.equal(r.status, 201, JSON.stringify(r.body));
  assert.equal(r.headers.get('location'), `${U}/jobs/${r.body.id}`);
  return r.body.id;
}

async function waitJob(id, states, ms = 90000) {
  const end = Date.now() + ms;
  let j;
  while (Date.now() < end) {
    j = (await call(`${U}/jobs/${id}`)).body;
    if (states.includes(j.state)) return j;
    await sleep(400);
  }
  assert.fail(`job ${id} is ${j && j.state} (${j && j.reason}) after ${ms} ms, not ${states.join('|')}`);
}

function cli(args, {token = tokens.team} = {}) {
  return new Promise(resolve => {
    const env = {...process.env, TRAINYARD_URL: proxy.url, TRAINYARD_TOKEN: token};
    execFile(BIN, args, {env, timeout: 60000}, (err, stdout, stderr) =>
      resolve({code: err ? (err.code ?? 1) : 0, stdout, stderr}));
  });
}

before(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ty_contract_'));
  proxy = await new ContractProxy().start();
  // --context-max-mb 1: the refusals' body of 1 MiB + 1 is past every route's limit
  server = start(['server', '--listen', '127.0.0.1:0', '--data', dir, '--public-url', proxy.url,
                  '--heartbeat-timeout', '60', '--context-max-mb', '1'], 'server');
  const urlFile = path.join(dir, 'server.url');
  for (let i = 0; i < 400 && !fs.existsSync(urlFile); i++) {
    if (server.exitCode !== null) throw new Error(`trainyard server exited; see ${dir}/server.log`);
    await sleep(50);
  }
  proxy.setTarget(fs.readFileSync(urlFile, 'utf8').trim());
  for (const [k, f] of [['team', 'token'], ['admin', 'admin.token'], ['join', 'node.token']])
    tokens[k] = fs.readFileSync(path.join(dir, f), 'utf8').trim();
  // the agent talks to the proxy; it runs the command jobs' relative paths from here.
  // --podman none: it runs no image (the image job below goes to a node this test plays)
  agent = start(['agent', '--server', proxy.url, '--token-file', path.join(dir, 'node.token'),
                 '--state-file', path.join(dir, 'agent.state'), '--cpu-slots', '4', '--hostname', 'contract-node',
                 '--heartbeat', '1', '--poll-wait', '5', '--worker-sched', 'idle', '--podman', 'none'], 'agent');
  for (let i = 0; i < 200; i++) {
    const c = await call(U + '/cluster');
    if (c.status === 200 && c.body.nodes && c.body.nodes.some(n => n.state === 'ready')) return;
    await sleep(100);
  }
  throw new Error(`the agent did not register; see ${dir}/agent.log`);
});

after(async () => {
  await stop(agent);
  await stop(server);
  if (proxy) await proxy.stop();
  for (const l of logs) fs.closeSync(l);
  if (dir && !process.env.WEB_KEEP) fs.rmSync(dir, {recursive: true, force: true});
});

const jobs = {};

test("the README's jobs, through the agent and its workers", async () => {
  // the quick job, smaller jobs of every strategy, a PyTorch command job
  jobs.quick = await submit(example('fashion_mnist_quick'));
  jobs.mirrored = await submit(example('mirrored_cpu', s => ({...s, data: {...s.data, limit: 3000}, fit: {...s.fit, epochs: 2}})));
  jobs.multi = await submit(example('multi_worker_cpu', s => ({...s, data: {...s.data, limit: 3000}, fit: {...s.fit, epochs: 2}})));
  jobs.ps = await submit(example('parameter_server_cpu', s => ({...s, data: {...s.data, limit: 3000}, fit: {...s.fit, epochs: 2}})));
  jobs.ddp = await submit(example('ddp_train'));
  // a command that fails: requeued once, then failed with its log tail; it
  // declares a port, so its running reports carry "ports" and its answers list it
  jobs.failing = await submit(JSON.stringify({name: 'fails', command: {argv: ['/bin/sh', '-c', 'echo boom >&2; exit 3']},
                                              max_restarts: 1, max_runtime_s: 60, ports: [{name: 'web', port: 8000}]}));
  // the queue and the cluster while jobs wait and devices are held
  for (let i = 0; i < 20; i++) {
    const c = await call(U + '/cluster');
    assert.equal(c.status, 200);
    const q = await call(U + '/queue');
    assert.equal(q.status, 200);
    if (JSON.stringify(q.body).includes('"id":' + jobs.failing) && JSON.stringify(c.body).includes('"job":')) break;
    await sleep(250);
  }

  // an event stream while the quick job runs: state events and metrics
  const ac = new AbortController();
  const sse = fetch(`${proxy.url}${U}/jobs/${jobs.quick}/events?since=0`,
                    {headers: {Authorization: 'Bearer ' + tokens.team, Accept: 'text/event-stream'}, signal: ac.signal})
    .then(async r => ({status: r.status, type: r.headers.get('content-type'), text: await r.text()}));

  const q = await waitJob(jobs.quick, ['succeeded', 'failed']);
  assert.equal(q.state, 'succeeded', q.reason);
  const stream = await sse;
  assert.equal(stream.status, 200);
  assert.match(stream.type, /^text\/event-stream/);
  const events = parseEventStream(stream.text);
  assert.ok(events.some(e => e.event === 'state'), 'the stream has state events');
  assert.ok(events.some(e => e.event === 'metric'), 'the stream has metrics');

  for (const k of ['mirrored', 'multi', 'ps', 'ddp']) {
    const j = await waitJob(jobs[k], ['succeeded', 'failed'], 100000);
    assert.equal(j.state, 'succeeded', `${k}: ${j.reason}`);
  }
  const f = await waitJob(jobs.failing, ['succeeded', 'failed']);
  assert.equal(f.state, 'failed');
  assert.equal(f.attempt, 2);
  const ended = (await call(`${U}/jobs/${jobs.failing}`)).body;
  assert.deepEqual(ended.ports, [{name: 'web', url: `/proxy/jobs/${jobs.failing}/web/`}]);
});

test("the README's reads of a finished job", async () => {
  const id = jobs.quick;
  const list = await call(U + '/jobs');
  assert.equal(list.status, 200);
  assert.ok(list.body.jobs.some(j => j.id === id));
  assert.equal((await call(U + '/jobs?state=succeeded&limit=2')).status, 200);
  const j = (await call(`${U}/jobs/${id}`)).body;
  assert.ok(j.progress.test, 'progress has the test metrics');
  const m = await call(`${U}/jobs/${id}/metrics?since=0&kind=epoch`);
  assert.equal(m.status, 200);
  assert.ok(m.body.metrics.length >= 2 && m.body.metrics.every(x => x.kind === 'epoch'));
  assert.equal((await call(`${U}/jobs/${jobs.ddp}/metrics?since=0`)).status, 200);
  assert.equal((await call(`${U}/jobs/${id}/metrics?last=1`)).status, 200);
  const log = await call(`${U}/jobs/${id}/logs?task=worker-0`);
  assert.equal(log.status, 200);
  assert.ok(log.headers.get('x-next-offset'));
  assert.match((await call(`${U}/jobs/${jobs.ddp}/logs?task=worker-1`)).body, /rank/);
  // a task that wrote nothing: empty, and where to read on
  const none = await call(`${U}/jobs/${id}/logs?task=worker-1`);
  assert.equal(none.body, '');
  assert.equal(none.headers.get('x-next-offset'), '0');
  const cps = await call(`${U}/jobs/${id}/checkpoints`);
  assert.equal(cps.status, 200);
  const newest = cps.body.checkpoints[0];
  const latest = await call(`${U}/jobs/${id}/checkpoints/latest`, {raw: true});
  assert.equal(latest.status, 200);
  assert.equal(crypto.createHash('sha256').update(latest.bytes).digest('hex'), newest.sha256);
  assert.equal((await call(`${U}/jobs/${id}/checkpoints/${newest.id}`, {raw: true})).status, 200);
  const ev = await call(`${U}/jobs/${id}/events`);
  assert.equal(ev.status, 200);
  assert.ok(ev.body.events.length > 0);
  assert.equal((await call(`${U}/jobs/${jobs.failing}/events?after=1&limit=50`)).status, 200);
  assert.equal((await call(`${U}/jobs/${jobs.failing}/logs?task=worker-0&since=0&limit=4096`)).status, 200);
  assert.equal((await call(`${U}/jobs/${id}/metrics?since=1&limit=3`)).status, 200);
  assert.equal((await call(`${U}/jobs?before=${jobs.failing}&limit=3`)).status, 200);
  assert.equal((await call(U + '/queue')).status, 200);
  assert.equal((await call(U + '/cluster')).status, 200);
  assert.equal((await call(U + '/examples')).status, 200);
  assert.equal((await call(U + '/health', {token: null})).status, 200);
  assert.equal((await call(U + '/openapi.json', {token: null})).status, 200);
  assert.equal((await call('/metrics', {token: tokens.admin})).status, 200);
});

test('cancel, a bad spec, teams and the node operations', async () => {
  // cancel a running job; a second cancel is 409
  const id = await submit(example('fashion_mnist_mlp'));
  await waitJob(id, ['running']);
  // a running job is not deleted: 409, cancel it first
  assert.equal((await call(`${U}/jobs/${id}`, {method: 'DELETE'})).status, 409);
  const c = await call(`${U}/jobs/${id}/cancel`, {method: 'POST'});
  assert.equal(c.status, 200);
  await waitJob(id, ['cancelled']);
  assert.equal((await call(`${U}/jobs/${id}/cancel`, {method: 'POST'})).status, 409);
  // cancelled, it is deleted (409 while its task still stops): its logs, checkpoints and metrics go, then 404
  let del;
  for (let i = 0; i < 150; i++) {
    del = await call(`${U}/jobs/${id}`, {method: 'DELETE'});
    if (del.status !== 409) break;
    await sleep(200);
  }
  assert.equal(del.status, 200, JSON.stringify(del.body));
  assert.equal(del.body.deleted, true);
  assert.ok(del.body.freed_bytes > 0);
  assert.equal((await call(`${U}/jobs/${id}`)).status, 404);
  assert.equal((await call(`${U}/jobs/${id}/logs`)).status, 404);
  assert.equal((await call(`${U}/jobs/${id}`, {method: 'DELETE'})).status, 404);

  const bad = await call(U + '/jobs', {method: 'POST', body: '{"model": {"layers": [{"type": "dense", "units": 0}]}}'});
  assert.equal(bad.status, 422);
  assert.equal(bad.body.error.field, 'model.layers[0].units');

  // a CNN's answer carries its model_summary (the document's ModelSummary), every layer type in it;
  // cancelled at once: the summary needs only the spec
  const cnn = await submit(JSON.stringify({name: 'contract-cnn', model: {layers: [
    {type: 'conv2d', filters: 4, kernel_size: 3, padding: 'same', activation: 'relu', input_shape: [28, 28]},
    {type: 'batch_normalization'}, {type: 'max_pooling2d'}, {type: 'average_pooling2d'}, {type: 'dropout', rate: 0.1},
    {type: 'activation', activation: 'relu'}, {type: 'global_average_pooling2d'}, {type: 'reshape', target_shape: [2, 2]},
    {type: 'flatten'}, {type: 'dense', units: 10, activation: 'softmax'}]},
    compile: {optimizer: 'adam', loss: 'sparse_categorical_crossentropy', metrics: ['accuracy']},
    data: {source: 'fashion-mnist', limit: 256}, fit: {epochs: 1, batch_size: 64}}));
  const cj = await call(`${U}/jobs/${cnn}`);
  assert.equal(cj.status, 200);
  assert.deepEqual(cj.body.model_summary.layers.map(l => l.output_shape),
                   [[28, 28, 4], [28, 28, 4], [14, 14, 4], [7, 7, 4], [7, 7, 4], [7, 7, 4], [4], [2, 2], [4], [10]]);
  assert.equal(cj.body.model_summary.non_trainable_params, 8);
  assert.ok([200, 409].includes((await call(`${U}/jobs/${cnn}/cancel`, {method: 'POST'})).status)); // 409: it ended already

  const t = await call(U + '/teams', {method: 'POST', token: tokens.admin, body: '{"name": "vision"}'});
  assert.equal(t.status, 201);
  assert.equal((await call(U + '/teams', {method: 'POST', token: tokens.admin, body: '{"name": "vision"}'})).status, 409);
  assert.equal((await call(U + '/teams')).status, 200);
  assert.equal((await call(U + '/teams/vision', {method: 'PATCH', token: tokens.admin, body: '{"weight": 2}'})).status, 200);
  assert.equal((await call(U + '/teams/vision', {method: 'POST', token: tokens.admin, body: '{"weight": 1}'})).status, 200);
  // the storage quota: a size, bytes, null; a bad one is a 422 naming it
  assert.equal((await call(U + '/teams/vision', {method: 'PATCH', token: tokens.admin, body: '{"storage_quota": "500GiB"}'})).status, 200);
  assert.equal((await call(U + '/teams/vision', {method: 'PATCH', token: tokens.admin, body: '{"storage_quota": 1048576}'})).status, 200);
  assert.equal((await call(U + '/teams/vision', {method: 'PATCH', token: tokens.admin, body: '{"storage_quota": "lots"}'})).status, 422);
  assert.equal((await call(U + '/teams/vision', {method: 'PATCH', token: tokens.admin, body: '{"storage_quota": null}'})).status, 200);
  // another team's job is a 404
  assert.equal((await call(`${U}/jobs/${jobs.quick}`, {token: t.body.token})).status, 404);

  // drain and undrain the node (admin), then revoke its token: the agent registers again
  const node = (await call(U + '/cluster')).body.nodes[0].id;
  assert.equal((await call(`${U}/nodes/${node}/drain`, {method: 'POST', token: tokens.admin})).status, 200);
  assert.equal((await call(`${U}/nodes/${node}/drain`, {method: 'DELETE', token: tokens.admin})).status, 200);
  assert.equal((await call(`${U}/nodes/${node}/token`, {method: 'DELETE', token: tokens.admin})).status, 200);
  await sleep(2500);
});

test('the CLI', async () => {
  const s = await cli(['submit', 'examples/fashion_mnist_quick.json', '--json']);
  assert.equal(s.code, 0, s.stderr);
  const id = JSON.parse(s.stdout).id;
  for (const args of [['jobs'], ['status', String(id)], ['queue'], ['cluster'], ['events', String(id)], ['teams']]) {
    const r = await cli(args);
    assert.equal(r.code, 0, `trainyard ${args.join(' ')}: ${r.stderr}`);
  }
  const w = await cli(['watch', String(id)]);
  assert.equal(w.code, 0, w.stderr);
  assert.equal((await cli(['logs', String(id)])).code, 0);
  const out = path.join(dir, 'model.safetensors');
  const d = await cli(['checkpoints', String(id), '--download', '-o', out]);
  assert.equal(d.code, 0, d.stderr);
  const again = await cli(['cancel', String(id)]);
  assert.equal(again.code, 1);
  assert.match(again.stderr, /already succeeded/);
  const del = await cli(['delete', String(id)]);
  assert.equal(del.code, 0, del.stderr);
  assert.match(del.stdout, /deleted/);
  assert.equal((await cli(['status', String(id)])).code, 1);
});

// A context: a folder as a gzip'd tar (tar czf), its list, its bytes, what
// is refused (a link leading out, not gzip, a job naming a context the team
// does not hold), its delete while a queued job names it (409) and after.
test('contexts', async () => {
  const src = fs.mkdtempSync(path.join(dir, 'ctx-'));
  fs.writeFileSync(path.join(src, 'train.py'), "print('trained')\n");
  const tgz = path.join(dir, 'ctx.tgz');
  execFileSync('tar', ['czf', tgz, '-C', src, '.']);
  const bytes = fs.readFileSync(tgz);
  const id = 'sha256:' + crypto.createHash('sha256').update(bytes).digest('hex');
  const gz = {'Content-Type': 'application/gzip'};
  let r = await call(U + '/contexts', {method: 'POST', body: bytes, headers: gz});
  assert.equal(r.status, 201, JSON.stringify(r.body));
  assert.equal(r.body.id, id);
  assert.equal((await call(U + '/contexts', {method: 'POST', body: bytes, headers: gz})).status, 200);
  r = await call(U + '/contexts');
  assert.equal(r.status, 200);
  assert.ok(r.body.contexts.some(c => c.id === id));
  r = await call(`${U}/contexts/${id}`, {raw: true});
  assert.equal(r.status, 200);
  assert.ok(r.bytes.equals(bytes));
  assert.equal(r.headers.get('x-checksum-sha256'), id.slice(7));
  assert.equal((await call(`${U}/contexts/sha256:nothex`)).status, 422);
  assert.equal((await call(`${U}/contexts/sha256:${'0'.repeat(64)}`)).status, 404);
  fs.symlinkSync('../../etc/passwd', path.join(src, 'out'));
  execFileSync('tar', ['czf', tgz, '-C', src, '.']);
  r = await call(U + '/contexts', {method: 'POST', body: fs.readFileSync(tgz), headers: gz});
  assert.equal(r.status, 422);
  assert.equal(r.body.error.code, 'invalid_context');
  assert.equal((await call(U + '/contexts', {method: 'POST', body: 'plain text', headers: gz})).status, 422);
  const spec = ctx => JSON.stringify({name: 'ctx', command: {argv: ['python3', 'train.py'], context: ctx},
                                      resources: {workers: 1, device: 'gpu'}, queue_if_infeasible: true});
  r = await call(U + '/jobs', {method: 'POST', body: spec('sha256:' + '1'.repeat(64))});
  assert.equal(r.status, 422);
  assert.equal(r.body.error.field, 'command.context');
  const job = await submit(spec(id)); // queued: no node here has a GPU
  assert.equal((await call(`${U}/contexts/${id}`, {method: 'DELETE'})).status, 409);
  assert.equal((await call(`${U}/jobs/${job}/cancel`, {method: 'POST'})).status, 200);
  assert.equal((await call(`${U}/contexts/${id}`, {method: 'DELETE'})).status, 204);
  assert.equal((await call(`${U}/contexts/${id}`, {method: 'DELETE'})).status, 404);
});

// Images and registry logins: an image job no node can run (422), the
// team's logins (stored, replaced, listed without the password, deleted),
// a node this test plays that reports podman, the image job's task reading
// the login and posting its image events, the pull failing the job for good.
test('images and registry logins', async () => {
  const image = 'registry.example.com:5000/team/trainer:1.0';
  const spec = (env, extra = {}) => JSON.stringify({name: 'image', command: {argv: ['python3', 'train.py']},
                                                    environment: env, max_runtime_s: 60, ...extra});
  // what the spec refuses, and no node with podman yet
  let r = await call(U + '/jobs', {method: 'POST', body: spec({image})});
  assert.equal(r.status, 422, JSON.stringify(r.body));
  assert.equal(r.body.error.code, 'infeasible');
  assert.equal(r.body.error.field, 'environment.image');
  for (const [env, field] of [[{image, pull: 'sometimes'}, 'environment.pull'], [{image: 'Team/Trainer'}, 'environment.image'],
                              [{pull: 'always'}, 'environment.image']]) {
    r = await call(U + '/jobs', {method: 'POST', body: spec(env)});
    assert.equal(r.status, 422);
    assert.equal(r.body.error.field, field);
  }
  r = await call(U + '/jobs', {method: 'POST', body: example('fashion_mnist_quick', s => ({...s, environment: {image}}))});
  assert.equal(r.status, 422);
  assert.equal(r.body.error.field, 'environment');

  // the team's login for the registry: stored (201), replaced (200), listed without the password
  const host = 'registry.example.com:5000', login = `${U}/registries/${host}`;
  r = await call(login, {method: 'PUT', body: JSON.stringify({username: 'ci', password: 'first-secret'})});
  assert.equal(r.status, 201, JSON.stringify(r.body));
  assert.deepEqual(r.body, {registry: host, username: 'ci'});
  assert.equal(r.headers.get('location'), login);
  r = await call(login, {method: 'PUT', body: JSON.stringify({username: 'ci', password: 'pull-secret'})});
  assert.equal(r.status, 200);
  r = await call(U + '/registries');
  assert.equal(r.status, 200);
  assert.deepEqual(r.body.registries.map(x => [x.registry, x.username]), [[host, 'ci']]);
  assert.ok(!JSON.stringify(r.body).includes('secret'), 'the list shows no password');
  assert.equal((await call(login, {method: 'PUT', token: tokens.admin, body: '{"username": "a", "password": "b"}'})).status, 403);
  assert.equal((await call(U + '/registries', {token: tokens.admin})).status, 403);
  for (const [p, body, field] of [[login, {username: 'ci'}, 'password'], [login, {username: 'a:b', password: 'x'}, 'username'],
                                  [login, {username: 'ci', password: 'x', email: 'e'}, 'email'],
                                  [`${U}/registries/bad_host!`, {username: 'ci', password: 'x'}, 'registry']]) {
    r = await call(p, {method: 'PUT', body: JSON.stringify(body)});
    assert.equal(r.status, 422, `${p} ${JSON.stringify(body)}`);
    assert.equal(r.body.error.field, field);
  }
  assert.equal((await call(`${U}/registries/other.example.com`, {method: 'DELETE'})).status, 404);

  // a node with podman (this test plays its agent); a runtime it cannot name is refused
  r = await call(U + '/nodes', {method: 'POST', token: tokens.join,
                                body: JSON.stringify({hostname: 'podman-node', address: '127.0.0.1', cpu_slots: 1, runtimes: ['docker']})});
  assert.equal(r.status, 422);
  assert.equal(r.body.error.field, 'runtimes');
  r = await call(U + '/nodes', {method: 'POST', token: tokens.join,
                                body: JSON.stringify({hostname: 'podman-node', address: '127.0.0.1', cpu_slots: 1,
                                                      runtimes: ['host', 'podman']})});
  assert.equal(r.status, 201);
  const node = r.body.id, nodeToken = r.body.token;
  const nodes = (await call(U + '/cluster')).body.nodes;
  assert.deepEqual(nodes.find(n => n.id === node).runtimes, ['host', 'podman']);
  assert.deepEqual(nodes.find(n => n.hostname === 'contract-node').runtimes, ['host']);

  // the image job goes to it: its task reads the team's login
  const job = await submit(spec({image, pull: 'always'}));
  let task;
  for (let i = 0; i < 20 && !task; i++) {
    const a = await call(`${U}/nodes/${node}/assignments?wait=2`, {token: nodeToken});
    assert.equal(a.status, 200);
    task = a.body.start.find(t => t.job === job);
  }
  assert.ok(task, 'the image job was not handed to the node with podman');
  const auth = `${U}/jobs/${job}/registry-auth`;
  r = await call(auth, {token: task.token});
  assert.equal(r.status, 200, JSON.stringify(r.body));
  assert.deepEqual(r.body, {registry: host, username: 'ci', password: 'pull-secret'});
  assert.equal((await call(`${U}/jobs/${jobs.quick}/registry-auth`, {token: task.token})).status, 404);

  // its image events: a line on the timeline; the wrong attempt (409) and bad bodies (422) refused
  const events = `${U}/jobs/${job}/events`;
  const post = body => call(events, {method: 'POST', token: task.token, body: JSON.stringify(body),
                                     headers: {'Content-Type': 'application/json'}});
  r = await post({kind: 'image', message: `pulling image ${image} on podman-node`, attempt: task.attempt});
  assert.equal(r.status, 200, JSON.stringify(r.body));
  assert.deepEqual(r.body, {job, kind: 'image'});
  r = await post({kind: 'image', message: 'late', attempt: task.attempt + 1});
  assert.equal(r.status, 409);
  assert.equal(r.body.error.field, 'attempt');
  for (const [body, code, field] of [[{kind: 'pulled', message: 'm', attempt: 1}, 'invalid_value', 'kind'],
                                     [{kind: 'image', message: '', attempt: 1}, 'invalid_value', 'message'],
                                     [{kind: 'image', message: 'x'.repeat(1001), attempt: 1}, 'invalid_value', 'message'],
                                     [{kind: 'image', message: 'm'}, 'missing_field', 'attempt'],
                                     [{kind: 'image', message: 'm', attempt: 1, at: 'now'}, 'unknown_field', 'at']]) {
    r = await post(body);
    assert.equal(r.status, 422, JSON.stringify(body));
    assert.deepEqual([r.body.error.code, r.body.error.field], [code, field]);
  }
  assert.ok((await call(events)).body.events.some(e => e.kind === 'image'), 'the image line is on the timeline');

  // the login deleted: the task finds none (404), the pull fails, and the job with it, for good
  r = await call(login, {method: 'DELETE'});
  assert.equal(r.status, 200);
  assert.deepEqual(r.body, {registry: host, deleted: true});
  assert.equal((await call(login, {method: 'DELETE'})).status, 404);
  assert.equal((await call(auth, {token: task.token})).status, 404);
  const why = `cannot pull image ${image}: unauthorized: authentication required`;
  r = await post({kind: 'image_pull_failed', message: why, attempt: task.attempt});
  assert.equal(r.status, 200);
  const failed = await waitJob(job, ['failed']);
  assert.ok(failed.reason.includes(why), failed.reason);
  assert.equal(failed.attempt, 1);
  assert.equal((await post({kind: 'image_pull_failed', message: why, attempt: task.attempt})).status, 409);
  assert.equal((await call(`${U}/nodes/${node}/drain`, {method: 'POST', token: nodeToken})).status, 200);
});

// Usage (who used what) of the jobs above: every grouping, a team and the
// admin, CSV, the CLI, and the refusals of bad arguments.
test('usage', async () => {
  for (const by of ['team', 'job', 'day']) {
    const r = await call(`${U}/usage?by=${by}`, {token: tokens.admin});
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.ok(r.body.rows.length > 0, by);
  }
  let r = await call(`${U}/usage?from=${encodeURIComponent(new Date(Date.now() - 86400000).toISOString())}&to=${Date.now() + 60000}`);
  assert.equal(r.status, 200, JSON.stringify(r.body));
  assert.ok(r.body.rows.every(x => x.team === 'default'));
  assert.ok(r.body.totals.cpu_slot_seconds > 0);
  r = await call(U + '/usage?by=day', {headers: {Accept: 'text/csv'}});
  assert.equal(r.status, 200);
  assert.match(r.body, /^day,team,gpu_seconds,cpu_slot_seconds,/);
  assert.equal((await call(U + '/usage?team=vision')).status, 403);
  assert.equal((await call(U + '/usage?team=vision', {token: tokens.admin})).status, 200);
  for (const [q, field] of [['by=week', 'by'], ['from=yesterday', 'from'], ['to=2026-02-30', 'to'], ['from=2026-01-02&to=2026-01-01', 'to']]) {
    r = await call(`${U}/usage?${q}`);
    assert.equal(r.status, 422, q);
    assert.equal(r.body.error.field, field, q);
  }
  const table = await cli(['usage', '--by', 'job']);
  assert.equal(table.code, 0, table.stderr);
  assert.match(table.stdout, /GPU-HOURS/);
  const csv = await cli(['usage', '--csv']);
  assert.equal(csv.code, 0, csv.stderr);
  assert.match(csv.stdout, /^team,gpu_seconds,/);
});

// Sweeps: a 2-trial grid of a small training job to its end (the trials
// are jobs that show their sweep and trial), a 2-trial ASHA sweep (each
// trial's worker asks POST /jobs/{id}/rung at its first rung's end), the
// list, a refused parameter, a cancel and its second cancel, the CLI's table.
test('sweeps', async () => {
  const job = JSON.parse(example('fashion_mnist_quick', s => ({...s, data: {...s.data, limit: 600}, fit: {...s.fit, epochs: 1}})));
  const body = {name: 'contract-sweep', job, search: {method: 'grid', metric: 'val_accuracy', mode: 'max',
    parameters: {'compile.optimizer.learning_rate': {values: [0.001, 0.003]}}, max_concurrent: 2}};
  let r = await call(U + '/sweeps', {method: 'POST', body: JSON.stringify(body)});
  assert.equal(r.status, 201, JSON.stringify(r.body));
  assert.equal(r.headers.get('location'), `${U}/sweeps/${r.body.id}`);
  const id = r.body.id;
  const end = Date.now() + 120000;
  do {
    r = await call(`${U}/sweeps/${id}`);
    assert.equal(r.status, 200);
    if (r.body.state !== 'running') break;
    await sleep(500);
  } while (Date.now() < end);
  assert.equal(r.body.state, 'succeeded', JSON.stringify(r.body));
  assert.equal(r.body.trials.length, 2);
  assert.ok(r.body.best && r.body.best.checkpoint > 0, JSON.stringify(r.body.best));
  const trialJob = (await call(`${U}/jobs/${r.body.trials[1].job_id}`)).body;
  assert.equal(trialJob.sweep, id);
  assert.equal(trialJob.trial, 1);
  r = await call(U + '/sweeps', {method: 'POST', body: JSON.stringify({...body, name: 'contract-asha',
    search: {...body.search, method: 'asha', max_epochs: 2, reduction_factor: 2}})});
  assert.equal(r.status, 201, JSON.stringify(r.body));
  const asha = r.body.id;
  do {
    r = await call(`${U}/sweeps/${asha}`);
    assert.equal(r.status, 200);
    if (r.body.state !== 'running') break;
    await sleep(500);
  } while (Date.now() < end);
  assert.equal(r.body.state, 'succeeded', JSON.stringify(r.body));
  assert.equal((await call(U + '/sweeps')).body.sweeps[1].id, id);
  r = await call(U + '/sweeps', {method: 'POST', body: JSON.stringify({...body,
    search: {...body.search, parameters: {'fit.batch_size': {values: [32, 0]}}}})});
  assert.equal(r.status, 422);
  assert.equal(r.body.error.field, 'search.parameters.fit.batch_size');
  r = await call(U + '/sweeps', {method: 'POST', body: JSON.stringify({...body, job: {...job, fit: {epochs: 50, batch_size: 64}}})});
  assert.equal(r.status, 201);
  r = await call(`${U}/sweeps/${r.body.id}/cancel`, {method: 'POST'});
  assert.equal(r.status, 200);
  assert.equal(r.body.state, 'cancelled');
  assert.equal((await call(`${U}/sweeps/${r.body.id}/cancel`, {method: 'POST'})).status, 409);
  assert.equal((await call(`${U}/sweeps/999999`)).status, 404);
  const table = await cli(['sweep-status', String(id)]);
  assert.equal(table.code, 0, table.stderr);
  assert.match(table.stdout, /TRIAL/);
});

test('error answers', async () => {
  assert.equal((await call(U + '/jobs', {token: null})).status, 401);
  assert.equal((await call(U + '/jobs', {token: 'ty_' + 'x'.repeat(43)})).status, 401);
  assert.equal((await call(U + '/teams', {method: 'POST', body: '{"name": "b"}'})).status, 403);
  assert.equal((await call('/metrics')).status, 403);
  assert.equal((await call(U + '/nodes/1/heartbeat', {method: 'POST', token: tokens.join, body: '{}'})).status, 403);
  assert.equal((await call(U + '/jobs/999999')).status, 404);
  assert.equal((await call(U + '/jobs/999999/metrics')).status, 404);
  assert.equal((await call(U + '/no/such/thing')).status, 404);
  assert.equal((await call(U + '/jobs', {method: 'DELETE'})).status, 405);
  assert.equal((await call(U + '/jobs', {method: 'POST', body: '{"name":'})).status, 400);
  assert.equal((await call(U + '/jobs?limit=many')).status, 400);
  assert.equal((await call(U + '/jobs', {method: 'POST', body: 'x'.repeat((1 << 20) + 1)})).status, 413);
  assert.equal((await call(U + '/jobs', {method: 'POST', body: '{}', headers: {'Content-Type': 'text/plain'}})).status, 415);
  // a checkpoint whose file is gone: 410
  const cps = (await call(`${U}/jobs/${jobs.quick}/checkpoints`)).body.checkpoints;
  fs.rmSync(path.join(dir, 'checkpoints', String(jobs.quick), `${cps[0].id}.safetensors`));
  assert.equal((await call(`${U}/jobs/${jobs.quick}/checkpoints/${cps[0].id}`)).status, 410);
  assert.equal((await call(`${U}/jobs/${jobs.quick}/checkpoints/latest`)).status, 410);
});

// Every operation refuses what docs/server.md says it refuses, with the
// document's statuses and Error body: no token (401), a token of a kind it
// does not take (403), a malformed query (400, before routing), a body that
// is not JSON (415) or past the route's limit (413). Nothing is changed.
test("every operation's refusals", async () => {
  const reg = await call(U + '/nodes', {method: 'POST', token: tokens.join,
                                        body: JSON.stringify({hostname: 'probe-node', address: '127.0.0.1', cpu_slots: 1})});
  assert.equal(reg.status, 201);
  const probe = reg.body.id;
  assert.equal((await call(`${U}/nodes/${probe}/drain`, {method: 'POST', token: reg.body.token})).status, 200);
  const held = {team: tokens.team, admin: tokens.admin, join: tokens.join, node: reg.body.token};
  const cid = (await call(`${U}/jobs/${jobs.mirrored}/checkpoints`)).body.checkpoints[0].id;
  const got = [];
  const expect = async (want, op, p, opts) => {
    const r = await call(p, opts);
    if (r.status !== want) got.push(`${op} ${JSON.stringify(opts.token ? Object.keys(held).find(k => held[k] === opts.token) : 'no token')}: ${r.status}, not ${want}`);
  };
  for (const op of proxy.operations()) {
    const [method, tpl] = op.split(' ');
    const d = proxy.doc.paths[tpl][method.toLowerCase()];
    const kinds = d['x-trainyard-tokens'];
    const p = tpl.replace('{id}', tpl.startsWith(U + '/nodes/') ? probe : jobs.mirrored).replace('{cid}', cid)
      .replace('{key}', 'k').replace('{name}', 'vision').replace('{host}', 'registry.example.com');
    const ok = Object.keys(held).find(k => kinds.includes(k));
    if (kinds.length) await expect(401, op, p, {method, token: null});
    for (const k of Object.keys(held)) if (kinds.length && !kinds.includes(k)) await expect(403, op, p, {method, token: held[k]});
    await expect(400, op, p + '?x=%zz', {method, token: ok ? held[ok] : null});
    if (!ok || !['POST', 'PUT', 'PATCH'].includes(method)) continue;
    const body = Object.keys(d.requestBody?.content || {});
    if (body.length === 1 && body[0] === 'application/json')
      await expect(415, op, p, {method, token: held[ok], body: '{}', headers: {'Content-Type': 'text/html'}});
    // a job's apps take 64 MiB (a notebook with its images), every other route 1 MiB
    const limit = tpl.startsWith('/proxy/') ? 64 << 20 : 1 << 20;
    await expect(413, op, p, {method, token: held[ok], body: 'x'.repeat(limit + 1)});
  }
  assert.deepEqual(got, [], 'answers other than the refusal asked for');
});

test('no contract violation, and every operation exercised', async t => {
  await stop(agent); // it drains its node through the proxy
  const checked = proxy.exchanges.filter(x => x.status > 0);
  t.diagnostic(`${checked.length} exchanges checked against api/openapi.json`);
  for (const [op, st] of [...proxy.coverage()].sort())
    t.diagnostic(`${op}: ${[...st].filter(s => s > 0).sort().join(' ')}`);
  const v = proxy.summary();
  assert.deepEqual(v, [], `answers or requests that do not match api/openapi.json:\n${v.join('\n')}`);
  const seen = proxy.coverage();
  const missing = proxy.operations().filter(op => !seen.has(op) && !NOT_REACHED.has(op));
  assert.deepEqual(missing, [], 'operations no traffic exercised');
  for (const op of NOT_REACHED.keys()) assert.ok(!seen.has(op), `${op} is reached: take it off NOT_REACHED`);
  const beats = proxy.exchanges.filter(x => x.operation === 'POST /api/v1/nodes/{id}/heartbeat' && x.status === 200);
  assert.ok(beats.length >= 5, `the agent's heartbeats were answered 200 (${beats.length})`);
  const statuses = [...seen.values()].reduce((s, v) => new Set([...s, ...v]), new Set());
  for (const st of [200, 201, 400, 401, 403, 404, 409, 410, 413, 415, 422])
    assert.ok(statuses.has(st), `no answer ${st} was checked`);
});
