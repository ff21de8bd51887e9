#!/usr/bin/env bash
# s3-dev.sh - a real S3 store for development, the tests and the benchmarks:
# a one-node Ceph (one monitor, one memstore OSD, radosgw on loopback), every
# file of it under one directory.
#
#   scripts/s3-dev.sh start DIR   starts it, makes a user with random keys and
#                                 a bucket, prints S3_ENDPOINT=, S3_BUCKET=,
#                                 S3_REGION= lines and writes DIR/credentials
#                                 (0600, AWS shared-credentials format)
#   scripts/s3-dev.sh stop DIR    stops radosgw, the OSD, the monitor (in that
#                                 order), removes the data, keeps DIR/log
#   scripts/s3-dev.sh req DIR METHOD /BUCKET/KEY?QUERY [BODYFILE]
#                                 one request signed with the store's keys
#                                 (SigV4 by python3 alone): the status on the
#                                 first line, then the body (for tests)
#
# Environment: S3_DEV_MB (the OSD's memory, default 2048: objects live in
# RAM; a full OSD hangs uploads instead of failing them, so size generously),
# S3_DEV_PORT (radosgw's port; default: a free one), S3_DEV_BUCKET (default
# trainyard). Runs as root (the daemons); packages: ceph-mon ceph-osd radosgw
# ceph-common (scripts/deps.sh). What the configuration needs and why: auth
# none with the crc messenger modes (radosgw defaults to "secure", which needs
# cephx, and then waits 5 minutes for its config), pool size one with the pg
# autoscaler off, radosgw's seven pools made up front (else it makes them one
# by one, 9 s), every path (run, log, data, admin socket) inside DIR; the
# daemons stop in the order radosgw, OSD, monitor (else each waits for the
# next), and a zombie counts as exited (PID 1 may reap late).
set -euo pipefail

starting=0
die() {
  echo "s3-dev: $*" >&2
  # a start that fails stops what it started
  if [ "$starting" = 1 ]; then starting=0; do_stop >/dev/null 2>&1 || true; fi
  exit 1
}

usage() { die "usage: $0 start DIR | stop DIR | req DIR METHOD PATH [BODYFILE]"; }

