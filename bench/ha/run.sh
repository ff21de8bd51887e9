#!/usr/bin/env bash
# run.sh - how long a standby takes to lead, and what a client sees meanwhile
# (docs/ha.md, "Takeover, measured"). PostgreSQL 15 in the root namespace on
# a bridge (scripts/pg-dev.sh, PG_DEV_LISTEN), two servers on it, each in a
# network namespace of its own; then HA_RUNS times (default 10), alternately
# a kill -9 of the leader and a cut of its network (its veth down):
#
#   takeover   from the kill/cut to the other server's GET /api/v1/health
#              saying "role":"leader" (polled every 50 ms)
#   client     a loop of curl POST /api/v1/jobs, one every 100 ms, each with
#              an Idempotency-Key kept across its retries, through both URLs
#              as our client goes (the last leader first; a refused or timed
#              out connection: the other one; a 503 standby: the "leader" it
#              names): failed attempts, slow submissions (> 1 s end to end),
#              and the longest gap between two acknowledged ones
#   lost/dup   every acknowledged submission listed once afterwards, with the
#              id it was acknowledged with; none listed twice
#   restore    the killed server started again, or the cut one's link put
#              back: it must step down by itself and answer as a standby
#
# Prints a table per run, a summary against the peers' figures, and one JSON
# object last. SMOKE=1 (make test): one run of each kind. Needs root,
# iproute2, curl and PostgreSQL 15; else it says SKIP (a JSON "skipped" line)
# and exits 0. Uses 10.213.80.0/24 and names ty-hb*/tyhb* (tests/check_ha
# uses 10.213.79.0/24: both can run at once). HA_KEEP=1 keeps the directory.
#
#   sudo bench/ha/run.sh        HA_RUNS=4 sudo bench/ha/run.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
BIN=${BIN:-$root/build/trainyard}
NET=10.213.80
PORT=8080

skip() {
  echo "bench/ha: SKIP: $1" >&2
  python3 -c 'import json,sys; print(json.dumps({"bench": "ha", "skipped": sys.argv[1]}))' "$1"
  exit 0
}
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces)"
command -v ip >/dev/null && ip -V >/dev/null 2>&1 || skip "needs iproute2"
command -v curl >/dev/null || skip "needs curl"
[ -x /usr/lib/postgresql/15/bin/postgres ] || skip "no PostgreSQL 15 (apt-get install postgresql-15)"
[ -x "$BIN" ] || { echo "bench/ha: $BIN missing: make build/trainyard" >&2; exit 1; }

runs=${HA_RUNS:-10}
[ "${SMOKE:-0}" = 1 ] && runs=1 # make test: one kill -9 (the cut's path runs in tests/check_ha.c)
[[ "$runs" =~ ^[0-9]+$ ]] && [ "$runs" -ge 1 ] || { echo "bench/ha: HA_RUNS=$runs: a count >= 1" >&2; exit 1; }

now() { local t=${EPOCHREALTIME/./}; echo "${t:0:13}"; } # ms since the epoch

# ------------------------------------------------------------------ network
id=$(($$ % 10000))
br=tyhbbr$id
ns=(ty-hb$id-s0 ty-hb$id-s1)
vroot=(tybv${id}s0 tybv${id}s1)
vns=(tybn${id}s0 tybn${id}s1)
host=(11 12)
url=("http://$NET.11:$PORT" "http://$NET.12:$PORT")
dir=""
pgdir=""
pid=(0 0)

net_teardown() {
  for i in 0 1; do
    ip netns del "${ns[$i]}" 2>/dev/null
    ip link del "${vroot[$i]}" 2>/dev/null
  done
  ip link del "$br" 2>/dev/null
}

