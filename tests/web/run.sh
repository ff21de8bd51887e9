#!/usr/bin/env bash
# run.sh BUILD - the browser, OpenAPI-validator, API-contract and vendored-library tests
# (node's test runner; playwright-core drives Debian's /usr/bin/chromium,
# headless; nothing is downloaded but the npm packages of package-lock.json).
# Screenshots go to BUILD/web-test/. Called by tests/run_all.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build/asan}
export TRAINYARD_BIN=${TRAINYARD_BIN:-$PWD/$build/trainyard}
export WEB_TEST_OUT=${WEB_TEST_OUT:-$PWD/$build/web-test}
for tool in node npm; do
  command -v $tool >/dev/null || { echo "web tests: $tool is missing (scripts/deps.sh installs it)"; exit 1; }
done
[ -x "${CHROMIUM:-/usr/bin/chromium}" ] || { echo "web tests: /usr/bin/chromium is missing (scripts/deps.sh installs it)"; exit 1; }
# the exact packages of package-lock.json; the browser is Debian's, never a
# download. Installed only when missing or older than the lock file: `npm ci`
# empties node_modules first, and tests/run_all.sh runs this beside suites
# that use it (check_oidc's provider), after installing them itself.
if [ ! -d node_modules/playwright-core ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error
fi
rm -rf "$WEB_TEST_OUT"
mkdir -p "$WEB_TEST_OUT"
# one file at a time (node 18 has no --test-concurrency): each starts its own server
timeout 120 node --test tests/web/openapi.test.mjs
# real traffic (clients, CLI, agent, workers) through a proxy that checks it against api/openapi.json
timeout 180 node --test tests/web/contract.test.mjs
timeout 300 node --test tests/web/dashboard.test.mjs
timeout 180 node --test tests/web/usage.test.mjs
timeout 240 node --test tests/web/sweep.test.mjs
# a job's web port opened from its page: the proxy-session cookie, a new tab
timeout 120 node --test tests/web/ports.test.mjs
# a task's shell in xterm.js over the exec WebSocket; a notebook job's Jupyter through the proxy
timeout 120 node --test tests/web/terminal.test.mjs
timeout 180 node --test tests/web/notebook.test.mjs
# single sign-on: the real provider (tests/oidc/provider.mjs), its login page, the session, CSRF, audit
timeout 120 node --test tests/web/sso.test.mjs
# several servers on one PostgreSQL: a standby's dashboard names the leader; the standby takes over
timeout 120 node --test tests/web/standby.test.mjs
echo "web tests: screenshots in $WEB_TEST_OUT"
