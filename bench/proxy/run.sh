#!/usr/bin/env bash
# bench/proxy - what the reverse proxy (server/proxy.c) adds to a request to
# an app on loopback, beside nginx as the peer (`make bench-proxy`).
# The app: nginx serving one SIZE-byte file (its own instance, one worker).
# In one run, each for DUR seconds, wrk against:
#   direct:    the app itself
#   trainyard: build/bench/proxy_bench, a daemon whose one route forwards
#              every request to the app (a job's port through the server)
#   nginx:     nginx as a reverse proxy to the app (proxy_pass, its
#              defaults: a new upstream connection a request, as ours)
# twice: latency with one connection (wrk -t1 -c1: the median is a
# request's own cost, not a queue's) and throughput with CONNS connections.
# Ends with one JSON line: the median latency each adds over direct (the
# target: ours +<= 1 ms) and our throughput over nginx's.
# SMOKE=1 (make test): one second a phase.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v wrk >/dev/null || TRAINYARD_EXTRA_PKGS=wrk scripts/deps.sh
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[ -x "$NGINX" ] || { TRAINYARD_EXTRA_PKGS=nginx-light scripts/deps.sh; NGINX=$(command -v nginx || echo /usr/sbin/nginx); }
BUILD=${BUILD:-build}
make -s -j2 "$BUILD/bench/proxy_bench" >/dev/null
[ "${SMOKE:-0}" = 1 ] && DUR=1
DUR=${DUR:-10}
CONNS=${CONNS:-32}
SIZE=${SIZE:-1024}
dir=$(mktemp -d /tmp/ty_bench_proxy.XXXXXX)
chmod 755 "$dir"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -n "${KEEP:-}" ] || rm -rf "$dir"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
APP=$(free_port); NGX=$(free_port)
mkdir -p "$dir/www" "$dir/app" "$dir/peer"
head -c "$SIZE" /dev/zero | tr '\0' x > "$dir/www/body"
user=""; [ "$(id -u)" = 0 ] && user="user root root;"
nginx_conf() { # NAME WORKERS SERVER-BLOCK
  cat > "$dir/$1/nginx.conf" <<CONF
$user
worker_processes $2;
daemon off;
pid $dir/$1/nginx.pid;
error_log $dir/$1/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $dir/$1/body; proxy_temp_path $dir/$1/proxy; fastcgi_temp_path $dir/$1/fcgi;
  uwsgi_temp_path $dir/$1/uwsgi; scgi_temp_path $dir/$1/scgi;
  $3
}
CONF
}
nginx_conf app 1 "server { listen 127.0.0.1:$APP; location / { root $dir/www; } }"
nginx_conf peer auto "server { listen 127.0.0.1:$NGX; location / { proxy_pass http://127.0.0.1:$APP; } }"
"$NGINX" -p "$dir/app" -e "$dir/app/error.log" -c "$dir/app/nginx.conf" 2>>"$dir/app/error.log" & pids+=($!)
"$NGINX" -p "$dir/peer" -e "$dir/peer/error.log" -c "$dir/peer/nginx.conf" 2>>"$dir/peer/error.log" & pids+=($!)
"$BUILD/bench/proxy_bench" "$APP" "$dir/ours.port" > "$dir/ours.out" 2>"$dir/ours.log" & ours_pid=$!; pids+=($ours_pid)
for _ in $(seq 100); do [ -s "$dir/ours.port" ] && break; sleep 0.05; done
OURS=$(cat "$dir/ours.port")
for port in "$APP" "$NGX" "$OURS"; do
  for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$port/body" && break; sleep 0.05; done
  [ "$(curl -s "http://127.0.0.1:$port/body" | wc -c)" = "$SIZE" ] || { echo "bench/proxy: port $port does not serve the body" >&2; cat "$dir"/*/error.log "$dir/ours.log" >&2; exit 1; }
done

parse() { python3 bench/wrk_parse.py "$1"; } # wrk output -> "rps p50_ms p99_ms errors"
declare -A R
for phase in lat thr; do
  if [ $phase = lat ]; then args=(-t1 -c1); else args=(-t2 "-c$CONNS"); fi
  for who in direct trainyard nginx; do
    case $who in direct) port=$APP ;; trainyard) port=$OURS ;; nginx) port=$NGX ;; esac
    wrk "${args[@]}" -d"${DUR}s" --latency "http://127.0.0.1:$port/body" > "$dir/$phase.$who.txt"
    R[$phase.$who]=$(parse "$dir/$phase.$who.txt")
    echo "$phase $who: rps p50_ms p99_ms errors = ${R[$phase.$who]}"
  done
done
kill -TERM "$ours_pid"; wait "$ours_pid" || true
python3 - "${R[lat.direct]}" "${R[lat.trainyard]}" "${R[lat.nginx]}" "${R[thr.direct]}" "${R[thr.trainyard]}" "${R[thr.nginx]}" "$DUR" "$CONNS" "$SIZE" <<'PY'
import json, sys
f = lambda s: [round(float(x), 3) for x in s.split()]
ld, lt, ln, td, tt, tn = (f(a) for a in sys.argv[1:7])
out = {"bench": "proxy", "dur_s": int(sys.argv[7]), "conns": int(sys.argv[8]), "body_bytes": int(sys.argv[9]),
       "latency_c1": {"direct_p50_ms": ld[1], "trainyard_p50_ms": lt[1], "nginx_p50_ms": ln[1],
                      "direct_p99_ms": ld[2], "trainyard_p99_ms": lt[2], "nginx_p99_ms": ln[2]},
       "added_p50_ms": round(lt[1] - ld[1], 3), "nginx_added_p50_ms": round(ln[1] - ld[1], 3),
       "target_added_p50_ms": 1.0,
       "rps": {"direct": td[0], "trainyard": tt[0], "nginx": tn[0]},
       "rps_ratio_vs_nginx": round(tt[0] / tn[0], 3) if tn[0] else None,
       "errors": int(sum(x[3] for x in (ld, lt, ln, td, tt, tn)))}
print(json.dumps(out))
PY
