// contract-proxy.mjs - an HTTP proxy that checks real traffic against
// api/openapi.json. Put it between a trainyard server and every client of
// it (curl-like fetches, the CLI, the agent and, with the server's
// --public-url, the workers): it forwards each request as it is, streams the
// answer back as it comes, and checks both with openapi-backend (Ajv
// underneath) against the document:
//
//   - the request: path, query and header parameters and the JSON body;
//     a request the document calls invalid is a violation only when the
//     server accepted it (2xx/3xx): refusing it is the server's job;
//   - the answer: its status is one the operation declares, its Content-Type
//     one that status declares, its declared headers (those marked required
//     present, every one present matching its schema), a JSON body against
//     the status's schema, and an event stream's events, each `data:` line
//     against the schema of its `event:` name when the media type declares
//     one in `x-trainyard-events`;
//   - an /api/ path that is no operation of the document: answered 404 or
//     405 with the document's Error body.
//
// The document is read by @apidevtools/swagger-parser (which validates it
// against the OpenAPI 3.0 schema and resolves its $refs); openapi-backend's
// OpenAPIValidator then checks traffic with Ajv for JSON Schema draft-04,
// the dialect OpenAPI 3.0 schemas are written in (a boolean
// exclusiveMinimum, nullable), with ajv-formats' date-time and the rest.
// (openapi-backend's own document check and its default Ajv read a 3.0
// document's schemas as draft-07, where exclusiveMinimum is a number.)
//
// Every exchange is kept (method, path, operation, status, errors); each
// error is a violation naming the method, the path, the status and the
// validator's message.
import http from 'node:http';
import fs from 'node:fs';
import SwaggerParser from '@apidevtools/swagger-parser';
import {OpenAPIValidator, ValidationContext} from 'openapi-backend';
import Ajv04 from 'ajv-draft-04';
import addFormats from 'ajv-formats';

const METHODS = ['get', 'put', 'post', 'delete', 'patch', 'head', 'options', 'trace'];
const KEEP_BODY = 64 << 20; // bytes of an answer kept for checking
const EXPECT_ABOVE = 64 * 1024;   // bytes: a body larger waits for 100 Continue

// The document with an operationId on every operation ("GET /api/v1/jobs"),
// which openapi-backend keys its validators by; nothing else is changed.
function withOperationIds(doc) {
  const d = structuredClone(doc);
  for (const [p, item] of Object.entries(d.paths || {}))
    for (const m of METHODS)
      if (item[m]) item[m].operationId = `${m.toUpperCase()} ${p}`;
  return d;
}

// The Ajv openapi-backend compiles with: draft-04, standard formats, and
// the OpenAPI formats (int32, int64, byte, ...) openapi-backend adds. The
// schemas are not checked against draft-04's meta-schema (swagger-parser
// checked the document's; openapi-backend's wrappers hold `required: []`,
// which draft-04 forbids).
function openapi30Ajv(original, opts) {
  const ajv = new Ajv04({...opts, strict: false, allErrors: true, validateSchema: false});
  addFormats(ajv);
  for (const [name, format] of Object.entries(original.formats))
    if (!ajv.formats[name]) ajv.addFormat(name, format);
  return ajv;
}

function ajvMessages(errors, limit = 20) {
  const out = (errors || []).slice(0, limit).map(e => {
    const where = e.instancePath || e.schemaPath || '';
    const params = e.params && Object.keys(e.params).length ? ' ' + JSON.stringify(e.params) : '';
    return `${where} ${e.message}${params}`.trim();
  });
  if ((errors || []).length > limit) out.push(`... ${errors.length - limit} more`);
  return out;
}

function baseType(ct) {
  return (ct || '').split(';')[0].trim().toLowerCase();
}

function typeMatches(declared, actual) {
  if (declared === actual || declared === '*/*') return true;
  const [dt, ds] = declared.split('/');
  return ds === '*' && actual.split('/')[0] === dt;
}

function isJson(t) {
  return t === 'application/json' || /^application\/[^/]+\+json$/.test(t);
}

// The response object an operation declares for a status: exact, then 4XX, then default.
function declaredResponse(op, status) {
  const r = op.responses || {};
  return r[String(status)] || r[`${String(status)[0]}XX`] || r.default || null;
}

