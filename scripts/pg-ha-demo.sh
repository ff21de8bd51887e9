#!/usr/bin/env bash
# pg-ha-demo.sh - PostgreSQL itself highly available under trainyard, with
# pg_auto_failover (docs/ha.md, "PostgreSQL itself: pg_auto_failover"): a
# monitor and two PostgreSQL 15 nodes (a primary and its synchronous
# secondary) on loopback, run by pg_autoctl; a trainyard server given both
# nodes in one libpq multi-host URL (target_session_attrs=read-write), an
# agent, and a job training on it.
#
#   scripts/pg-ha-demo.sh start DIR   starts all of it and prints the URLs
#   scripts/pg-ha-demo.sh run DIR     start, then a job trains; `pg_autoctl
#                                     perform failover` while a client submits
#                                     jobs; shows the job's steps going on,
#                                     the server's writes on the new primary,
#                                     what the client saw fail and for how
#                                     long, the server's log; then stop
#                                     (PG_HA_KEEP=1: leave it running)
#   scripts/pg-ha-demo.sh stop DIR    stops what start started and removes its
#                                     data; DIR/log stays
#
# Everything lives under DIR (data, pg_autoctl's configuration and state
# through XDG_*, logs), except PostgreSQL's sockets, which stay in the
# package's /var/run/postgresql. PostgreSQL refuses to run as root: as root
# the nodes run as the postgres system user (runuser), as scripts/pg-dev.sh
# does, so DIR and every directory above it must be searchable by it.
# pg_autoctl's own connections (monitor, replication) use trust on
# 127.0.0.1; the trainyard role logs in with a password, scram-sha-256, from
# DIR/pgpass (0600). Needs postgresql-15, postgresql-15-auto-failover and
# pg-auto-failover-cli (scripts/deps.sh), curl, python3, and BIN (default
# build/trainyard). Not part of `make test`: it takes a minute, starts three
# PostgreSQL clusters, and what it shows is for a person to read
# (`make demo-pg-ha` runs it).
set -euo pipefail

