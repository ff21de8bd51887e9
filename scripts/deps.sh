#!/usr/bin/env bash
# deps.sh - install the Debian packages trainyard needs to build, test and run.
# Idempotent: installs only what is missing; uses sudo when not root.
set -euo pipefail
pkgs=(build-essential pkg-config libmicrohttpd-dev libgnutls28-dev libcjson-dev libsqlite3-dev check
      libsubunit-dev libopenblas-dev libcurl4-openssl-dev libssl-dev zlib1g-dev libarchive-dev
      libcjose-dev libjansson-dev
      dataset-fashion-mnist python3 python3-numpy curl jq sqlite3 procps iproute2)
# command jobs' tests and examples: PyTorch DDP on /usr/bin/python3 (tests/check_command.c)
pkgs+=(python3-torch)   # python3-numpy is above
# notebook jobs: the node's Jupyter, and the interactive jobs' tests drive it through
# the proxy with python3-websocket (tests/check_interactive.c, tests/notebook_client.py)
pkgs+=(jupyter-notebook python3-ipykernel python3-websocket)
# the dashboard's tests: headless Chromium driven by playwright-core from npm,
# the Prometheus text parser; node and npm only when none is on the PATH
# (a node from elsewhere, e.g. NodeSource, must not be replaced by Debian's)
pkgs+=(chromium chromium-driver python3-prometheus-client)
command -v node >/dev/null 2>&1 || pkgs+=(nodejs)
command -v npm >/dev/null 2>&1 || pkgs+=(npm)
# command jobs in a team's image: podman with runc (crun refuses hybrid cgroup
# layouts; listing runc makes apt pick it for podman's "crun | runc"); their
# tests build an image offline from Debian's packages (mmdebstrap) and serve
# it from a registry on loopback (docker-registry)
pkgs+=(podman runc mmdebstrap docker-registry)
# the HTTPS server's scan (tests/testssl.sh; it brings the openssl command it probes with)
pkgs+=(testssl.sh)
# checkpoints and contexts in an S3 store: the tests and bench-blobs run a real
# one, a one-node Ceph (monitor, memstore OSD, radosgw) on loopback started by
# scripts/s3-dev.sh (no systemd unit; nothing starts on install)
pkgs+=(ceph-mon ceph-osd radosgw ceph-common)
# the state in PostgreSQL (trainyard server --db postgres://...): libpq to build; the
# tests and bench-api DB=postgres run a real PostgreSQL 15 (scripts/pg-dev.sh; the
# package's own cluster is not used)
pkgs+=(libpq-dev postgresql-15)
# PostgreSQL itself highly available: pg_auto_failover's monitor and keeper
# (pg_autoctl) for scripts/pg-ha-demo.sh (`make demo-pg-ha`, docs/ha.md)
pkgs+=(postgresql-15-auto-failover pg-auto-failover-cli)
pkgs+=(${TRAINYARD_EXTRA_PKGS:-})
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