// Splits an event stream into events ({event, data, id}); the text after
// the last blank line is an event not finished yet and is left out.
export function parseEventStream(text) {
  const events = [];
  const blocks = text.replace(/\r\n?/g, '\n').split('\n\n');
  blocks.pop();
  for (const block of blocks) {
    const ev = {event: 'message', data: [], id: null, fields: 0};
    for (const line of block.split('\n')) {
      if (line === '' || line.startsWith(':')) continue;
      const i = line.indexOf(':');
      const name = i < 0 ? line : line.slice(0, i);
      const value = i < 0 ? '' : line.slice(i + 1).replace(/^ /, '');
      ev.fields++;
      if (name === 'event') ev.event = value;
      else if (name === 'data') ev.data.push(value);
      else if (name === 'id') ev.id = value;
    }
    if (ev.data.length) events.push({event: ev.event, data: ev.data.join('\n'), id: ev.id});
  }
  return events;
}

export class ContractProxy {
  constructor({document = 'api/openapi.json'} = {}) {
    this.doc = JSON.parse(fs.readFileSync(document, 'utf8'));
    this.target = null;
    this.exchanges = [];  // {method, path, operation, status, source, errors: [], requestErrors: []}
    this.server = null;
    this.url = null;
  }

  async start() {
    this.definition = await SwaggerParser.validate(withOperationIds(this.doc));
    this.validator = new OpenAPIValidator({definition: this.definition, lazyCompileValidators: true,
                                           customizeAjv: openapi30Ajv});
    this.router = this.validator.router;
    this.errorSchema = OpenAPIValidator.compileSchema(this.validator.getAjv(ValidationContext.Response),
                                                      this.definition.components.schemas.Error);
    this.eventValidators = new Map();
    this.server = http.createServer((req, res) => this.handle(req, res));
    this.server.keepAliveTimeout = 65000; // longer than any long-poll the agents hold
    this.server.requestTimeout = 0;
    await new Promise(r => this.server.listen(0, '127.0.0.1', r));
    this.url = `http://127.0.0.1:${this.server.address().port}`;
    return this;
  }

  setTarget(url) { this.target = new URL(url); }

  async stop() {
    if (!this.server) return;
    this.server.closeAllConnections?.();
    await new Promise(r => this.server.close(r));
    this.server = null;
  }

  // Violations: every answer error, and request errors of requests the server accepted.
  violations() {
    const v = [];
    for (const x of this.exchanges) {
      const head = `${x.method} ${x.path} -> ${x.status}${x.operation ? ` (${x.operation})` : ''}`;
      for (const e of x.errors) v.push(`${head}: ${e}`);
      if (x.status < 400)
        for (const e of x.requestErrors) v.push(`${head}: the request, accepted, does not match: ${e}`);
    }
    return v;
  }

