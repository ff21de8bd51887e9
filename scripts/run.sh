#!/usr/bin/env bash
# run.sh - `make run`: trainyard up (server + local agent, data in ./.trainyard),
# and, unless DEMO=0, the Fashion-MNIST example submitted once it answers, so
# there is a job to watch (`./build/trainyard logs 1 -f`, or curl).
#
# ONCE=1 (`make run ONCE=1`, or --once as the first argument): a smoke test of
# an install. The demo's progress is followed until it ends, then the service
# stops; the exit status is 0 only if the demo job succeeded (1 if the service
# did not start, the CLI's code otherwise: 4 failed, 5 cancelled).
set -u
cd "$(dirname "$0")/.."
BIN=./build/trainyard
DATA=${TRAINYARD_DATA:-./.trainyard}
ONCE=${ONCE:-}
if [ "${1:-}" = "--once" ]; then ONCE=1; shift; fi
[ "$ONCE" = 0 ] && ONCE=
rm -f "$DATA/server.url"
# 4 CPU slots by default (CPU_SLOTS=N to change), so the examples' strategies
# (2 replicas, 2 workers, 1 ps + 2 workers) all fit even on a 2-core machine
"$BIN" up --data "$DATA" --cpu-slots "${CPU_SLOTS:-4}" "$@" &
up=$!
stop() { kill -TERM $up 2>/dev/null; wait $up 2>/dev/null; }
trap 'stop; exit 0' INT TERM
if [ "${DEMO:-1}" != 0 ] || [ -n "$ONCE" ]; then
  # as long as `up` lives (it gives up itself after 30 s): a first start on a
  # busy disk (a package install just before) can take more than a few seconds
  for i in $(seq 600); do
    [ -s "$DATA/server.url" ] && break
    kill -0 $up 2>/dev/null || break
    [ "$i" = 50 ] && echo "run: waiting for the server to listen (a slow disk?)" >&2
    sleep 0.1
  done
  if [ ! -s "$DATA/server.url" ]; then
    echo "run: the service did not start (see above)" >&2
    stop
    exit 1
  fi
  url=$(cat "$DATA/server.url")
  export TRAINYARD_URL=$url TRAINYARD_TOKEN_FILE=$DATA/token
  id=
  if out=$("$BIN" submit --json examples/fashion_mnist_mlp.json); then
    id=$(printf '%s' "$out" | sed -n 's/^{"id":\([0-9]*\).*/\1/p')
  fi
  if [ -z "$id" ]; then
    echo "run: the demo job was not accepted: $out" >&2
    if [ -n "$ONCE" ]; then stop; exit 1; fi
  elif [ -n "$ONCE" ]; then
    echo "run: demo job $id (examples/fashion_mnist_mlp.json) submitted to $url; following it until it ends" >&2
    "$BIN" watch "$id" --interval 1000
    rc=$?
    stop
    if [ $rc = 0 ]; then echo "run: demo job $id succeeded; the service is stopped (ONCE=1)" >&2
    else echo "run: demo job $id did not succeed (exit $rc)" >&2; fi
    exit $rc
  else
    cat >&2 <<MSG

  demo: job $id (examples/fashion_mnist_mlp.json) submitted to $url.
  watch it:  ./build/trainyard logs $id -f      ./build/trainyard status $id
             curl -s -H "Authorization: Bearer \$(cat .trainyard/token)" $url/api/v1/jobs/$id
  stop the service with Ctrl-C.

MSG
  fi
fi
wait $up
