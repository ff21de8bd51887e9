#!/usr/bin/env bash
# run.sh - what an evaluator side-car costs the training beside it, on this
# machine, in one run: the same job (Fashion-MNIST, 30,000 examples of which
# 30% validation, a 784-128-10 MLP, mirrored on 1 worker x 2 CPU slots so the
# training wants every core of a 2-core machine, EPOCHS epochs, a checkpoint
# each epoch, resources.memory 2GiB so that the evaluator has room beside a
# gang that holds every slot: with default shares the gang would hold all of
# the node's memory) without and with resources.evaluator, alternating, ROUNDS times, on
# `trainyard up --cpu-slots 2` with the agent's --worker-sched idle (up's
# default: the workers themselves under SCHED_IDLE) and normal (workers at
# nice 10, normal policy). The figure: the training samples/s of epochs 2..E
# (the chief's epoch metrics), median over rounds, and their ratio; and the
# eval metrics the evaluator posted.
#
#   bench/evaluator/run.sh            ROUNDS=4 EPOCHS=15 bench/evaluator/run.sh
#
# The last line is one JSON object.
set -euo pipefail
cd "$(dirname "$0")/../.."
# SMOKE=1 (make test): one round of 3 epochs (the figure is epochs 2..E)
if [ "${SMOKE:-0}" = 1 ]; then ROUNDS=1 EPOCHS=3; fi
ROUNDS=${ROUNDS:-4}
EPOCHS=${EPOCHS:-15}
make --no-print-directory -s -j2 CUDA=0 build/trainyard
bin=$PWD/build/trainyard
export OPENBLAS_NUM_THREADS=1
echo "== $(date -u +%FT%TZ), $(getconf _NPROCESSORS_ONLN) cores ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)), $ROUNDS rounds of $EPOCHS epochs;" \
     "$(uptime | sed 's/.*load average/load average/')"
results=$(mktemp /tmp/eval_bench.XXXXXX)
trap 'rm -f "$results"; [ -n "${up_pid:-}" ] && kill "$up_pid" 2>/dev/null; wait 2>/dev/null || true' EXIT
for sched in idle normal; do
  dir=$(mktemp -d /tmp/eval_bench_up.XXXXXX)
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$bin" up --listen 127.0.0.1:$port --data "$dir" --cpu-slots 2 --worker-sched $sched --log-level warn \
      >"$dir/up.log" 2>&1 &
  up_pid=$!
  for _ in $(seq 100); do [ -s "$dir/server.url" ] && break; sleep 0.1; done
  python3 bench/evaluator/jobs.py "http://127.0.0.1:$port" "$(cat "$dir/token")" "$sched" "$ROUNDS" "$EPOCHS" >>"$results"
  kill "$up_pid"; wait "$up_pid" || true; up_pid=
  rm -rf "$dir"
done
python3 - "$results" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
out = {}
for sched in ("idle", "normal"):
    r = [x for x in rows if x["worker_sched"] == sched]
    base = [x["samples_per_sec"] for x in r if not x["evaluator"]]
    ev = [x["samples_per_sec"] for x in r if x["evaluator"]]
    ratios = [e / b for b, e in zip(base, ev)]
    out[sched] = {"without": round(statistics.median(base)), "with": round(statistics.median(ev)),
                  "ratio": round(statistics.median(ratios), 3),
                  "runs_without": [round(v) for v in base], "runs_with": [round(v) for v in ev],
                  "eval_metrics": [x["eval_metrics"] for x in r if x["evaluator"]]}
    print(f"worker-sched {sched}: without {out[sched]['without']} samples/s, with {out[sched]['with']}, "
          f"median ratio {out[sched]['ratio']} (rounds {ratios})")
print(json.dumps(out))
PY
