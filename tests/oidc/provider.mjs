// provider.mjs - a real OpenID Provider for the tests of server/oidc.c:
// npm's oidc-provider (panva's, OpenID certified) on 127.0.0.1, with two
// users, one confidential client, the device flow, and a control port on
// which a test approves or denies device codes through the provider's own
// pages, makes the token endpoint answer a forged ID token, and adds keys
// to the JWKS (docs/sso.md, "The test provider").
//
//   node tests/oidc/provider.mjs --redirect-uri URI --client-secret-file PATH \
//        --key-file PATH [--port N] [--control-port N] [--client-id ID]
//
// --key-file is written (0600) with the private JWK the provider signs ID
// tokens with, so a test can forge tokens under the right key. When both
// ports listen, one JSON line goes to stdout:
//   {"issuer":"http://127.0.0.1:P","control":"http://127.0.0.1:Q","client_id":"trainyard"}
//
// Users (login / password): ada / ada-password, groups ["vision:admin"];
// bob / bob-password, groups ["vision:viewer", "nlp:member"].
import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import Provider from 'oidc-provider';

function args() {
  const a = { port: 0, controlPort: 0, clientId: 'trainyard' };
  const names = {
    '--port': 'port', '--control-port': 'controlPort', '--redirect-uri': 'redirectUri',
    '--client-secret-file': 'secretFile', '--key-file': 'keyFile', '--client-id': 'clientId',
  };
  const v = process.argv.slice(2);
  for (let i = 0; i < v.length; i += 2) {
    const k = names[v[i]];
    if (!k || i + 1 >= v.length) {
      console.error(`provider.mjs: unknown or incomplete argument ${v[i]}`);
      process.exit(2);
    }
    a[k] = v[i + 1];
  }
  for (const k of ['redirectUri', 'secretFile', 'keyFile']) {
    if (!a[k]) {
      console.error(`provider.mjs: --${k.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)} is required`);
      process.exit(2);
    }
  }
  a.port = Number(a.port);
  a.controlPort = Number(a.controlPort);
  return a;
}

// stdout carries the one ready line: the provider's notices go to stderr,
// and a reader that has gone away (EPIPE) is no reason to stop
console.log = console.error;
console.info = console.error;
process.stdout.on('error', () => {});

const opts = args();
const clientSecret = fs.readFileSync(opts.secretFile, 'utf8').trim();

const USERS = {
  ada: { password: 'ada-password', name: 'Ada Lovelace', email: 'ada@example.org', groups: ['vision:admin'] },
  bob: { password: 'bob-password', name: 'Bob Page', email: 'bob@example.org', groups: ['vision:viewer', 'nlp:member'] },
};

// the signing key: made at start, its private half written for the test
const { privateKey } = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 });
const signingJwk = { ...privateKey.export({ format: 'jwk' }), kid: 'fixture-rsa-1', alg: 'RS256', use: 'sig' };
fs.writeFileSync(opts.keyFile, JSON.stringify(signingJwk), { mode: 0o600 });

// what the control port changes
const state = {
  forge: null,          // an id_token the token endpoint answers instead of its own
  extraKeys: [],        // public JWKs appended to the provider's JWKS
  jwksFetches: 0,
  tokenRequests: 0,
  lastIdToken: null,    // the last id_token the provider itself issued
};

function listen(server, port) {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, '127.0.0.1', () => resolve(server.address().port));
  });
}

const opServer = http.createServer();
const port = await listen(opServer, opts.port);
const issuer = `http://127.0.0.1:${port}`;

const provider = new Provider(issuer, {
  clients: [{
    client_id: opts.clientId,
    client_secret: clientSecret,
    redirect_uris: [opts.redirectUri],
    grant_types: ['authorization_code', 'urn:ietf:params:oauth:grant-type:device_code'],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_basic',
  }],
  jwks: { keys: [signingJwk] },
  async findAccount(ctx, id) {
    const u = USERS[id];
    if (!u) return undefined;
    return {
      accountId: id,
      async claims() {
        return {
          sub: id, preferred_username: id, name: u.name, email: u.email, email_verified: true, groups: u.groups,
        };
      },
    };
  },
  scopes: ['openid', 'profile', 'email', 'groups'],
  claims: {
    openid: ['sub'],
    profile: ['name', 'preferred_username'],
    email: ['email', 'email_verified'],
    groups: ['groups'],
  },
  conformIdTokenClaims: false,
  pkce: { required: () => true },
  features: {
    devInteractions: { enabled: false },
    deviceFlow: { enabled: true },
  },
  cookies: {
    names: { session: 'op_session', interaction: 'op_interaction', resume: 'op_interaction_resume' },
    keys: [crypto.randomBytes(32).toString('hex')],
  },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
});

