// openapi.test.mjs - api/openapi.json is a valid OpenAPI 3 document for
// @apidevtools/swagger-parser (schema and $refs), and the running server
// serves it. tests/check_openapi.c checks it against the route tables.
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
