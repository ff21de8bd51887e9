// dashboard.test.mjs - the dashboard in headless Chromium (Debian's, driven
// by playwright-core) against the real `trainyard up`: sign in (a wrong token
// is refused, a rotated-away one said to have expired), submit a job through the form and watch it run to succeeded
// with both charts drawn and its mean speed, an elastic job's workers chart, cancel a running job from its page, see a bad
// spec's error at the field it names, what users wrote rendered as text,
// a CNN's model as Keras' model.summary() shows it (and a command job's
// page without one), and the jobs, queue and cluster pages at a desktop's
// and a phone's width.
// Screenshots go to $WEB_TEST_OUT (default build/web-test).
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
let srv, ctx, page, profile;
const pageErrors = [];

/* A job the size of a test: Fashion-MNIST, 2000 examples, a small MLP. */
function spec(name, epochs) {
  return JSON.stringify({name, model: {layers: [{type: 'flatten', input_shape: [28, 28]}, {type: 'dense', units: 32, activation: 'relu'},
    {type: 'dense', units: 10, activation: 'softmax'}]}, compile: {optimizer: {type: 'adam', learning_rate: 0.001},
    loss: 'sparse_categorical_crossentropy', metrics: ['accuracy']}, data: {source: 'fashion-mnist', limit: 2000, validation_split: 0.1, seed: 7},
    fit: {epochs, batch_size: 64}});
}

async function shot(name) {
  await page.screenshot({path: path.join(OUT, name + '.png'), fullPage: true});
}

/* Non-grey pixels of the chart's canvas: the drawn series (axes and grid are grey). */
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

async function pickExampleAndSet(fields) {
  await page.click('a[href="#/submit"]');
  await page.waitForFunction(() => document.querySelector('#spec') && document.querySelector('#spec').value.includes('"fashion-quick"'));
  for (const [id, v] of Object.entries(fields)) await page.fill(id, v);
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
});

after(async () => {
  if (ctx) await ctx.close();
  if (srv) await srv.stop();
  if (profile) fs.rmSync(profile, {recursive: true, force: true});
});

test('sign in with a team token', async () => {
  await page.goto(srv.url + '/');
  await page.fill('#token', 'ty_not_a_token');
  await page.click('#signin button[type=submit]');
  await page.waitForSelector('#signin-error:has-text("not valid")');
  await shot('signin-desktop');
  // a token rotated away (no grace) is said to have expired, not just refused
  const admin = fs.readFileSync(path.join(srv.dir, 'admin.token'), 'utf8').trim();
  const team = await srv.api('/teams', {method: 'POST', token: admin, body: JSON.stringify({name: 'browser-rotated'})});
  assert.equal(team.status, 201);
  const rot = await srv.api('/teams/browser-rotated/tokens', {method: 'POST', token: team.body.token,
                                                               body: JSON.stringify({rotate: true, grace_s: 0})});
  assert.equal(rot.status, 201);
  assert.equal(rot.body.rotated, 1);
  await page.fill('#token', team.body.token);
  await page.click('#signin button[type=submit]');
  await page.waitForSelector('#signin-error:has-text("expired")');
  await page.fill('#token', srv.token);
  await page.click('#signin button[type=submit]');
  await page.waitForSelector('#jobs');
  assert.equal(await page.evaluate(() => localStorage.getItem('trainyard.token')), srv.token);
  // a reload keeps the session
  await page.reload();
  await page.waitForSelector('#jobs');
});

