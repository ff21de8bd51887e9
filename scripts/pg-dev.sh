#!/usr/bin/env bash
# pg-dev.sh - a real PostgreSQL 15 for development and the tests: one cluster
# on loopback, every file of it (data, socket directory, log) under one
# directory.
#
#   scripts/pg-dev.sh start DIR   initdb's a cluster in DIR/data, starts it on
#                                 127.0.0.1, makes a role trainyard with a
#                                 random password and a database trainyard it
#                                 owns, writes DIR/pgpass (0600, libpq passfile
#                                 format) and prints DATABASE_URL= and
#                                 PGPASSFILE= lines; the role has CREATEDB,
#                                 and DIR/pgpass names any database (*), so
#                                 the tests make a fresh database per test
#                                 (tests/pg_fixture.h)
#   scripts/pg-dev.sh stop DIR    stops it (pg_ctl stop -m fast), removes the
#                                 data, keeps DIR/log; stopping again is a no-op
#
# Environment: PG_DEV_LISTEN=ADDR/PREFIX (also listen on ADDR, and let clients
# of that network in with the password: servers in other network namespaces,
# tests/check_ha.c; DATABASE_URL still names 127.0.0.1), PG_DEV_PORT (the TCP
# port; default: a free one), PG_DEV_FAST=1
# (fsync, synchronous_commit and full_page_writes off, initdb without sync:
# for speed only, never for durability tests; default: durable), PG_DEV_BIN
# (default /usr/lib/postgresql/15/bin; package postgresql-15). PostgreSQL
# refuses to run as root: as root the server runs as the postgres system user
# (runuser), who then owns DIR/data, DIR/run and DIR/log, so every directory
# above DIR must be searchable by it; as any other user it runs as that user.
# Authentication: scram-sha-256 over TCP, peer on the socket in DIR/run (for
# the cluster's superuser, the user the server runs as). The password never
# reaches a command line, the output or the server in clear:
# scripts/pg-scram-pass.py writes it to DIR/pgpass and hands psql only its SCRAM
# verifier, on standard input.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
starting=0
die() {
  echo "pg-dev: $*" >&2
  # a start that fails stops what it started
  if [ "$starting" = 1 ]; then starting=0; do_stop >/dev/null 2>&1 || true; fi
  exit 1
}

usage() { die "usage: $0 start DIR | stop DIR"; }