  // The violations, one line per operation, status and message (array
  // indexes and ids folded), with how many times and the first path.
  summary() {
    const groups = new Map();
    for (const line of this.violations()) {
      const m = line.match(/^(\S+) (\S+) -> (\d+)(?: \(([^)]*)\))?: (.*)$/s);
      const key = m ? `${m[4] || m[1] + ' (no operation)'} -> ${m[3]}: ${m[5].replace(/\/\d+\//g, '/N/')}` : line;
      if (!groups.has(key)) groups.set(key, {n: 0, first: m ? `${m[1]} ${m[2]}` : ''});
      groups.get(key).n++;
    }
    return [...groups].map(([k, g]) => `${k}  [${g.n}x, first ${g.first}]`);
  }

  // operation -> set of statuses seen
  coverage() {
    const c = new Map();
    for (const x of this.exchanges) {
      if (!x.operation) continue;
      if (!c.has(x.operation)) c.set(x.operation, new Set());
      c.get(x.operation).add(x.status);
    }
    return c;
  }

  operations() {
    const ops = [];
    for (const [p, item] of Object.entries(this.doc.paths))
      for (const m of METHODS) if (item[m]) ops.push(`${m.toUpperCase()} ${p}`);
    return ops;
  }

  handle(req, res) {
    const chunks = [];
    let size = 0;
    req.on('data', c => { chunks.push(c); size += c.length; });
    req.on('end', () => this.forward(req, res, Buffer.concat(chunks, size)));
  }

  forward(req, res, body) {
    const u = new URL(req.url, 'http://proxy');
    const x = {at: new Date().toISOString(), method: req.method, path: u.pathname + u.search, operation: null,
               status: 0, errors: [], requestErrors: []};
    this.exchanges.push(x);
    const op = this.match(req, u);
    if (op) {
      x.operation = op.operationId;
      try {
        x.requestErrors = this.checkRequest(req, u, body, op);
      } catch (e) { // a malformed path or query (the server answers it 400)
        x.requestErrors = [`the request cannot be read: ${e.message}`];
      }
    }
    if (!this.target) {
      x.status = 502;
      x.errors.push('the proxy has no server to forward to yet');
      res.writeHead(502).end();
      return;
    }
    // one connection per request (no race with the server closing an idle
    // kept-alive one); the body goes whole, with its length
    const headers = {...req.headers, host: this.target.host, connection: 'close'};
    for (const h of ['keep-alive', 'transfer-encoding', 'te', 'trailer', 'upgrade', 'proxy-connection'])
      delete headers[h];
    if (body.length || req.headers['content-length'] !== undefined) headers['content-length'] = String(body.length);
    // A large body waits for the server's 100 Continue, as curl's does: a
    // server that refuses it by its length (413) answers before reading it,
    // and writing it regardless would race the server's close (EPIPE, and
    // the answer lost). Without a word from the server in 2 s it goes anyway.
    const expect = body.length > EXPECT_ABOVE;
    if (expect) headers.expect = '100-continue';
    else delete headers.expect;
    const up = http.request({host: this.target.hostname, port: this.target.port, method: req.method,
                             path: req.url, headers, agent: false});
    let answered = false, clientGone = false;
    up.on('response', ur => {
      answered = true;
      x.status = ur.statusCode;
      const hop = new Set(['connection', 'keep-alive', 'transfer-encoding']);
      const raw = [];
      for (let i = 0; i < ur.rawHeaders.length; i += 2)
        if (!hop.has(ur.rawHeaders[i].toLowerCase())) raw.push(ur.rawHeaders[i], ur.rawHeaders[i + 1]);
      res.writeHead(ur.statusCode, ur.statusMessage, raw);
      res.flushHeaders();
      const kept = [];
      let keptLen = 0, total = 0;
      ur.on('data', c => {
        total += c.length;
        if (keptLen < KEEP_BODY) { kept.push(c); keptLen += c.length; }
        res.write(c);
      });
      let done = false;
      // how the answer ended: 'end', 'client' (it went away first), 'server' (it broke off)
      const finish = ended => {
        if (done) return;
        done = true;
        try {
          this.checkAnswer(x, op, ur, Buffer.concat(kept, keptLen), total, ended);
        } catch (e) {
          x.errors.push(`the proxy could not check the answer: ${e.stack || e}`);
        }
      };
      ur.on('end', () => { res.end(); finish('end'); });
      ur.on('error', () => { res.destroy(); finish(clientGone ? 'client' : 'server'); });
      res.on('close', () => { if (!ur.complete) finish('client'); });
    });
    up.on('error', e => {
      if (answered || clientGone) return;
      x.status = 502;
      x.errors.push(`the server did not answer: ${e.message} (sent at ${x.at}, failed at ${new Date().toISOString()})`);
      if (!res.headersSent) res.writeHead(502);
      res.end();
    });
    // the client went away before the answer's end (an event stream it stopped reading)
    res.on('close', () => {
      if (res.writableFinished) return;
      clientGone = true; // not a failure of the server: status stays 0
      up.destroy();
    });
    if (!expect) {
      up.end(body);
    } else {
      let sent = false;
      const send = () => { if (!sent && !answered) { sent = true; up.end(body); } };
      up.on('continue', send);
      up.on('response', () => { sent = true; }); // refused before the body: it is never sent
      setTimeout(send, 2000).unref();
      up.flushHeaders();
    }
  }

  match(req, u) {
    try {
      return this.router.matchOperation({method: req.method.toLowerCase(), path: u.pathname,
                                             query: u.search.slice(1), headers: req.headers}) || null;
    } catch { return null; }
  }

  checkRequest(req, u, body, op) {
    const ct = baseType(req.headers['content-type']);
    const declared = Object.keys(op.requestBody?.content || {});
    const r = {method: req.method.toLowerCase(), path: u.pathname, query: u.search.slice(1),
               headers: req.headers};
    // A JSON body is checked as JSON whatever curl -d labels it (the server reads
    // x-www-form-urlencoded as JSON, docs/server.md); other bodies are not parsed.
    if (body.length && declared.some(isJson)) r.body = body.toString('utf8');
    const errs = [];
    if (body.length && declared.length && !declared.some(d => typeMatches(d, ct)) &&
        !(declared.some(isJson) && (ct === '' || ct === 'application/x-www-form-urlencoded')))
      errs.push(`Content-Type ${ct || '(none)'} is not one of ${declared.join(', ')}`);
    const v = this.validator.validateRequest(r, op);
    if (!v.valid) errs.push(...ajvMessages(v.errors));
    return errs;
  }

  checkAnswer(x, op, ur, body, total, ended) {
    const ct = baseType(ur.headers['content-type']);
    if (!op) {
      // /api/... that is no operation: the convention of docs/server.md
      if (!x.path.startsWith('/api/')) return;
      if (x.status !== 404 && x.status !== 405) {
        x.errors.push(`a path and method the document does not have answered ${x.status}, not 404 or 405`);
        return;
      }
      this.checkJson(x, body, ct, this.errorSchema, 'the Error schema');
      return;
    }
    const decl = declaredResponse(op, x.status);
    if (!decl) {
      x.errors.push(`status ${x.status} is not declared (declared: ${Object.keys(op.responses).join(', ')})`);
      return;
    }
    // headers: declared ones present and matching, required ones present
    for (const [name, h] of Object.entries(decl.headers || {}))
      if (h.required && ur.headers[name.toLowerCase()] === undefined)
        x.errors.push(`header ${name} (required) is missing`);
    const hv = this.validator.validateResponseHeaders(ur.headers, op, {statusCode: x.status, setMatchType: 'any'});
    if (!hv.valid) x.errors.push(...ajvMessages(hv.errors).map(m => `header ${m}`));
    const content = decl.content || {};
    const types = Object.keys(content);
    if (!types.length) {
      if (total > 0 && x.method !== 'HEAD') x.errors.push(`a ${total}-byte body where the document declares none`);
      return;
    }
    if (x.method === 'HEAD') return;
    const declaredType = types.find(t => typeMatches(t, ct));
    if (!declaredType) {
      x.errors.push(`Content-Type ${ct || '(none)'} is not one of ${types.join(', ')}`);
      return;
    }
    if (isJson(declaredType)) {
      if (ended === 'client') return; // the client left before the end: nothing whole to check
      if (ended === 'server') {
        x.errors.push(`the answer broke off after ${total} bytes`);
        return;
      }
      let parsed;
      try {
        parsed = JSON.parse(body.toString('utf8'));
      } catch (e) {
        x.errors.push(`the body is not JSON: ${e.message}`);
        return;
      }
      const v = this.validator.validateResponse(parsed, op, x.status);
      if (!v.valid) x.errors.push(...ajvMessages(v.errors));
      return;
    }
    if (declaredType === 'text/event-stream') {
      const schemas = content[declaredType]['x-trainyard-events'];
      if (!schemas) return;
      for (const ev of parseEventStream(body.toString('utf8'))) {
        const validate = this.eventValidator(x.operation, ev.event, schemas[ev.event]);
        if (!validate) {
          x.errors.push(`event "${ev.event}" is not one of ${Object.keys(schemas).join(', ')}`);
          continue;
        }
        let data;
        try {
          data = JSON.parse(ev.data);
        } catch (e) {
          x.errors.push(`event "${ev.event}": data is not JSON: ${e.message}`);
          continue;
        }
        if (!validate(data))
          x.errors.push(...ajvMessages(validate.errors).map(m => `event "${ev.event}" data: ${m}`));
      }
    }
  }

  checkJson(x, body, ct, validate, what) {
    if (!isJson(ct)) {
      x.errors.push(`Content-Type ${ct || '(none)'} is not JSON`);
      return;
    }
    let parsed;
    try {
      parsed = JSON.parse(body.toString('utf8'));
    } catch (e) {
      x.errors.push(`the body is not JSON: ${e.message}`);
      return;
    }
    if (!validate(parsed)) x.errors.push(...ajvMessages(validate.errors).map(m => `${what}: ${m}`));
  }

  eventValidator(operation, name, schema) {
    if (!schema) return null;
    const key = `${operation} ${name}`;
    if (!this.eventValidators.has(key))
      this.eventValidators.set(key, OpenAPIValidator.compileSchema(
        this.validator.getAjv(ValidationContext.Response), schema));
    return this.eventValidators.get(key);
  }
}
