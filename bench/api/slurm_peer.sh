#!/usr/bin/env bash
# bench/api/slurm_peer.sh - the peer for bench/api: slurmrestd on a one-node Slurm
# cluster (munged + slurmctld + slurmd, JWT auth), measured the way run.sh measures
# trainyard:  GET /slurm/<ver>/job/{id}  wrk -t2 -c32 -d${DUR}s --latency
#             POST /slurm/<ver>/job/submit (held jobs)  wrk -t2 -c8 -d${SUBMIT_DUR}s --latency
#             and 300 held jobs submitted by 8 keep-alive curl clients.
# Runs in a private network namespace (unshare -n) when it can, so slurmctld and
# slurmd, which listen on every address, only ever see a loopback; slurmrestd binds
# 127.0.0.1. State lives in a temp dir; every daemon is stopped at exit.
# Must run as root (daemons, useradd). Ends with one JSON line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
DUR=${DUR:-10}
SUBMIT_DUR=${SUBMIT_DUR:-$DUR}
RUSER=${SLURM_BENCH_USER:-slurmbench}
[ "$(id -u)" = 0 ] || { echo "slurm_peer.sh: needs root (starts slurmctld/slurmd/munged)" >&2; exit 1; }

# --- 1. install what is missing (before leaving the host's network) ---
if [ -z "${TY_SLURM_INNER:-}" ]; then
  missing=0
  for c in slurmctld slurmd slurmrestd scontrol munged mungekey wrk curl python3; do
    command -v "$c" >/dev/null || missing=1
  done
  if [ $missing = 1 ]; then
    pkgs="slurm-wlm slurmrestd munge wrk curl python3"
    DEBIAN_FRONTEND=noninteractive apt-get install -y $pkgs >&2 ||
      { apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y $pkgs >&2; }
  fi
  id "$RUSER" >/dev/null 2>&1 || useradd -r -M -s /usr/sbin/nologin "$RUSER"
  export TY_SLURM_INNER=1
  if unshare --fork --pid --mount-proc -n true 2>/dev/null; then
    # own network namespace (only a loopback) and own pid namespace: when its first
    # process dies, the kernel kills every daemon left in it, whatever happened.
    export TY_SLURM_NETNS=1
    TY_SLURM_DIR=$(mktemp -d /tmp/ty_slurm.XXXXXX)
    export TY_SLURM_DIR
    unshare --fork --pid --mount-proc --kill-child -n -- bash "$0" "$@" &
    ns=$!
    trap 'kill -KILL $ns 2>/dev/null || true; wait $ns 2>/dev/null || true; rm -rf "$TY_SLURM_DIR"' EXIT
    trap 'exit 130' INT TERM
    rc=0; wait $ns || rc=$?
    exit $rc
  fi
  echo "slurm_peer.sh: unshare -n/-p not permitted; running on the host network" \
       "(slurmctld/slurmd listen on all addresses, slurmrestd on 127.0.0.1)" >&2
  export TY_SLURM_NETNS=0
fi
if [ "${TY_SLURM_NETNS:-0}" = 1 ]; then
  # slurmctld/slurmd resolve their listen address with AF_INET + AI_ADDRCONFIG, which
  # glibc refuses when 127.0.0.1 is the only IPv4 address: add a second loopback one.
  ip link set lo up
  ip addr add 127.0.0.2/32 dev lo
fi