cleanup() {
  for i in 0 1; do
    if [ "${pid[$i]}" -gt 0 ] 2>/dev/null && kill -0 "${pid[$i]}" 2>/dev/null; then
      kill -TERM "${pid[$i]}" 2>/dev/null
      for _ in $(seq 50); do kill -0 "${pid[$i]}" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "${pid[$i]}" 2>/dev/null
      wait "${pid[$i]}" 2>/dev/null
    fi
  done
  [ -n "$pgdir" ] && [ -d "$pgdir" ] && scripts/pg-dev.sh stop "$pgdir" >/dev/null 2>&1
  net_teardown
  if [ -n "$dir" ]; then
    if [ "${HA_KEEP:-0}" = 1 ]; then echo "bench/ha: kept $dir" >&2; else rm -rf "$dir"; fi
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# what a killed run of this benchmark left behind: namespaces nothing runs
# in, bridges with no port (another run's are busy and left alone)
for n in $(ip netns list 2>/dev/null | awk '/^ty-hb[0-9]+-s[01]( |$)/ {print $1}'); do
  [ -z "$(ip netns pids "$n" 2>/dev/null)" ] && ip netns del "$n" 2>/dev/null
done
for l in $(ip -o link show type bridge 2>/dev/null | awk -F': ' '$2 ~ /^tyhbbr[0-9]+$/ {print $2}'); do
  [ -z "$(ls "/sys/class/net/$l/brif" 2>/dev/null)" ] && ip link del "$l" 2>/dev/null
done
if ip -o addr show 2>/dev/null | grep -q " $NET\.1/"; then
  skip "$NET.1 is taken by another interface (another bench/ha running?)"
fi

{ ip link add "$br" type bridge && ip addr add "$NET.1/24" dev "$br" && ip link set "$br" up; } ||
  skip "cannot make a bridge here"
for i in 0 1; do
  { ip netns add "${ns[$i]}" && ip link add "${vroot[$i]}" type veth peer name "${vns[$i]}" &&
    ip link set "${vroot[$i]}" master "$br" up && ip link set "${vns[$i]}" netns "${ns[$i]}" &&
    ip netns exec "${ns[$i]}" ip addr add "$NET.${host[$i]}/24" dev "${vns[$i]}" &&
    ip netns exec "${ns[$i]}" ip link set "${vns[$i]}" up &&
    ip netns exec "${ns[$i]}" ip link set lo up; } || skip "cannot make network namespaces with veth here"
done

# ------------------------------------------------------------------ PostgreSQL and the servers
dir=$(mktemp -d /tmp/ty_bench_ha.XXXXXX)
chmod 755 "$dir"
pgdir=$dir/pg
out=$(PG_DEV_FAST=1 PG_DEV_LISTEN=$NET.1/24 scripts/pg-dev.sh start "$pgdir" 2>&1) || {
  echo "$out" >&2; echo "bench/ha: scripts/pg-dev.sh start failed" >&2; exit 1; }
pgport=$(sed -n 's|^DATABASE_URL=postgres://trainyard@127.0.0.1:\([0-9]*\)/.*|\1|p' <<<"$out")
[ -n "$pgport" ] || { echo "bench/ha: no port in pg-dev's output: $out" >&2; exit 1; }
dburl="postgres://trainyard@$NET.1:$pgport/trainyard?passfile=$pgdir/pgpass"

start_server() { # i
  local i=$1
  mkdir -p "$dir/s$i"
  ip netns exec "${ns[$i]}" "$BIN" server --listen "$NET.${host[$i]}:$PORT" --insecure-http \
    --public-url "${url[$i]}" --data "$dir/s$i" --db "$dburl" >>"$dir/s$i/server.log" 2>&1 &
  pid[$i]=$!
}

role_of() { # i: leader, standby, or "" (no answer)
  curl -s --max-time 0.5 "${url[$1]}/api/v1/health" 2>/dev/null |
    sed -n 's/.*"role": *"\([a-z]*\)".*/\1/p'
}

wait_role() { # i role ms: 0 when it said role within ms
  local end=$(($(now) + $3))
  while [ "$(now)" -lt "$end" ]; do
    [ "$(role_of "$1")" = "$2" ] && return 0
    sleep 0.05
  done
  return 1
}

start_server 0
wait_role 0 leader 30000 || { echo "bench/ha: s0 did not lead; see $dir/s0/server.log" >&2; tail -5 "$dir/s0/server.log" >&2; HA_KEEP=1; exit 1; }
start_server 1
wait_role 1 standby 30000 || { echo "bench/ha: s1 did not stand by; see $dir/s1/server.log" >&2; HA_KEEP=1; exit 1; }
token=$(cat "$dir/s0/token") || { echo "bench/ha: no $dir/s0/token" >&2; exit 1; }

# ------------------------------------------------------------------ the client
# A job that waits queued for ever (a GPU no node has): the queue grows by
# what was submitted, nothing runs.
spec() {
  printf '{"name":"%s","model":{"layers":[{"type":"dense","units":1,"activation":"sigmoid","input_shape":[4]}]},' "$1"
  printf '"compile":{"optimizer":"sgd","loss":"binary_crossentropy"},"data":{"source":"synthetic","features":4},'
  printf '"fit":{"epochs":1,"batch_size":10},"resources":{"workers":1,"devices_per_worker":1,"device":"gpu"},'
  printf '"queue_if_infeasible":true}'
}

# client RUN LOG STOPFILE: one line per submission:
#   k name key acked(0/1) id t_start t_end failed_attempts redirects
client() {
  local run=$1 log=$2 stop=$3 cur=0 k=0
  local body=$dir/client$run.body
  while [ ! -e "$stop" ]; do
    local name="hb-$run-$k" key t0 t1 fails=0 redirs=0 acked=0 jid="" code leader try
    key=$(cat /proc/sys/kernel/random/uuid)
    t0=$(now)
    local data
    data=$(spec "$name")
    while :; do
      code=$(curl -s -o "$body" -w '%{http_code}' --connect-timeout 0.5 --max-time 2 -X POST \
        -H "Authorization: Bearer $token" -H "Idempotency-Key: $key" -H 'Content-Type: application/json' \
        --data-binary "$data" "${url[$cur]}/api/v1/jobs" 2>/dev/null)
      if [ "$code" = 201 ] || [ "$code" = 200 ]; then
        jid=$(sed -n 's/^{"id": *\([0-9]*\).*/\1/p; s/.*[,{]"id": *\([0-9]*\)[,}].*/\1/p' "$body" | head -1)
        acked=1
        break
      fi
      leader=""
      [ "$code" = 503 ] && leader=$(sed -n 's/.*"leader": *"\([^"]*\)".*/\1/p' "$body")
      if [ -n "$leader" ] && [ "$leader" != "${url[$cur]}" ]; then
        # the standby names the leader: go there, a redirect and not a failure
        redirs=$((redirs + 1))
        for try in 0 1; do [ "${url[$try]}" = "$leader" ] && cur=$try; done
        [ "$redirs" -gt 20 ] && { fails=$((fails + 1)); sleep 0.1; }
      else
        # refused, timed out, no leader yet, or an error: the other one
        fails=$((fails + 1))
        cur=$((1 - cur))
        [ $((fails % 2)) = 0 ] && sleep 0.1
      fi
      [ $(($(now) - t0)) -gt 30000 ] && break
    done
    t1=$(now)
    echo "$k $name $key $acked ${jid:-0} $t0 $t1 $fails $redirs" >>"$log"
    k=$((k + 1))
    sleep 0.1
  done
}

# the jobs listed whose name starts with hb-RUN-: "name id" lines
list_jobs() { # run leader_index
  python3 - "${url[$2]}" "$token" "hb-$1-" <<'PY'
import json, sys, urllib.request
base, tok, prefix = sys.argv[1:4]
before = None
while True:
    q = "/api/v1/jobs?limit=1000" + (f"&before={before}" if before else "")
    r = urllib.request.Request(base + q, headers={"Authorization": "Bearer " + tok})
    d = json.load(urllib.request.urlopen(r, timeout=10))
    for j in d["jobs"]:
        if j.get("name", "").startswith(prefix):
            print(j["name"], j["id"])
    before = d.get("next_before")
    if not before:
        break
PY
}

# ------------------------------------------------------------------ the runs
results=$dir/results
: >"$results"
fail=0
printf '%-4s %-5s %-7s %9s %6s %6s %6s %5s %6s %8s %5s %5s  %s\n' \
  run kind leader takeover_s subs acked failed slow maxgap_s redirect lost dup restore >&2
for r in $(seq 1 "$runs"); do
  if [ $((r % 2)) = 1 ]; then kind=kill; else kind=cut; fi
  L=""
  for i in 0 1; do [ "$(role_of $i)" = leader ] && L=$i; done
  [ -n "$L" ] || { echo "bench/ha: run $r: no leader before the fault" >&2; fail=1; break; }
  S=$((1 - L))
  [ "$(role_of $S)" = standby ] || wait_role "$S" standby 20000 ||
    { echo "bench/ha: run $r: s$S is no standby before the fault" >&2; fail=1; break; }
  clog=$dir/client$r.log
  stopf=$dir/client$r.stop
  : >"$clog"
  client "$r" "$clog" "$stopf" &
  cpid=$!
  sleep 1.5
  t0=$(now)
  if [ $kind = kill ]; then
    kill -KILL "${pid[$L]}"
    wait "${pid[$L]}" 2>/dev/null
    pid[$L]=0
  else
    ip link set "${vroot[$L]}" down
  fi
  took=""
  end=$((t0 + 30000))
  while [ "$(now)" -lt "$end" ]; do
    if [ "$(role_of "$S")" = leader ]; then took=$(($(now) - t0)); break; fi
    sleep 0.05
  done
  sleep 1.5
  touch "$stopf"
  wait "$cpid"
  # restore: the killed one started again; the cut one's link put back, after
  # which it must have stepped down by itself and answer as a standby
  t1=$(now)
  restore=""
  if [ $kind = kill ]; then
    start_server "$L"
    wait_role "$L" standby 30000 && restore="standby $(( ($(now) - t1) / 100 ))"
  else
    ip link set "${vroot[$L]}" up
    if wait_role "$L" standby 30000 && grep -q "no longer the leader" "$dir/s$L/server.log"; then
      restore="standby $(( ($(now) - t1) / 100 ))"
    fi
  fi
  if [ -n "$restore" ]; then
    restore="${restore% *} $(awk -v d="${restore#* }" 'BEGIN {printf "%.1fs", d / 10}')"
  else
    restore=failed
    fail=1
    if [ $kind = cut ] && ! kill -0 "${pid[$L]}" 2>/dev/null; then
      restore="failed(exited)"
      wait "${pid[$L]}" 2>/dev/null
      start_server "$L"
      wait_role "$L" standby 30000 || true
    fi
    echo "bench/ha: run $r: s$L did not come back as a standby; see $dir/s$L/server.log" >&2
    tail -5 "$dir/s$L/server.log" >&2
  fi
  [ -n "$took" ] || { fail=1; echo "bench/ha: run $r: s$S did not lead within 30 s of the $kind" >&2; took=-1; }
  list_jobs "$r" "$S" >"$dir/listed$r" 2>"$dir/listed$r.err" || { fail=1; cat "$dir/listed$r.err" >&2; }
  line=$(python3 - "$r" "$kind" "s$L" "$took" "$clog" "$dir/listed$r" "$restore" "$t0" <<'PY'
import json, sys
run, kind, leader, took, clog, listed, restore, t0 = sys.argv[1:9]
subs = [l.split() for l in open(clog) if l.strip()]
seen = {}
for l in open(listed):
    name, jid = l.split()
    seen.setdefault(name, []).append(int(jid))
acked = [s for s in subs if s[3] == "1"]
lost = sum(1 for s in acked if len(seen.get(s[1], [])) == 0 or int(s[4]) not in seen[s[1]])
dup = sum(1 for v in seen.values() if len(v) > 1)
failed = sum(int(s[7]) for s in subs)
redir = sum(int(s[8]) for s in subs)
slow = sum(1 for s in subs if int(s[6]) - int(s[5]) > 1000)
ends = sorted(int(s[6]) for s in acked)
gap = max((b - a for a, b in zip(ends, ends[1:])), default=0)
d = {"run": int(run), "kind": kind, "leader": leader, "takeover_s": int(took) / 1000 if int(took) >= 0 else None,
     "submissions": len(subs), "acked": len(acked), "failed_attempts": failed, "slow": slow,
     "max_gap_s": gap / 1000, "redirects": redir, "lost": lost, "doubled": dup, "restore": restore}
print(json.dumps(d))
PY
)
  echo "$line" >>"$results"
  python3 - "$line" >&2 <<'PY'
import json, sys
d = json.loads(sys.argv[1])
t = "%.2f" % d["takeover_s"] if d["takeover_s"] is not None else "none"
print("%-4d %-5s %-7s %9s %6d %6d %6d %5d %6.2f %8d %5d %5d  %s" % (d["run"], d["kind"], d["leader"], t,
      d["submissions"], d["acked"], d["failed_attempts"], d["slow"], d["max_gap_s"], d["redirects"], d["lost"],
      d["doubled"], d["restore"]))
PY
  python3 -c 'import json,sys; d=json.loads(sys.argv[1]); sys.exit(1 if d["lost"] or d["doubled"] or not d["acked"] else 0)' "$line" || fail=1
done

# ------------------------------------------------------------------ summary
python3 - "$results" "$fail" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
fail = int(sys.argv[2])
# the peers' figures (docs/ha.md): Slurm's backup slurmctld takes over after
# SlurmctldTimeout (default 120 s); Kubernetes' leader election (kube-
# scheduler, kube-controller-manager) after its lease, 15 s by default;
# Determined's master has no standby
peers = {"slurm_slurmctldtimeout_s": 120, "kubernetes_lease_s": 15}
out = {"bench": "ha", "runs": len(rows), "ok": not fail}
for kind in ("kill", "cut"):
    t = [r["takeover_s"] for r in rows if r["kind"] == kind and r["takeover_s"] is not None]
    if not t:
        continue
    med = statistics.median(t)
    out[kind] = {"n": len(t), "min_s": min(t), "median_s": round(med, 2), "max_s": max(t),
                 "max_gap_s": max(r["max_gap_s"] for r in rows if r["kind"] == kind),
                 "failed_attempts": sum(r["failed_attempts"] for r in rows if r["kind"] == kind),
                 "vs_slurm": round(120 / med, 1), "vs_kubernetes": round(15 / med, 1)}
    print("bench/ha: %-4s takeover min %.2f / median %.2f / max %.2f s over %d; Slurm's 120 s is %.1fx, "
          "Kubernetes' 15 s lease %.1fx (Determined: no standby)" % (kind, min(t), med, max(t), len(t), 120 / med,
                                                                       15 / med), file=sys.stderr)
out["acked"] = sum(r["acked"] for r in rows)
out["lost"] = sum(r["lost"] for r in rows)
out["doubled"] = sum(r["doubled"] for r in rows)
out["restored"] = sum(1 for r in rows if r["restore"].startswith("standby"))
out["peers"] = peers
print("bench/ha: %d acknowledged submissions, %d lost, %d doubled; %d/%d faulted servers back as standbys"
      % (out["acked"], out["lost"], out["doubled"], out["restored"], len(rows)), file=sys.stderr)
print(json.dumps(out))
PY
exit $fail
