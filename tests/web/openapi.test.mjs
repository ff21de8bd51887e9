// openapi.test.mjs - api/openapi.json is a valid OpenAPI 3 document for
// @apidevtools/swagger-parser (schema and $refs), and the running server
// serves it; every error code a handler answers is declared. tests/check_openapi.c
// checks it against the route tables.
// The vendored libraries (uPlot, xterm.js and its fit addon) are their npm
// packages byte for byte, and the binary serves them.
import {test} from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import SwaggerParser from '@apidevtools/swagger-parser';
import {startUp} from './server.mjs';

test('api/openapi.json validates', async () => {
  const doc = JSON.parse(fs.readFileSync('api/openapi.json', 'utf8'));
  const api = await SwaggerParser.validate(structuredClone(doc));
  assert.equal(api.openapi, '3.0.3');
  assert.ok(Object.keys(api.paths).length >= 20);
});

// OpenAPI 3.0.3: "nullable: true" adds null to the type of its own schema
// object, and means nothing without one (a oneOf beside it stays non-null).
test('nullable stands beside a type', () => {
  const doc = JSON.parse(fs.readFileSync('api/openapi.json', 'utf8'));
  const bad = [];
  (function walk(o, at) {
    if (Array.isArray(o)) o.forEach((v, i) => walk(v, `${at}/${i}`));
    else if (o && typeof o === 'object') {
      if (o.nullable === true && !('type' in o)) bad.push(at);
      for (const [k, v] of Object.entries(o)) walk(v, `${at}/${k}`);
    }
  })(doc, '#');
  assert.deepEqual(bad, [], 'nullable without a type (make the type nullable, or one of the oneOf/anyOf branches)');
});

// Every error code a handler can answer (the literal code of each
// http_error() in api/ and server/) is in the Error schema's enum: the
// contract test sees only the codes its traffic meets, so a new route's
// rarer answers would otherwise stay undeclared until a client met them.
test('every http_error code is declared', () => {
  const doc = JSON.parse(fs.readFileSync('api/openapi.json', 'utf8'));
  const declared = new Set(doc.components.schemas.Error.properties.error.properties.code.enum);
  const missing = [];
  for (const dir of ['api', 'server']) {
    for (const f of fs.readdirSync(dir).filter((n) => n.endsWith('.c')).sort()) {
      const text = fs.readFileSync(`${dir}/${f}`, 'utf8');
      for (const m of text.matchAll(/http_error\(\s*\w+\s*,\s*\d+\s*,\s*"([a-z_]+)"/g)) {
        if (!declared.has(m[1])) missing.push(`${dir}/${f}: ${m[1]}`);
      }
    }
  }
  assert.ok(declared.has('not_found') && declared.has('invalid_value'), 'the enum was not found where expected');
  assert.deepEqual([...new Set(missing)], [], 'codes answered but not in components.schemas.Error ... code.enum');
});

test('the server serves the same document', async () => {
  const srv = await startUp({cpuSlots: 1});
  try {
    const r = await fetch(srv.url + '/api/v1/openapi.json');
    assert.equal(r.status, 200);
    assert.match(r.headers.get('content-type'), /^application\/json/);
    const served = await r.json();
    assert.deepEqual(served, JSON.parse(fs.readFileSync('api/openapi.json', 'utf8')));
    await SwaggerParser.validate(served);
  } finally { await srv.stop(); }
});

test('the vendored chart library is the npm package', () => {
  const pkg = JSON.parse(fs.readFileSync('node_modules/uplot/package.json', 'utf8'));
  const v = pkg.version;
  assert.ok(fs.existsSync(`web/vendor/uPlot-${v}.iife.min.js`), `web/vendor/ holds uPlot ${v} (package.json's version)`);
  assert.deepEqual(fs.readFileSync(`web/vendor/uPlot-${v}.iife.min.js`), fs.readFileSync('node_modules/uplot/dist/uPlot.iife.min.js'));
  assert.deepEqual(fs.readFileSync(`web/vendor/uPlot-${v}.min.css`), fs.readFileSync('node_modules/uplot/dist/uPlot.min.css'));
  assert.deepEqual(fs.readFileSync('web/vendor/uPlot-LICENSE.txt'), fs.readFileSync('node_modules/uplot/LICENSE'));
});

test('the vendored terminal (xterm.js, its fit addon) is the npm packages, served from the binary, loaded on demand', async () => {
  const xv = JSON.parse(fs.readFileSync('node_modules/@xterm/xterm/package.json', 'utf8')).version;
  const fv = JSON.parse(fs.readFileSync('node_modules/@xterm/addon-fit/package.json', 'utf8')).version;
  assert.match(xv, /^5\./, 'xterm.js 5.x');
  const files = {
    [`web/vendor/xterm-${xv}.min.js`]: 'node_modules/@xterm/xterm/lib/xterm.js',
    [`web/vendor/xterm-${xv}.css`]: 'node_modules/@xterm/xterm/css/xterm.css',
    'web/vendor/xterm-LICENSE.txt': 'node_modules/@xterm/xterm/LICENSE',
    [`web/vendor/xterm-addon-fit-${fv}.min.js`]: 'node_modules/@xterm/addon-fit/lib/addon-fit.js',
    'web/vendor/xterm-addon-fit-LICENSE.txt': 'node_modules/@xterm/addon-fit/LICENSE',
  };
  for (const [ours, theirs] of Object.entries(files)) {
    assert.ok(fs.existsSync(ours), `${ours} (package-lock.json's version)`);
    assert.deepEqual(fs.readFileSync(ours), fs.readFileSync(theirs), `${ours} is ${theirs}`);
  }
  /* the page names these versions, and only the terminal page loads them */
  const app = fs.readFileSync('web/app.js', 'utf8');
  for (const f of Object.keys(files).filter(f => !f.endsWith('.txt'))) assert.ok(app.includes(`'${f.slice(4)}'`), `app.js loads ${f}`);
  assert.ok(!fs.readFileSync('web/index.html', 'utf8').includes('xterm'), 'index.html does not load xterm.js');
  const srv = await startUp();
  try {
    for (const f of Object.keys(files)) {
      const r = await fetch(srv.url + f.slice(3));
      assert.equal(r.status, 200, f);
      assert.equal(r.headers.get('cache-control'), 'public, max-age=31536000, immutable', f);
      assert.equal(r.headers.get('content-type'), f.endsWith('.js') ? 'text/javascript; charset=utf-8'
        : f.endsWith('.css') ? 'text/css; charset=utf-8' : 'text/plain; charset=utf-8', f);
      assert.deepEqual(Buffer.from(await r.arrayBuffer()), fs.readFileSync(f), `${f} as served`);
    }
  } finally { await srv.stop(); }
});
