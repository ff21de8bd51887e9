#!/usr/bin/env bash
# run.sh - `make run`: trainyard up (server + local agent, data in ./.trainyard),
# and, unless DEMO=0, the Fashion-MNIST example submitted once it answers, so
# there is a job to watch (`./build/trainyard logs 1 -f`, or curl).
set -u
cd "$(dirname "$0")/.."
BIN=./build/trainyard
DATA=${TRAINYARD_DATA:-./.trainyard}
rm -f "$DATA/server.url"
# 4 CPU slots by default (CPU_SLOTS=N to change), so the examples' strategies
# (2 replicas, 2 workers, 1 ps + 2 workers) all fit even on a 2-core machine
"$BIN" up --data "$DATA" --cpu-slots "${CPU_SLOTS:-4}" "$@" &
up=$!
trap 'kill -TERM $up 2>/dev/null; wait $up; exit 0' INT TERM
if [ "${DEMO:-1}" != 0 ]; then
  for _ in $(seq 100); do [ -s "$DATA/server.url" ] && break; sleep 0.1; done
  if [ -s "$DATA/server.url" ]; then
    url=$(cat "$DATA/server.url")
    if out=$(TRAINYARD_URL=$url TRAINYARD_TOKEN_FILE=$DATA/token "$BIN" submit --json examples/fashion_mnist_mlp.json); then
      id=$(printf '%s' "$out" | sed -n 's/^{"id":\([0-9]*\).*/\1/p')
      cat >&2 <<MSG

  demo: job $id (examples/fashion_mnist_mlp.json) submitted to $url.
  watch it:  ./build/trainyard logs $id -f      ./build/trainyard status $id
             curl -s -H "Authorization: Bearer \$(cat .trainyard/token)" $url/api/v1/jobs/$id
  stop the service with Ctrl-C.

MSG
    fi
  fi
fi
wait $up