// forge mode, the JWKS additions and the counters
provider.use(async (ctx, next) => {
  await next();
  if (ctx.path === '/token' && ctx.method === 'POST') {
    state.tokenRequests += 1;
    if (ctx.status === 200 && ctx.body && ctx.body.id_token) {
      state.lastIdToken = ctx.body.id_token;
      if (state.forge) ctx.body = { ...ctx.body, id_token: state.forge };
    }
  } else if (ctx.path === '/jwks' && ctx.status === 200) {
    state.jwksFetches += 1;
    if (state.extraKeys.length) ctx.body = { keys: [...ctx.body.keys, ...state.extraKeys] };
  }
});

// ---------------------------------------------------------------- interactions
const esc = (s) => String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

function loginPage(res, uid, message) {
  res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' });
  res.end(`<!DOCTYPE html><html><head><title>Sign in</title></head><body>
<p>${esc(message)}</p>
<form method="post" action="/interaction/${esc(uid)}/login">
<input name="login"><input name="password" type="password"><button type="submit">Sign in</button>
</form></body></html>`);
}

async function readBody(req, limit = 65536) {
  let s = '';
  for await (const chunk of req) {
    s += chunk;
    if (s.length > limit) throw new Error('body too large');
  }
  return s;
}

// consent: the client is first-party, so every scope and claim asked is granted
async function grantAll(req, res, details) {
  const { prompt, params, session, grantId } = details;
  const grant = grantId
    ? await provider.Grant.find(grantId)
    : new provider.Grant({ accountId: session.accountId, clientId: params.client_id });
  const d = prompt.details;
  if (d.missingOIDCScope) grant.addOIDCScope(d.missingOIDCScope.join(' '));
  if (d.missingOIDCClaims) grant.addOIDCClaims(d.missingOIDCClaims);
  if (d.missingResourceScopes) {
    for (const [indicator, scopes] of Object.entries(d.missingResourceScopes)) {
      grant.addResourceScope(indicator, scopes.join(' '));
    }
  }
  const id = await grant.save();
  await provider.interactionFinished(req, res, { consent: { grantId: id } }, { mergeWithLastSubmission: true });
}

const opCallback = provider.callback();
opServer.on('request', async (req, res) => {
  const m = /^\/interaction\/([A-Za-z0-9_-]+)(\/login)?$/.exec(new URL(req.url, issuer).pathname);
  if (!m) {
    opCallback(req, res);
    return;
  }
  try {
    const details = await provider.interactionDetails(req, res);
    if (details.uid !== m[1]) throw new Error('interaction mismatch');
    if (req.method === 'GET' && !m[2]) {
      if (details.prompt.name === 'login') loginPage(res, details.uid, 'Sign in');
      else if (details.prompt.name === 'consent') await grantAll(req, res, details);
      else throw new Error(`prompt ${details.prompt.name} not handled`);
    } else if (req.method === 'POST' && m[2]) {
      const form = new URLSearchParams(await readBody(req));
      const login = form.get('login') || '';
      const u = Object.hasOwn(USERS, login) ? USERS[login] : null;
      if (!u || form.get('password') !== u.password) {
        loginPage(res, details.uid, 'Wrong login or password');
        return;
      }
      await provider.interactionFinished(req, res, { login: { accountId: login } }, { mergeWithLastSubmission: false });
    } else {
      res.writeHead(405).end();
    }
  } catch (e) {
    res.writeHead(400, { 'content-type': 'text/plain' }).end(`interaction: ${e.message}\n`);
  }
});

// ---------------------------------------------------------------- the control port
// A browser with a cookie jar (cookies kept by name and path), for driving
// the provider's device pages.
class Browser {
  constructor() { this.jar = new Map(); }

  cookieHeader(path) {
    const out = [];
    for (const c of this.jar.values()) if (path.startsWith(c.path)) out.push(`${c.name}=${c.value}`);
    return out.join('; ');
  }