# --- 2. temp state, config ---
dir=${TY_SLURM_DIR:-$(mktemp -d /tmp/ty_slurm.XXXXXX)}
chmod 755 "$dir"
mkdir -m 755 "$dir/munge"; mkdir -m 700 "$dir/ctld" "$dir/slurmd"; mkdir -m 1777 "$dir/work"
pids=()
cleanup() {
  local p i
  for ((i=${#pids[@]}-1; i>=0; i--)); do kill -TERM "${pids[i]}" 2>/dev/null || true; done
  for _ in $(seq 50); do
    alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ -n "${KEEP_LOGS:-}" ]; then cp "$dir"/*.log "$dir"/munge/*.log "$KEEP_LOGS"/ 2>/dev/null || true; fi
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
die() {
  echo "slurm_peer.sh: $*" >&2
  for f in "$dir/munge/munged.log" "$dir/slurmctld.log" "$dir/slurmd.log" "$dir/slurmrestd.log"; do
    [ -s "$f" ] && { echo "--- tail $f" >&2; tail -n 15 "$f" >&2; }
  done
  exit 1
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
CTLD_PORT=$(free_port); SLURMD_PORT=$(free_port); REST_PORT=$(free_port)
while [ "$SLURMD_PORT" = "$CTLD_PORT" ]; do SLURMD_PORT=$(free_port); done
while [ "$REST_PORT" = "$CTLD_PORT" ] || [ "$REST_PORT" = "$SLURMD_PORT" ]; do REST_PORT=$(free_port); done
# hardware line from slurmd -C, minus its NodeName and UpTime
NODE_HW=$(slurmd -C | head -1 | tr ' ' '\n' | grep -v -e '^NodeName=' -e '^$' | tr '\n' ' ')
conf=$dir/slurm.conf
sed -e "s|@DIR@|$dir|g" -e "s|@CTLD_PORT@|$CTLD_PORT|" -e "s|@SLURMD_PORT@|$SLURMD_PORT|" \
    -e "s|@NODE_HW@|$NODE_HW|" "$here/slurm/slurm.conf.in" > "$conf"
chmod 644 "$conf"
sed -e "s|@DIR@|$dir|g" "$here/slurm/job.json.in" > "$dir/job.json"
chmod 644 "$dir/job.json"
export SLURM_CONF=$conf
dd if=/dev/urandom of="$dir/jwt.key" bs=32 count=1 status=none
chmod 600 "$dir/jwt.key"

# --- 3. daemons ---
mungekey -c -k "$dir/munge/munge.key" 2>/dev/null || dd if=/dev/urandom of="$dir/munge/munge.key" bs=128 count=1 status=none
chmod 600 "$dir/munge/munge.key"
munged -F --force -S "$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
  --log-file="$dir/munge/munged.log" --pid-file="$dir/munge/munged.pid" \
  --seed-file="$dir/munge/munged.seed" 2>>"$dir/munge/munged.log" &
pids+=($!)
for _ in $(seq 100); do [ -S "$dir/munge/munge.socket" ] && break; sleep 0.1; done
[ -S "$dir/munge/munge.socket" ] || die "munged did not start"

slurmctld -D -i -f "$conf" 2>>"$dir/slurmctld.log" &
pids+=($!)
ctld=$!
for _ in $(seq 100); do
  kill -0 $ctld 2>/dev/null || die "slurmctld exited"
  timeout 5 scontrol ping 2>/dev/null | grep -q 'is UP' && break; sleep 0.2
done
scontrol ping 2>/dev/null | grep -q 'is UP' || die "slurmctld did not come up"

slurmd -D -N localhost -f "$conf" 2>>"$dir/slurmd.log" &
pids+=($!)
sd=$!
state=""
for _ in $(seq 100); do
  kill -0 $sd 2>/dev/null || die "slurmd exited"
  state=$(sinfo -h -n localhost -o %T 2>/dev/null || true)
  [ "$state" = idle ] && break; sleep 0.2
done
[ "$state" = idle ] || die "node localhost is '$state', not idle"

# openapi plugin: v0.0.38 if installed, else the newest openapi_v* there is;
# only that one is loaded (the dbv* ones need slurmdbd, which this cluster has not)
plugdir=$(scontrol show config | awk '$1 == "PluginDir" {print $3}')
API=${SLURM_API:-}
if [ -z "$API" ]; then
  if [ -e "$plugdir/openapi_v0_0_38.so" ]; then API=v0.0.38
  else API=$(ls "$plugdir" | sed -n 's/^openapi_v\([0-9_]*\)\.so$/v\1/p' | tr _ . | sort -V | tail -1); fi
fi
[ -n "$API" ] || die "no openapi_v*.so plugin in '$plugdir'"
JWT=$(scontrol token username="$RUSER" lifespan=7200 | sed -n 's/^SLURM_JWT=//p')
[ -n "$JWT" ] || die "scontrol token gave no token"
setpriv --reuid="$RUSER" --regid="$(id -g "$RUSER")" --init-groups -- \
  env SLURM_CONF="$conf" SLURM_JWT=daemon slurmrestd -a rest_auth/jwt -s "openapi/$API" "127.0.0.1:$REST_PORT" >>"$dir/slurmrestd.log" 2>&1 &
pids+=($!)
rest=$!
URL=http://127.0.0.1:$REST_PORT
H=(-H "X-SLURM-USER-NAME: $RUSER" -H "X-SLURM-USER-TOKEN: $JWT")
code=""
for _ in $(seq 50); do
  kill -0 $rest 2>/dev/null || die "slurmrestd exited"
  code=$(curl -s -o /dev/null -w '%{http_code}' "${H[@]}" "$URL/slurm/$API/ping" || true)
  [ "$code" = 200 ] && break
  sleep 0.2
done
[ "$code" = 200 ] || die "slurmrestd: GET /slurm/$API/ping answers ${code:-nothing}, not 200"
VERSION=$(slurmctld -V | awk '{print $2}')
echo "slurmrestd $VERSION on $URL, API $API, netns=${TY_SLURM_NETNS}"

submit_one() {
  curl -sf "${H[@]}" -H 'Content-Type: application/json' --data-binary @"$dir/job.json" \
    "$URL/slurm/$API/job/submit"
}
# a held job comes back with errors [{"error_code": 2042, "Job is in held state..."}]: not a failure
resp=$(submit_one) || die "POST /slurm/$API/job/submit failed"
id=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); e=[x for x in d.get("errors", []) if x.get("error_code") != 2042]; assert not e, e; print(d["job_id"])' "$resp") ||
  die "submit answer has no job_id: $resp"
curl -sf "${H[@]}" "$URL/slurm/$API/job/$id" | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert not d.get("errors"), d["errors"]
j = d["jobs"][0]
print("job", j["job_id"], j["job_state"], j.get("state_reason"))
assert j["job_state"] == "PENDING", j["job_state"]' || die "GET /slurm/$API/job/$id is not a pending job"

parse() { # wrk output -> "rps p50_ms p99_ms"
  python3 - "$1" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
def ms(v, u): return float(v) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[u]
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
lat = dict((p, ms(v, u)) for p, v, u in re.findall(r"\s(50|99)%\s+([\d.]+)(us|ms|s)", t))
print(rps, lat.get("50"), lat.get("99"))
PY
}
non2xx() { grep -o 'Non-2xx or 3xx responses: [0-9]*' "$1" | grep -o '[0-9]*$' || echo 0; }
njobs() { squeue -h -t all -o %i | wc -l; }

# --- 4. GET one job ---
echo "== slurmrestd GET /slurm/$API/job/$id  (wrk -t2 -c32 -d${DUR}s)"
wrk -t2 -c32 -d"${DUR}s" --latency "${H[@]}" "$URL/slurm/$API/job/$id" | tee "$dir/get.txt"
read -r get_rps get_p50 get_p99 < <(parse "$dir/get.txt")
get_non2xx=$(non2xx "$dir/get.txt")

# --- 5. submit held jobs: wrk, 8 keep-alive connections (as run.sh does for trainyard) ---
before=$(njobs)
echo "== slurmrestd POST /slurm/$API/job/submit  (wrk -t2 -c8 -d${SUBMIT_DUR}s, held jobs)"
JOB_JSON=$dir/job.json wrk -t2 -c8 -d"${SUBMIT_DUR}s" --latency -s "$here/slurm/submit.lua" \
  "${H[@]}" "$URL/slurm/$API/job/submit" | tee "$dir/post.txt"
read -r post_rps post_p50 post_p99 < <(parse "$dir/post.txt")
acked=$(sed -n 's/^acked=\([0-9]*\) .*/\1/p' "$dir/post.txt")
failed=$(sed -n 's/.* failed=\([0-9]*\)$/\1/p' "$dir/post.txt")
after=$(njobs)
stored=$((after - before))
echo "slurmctld holds $stored new jobs; wrk saw $acked answers with a job_id, $failed without"

# --- 6. 300 held jobs from 8 keep-alive curl clients ---
N300=${N300:-300}
for c in $(seq 0 7); do
  n=$(( N300 / 8 + (c < N300 % 8 ? 1 : 0) ))
  : > "$dir/curl$c.cfg"
  for i in $(seq "$n"); do
    [ "$i" -gt 1 ] && echo next >> "$dir/curl$c.cfg"
    printf 'url = "%s"\nheader = "X-SLURM-USER-NAME: %s"\nheader = "X-SLURM-USER-TOKEN: %s"\nheader = "Content-Type: application/json"\ndata-binary = "@%s"\nwrite-out = "%%{http_code}\\n"\noutput = "/dev/null"\n' \
      "$URL/slurm/$API/job/submit" "$RUSER" "$JWT" "$dir/job.json" >> "$dir/curl$c.cfg"
  done
done
before=$(njobs)
t0=$(date +%s.%N)
cpids=()
for c in $(seq 0 7); do curl -s -K "$dir/curl$c.cfg" > "$dir/curl$c.out" & cpids+=($!); done
for p in "${cpids[@]}"; do wait "$p" || die "a curl client failed"; done
t1=$(date +%s.%N)
ok300=$(cat "$dir"/curl?.out | grep -c '^200$' || true)
stored300=$(( $(njobs) - before ))
curl300_rps=$(python3 -c "print(round($ok300 / ($t1 - $t0), 1))")
echo "== $N300 held jobs from 8 keep-alive curl clients: $ok300 answered 200, $stored300 stored, $curl300_rps jobs/s"

printf '{"peer":"slurmrestd","version":"%s","api":"%s","netns":%s,"get_rps":%s,"get_p50_ms":%s,"get_p99_ms":%s,"get_non2xx":%s,"submit_rps":%s,"submit_p50_ms":%s,"submit_p99_ms":%s,"submit_acked":%s,"submit_failed":%s,"submit_stored":%s,"submit300_curl_jobs_s":%s,"submit300_stored":%s}\n' \
  "$VERSION" "$API" "$([ "$TY_SLURM_NETNS" = 1 ] && echo true || echo false)" \
  "$get_rps" "$get_p50" "$get_p99" "$get_non2xx" "$post_rps" "$post_p50" "$post_p99" \
  "${acked:-0}" "${failed:-0}" "$stored" "$curl300_rps" "$stored300"