starting=0
die() {
  echo "pg-ha-demo: $*" >&2
  # a start or run that fails stops what it started
  if [ "$starting" = 1 ]; then starting=0; do_stop >/dev/null 2>&1 || true; fi
  exit 1
}
[ $# -eq 2 ] || die "usage: $0 start DIR | run DIR | stop DIR"
cmd=$1
dir=$2
case "$dir" in /*) ;; *) dir="$PWD/$dir" ;; esac
dir=${dir%/}
root=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$root/build/trainyard}
pgbin=${PG_DEV_BIN:-/usr/lib/postgresql/15/bin}

as_pg=()
[ "$(id -u)" -eq 0 ] && as_pg=(runuser -u postgres --)
# pg_autoctl keeps its configuration and state under XDG_*: DIR's
ctl() {
  (cd "$dir" && "${as_pg[@]}" env XDG_CONFIG_HOME="$dir/xdg/config" XDG_DATA_HOME="$dir/xdg/data" \
    XDG_RUNTIME_DIR="$dir/xdg/run" PATH="$pgbin:/usr/bin:/bin" pg_autoctl "$@")
}
psql_at() { # port sql...: as the cluster's superuser, over TCP (trust for postgres on 127.0.0.1)
  local port=$1; shift
  "${as_pg[@]}" "$pgbin/psql" -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -d trainyard "$@"
}
now() { local t=${EPOCHREALTIME/./}; echo "${t:0:13}"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
say() { printf '\n== %s\n' "$*"; }

gone() { [ ! -d "/proc/$1" ] || [ "$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)" = Z ]; }
stop_pid() { # pid: TERM, then KILL after 10 s
  local p=$1
  [ -n "$p" ] && ! gone "$p" || return 0
  kill -TERM "$p" 2>/dev/null || true
  for _ in $(seq 100); do gone "$p" && return 0; sleep 0.1; done
  kill -KILL "$p" 2>/dev/null || true
}

# node_states: "name:state ..." of the formation, as the monitor sees it
node_states() {
  ctl show state --pgdata "$dir/monitor" --json 2>/dev/null | python3 -c '
import json, sys
try:
    d = json.load(sys.stdin)
except ValueError:
    sys.exit(0)
print(" ".join("%s:%s/%s" % (n["nodename"], n["current_group_state"], n["assigned_group_state"]) for n in d))'
}
wait_states() { # want (e.g. "node1:primary/primary node2:secondary/secondary") seconds
  local end=$(($(date +%s) + $2)) s=""
  while [ "$(date +%s)" -lt "$end" ]; do
    s=$(node_states)
    [ "$s" = "$1" ] && return 0
    sleep 0.5
  done
  die "the nodes did not reach '$1' in $2 s (now: '$s'); see $dir/log"
}

do_stop() {
  [ -f "$dir/pids" ] || { echo "pg-ha-demo: nothing started in $dir"; return 0; }
  local p
  for name in agent server; do
    p=$(awk -v n=$name '$1 == n { print $2 }' "$dir/pids")
    stop_pid "$p"
  done
  for name in node2 node1 monitor; do
    [ -d "$dir/$name" ] && ctl stop --pgdata "$dir/$name" >>"$dir/log/stop.log" 2>&1 || true
  done
  for name in node2 node1 monitor; do
    p=$(awk -v n=$name '$1 == n { print $2 }' "$dir/pids")
    stop_pid "$p"
  done
  rm -f "$dir/pids"
  # the clusters' data go (200 MB), as scripts/pg-dev.sh's do; the logs stay
  rm -rf "$dir/monitor" "$dir/node1" "$dir/node2" "$dir/backup" "$dir/xdg" "$dir/server" "$dir/pgpass" \
    "$dir/agent.state" "$dir"/.body.* "$dir"/.code.* "$dir/.cbody"
  echo "pg-ha-demo: stopped; the data removed, the logs kept in $dir/log"
}

do_start() {
  for b in pg_ctl postgres psql; do [ -x "$pgbin/$b" ] || die "$pgbin/$b missing: install postgresql-15"; done
  command -v pg_autoctl >/dev/null || die "pg_autoctl missing: install postgresql-15-auto-failover pg-auto-failover-cli (scripts/deps.sh)"
  command -v curl >/dev/null || die "curl missing"
  [ -x "$BIN" ] || die "$BIN missing: make build/trainyard"
  [ -f "$dir/pids" ] && die "$dir already holds a running demo; run: $0 stop $dir"
  mkdir -p "$dir/log" "$dir/xdg"
  rm -rf "$dir/monitor" "$dir/node1" "$dir/node2" "$dir/backup" "$dir/xdg/"* "$dir/server" "$dir/agent.state"
  chmod 755 "$dir"
  [ ${#as_pg[@]} -eq 0 ] || chown postgres: "$dir" "$dir/log" "$dir/xdg"
  ctl --version >/dev/null 2>&1 || die "pg_autoctl does not run as ${as_pg[*]:-$(id -un)} in $dir (is every directory above it searchable?)"
  : >"$dir/pids"
  starting=1
  local pm p1 p2 hp
  pm=$(free_port); p1=$(free_port); p2=$(free_port); hp=$(free_port)
  # pg_autoctl sizes shared_buffers for a whole machine (a quarter of it);
  # three clusters on one small one get 32 MB each, and loopback only
  local tune
  tune=$(printf "shared_buffers = '32MB'\nlisten_addresses = '127.0.0.1'\nlogging_collector = off\n")

  say "the monitor on 127.0.0.1:$pm"
  ctl create monitor --pgdata "$dir/monitor" --pgport "$pm" --hostname 127.0.0.1 --auth trust --no-ssl \
    >>"$dir/log/monitor.log" 2>&1 || die "pg_autoctl create monitor failed; see $dir/log/monitor.log"
  "${as_pg[@]}" tee -a "$dir/monitor/postgresql.auto.conf" <<<"$tune" >/dev/null
  ctl run --pgdata "$dir/monitor" >>"$dir/log/monitor.log" 2>&1 &
  echo "monitor $!" >>"$dir/pids"
  local uri="" end=$(($(date +%s) + 30))
  while [ -z "$uri" ] && [ "$(date +%s)" -lt "$end" ]; do
    "${as_pg[@]}" "$pgbin/pg_isready" -q -h 127.0.0.1 -p "$pm" && uri=$(ctl show uri --pgdata "$dir/monitor" --formation monitor 2>/dev/null)
    [ -n "$uri" ] || sleep 0.3
  done
  [ -n "$uri" ] || die "the monitor did not start; see $dir/log/monitor.log"
  echo "$uri"

  say "node1 on 127.0.0.1:$p1 (the first primary)"
  ctl create postgres --pgdata "$dir/node1" --pgport "$p1" --hostname 127.0.0.1 --listen 127.0.0.1 --name node1 \
    --dbname trainyard --monitor "$uri" --auth trust --no-ssl >>"$dir/log/node1.log" 2>&1 ||
    die "pg_autoctl create postgres (node1) failed; see $dir/log/node1.log"
  "${as_pg[@]}" tee -a "$dir/node1/postgresql.auto.conf" <<<"$tune" >/dev/null
  # the trainyard role logs in with its password, before the trust lines
  # (pg_basebackup copies this file to node2)
  "${as_pg[@]}" sed -i '1i host all trainyard 127.0.0.1/32 scram-sha-256' "$dir/node1/pg_hba.conf"
  ctl run --pgdata "$dir/node1" >>"$dir/log/node1.log" 2>&1 &
  echo "node1 $!" >>"$dir/pids"
  wait_states "node1:single/single" 60

  # the role with a random password: scripts/pg-scram-pass.py writes it to
  # DIR/pgpass and prints only its SCRAM verifier, for psql
  local verifier sql
  verifier=$(umask 077; python3 "$root/scripts/pg-scram-pass.py" "$dir/pgpass" \
    "127.0.0.1:$p1:trainyard:trainyard" "127.0.0.1:$p2:trainyard:trainyard") || die "writing $dir/pgpass failed"
  sql="CREATE ROLE trainyard LOGIN PASSWORD '$verifier';
ALTER DATABASE trainyard OWNER TO trainyard;"
  psql_at "$p1" <<<"$sql" >>"$dir/log/node1.log" 2>&1 || die "creating the role trainyard failed; see $dir/log/node1.log"

  say "node2 on 127.0.0.1:$p2 (its synchronous secondary)"
  ctl create postgres --pgdata "$dir/node2" --pgport "$p2" --hostname 127.0.0.1 --listen 127.0.0.1 --name node2 \
    --dbname trainyard --monitor "$uri" --auth trust --no-ssl >>"$dir/log/node2.log" 2>&1 ||
    die "pg_autoctl create postgres (node2) failed; see $dir/log/node2.log"
  grep -q '^host all trainyard 127.0.0.1/32 scram-sha-256' "$dir/node2/pg_hba.conf" ||
    "${as_pg[@]}" sed -i '1i host all trainyard 127.0.0.1/32 scram-sha-256' "$dir/node2/pg_hba.conf"
  ctl run --pgdata "$dir/node2" >>"$dir/log/node2.log" 2>&1 &
  echo "node2 $!" >>"$dir/pids"
  wait_states "node1:primary/primary node2:secondary/secondary" 120
  echo "node1 primary, node2 secondary; on the primary synchronous_standby_names = $(psql_at "$p1" -c 'SHOW synchronous_standby_names')"

  local q
  q=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe="/"))' "$dir/pgpass")
  local dburl="postgres://trainyard@127.0.0.1:$p1,127.0.0.1:$p2/trainyard?target_session_attrs=read-write&passfile=$q"
  say "trainyard server on http://127.0.0.1:$hp"
  echo "--db '$dburl'"
  mkdir -p "$dir/server"
  "$BIN" server --listen "127.0.0.1:$hp" --data "$dir/server" --db "$dburl" >>"$dir/log/server.log" 2>&1 &
  echo "server $!" >>"$dir/pids"
  local url="http://127.0.0.1:$hp"
  end=$(($(date +%s) + 30))
  until curl -s --max-time 1 "$url/api/v1/health" | grep -q '"role":"leader"'; do
    [ "$(date +%s)" -lt "$end" ] || die "the server did not lead in 30 s; see $dir/log/server.log"
    sleep 0.2
  done
  "$BIN" agent --server "$url" --token-file "$dir/server/node.token" --hostname pg-ha-node --address 127.0.0.1 \
    --cpu-slots 1 --heartbeat 1 --state-file "$dir/agent.state" >>"$dir/log/agent.log" 2>&1 &
  echo "agent $!" >>"$dir/pids"
  printf 'URL=%s\nTOKEN_FILE=%s\nMONITOR=%s\nNODE1_PORT=%s\nNODE2_PORT=%s\nDATABASE_URL=%s\n' \
    "$url" "$dir/server/token" "$uri" "$p1" "$p2" "$dburl" >"$dir/env"
  [ "$cmd" = run ] || starting=0
  say "started"
  cat "$dir/env"
}

# ------------------------------------------------------------------ run
api() { # method path [body] [key]: the answer's body; its HTTP status in $dir/.code.$TAG
  local args=(-s -o "$dir/.body.$TAG" -w '%{http_code}' --max-time 3 -X "$1" -H "Authorization: Bearer $TOKEN")
  [ $# -ge 3 ] && args+=(-H 'Content-Type: application/json' --data-binary "$3")
  [ $# -ge 4 ] && args+=(-H "Idempotency-Key: $4")
  curl "${args[@]}" "$URL$2" >"$dir/.code.$TAG" 2>/dev/null || echo 000 >"$dir/.code.$TAG"
  cat "$dir/.body.$TAG" 2>/dev/null
}
TAG=main
jnum() { python3 -c 'import json,sys
try: d=json.load(sys.stdin)
except ValueError: sys.exit(0)
for k in sys.argv[1].split("."): d = d.get(k) if isinstance(d, dict) else None
print("" if d is None else d)' "$1"; }

# the client: a queued job submitted every 100 ms, each with a key of its
# own kept across its retries; one line a submission:
#   name key acked id t_start t_end failed_attempts first_fail_ms last_fail_ms
client() {
  local stop=$1 log=$2 k=0 body
  while [ ! -e "$stop" ]; do
    local name=demo-sub-$k key t0 fails=0 ff=0 lf=0 code jid=0 acked=0
    key=$(cat /proc/sys/kernel/random/uuid)
    t0=$(now)
    body=$(printf '{"name":"%s","model":{"layers":[{"type":"dense","units":1,"activation":"sigmoid","input_shape":[4]}]},"compile":{"optimizer":"sgd","loss":"binary_crossentropy"},"data":{"source":"synthetic","features":4},"fit":{"epochs":1,"batch_size":10},"resources":{"workers":1,"devices_per_worker":1,"device":"gpu"},"queue_if_infeasible":true}' "$name")
    while [ $(($(now) - t0)) -lt 30000 ]; do
      code=$(curl -s -o "$dir/.cbody" -w '%{http_code}' --max-time 3 -X POST -H "Authorization: Bearer $TOKEN" \
        -H "Idempotency-Key: $key" -H 'Content-Type: application/json' --data-binary "$body" "$URL/api/v1/jobs" 2>/dev/null)
      if [ "$code" = 201 ] || [ "$code" = 200 ]; then
        jid=$(jnum id <"$dir/.cbody"); acked=1; break
      fi
      fails=$((fails + 1)); lf=$(now); [ "$ff" = 0 ] && ff=$lf
      echo "$(date -u +%T.%3N) $name: HTTP $code $(head -c 160 "$dir/.cbody" 2>/dev/null)" >>"$log.errors"
      sleep 0.1
    done
    echo "$name $key $acked $jid $t0 $(now) $fails $ff $lf" >>"$log"
    k=$((k + 1))
    sleep 0.1
  done
}

do_run() {
  do_start
  # shellcheck disable=SC1091
  . "$dir/env"
  TOKEN=$(cat "$TOKEN_FILE")
  local spec='{"name":"pg-ha-train","model":{"layers":[{"type":"dense","units":64,"activation":"relu","input_shape":[32]},{"type":"dense","units":1,"activation":"sigmoid"}]},"compile":{"optimizer":{"type":"sgd","learning_rate":0.05},"loss":"binary_crossentropy"},"data":{"source":"synthetic","examples":20000,"features":32,"seed":3},"fit":{"epochs":5000,"batch_size":64},"resources":{"workers":1,"devices_per_worker":1,"device":"cpu"},"checkpoint":{"every_epochs":1,"keep":2}}'
  local job
  job=$(api POST /api/v1/jobs "$spec" "$(cat /proc/sys/kernel/random/uuid)" | jnum id)
  [ -n "$job" ] || die "the training job was not accepted: $(cat "$dir/.body.$BASHPID")"
  say "job $job trains"
  local step="" end=$(($(date +%s) + 60))
  while [ "$(date +%s)" -lt "$end" ]; do
    step=$(api GET "/api/v1/jobs/$job" | jnum progress.step)
    [ -n "$step" ] && [ "$step" != 0 ] && break
    sleep 0.5
  done
  [ -n "$step" ] && [ "$step" != 0 ] || die "job $job did not train; see $dir/log"
  echo "step $step"

  # steps, every 500 ms, through the switch
  rm -f "$dir/.stop" "$dir/client.log" "$dir/client.log.errors"
  : >"$dir/steps"
  ( TAG=steps
    while [ ! -e "$dir/.stop" ]; do
      s=$(api GET "/api/v1/jobs/$job" | jnum progress.step)
      echo "$(now) ${s:--} $(cat "$dir/.code.steps")" >>"$dir/steps"
      sleep 0.5
    done ) &
  local steps_pid=$!
  client "$dir/.stop" "$dir/client.log" &
  local client_pid=$!
  sleep 3
  local off t0 t1
  off=$(stat -c %s "$dir/log/server.log")
  say "pg_autoctl perform failover"
  node_states
  echo "before: $(psql_at "$NODE1_PORT" -c "SELECT 'lease epoch ' || epoch || ', holder ' || holder FROM ty_lease")"
  t0=$(now)
  ctl perform failover --pgdata "$dir/monitor" >>"$dir/log/failover.log" 2>&1 || die "perform failover failed; see $dir/log/failover.log"
  t1=$(now)
  node_states
  echo "pg_autoctl perform failover returned after $(( (t1 - t0) ))ms"
  sleep 8
  touch "$dir/.stop"
  wait "$client_pid" "$steps_pid" 2>/dev/null || true

  say "the job's steps through the switch (every 500 ms; t from the failover's start)"
  awk -v t0="$t0" '{ printf "  t=%+6.1fs  step %-8s HTTP %s\n", ($1 - t0) / 1000, $2, $3 }' "$dir/steps" |
    awk 'NR % 2 == 1 || !/HTTP 200/'
  say "the server's writes, on the new primary (node2, 127.0.0.1:$NODE2_PORT)"
  psql_at "$NODE2_PORT" -F ' ' <<'SQL'
SELECT 'in recovery: ' || pg_is_in_recovery();
SELECT 'lease: epoch ' || epoch || ', holder ' || holder || ', expires in ' ||
       round(extract(epoch FROM expires_at - clock_timestamp())::numeric, 1) || ' s' FROM ty_lease;
SELECT 'jobs: ' || count(*) || ', newest ' || max(id) FROM jobs;
SELECT 'trainyard sessions here: ' || count(*) || ' (' || string_agg(DISTINCT application_name, ', ') || ')'
  FROM pg_stat_activity WHERE usename = 'trainyard';
SQL
  echo "node1 (127.0.0.1:$NODE1_PORT) in recovery: $(psql_at "$NODE1_PORT" -c 'SELECT pg_is_in_recovery()' 2>&1)"

  say "what the client saw (a submission every 100 ms, retried with its key)"
  api GET "/api/v1/jobs?limit=1000" >"$dir/listed.json"
  python3 - "$dir/client.log" "$t0" "$t1" "$dir/listed.json" <<'PY' | tee "$dir/summary"
import json, sys
subs = [l.split() for l in open(sys.argv[1]) if l.strip()]
t0, t1 = int(sys.argv[2]), int(sys.argv[3])
listed = {}
for j in json.load(open(sys.argv[4]))["jobs"]:
    listed.setdefault(j["name"], []).append(j["id"])
acked = [s for s in subs if s[2] == "1"]
fails = sum(int(s[6]) for s in subs)
ff = [int(s[7]) for s in subs if s[7] != "0"]
lf = [int(s[8]) for s in subs if s[8] != "0"]
ends = sorted(int(s[5]) for s in acked)
gap = max((b - a for a, b in zip(ends, ends[1:])), default=0)
slow = sum(1 for s in subs if int(s[5]) - int(s[4]) > 1000)
lost = sum(1 for s in acked if int(s[3]) not in listed.get(s[0], []))
dup = sum(1 for n, v in listed.items() if n.startswith("demo-sub-") and len(v) > 1)
print(f"submissions {len(subs)}, acknowledged {len(acked)}, failed attempts {fails}, slow (> 1 s) {slow}")
if ff:
    print(f"failures from t={(min(ff) - t0) / 1000:+.2f}s to t={(max(lf) - t0) / 1000:+.2f}s: "
          f"{(max(lf) - min(ff)) / 1000:.2f} s with failures")
print(f"longest gap between two acknowledged submissions {gap / 1000:.2f} s; perform failover took {(t1 - t0) / 1000:.2f} s")
print(f"acknowledged and not listed: {lost}; listed twice: {dup}")
print(json.dumps({"demo": "pg-ha", "submissions": len(subs), "acked": len(acked), "failed_attempts": fails,
                  "fail_window_s": (max(lf) - min(ff)) / 1000 if ff else 0, "max_gap_s": gap / 1000,
                  "failover_s": (t1 - t0) / 1000, "lost": lost, "doubled": dup}))
PY
  if [ -s "$dir/client.log.errors" ]; then
    echo "the failed attempts (first 5, last 2):"
    head -5 "$dir/client.log.errors" | sed 's/^/  /'
    tail -2 "$dir/client.log.errors" | sed 's/^/  /'
  fi
  say "the server's log from the failover on (its requests answered 503 counted, not listed)"
  tail -c +"$((off + 1))" "$dir/log/server.log" >"$dir/log/server.failover.log"
  grep -v ' 503 [0-9]*B ' "$dir/log/server.failover.log" | grep -v ': queued (team' | head -30
  grep ' 503 [0-9]*B ' "$dir/log/server.failover.log" | awk '{ print $4, $5 }' | sed 's|/[0-9][0-9]*|/N|g' |
    sort | uniq -c | sed 's/^/  503 x/'
  grep ' 503 [0-9]*B ' "$dir/log/server.failover.log" | sed -n '1s/ .*//p;$s/ .*//p' | paste -sd' ' |
    sed 's/^/  the 503s from, to: /'
  local after
  after=$(api GET "/api/v1/jobs/$job")
  echo "job $job: state $(jnum state <<<"$after"), attempt $(jnum attempt <<<"$after"), step $(jnum progress.step <<<"$after")"
  api POST "/api/v1/jobs/$job/cancel" >/dev/null
  starting=0
  if [ "${PG_HA_KEEP:-0}" = 1 ]; then
    echo "left running: $0 stop $dir"
  else
    sleep 1
    do_stop
  fi
}

case "$cmd" in
  start) do_start ;;
  stop) do_stop ;;
  run) do_run ;;
  *) die "usage: $0 start DIR | run DIR | stop DIR" ;;
esac