  keep(res) {
    for (const line of res.headers.getSetCookie()) {
      const parts = line.split(';').map((s) => s.trim());
      const eq = parts[0].indexOf('=');
      const name = parts[0].slice(0, eq);
      const value = parts[0].slice(eq + 1);
      let path = '/';
      let expired = false;
      for (const p of parts.slice(1)) {
        const [k, v] = p.split('=');
        if (k.toLowerCase() === 'path') path = v;
        if (k.toLowerCase() === 'expires' && Date.parse(v) < Date.now()) expired = true;
        if (k.toLowerCase() === 'max-age' && Number(v) <= 0) expired = true;
      }
      const key = `${name} ${path}`;
      if (expired) this.jar.delete(key);
      else this.jar.set(key, { name, value, path });
    }
  }

  // one request, then the redirects followed (303/302 as GET); the last answer's text
  async go(url, form) {
    let method = form ? 'POST' : 'GET';
    let body = form ? new URLSearchParams(form).toString() : undefined;
    for (let hop = 0; hop < 20; hop++) {
      const u = new URL(url, issuer);
      const headers = { cookie: this.cookieHeader(u.pathname) };
      if (body) headers['content-type'] = 'application/x-www-form-urlencoded';
      const res = await fetch(u, { method, headers, body, redirect: 'manual' });
      this.keep(res);
      const loc = res.headers.get('location');
      if (res.status >= 300 && res.status < 400 && loc) {
        url = new URL(loc, u).toString();
        method = 'GET';
        body = undefined;
        continue;
      }
      return { status: res.status, url: u.toString(), text: await res.text() };
    }
    throw new Error('too many redirects');
  }
}

function field(html, name) {
  const m = new RegExp(`name="${name}" value="([^"]*)"`).exec(html);
  if (!m) throw new Error(`no ${name} in the page`);
  return m[1];
}

// the user's side of the device flow, on the provider's own pages:
// the code entered, then confirmed (or aborted), then the login as username
async function device(userCode, username) {
  const b = new Browser();
  let page = await b.go('/device');
  const xsrf = field(page.text, 'xsrf');
  page = await b.go('/device', { xsrf, user_code: userCode });
  if (!page.text.includes('op.deviceConfirmForm')) throw new Error(`user code ${userCode} not accepted`);
  if (!username) {
    page = await b.go('/device', { xsrf: field(page.text, 'xsrf'), user_code: userCode, abort: 'yes' });
    return { denied: true };
  }
  page = await b.go('/device', { xsrf: field(page.text, 'xsrf'), user_code: userCode, confirm: 'yes' });
  const m = /action="\/interaction\/([A-Za-z0-9_-]+)\/login"/.exec(page.text);
  if (!m) throw new Error(`no login form after the confirmation (${page.status} ${page.url})`);
  const u = USERS[username];
  if (!u) throw new Error(`no user ${username}`);
  page = await b.go(`/interaction/${m[1]}/login`, { login: username, password: u.password });
  if (page.status !== 200 || !/success|Sign-in Success/i.test(page.text)) {
    throw new Error(`device login did not end in success (${page.status} ${page.url})`);
  }
  return { approved: username };
}

function reply(res, status, obj) {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(`${JSON.stringify(obj)}\n`);
}

const control = http.createServer(async (req, res) => {
  try {
    const path = new URL(req.url, 'http://x').pathname;
    const text = req.method === 'GET' || req.method === 'DELETE' ? '' : await readBody(req);
    const body = text ? JSON.parse(text) : {};
    if (req.method === 'POST' && path === '/device/approve') {
      reply(res, 200, await device(String(body.user_code), String(body.username)));
    } else if (req.method === 'POST' && path === '/device/deny') {
      reply(res, 200, await device(String(body.user_code), null));
    } else if (req.method === 'PUT' && path === '/forge') {
      state.forge = String(body.id_token);
      reply(res, 200, { forge: true });
    } else if (req.method === 'DELETE' && path === '/forge') {
      state.forge = null;
      reply(res, 200, { forge: false });
    } else if (req.method === 'POST' && path === '/jwks') {
      state.extraKeys.push(body);
      reply(res, 200, { keys: state.extraKeys.length + 1 });
    } else if (req.method === 'GET' && path === '/stats') {
      reply(res, 200, {
        jwks_fetches: state.jwksFetches, token_requests: state.tokenRequests, last_id_token: state.lastIdToken,
      });
    } else {
      reply(res, 404, { error: `no ${req.method} ${path}` });
    }
  } catch (e) {
    reply(res, 400, { error: e.message });
  }
});
const controlPort = await listen(control, opts.controlPort);

process.on('SIGTERM', () => process.exit(0));
process.stdout.write(`${JSON.stringify({ issuer, control: `http://127.0.0.1:${controlPort}`, client_id: opts.clientId })}\n`);