[ $# -eq 2 ] || usage
cmd=$1
dir=$2
case "$dir" in /*) ;; *) dir="$PWD/$dir" ;; esac
dir=${dir%/}

bin=${PG_DEV_BIN:-/usr/lib/postgresql/15/bin}

# as root, the server and its tools run as postgres; else as the caller
as_pg=()
pguser=$(id -un)
if [ "$(id -u)" -eq 0 ]; then
  as_pg=(runuser -u postgres --)
  pguser=postgres
fi
pg() { "${as_pg[@]}" "$@"; }

# 0 when pid is gone or a zombie (PID 1 may reap late)
gone() {
  local st
  [ -r "/proc/$1/stat" ] || return 0
  st=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 0
  [ -z "$st" ] || [ "$st" = Z ] || [ "$st" = X ]
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# port_free PORT: 0 when 127.0.0.1:PORT can be bound
port_free() {
  python3 -c 'import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1",int(sys.argv[1]))); s.listen()' "$1" 2>/dev/null
}

do_stop() {
  [ -d "$dir" ] || die "$dir: no such directory"
  [ -f "$dir/pids" ] || [ -d "$dir/data" ] || [ -f "$dir/log/postgres.log" ] ||
    die "$dir: nothing started there (no pids, data or log/postgres.log)"
  local pid=""
  [ -f "$dir/pids" ] && pid=$(awk '$1 == "postgres" { print $2 }' "$dir/pids")
  if [ -f "$dir/data/postmaster.pid" ]; then
    pg "$bin/pg_ctl" -D "$dir/data" -m fast -w -t 30 stop >>"$dir/log/pg-dev.log" 2>&1 || true
  fi
  if [ -n "$pid" ] && ! gone "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do gone "$pid" && break; sleep 0.1; done
    if ! gone "$pid"; then
      echo "pg-dev: postgres (pid $pid) did not stop in 10 s; killed" >&2
      kill -KILL "$pid" 2>/dev/null || true
      for _ in $(seq 50); do gone "$pid" && break; sleep 0.1; done
    fi
  fi
  rm -rf "$dir/data" "$dir/run" "$dir/pgpass" "$dir/env" "$dir/pids"
}

do_start() {
  local b
  for b in initdb pg_ctl postgres psql; do
    [ -x "$bin/$b" ] || die "$bin/$b missing: install postgresql-15 (or set PG_DEV_BIN)"
  done
  command -v python3 >/dev/null 2>&1 || die "python3 missing: install python3"
  [ "$pguser" != trainyard ] || die "the cluster's superuser is the user the server runs as, and cannot be trainyard (the role it makes); run as another user"
  if [ ${#as_pg[@]} -gt 0 ]; then
    id postgres >/dev/null 2>&1 || die "no postgres user to run the server as (root cannot): install postgresql-15"
  fi
  if [ -f "$dir/pids" ]; then
    local p
    p=$(awk '$1 == "postgres" { print $2 }' "$dir/pids")
    [ -n "$p" ] && ! gone "$p" && die "$dir already holds a running cluster (pid $p); run: $0 stop $dir"
  fi
  local port=${PG_DEV_PORT:-}
  if [ -n "$port" ]; then
    if ! [[ "$port" =~ ^[0-9]+$ ]] || [ "$port" -lt 1 ] || [ "$port" -gt 65535 ]; then
      die "PG_DEV_PORT=$port: a TCP port number"
    fi
    port_free "$port" || die "port $port on 127.0.0.1 is taken"
  else
    port=$(free_port)
  fi
  # the socket's path must fit sockaddr_un (107 bytes and a NUL)
  local sock="$dir/run/.s.PGSQL.$port.lock"
  [ ${#sock} -le 107 ] || die "$dir: too long a path for the socket $sock (at most 107 bytes); use a shorter DIR"
  local listen=127.0.0.1 net=${PG_DEV_LISTEN:-}
  if [ -n "$net" ]; then
    [[ "$net" =~ ^([0-9]{1,3}\.){3}[0-9]{1,3}/[0-9]{1,2}$ ]] || die "PG_DEV_LISTEN=$net: ADDR/PREFIX (10.0.0.1/24)"
    listen="127.0.0.1,${net%/*}"
  fi
  local fast=${PG_DEV_FAST:-0}
  [ "$fast" = 0 ] || [ "$fast" = 1 ] || die "PG_DEV_FAST=$fast: 0 or 1"
  mkdir -p "$dir"
  starting=1
  rm -rf "$dir/data" "$dir/run" "$dir/pgpass" "$dir/env" "$dir/pids"
  mkdir -p "$dir/data" "$dir/run" "$dir/log"
  chmod 700 "$dir/data" "$dir/run"
  [ ${#as_pg[@]} -eq 0 ] || chown postgres: "$dir/data" "$dir/run" "$dir/log"
  # as root, DIR itself (a `mktemp -d`, 0700) is opened for search only, so
  # postgres reaches its own folders in it; nothing else in DIR is readable
  if [ ${#as_pg[@]} -ne 0 ] && ! pg test -x "$dir"; then chmod o+x "$dir"; fi
  pg test -w "$dir/data" -a -x "$dir/data" ||
    die "$pguser cannot reach $dir/data (is every directory above $dir searchable by $pguser?)"
  local slog=$dir/log/pg-dev.log
  : >>"$slog"
  [ ${#as_pg[@]} -eq 0 ] || chown postgres: "$slog"
  run() { local what=$1; shift; "$@" >>"$slog" 2>&1 || die "$what failed; see $slog"; }
  local sync=()
  [ "$fast" = 1 ] && sync=(--no-sync)
  run initdb pg "$bin/initdb" -D "$dir/data" -U "$pguser" -E UTF8 --locale=C.UTF-8 \
    --auth-local=peer --auth-host=scram-sha-256 "${sync[@]}" --no-instructions
  # initdb's pg_hba.conf: peer on the socket, scram-sha-256 on 127.0.0.1/::1
  local conf=$dir/data/postgresql.auto.conf
  {
    echo "listen_addresses = '$listen'"
    echo "port = $port"
    echo "unix_socket_directories = '${dir//\'/\'\'}/run'"
    echo "password_encryption = 'scram-sha-256'"
    echo "logging_collector = off"
    if [ "$fast" = 1 ]; then
      echo "fsync = off"
      echo "synchronous_commit = off"
      echo "full_page_writes = off"
    fi
  } | pg tee -a "$conf" >/dev/null || die "writing $conf failed"
  if [ -n "$net" ]; then
    echo "host all trainyard $net scram-sha-256" | pg tee -a "$dir/data/pg_hba.conf" >/dev/null ||
      die "writing $dir/data/pg_hba.conf failed"
  fi
  port_free "$port" || die "port $port on 127.0.0.1 is taken"
  if ! pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/log/postgres.log" -w -t 30 start >>"$slog" 2>&1; then
    grep -q 'could not bind' "$dir/log/postgres.log" 2>/dev/null && die "port $port on 127.0.0.1 is taken"
    die "pg_ctl start failed; see $dir/log/postgres.log"
  fi
  local pid
  pid=$(head -n1 "$dir/data/postmaster.pid" 2>/dev/null) || die "no $dir/data/postmaster.pid after start; see $dir/log/postgres.log"
  echo "postgres $pid" >"$dir/pids"
  # the password: scripts/pg-scram-pass.py writes it to DIR/pgpass (any host:
  # 127.0.0.1, or PG_DEV_LISTEN's address; any database) and prints only its
  # SCRAM verifier, which psql reads on standard input
  local verifier sql
  verifier=$(umask 077; python3 "$here/pg-scram-pass.py" "$dir/pgpass" "*:$port:*:trainyard") ||
    die "writing $dir/pgpass failed"
  sql="CREATE ROLE trainyard LOGIN CREATEDB PASSWORD '$verifier';
CREATE DATABASE trainyard OWNER trainyard;"
  pg "$bin/psql" -X -q -v ON_ERROR_STOP=1 -h "$dir/run" -p "$port" -U "$pguser" -d postgres \
    >>"$slog" 2>&1 <<<"$sql" || die "creating role and database trainyard failed; see $slog"
  local qdir
  qdir=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe="/"))' "$dir/pgpass")
  printf 'DATABASE_URL=postgres://trainyard@127.0.0.1:%s/trainyard?passfile=%s\nPGPASSFILE=%s\n' \
    "$port" "$qdir" "$dir/pgpass" >"$dir/env"
  starting=0
  cat "$dir/env"
}

case "$cmd" in
  start) do_start ;;
  stop) do_stop ;;
  *) usage ;;
esac
