#!/usr/bin/env bash
# bench/images - what an image and a context add to a command job's start,
# on a `trainyard up` of its own (its own --data, port and --cache-dir):
#   1. submit -> the program's first line, host task vs image task (podman,
#      image cached, pull if_not_present), RUNS (20) of each alternating,
#      beside the bare `podman run --rm --network host IMAGE true`;
#   2. a 10 MiB context of 100 random files: `trainyard context push` (pack +
#      upload) vs curl POSTing the packed tar, and the node's fetch + unpack
#      (a job with it, not cached / cached, vs one without), CTX_RUNS (5) each.
# The measuring is bench/images/start_cost.py. Needs root, podman,
# docker-registry (the image is pushed to a loopback registry so the team's
# first job really pulls it, as on a cluster) and the test image
# (tests/image/build.sh, mmdebstrap). Writes
# bench/images/results/<date>-<host>.txt (raw numbers, then the summary)
# and prints the summary.
#
#   make bench-images                  BIN=build/hD/trainyard bench/images/run.sh
#   RUNS=20 CTX_RUNS=5 PORT=18590 UP_ARGS="--worker-sched normal --worker-nice 0"
set -euo pipefail
cd "$(dirname "$0")/../.."
export OPENBLAS_NUM_THREADS=1
BIN=$(realpath "${BIN:-build/trainyard}")
# SMOKE=1 (make test): 2 starts of each kind, 1 round of the context figures
if [ "${SMOKE:-0}" = 1 ]; then RUNS=2 CTX_RUNS=1; fi
RUNS=${RUNS:-20}
CTX_RUNS=${CTX_RUNS:-5}
PORT=${PORT:-18590}
IMAGE_LOCAL=${IMAGE_LOCAL:-localhost/trainyard-test:bookworm-py3}
# a node's agent runs its workers at normal priority unless told otherwise;
# up's default (SCHED_IDLE, nice 10) would measure whatever else this machine runs
UP_ARGS=${UP_ARGS:---worker-sched normal --worker-nice 0}

die() { echo "bench/images: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (tasks run as their own uids; rootful podman)"
[ -x "$BIN" ] || die "$BIN is missing: make (or BIN=build/hD/trainyard)"
for p in podman docker-registry curl python3; do command -v $p >/dev/null || die "$p is not installed"; done
tests/image/build.sh "$IMAGE_LOCAL" || die "tests/image/build.sh could not build $IMAGE_LOCAL"
if curl -s -o /dev/null "http://127.0.0.1:$PORT/"; then die "port $PORT is taken (PORT=...)"; fi

dir=$(mktemp -d /tmp/ty_bench_images.XXXXXX)
chmod 755 "$dir"
up_pid= reg_pid= reg_conf=
cleanup() {
  [ -n "$up_pid" ] && kill -INT "$up_pid" 2>/dev/null && wait "$up_pid" 2>/dev/null || true
  [ -n "$reg_pid" ] && kill "$reg_pid" 2>/dev/null && wait "$reg_pid" 2>/dev/null || true
  [ -n "$reg_conf" ] && rm -f "$reg_conf"
  [ -n "${image_ref:-}" ] && podman rmi -f "$image_ref" >/dev/null 2>&1 || true
  if [ -n "${KEEP:-}" ]; then echo "bench/images: kept $dir" >&2; else rm -rf "$dir"; fi
}
trap cleanup EXIT

# a loopback registry (plain HTTP, no login) holding the test image
reg_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mkdir -p "$dir/registry"
cat >"$dir/registry/config.yml" <<EOF
version: 0.1
storage:
  filesystem:
    rootdirectory: $dir/registry/data
http:
  addr: 127.0.0.1:$reg_port
EOF
docker-registry serve "$dir/registry/config.yml" >"$dir/registry/log" 2>&1 &
reg_pid=$!
reg_conf=/etc/containers/registries.conf.d/90-trainyard-bench-$reg_port.conf
mkdir -p /etc/containers/registries.conf.d
printf '[[registry]]\nlocation = "127.0.0.1:%s"\ninsecure = true\n' "$reg_port" >"$reg_conf"
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$reg_port/v2/" && break; sleep 0.1; done
image_ref=127.0.0.1:$reg_port/bench/trainer:1
podman push -q "$IMAGE_LOCAL" "$image_ref" >"$dir/push.log" 2>&1 || die "podman push failed: $(tail -3 "$dir/push.log")"

# shellcheck disable=SC2086
"$BIN" up --listen "127.0.0.1:$PORT" --data "$dir/data" --cache-dir "$dir/cache" --cpu-slots 2 $UP_ARGS \
  >"$dir/up.log" 2>&1 &
up_pid=$!
for _ in $(seq 200); do grep -q "registered as node" "$dir/up.log" 2>/dev/null && break; sleep 0.1; done
grep -q "registered as node" "$dir/up.log" || die "up did not start: $(tail -5 "$dir/up.log")"
grep -q "images run here with" "$dir/up.log" || die "the agent found no podman: $(tail -5 "$dir/up.log")"

host=$(hostname -s)
mkdir -p bench/images/results
res=bench/images/results/$(date +%F)-$host.txt
[ "${SMOKE:-0}" = 1 ] && res=$dir/smoke.txt   # a smoke run records nothing
{
  echo "# bench/images/run.sh on $host, $(date -u +%FT%TZ)"
  echo "# commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (with local changes)'), BIN=$BIN"
  echo "# $(nproc) cores; $(podman --version), runtime $(podman info --format '{{.Host.OCIRuntime.Name}} {{.Host.OCIRuntime.Version}}' 2>/dev/null | head -1)"
  echo "# up: --cpu-slots 2 $UP_ARGS, RUNS=$RUNS CTX_RUNS=$CTX_RUNS, OPENBLAS_NUM_THREADS=1"
  echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg); other trainyard processes: $(pgrep -c -f 'trainyard (up|server|agent|worker)' || true) (ours 3)"
} >"$dir/head.txt"
python3 bench/images/start_cost.py --url "http://127.0.0.1:$PORT" --token "$(cat "$dir/data/token")" \
  --bin "$BIN" --image "$image_ref" --local-image "$IMAGE_LOCAL" --up-log "$dir/up.log" \
  --cache-dir "$dir/cache" --work "$dir" --runs "$RUNS" --ctx-runs "$CTX_RUNS" >"$dir/out.txt" ||
  { cat "$dir/out.txt"; die "start_cost.py failed (up's log: $dir/up.log; KEEP=1 keeps it)"; }
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$dir/head.txt"
cat "$dir/head.txt" "$dir/out.txt" >"$res"
sed -n '/^== summary$/,$p' "$res" | sed '$d'
echo "(raw numbers: $res)"
tail -1 "$res"   # the result line: one JSON object