test('submit through the form; it runs to succeeded with its charts drawn', async () => {
  await pickExampleAndSet({'#f-name': 'browser-quick', '#f-fit-epochs': '3'});
  const specText = await page.inputValue('#spec');
  assert.equal(JSON.parse(specText).fit.epochs, 3, 'the form writes into the spec');
  await page.click('#submit');
  await page.waitForURL(/#\/jobs\/\d+$/);
  const id = Number(page.url().split('/').pop());
  await page.waitForSelector('#job-state [data-state="succeeded"]', {timeout: 90000});
  // the charts: points from the step, epoch and test metrics, and lines on the canvas
  await page.waitForFunction(() => Number(document.querySelector('#chart-loss')?.dataset.points || 0) >= 4 &&
                                   Number(document.querySelector('#chart-accuracy')?.dataset.points || 0) >= 3);
  assert.ok(await coloredPixels('#chart-loss') > 100, 'the loss curve is drawn');
  assert.ok(await coloredPixels('#chart-accuracy') > 100, 'the accuracy curve is drawn');
  // timeline, log, checkpoints
  await page.waitForSelector('#timeline [data-state="succeeded"]');
  assert.equal(await page.locator('#timeline li').count() >= 4, true);
  await page.waitForSelector('#log:has-text("done")');
  await page.waitForSelector('#checkpoints tr[data-checkpoint]');
  const r = await srv.api(`/jobs/${id}`);
  assert.equal(r.body.state, 'succeeded');
  assert.equal(r.body.name, 'browser-quick');
  // its speed is the run's mean: the samples it trained (epochs x the training
  // examples of its spec) over its training time (its epoch metrics' seconds)
  const sp = JSON.parse(specText).data;
  const perEpoch = sp.limit - Math.trunc(sp.limit * (sp.validation_split || 0));
  const epochs = (await srv.api(`/jobs/${id}/metrics?since=0&kind=epoch`)).body.metrics;
  assert.equal(epochs.length, 3);
  const trainSecs = epochs.reduce((t, m) => t + m.seconds, 0);
  const want = 3 * perEpoch / trainSecs;
  await page.waitForSelector('#samples-per-sec:has-text("mean")');
  const speed = await page.textContent('#samples-per-sec');
  const shown = Number(speed.split('(')[0].replace(/[^0-9]/g, ''));
  assert.ok(Math.abs(shown - want) <= 0.001 * want + 1,
            `Samples/s shows "${speed}"; ${3 * perEpoch} samples in ${trainSecs.toFixed(4)} s of training is ${Math.round(want)}`);
  const dl = page.waitForEvent('download');
  await page.locator('#checkpoints button.download').first().click();
  const file = await (await dl).path();
  assert.ok(fs.statSync(file).size > 1000, 'the checkpoint downloads');
  await shot('job-desktop');
});

test('a job with an evaluator shows its eval points beside val and test', async () => {
  const body = JSON.parse(spec('browser-eval', 3));
  body.resources = {evaluator: true};
  const r = await srv.api('/jobs', {method: 'POST', body: JSON.stringify(body)});
  assert.equal(r.status, 201);
  await page.goto(`${srv.url}/#/jobs/${r.body.id}`);
  await page.waitForSelector('#job-state [data-state="succeeded"]', {timeout: 90000});
  // an eval point per checkpoint the evaluator saw on each chart (a checkpoint
  // an upload still in flight replaced is not evaluated: on a loaded machine
  // one of the three epochs' may be skipped: executor/report.c keeps only the
  // newest checkpoint not yet uploaded), and the
  // newest, epoch 3's, in the progress card
  await page.waitForFunction(() => Number(document.querySelector('#chart-loss')?.getAttribute('data-points-eval_loss') || 0) >= 2 &&
                                   Number(document.querySelector('#chart-accuracy')?.getAttribute('data-points-eval_accuracy') || 0) >= 2,
                             null, {timeout: 30000});
  assert.ok(Number(await page.getAttribute('#chart-loss', 'data-points-val_loss')) >= 3, 'val points beside the eval points');
  await page.waitForSelector('#eval-summary:has-text("accuracy")');
  assert.match(await page.textContent('#eval-summary'), /epoch 3/);
  assert.equal(await page.locator('#tasks td', {hasText: 'evaluator-0'}).count(), 1);
  await shot('job-evaluator');
});

test('an elastic job shows its workers over the steps beside its loss', async () => {
  const body = JSON.parse(spec('browser-elastic', 3));
  body.strategy = {type: 'multi_worker_mirrored'};
  body.resources = {workers: {min: 1, max: 2}};
  const r = await srv.api('/jobs', {method: 'POST', body: JSON.stringify(body)});
  assert.equal(r.status, 201);
  await page.goto(`${srv.url}/#/jobs/${r.body.id}`);
  await page.waitForSelector('#job-state [data-state="succeeded"]', {timeout: 90000});
  // data-points is set when the chart is drawn (data-points-workers when a point is added)
  await page.waitForFunction(() => Number(document.querySelector('#chart-workers')?.getAttribute('data-points-workers') || 0) >= 2 &&
                                   Number(document.querySelector('#chart-workers')?.dataset.points || 0) >= 2,
                             null, {timeout: 30000});
  assert.ok(await coloredPixels('#chart-workers') > 50, 'the workers line is drawn');
  assert.match(await page.textContent('#job-summary'), /\d \(1-2\)×1 cpu/);
  await shot('job-elastic');
});

test('cancel a running job from its page', async () => {
  const r = await srv.api('/jobs', {method: 'POST', body: spec('browser-long', 3000)});
  assert.equal(r.status, 201);
  await page.goto(`${srv.url}/#/jobs/${r.body.id}`);
  await page.waitForSelector('#job-state [data-state="running"]', {timeout: 60000});
  await page.waitForFunction(() => Number(document.querySelector('#chart-loss')?.dataset.points || 0) >= 2, null, {timeout: 60000});
  await page.click('#cancel');
  await page.waitForSelector('#cancel:has-text("Yes, cancel")');
  await page.click('#cancel');
  await page.waitForSelector('#job-state [data-state="cancelled"]');
  await page.waitForSelector('#timeline [data-state="cancelled"]');
  assert.equal((await srv.api(`/jobs/${r.body.id}`)).body.state, 'cancelled');
  await page.click('a[href="#/jobs"]');
  await page.waitForSelector(`#jobs tr[data-job-id="${r.body.id}"][data-state="cancelled"]`);
});

test('a bad spec shows its error at the field it names', async () => {
  await pickExampleAndSet({'#f-fit-epochs': '0'});
  await page.click('#submit');
  const err = page.locator('[data-error-for="fit.epochs"]');
  await err.waitFor();
  assert.match(await err.textContent(), /epochs|between|at least|must/i);
  assert.equal(await page.getAttribute('#f-fit-epochs', 'aria-invalid'), 'true');
  assert.equal(await page.evaluate(() => document.activeElement.id), 'f-fit-epochs');
  assert.match(page.url(), /#\/submit$/, 'nothing was submitted');
  await shot('submit-error-desktop');
  // a field the form does not have: the error is shown at the JSON editor
  const s = JSON.parse(await page.inputValue('#spec'));
  s.fit.epochs = 2;
  s.model.layers[1].units = 0;
  await page.fill('#spec', JSON.stringify(s, null, 2));
  await page.click('#submit');
  await page.waitForSelector('#spec-error[data-error-for="model.layers[1].units"]');
  assert.match(await page.textContent('#spec-error'), /model\.layers\[1\]\.units/);
  assert.equal(await page.locator('[data-error-for="fit.epochs"]').count(), 0, 'the old error is gone');
});

test('what users wrote is shown as text, never as markup', async () => {
  // a cancel reason is free text: it shows in the job's timeline
  const evil = '<img src=x onerror="window.pwned=1">';
  const r = await srv.api('/jobs', {method: 'POST', body: spec('markup-check', 3000)});
  assert.equal(r.status, 201);
  const c = await srv.api(`/jobs/${r.body.id}/cancel`, {method: 'POST', body: JSON.stringify({reason: evil})});
  assert.equal(c.status, 200);
  await page.goto(`${srv.url}/#/jobs/${r.body.id}`);
  await page.waitForSelector('#timeline [data-state="cancelled"]');
  const li = page.locator('#timeline li', {hasText: 'onerror'});
  assert.match(await li.textContent(), /<img src=x onerror="window\.pwned=1">/);
  assert.equal(await page.locator('#timeline img, #job-summary img').count(), 0);
  assert.match(await page.textContent('#job-summary'), /<img src=x/);
  assert.equal(await page.evaluate(() => window.pwned), undefined);
});

/* A small CNN: conv2d 8 3x3 on [28, 28] (one channel added) -> (26, 26, 8), 80 params;
 * pooling, batch normalization (16 of its 32 params trainable), flatten, dense. */
function cnnSpec(name) {
  return JSON.stringify({name, model: {layers: [
    {type: 'conv2d', filters: 8, kernel_size: 3, activation: 'relu', input_shape: [28, 28]}, {type: 'max_pooling2d'},
    {type: 'batch_normalization'}, {type: 'flatten'}, {type: 'dense', units: 10, activation: 'softmax'}]},
    compile: {optimizer: 'adam', loss: 'sparse_categorical_crossentropy', metrics: ['accuracy']},
    data: {source: 'fashion-mnist', limit: 512}, fit: {epochs: 1, batch_size: 64}});
}

test('a job page shows the model as Keras\' model.summary(), at a desktop and a phone width', async () => {
  // the summary needs only the spec: the job is cancelled at once (whether it trains does not matter here)
  const r = await srv.api('/jobs', {method: 'POST', body: cnnSpec('browser-cnn')});
  assert.equal(r.status, 201);
  await srv.api(`/jobs/${r.body.id}/cancel`, {method: 'POST'});
  const m = (await srv.api(`/jobs/${r.body.id}`)).body.model_summary;
  assert.deepEqual(m.layers.map(l => [l.name, l.output_shape, l.params]),
                   [['conv2d_0', [26, 26, 8], 80], ['max_pooling2d_0', [13, 13, 8], 0], ['batch_normalization_0', [13, 13, 8], 32],
                    ['flatten_0', [1352], 0], ['dense_0', [10], 13530]]);
  const count = (t) => Number(t.split('(')[0].replace(/[^0-9]/g, ''));
  for (const [vp, tag] of [[DESKTOP, 'desktop'], [PHONE, 'phone']]) {
    await page.setViewportSize(vp);
    await page.goto(`${srv.url}/#/jobs`); // the job page drawn afresh at this width
    await page.waitForSelector('#jobs');
    await page.goto(`${srv.url}/#/jobs/${r.body.id}`);
    await page.waitForSelector('#model tbody tr');
    await page.waitForTimeout(300); // its charts sized
    // a row a layer with the API's name, Keras' class, the shape with None for the batch and the Param #
    const rows = await page.$$eval('#model tbody tr', trs => trs.map(tr => [...tr.cells].map(td => td.textContent)));
    assert.deepEqual(rows.map(([layer, shape, params]) => [layer, shape, count(params)]),
                     m.layers.map(l => [`${l.name} (${{conv2d: 'Conv2D', max_pooling2d: 'MaxPooling2D', batch_normalization: 'BatchNormalization',
                                                        flatten: 'Flatten', dense: 'Dense'}[l.type]})`,
                                         `(None, ${l.output_shape.join(', ')})`, l.params]));
    assert.equal(rows[0][1], '(None, 26, 26, 8)');
    assert.equal(count(await page.textContent('#model-total')), m.total_params);
    assert.equal(count(await page.textContent('#model-trainable')), m.trainable_params);
    assert.equal(count(await page.textContent('#model-non-trainable')), m.non_trainable_params);
    assert.deepEqual([m.total_params, m.trainable_params, m.non_trainable_params], [13642, 13626, 16]);
    assert.match(await page.textContent('#model-total'), /^13,642 \(53\.3 KiB\)$/);
    assert.equal(await page.textContent('#model-input'), 'input (None, 28, 28, 1)');
    // readable on a phone: no sideways scrolling of the page, nor of the table in its frame
    assert.ok(await page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth + 1), `the job page fits the ${tag}`);
    assert.ok(await page.$eval('#model', t => t.parentElement.scrollWidth <= t.parentElement.clientWidth + 1),
              `the model's table fits the ${tag} without scrolling`);
    await page.locator('#model-card').screenshot({path: path.join(OUT, `job-model-${tag}.png`)});
  }
  await page.setViewportSize(DESKTOP);
  // a command job has no model: no card
  const c = await srv.api('/jobs', {method: 'POST', body: JSON.stringify({name: 'browser-command', command: {argv: ['true']}})});
  assert.equal(c.status, 201);
  assert.equal((await srv.api(`/jobs/${c.body.id}`)).body.model_summary, null);
  await page.goto(`${srv.url}/#/jobs/${c.body.id}`);
  await page.waitForSelector('#job-summary dt');
  assert.equal(await page.locator('#model, #model-card').count(), 0);
});

test('jobs, queue and cluster at a desktop and a phone width', async () => {
  // the slots free of the earlier tests' jobs (a cancelled worker exits in its own time)
  for (let i = 0; i < 600; i++) {
    const c = await srv.api('/cluster');
    if (c.body.utilisation.cpu_slots_used === 0) break;
    await new Promise((res) => setTimeout(res, 100));
  }
  // two long jobs hold both CPU slots; a third waits in the queue
  const ids = [];
  for (const n of ['resnet-ish', 'bert-ish', 'waits-for-a-slot']) {
    const r = await srv.api('/jobs', {method: 'POST', body: spec(n, 3000)});
    ids.push(r.body.id);
  }
  await page.goto(`${srv.url}/#/jobs`);
  await page.waitForFunction((id) => document.querySelector(`#jobs tr[data-job-id="${id}"][data-state="running"]`), ids[1], {timeout: 60000});
  await page.waitForSelector(`#jobs tr[data-job-id="${ids[2]}"][data-state="queued"]`);
  await page.waitForTimeout(2500); // one more live refresh: progress bars move
  for (const [vp, tag] of [[DESKTOP, 'desktop'], [PHONE, 'phone']]) {
    await page.setViewportSize(vp);
    await page.goto(`${srv.url}/#/jobs`);
    await page.waitForSelector(`#jobs tr[data-job-id="${ids[0]}"]`);
    assert.ok(await page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth + 1), `no sideways scrolling on the ${tag}`);
    await shot('jobs-' + tag);
    await page.goto(`${srv.url}/#/queue`);
    await page.waitForSelector(`#queue tr[data-job-id="${ids[2]}"] td.reason`);
    assert.ok((await page.textContent(`#queue tr[data-job-id="${ids[2]}"] td.reason`)).length > 5, 'why it waits');
    await shot('queue-' + tag);
    await page.goto(`${srv.url}/#/cluster`);
    await page.waitForSelector('#nodes .slot.held');
    assert.equal(await page.locator('#nodes .slot.held').count(), 2, 'both CPU slots held');
    await shot('cluster-' + tag);
    await page.goto(`${srv.url}/#/jobs/${ids[0]}`);
    await page.waitForFunction(() => Number(document.querySelector('#chart-loss')?.dataset.points || 0) >= 2, null, {timeout: 60000});
    await page.waitForTimeout(500);
    assert.ok(await page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth + 1), `job page fits the ${tag}`);
    assert.equal(await page.locator('#model tbody tr').count(), 3, 'the MLP\'s layers: flatten, dense, dense');
    await shot('job-running-' + tag);
    await page.goto(`${srv.url}/#/submit`);
    await page.waitForSelector('#f-fit-epochs');
    await shot('submit-' + tag);
  }
  for (const id of ids) await srv.api(`/jobs/${id}/cancel`, {method: 'POST'});
  assert.deepEqual(pageErrors, [], 'no script errors in the page');
});