[ $# -ge 2 ] || usage
cmd=$1
dir=$2
shift 2
case "$dir" in /*) ;; *) dir="$PWD/$dir" ;; esac

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# 0 when pid is gone or a zombie (PID 1 may reap late)
gone() {
  local st
  [ -r "/proc/$1/stat" ] || return 0
  st=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 0
  [ -z "$st" ] || [ "$st" = Z ] || [ "$st" = X ]
}

# stop_pid PID NAME: SIGTERM, wait up to 10 s, then SIGKILL
stop_pid() {
  local pid=$1
  gone "$pid" && return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 100); do gone "$pid" && return 0; sleep 0.1; done
  echo "s3-dev: $2 (pid $pid) did not stop in 10 s; killed" >&2
  kill -KILL "$pid" 2>/dev/null || true
  for _ in $(seq 50); do gone "$pid" && return 0; sleep 0.1; done
}

do_stop() {
  [ -d "$dir" ] || die "$dir: no such directory"
  if [ -f "$dir/pids" ]; then
    local name
    for name in radosgw osd mon; do
      local pid
      pid=$(awk -v n="$name" '$1 == n { print $2 }' "$dir/pids")
      [ -n "$pid" ] && stop_pid "$pid" "$name"
    done
    rm -f "$dir/pids"
  fi
  rm -rf "$dir/osd" "$dir/mon" "$dir/run" "$dir/rgw" "$dir/monmap" "$dir/credentials" "$dir/env"
}

# signed ENDPOINT REGION AK SK METHOD PATH [BODYFILE]: one SigV4-signed
# request by python3's hashlib and hmac alone (no aws-cli; an independent
# check of the project's own signer). PATH may carry a query. Prints the
# HTTP status on the first line (0 when nothing answered), then the body.
signed() {
  python3 - "$@" <<'PY'
import datetime, hashlib, hmac, sys, urllib.parse, urllib.request, urllib.error
endpoint, region, ak, sk, method, target = sys.argv[1:7]
body = b""
if len(sys.argv) > 7:
    with open(sys.argv[7], "rb") as f:
        body = f.read()
host = endpoint.split("://", 1)[1].rstrip("/")
path, _, query = target.partition("?")
q = lambda s: urllib.parse.quote(s, safe="-_.~")
cpath = "/".join(q(urllib.parse.unquote(seg)) for seg in path.split("/"))
pairs = [p.partition("=") for p in query.split("&") if p]
cquery = "&".join(f"{q(urllib.parse.unquote(k))}={q(urllib.parse.unquote(v))}"
                  for k, _, v in sorted(pairs, key=lambda p: (urllib.parse.unquote(p[0]), urllib.parse.unquote(p[2]))))
now = datetime.datetime.now(datetime.timezone.utc)
amz, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
phash = hashlib.sha256(body).hexdigest()
headers = {"host": host, "x-amz-content-sha256": phash, "x-amz-date": amz}
names = ";".join(sorted(headers))
canon = "\n".join([method, cpath, cquery,
                   "".join(f"{k}:{headers[k]}\n" for k in sorted(headers)), names, phash])
scope = f"{day}/{region}/s3/aws4_request"
tosign = "\n".join(["AWS4-HMAC-SHA256", amz, scope, hashlib.sha256(canon.encode()).hexdigest()])
key = ("AWS4" + sk).encode()
for part in (day, region, "s3", "aws4_request"):
    key = hmac.new(key, part.encode(), hashlib.sha256).digest()
sig = hmac.new(key, tosign.encode(), hashlib.sha256).hexdigest()
url = endpoint.rstrip("/") + cpath + ("?" + cquery if cquery else "")
req = urllib.request.Request(url, method=method, data=body if method in ("PUT", "POST") else None)
req.add_header("x-amz-date", amz)
req.add_header("x-amz-content-sha256", phash)
req.add_header("Authorization",
               f"AWS4-HMAC-SHA256 Credential={ak}/{scope}, SignedHeaders={names}, Signature={sig}")
out = sys.stdout.buffer
try:
    with urllib.request.urlopen(req, timeout=60) as r:
        out.write(b"%d\n" % r.status + r.read())
except urllib.error.HTTPError as e:
    out.write(b"%d\n" % e.code + e.read())
except OSError as e:
    out.write(b"0\n" + str(e).encode())
PY
}

# keyof DIR NAME: a value of DIR/credentials
keyof() { awk -F' *= *' -v k="$2" '$1 == k { print $2 }' "$1/credentials"; }

# req DIR METHOD PATH [BODYFILE]: a signed request to the store started in DIR
do_req() {
  [ -f "$dir/env" ] && [ -f "$dir/credentials" ] || die "$dir: no store started there (no env or credentials)"
  local endpoint region
  endpoint=$(sed -n 's/^S3_ENDPOINT=//p' "$dir/env")
  region=$(sed -n 's/^S3_REGION=//p' "$dir/env")
  signed "$endpoint" "$region" "$(keyof "$dir" aws_access_key_id)" "$(keyof "$dir" aws_secret_access_key)" "$@"
}

do_start() {
  [ "$(id -u)" -eq 0 ] || die "must run as root (the Ceph daemons and their data); try: sudo $0 start $dir"
  local missing=() b
  for b in ceph-mon ceph-osd radosgw radosgw-admin ceph monmaptool uuidgen python3 curl; do
    command -v "$b" >/dev/null 2>&1 || missing+=("$b")
  done
  [ ${#missing[@]} -eq 0 ] || die "missing ${missing[*]}: install ceph-mon ceph-osd radosgw ceph-common (scripts/deps.sh)"
  if [ -f "$dir/pids" ]; then
    local p
    for p in $(awk '{ print $2 }' "$dir/pids"); do
      gone "$p" || die "$dir already holds a running store (pid $p); run: $0 stop $dir"
    done
  fi
  mkdir -p "$dir"
  starting=1
  rm -rf "$dir/osd" "$dir/mon" "$dir/run" "$dir/rgw" "$dir/pids"
  mkdir -p "$dir/mon" "$dir/osd" "$dir/run" "$dir/log" "$dir/rgw"
  local mb=${S3_DEV_MB:-2048}
  [[ "$mb" =~ ^[0-9]+$ ]] && [ "$mb" -ge 256 ] || die "S3_DEV_MB=$mb: a number of MB, at least 256"
  local monport rgwport fsid bucket=${S3_DEV_BUCKET:-trainyard}
  monport=$(free_port)
  rgwport=${S3_DEV_PORT:-$(free_port)}
  [ "$rgwport" != "$monport" ] || monport=$(free_port)
  fsid=$(uuidgen)
  local conf=$dir/ceph.conf
  cat >"$conf" <<EOF
[global]
fsid = $fsid
mon host = [v2:127.0.0.1:$monport]
mon initial members = a
auth cluster required = none
auth service required = none
auth client required = none
ms mon client mode = crc
ms mon service mode = crc
ms mon cluster mode = crc
ms client mode = crc
ms service mode = crc
ms cluster mode = crc
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
paxos propose interval = 0.1
mon data avail warn = 2
mon data avail crit = 1
run dir = $dir/run
admin socket = $dir/run/\$name.asok
pid file = $dir/run/\$name.pid
log file = $dir/log/\$name.log
mon data = $dir/mon/\$name
osd data = $dir/osd/\$name
osd objectstore = memstore
memstore device bytes = $((mb * 1048576))
[client.rgw.dev]
rgw frontends = beast endpoint=127.0.0.1:$rgwport
rgw data = $dir/rgw
EOF
  local C=(-c "$conf")
  local slog=$dir/log/s3-dev.log
  : >"$slog"
  run() { "$@" >>"$slog" 2>&1 || die "$1 failed (exit $?); see $slog"; }
  run monmaptool --create --addv a "[v2:127.0.0.1:$monport]" --fsid "$fsid" "$dir/monmap"
  run ceph-mon "${C[@]}" --mkfs -i a --monmap "$dir/monmap"
  ceph-mon "${C[@]}" -i a -f >>"$dir/log/mon.out" 2>&1 </dev/null &
  echo "mon $!" >>"$dir/pids"
  local osdid u
  u=$(uuidgen)
  osdid=$(timeout 30 ceph "${C[@]}" --connect-timeout 20 osd new "$u" 2>>"$slog") ||
    die "the monitor did not answer in 30 s; see $dir/log/mon.a.log"
  mkdir -p "$dir/osd/osd.$osdid"
  run ceph-osd "${C[@]}" -i "$osdid" --mkfs --osd-uuid "$u"
  ceph-osd "${C[@]}" -i "$osdid" -f >>"$dir/log/osd.out" 2>&1 </dev/null &
  echo "osd $!" >>"$dir/pids"
  local p
  for p in .rgw.root default.rgw.log default.rgw.control default.rgw.meta \
           default.rgw.buckets.index default.rgw.buckets.data default.rgw.buckets.non-ec; do
    run timeout 30 ceph "${C[@]}" osd pool create "$p" 8 8 replicated
    run timeout 30 ceph "${C[@]}" osd pool application enable "$p" rgw
  done
  radosgw "${C[@]}" -n client.rgw.dev -f >>"$dir/log/rgw.out" 2>&1 </dev/null &
  local rgwpid=$!
  echo "radosgw $rgwpid" >>"$dir/pids"
  local endpoint=http://127.0.0.1:$rgwport code=000
  for _ in $(seq 300); do
    code=$(curl -s -o /dev/null -m 2 -w '%{http_code}' "$endpoint/" || true)
    [ "$code" = 200 ] && break
    gone "$rgwpid" && die "radosgw exited; see $dir/log/client.rgw.dev.log"
    sleep 0.1
  done
  [ "$code" = 200 ] || die "radosgw did not answer on $endpoint in 30 s; see $dir/log/client.rgw.dev.log"
  local ak sk
  ak=$(python3 -c 'import secrets; print(secrets.token_hex(10).upper())')
  sk=$(python3 -c 'import secrets; print(secrets.token_hex(20))')
  run timeout 60 radosgw-admin "${C[@]}" user create --uid=trainyard --display-name=trainyard \
      --access-key="$ak" --secret-key="$sk"
  (umask 077; printf '[default]\naws_access_key_id = %s\naws_secret_access_key = %s\n' "$ak" "$sk" >"$dir/credentials")
  chmod 600 "$dir/credentials"
  local out=""
  for _ in $(seq 50); do
    out=$(signed "$endpoint" us-east-1 "$ak" "$sk" PUT "/$bucket")
    [ "$(head -n1 <<<"$out")" = 200 ] && break
    sleep 0.2
  done
  [ "$(head -n1 <<<"$out")" = 200 ] || die "creating bucket $bucket on $endpoint: $(tr '\n' ' ' <<<"$out")"
  printf 'S3_ENDPOINT=%s\nS3_BUCKET=%s\nS3_REGION=us-east-1\n' "$endpoint" "$bucket" >"$dir/env"
  starting=0
  cat "$dir/env"
}

case "$cmd" in
  start) [ $# -eq 0 ] || usage; do_start ;;
  stop) [ $# -eq 0 ] || usage; do_stop ;;
  req) [ $# -ge 2 ] && [ $# -le 3 ] || usage; do_req "$@" ;;
  *) usage ;;
esac
