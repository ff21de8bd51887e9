#!/usr/bin/env python3
"""start_cost.py - the measuring half of bench/images/run.sh (which starts
`trainyard up`, a loopback registry and the test image, then runs this).

1. Image vs host start: 1-worker command jobs whose program is
   `date +%s.%N` (the first thing it does is print the time); the start is
   that time minus the time taken just before the POST /jobs. Host and image
   jobs alternate (ABAB), image cached (pull if_not_present); the job's
   timeline and the worker's log split it into steps. Then the bare podman
   figures: `podman run --rm --network host IMAGE true`, the same with the
   flags trainyard's worker adds (executor/container.c), and the per-task
   `podman image exists` check, alternated too.
2. A 10 MiB context (100 incompressible files): `trainyard context push DIR`
   (pack + upload) against curl POSTing the packed tar alone, the context
   deleted between runs so each is a real upload (201); then host jobs with
   no context, with it not cached on the node (fetch + unpack), and cached
   (unpack only), alternated, the agent's cache emptied before each cold one;
   the agent's "context ... fetched (N bytes, X ms)" from up's log.

Raw numbers go to stdout as `raw ...` lines, the summary after them."""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("--url", required=True)
ap.add_argument("--token", required=True)
ap.add_argument("--bin", required=True)
ap.add_argument("--image", required=True, help="the registry reference jobs name")
ap.add_argument("--local-image", required=True, help="the same image, for the bare podman runs")
ap.add_argument("--up-log", required=True)
ap.add_argument("--cache-dir", required=True)
ap.add_argument("--work", required=True)
ap.add_argument("--runs", type=int, default=20)
ap.add_argument("--ctx-runs", type=int, default=5)
ap.add_argument("--ctx-mib", type=int, default=10)
ap.add_argument("--ctx-files", type=int, default=100)
args = ap.parse_args()
API = args.url.rstrip("/") + "/api/v1"
HDR = {"Authorization": "Bearer " + args.token}

summary = []


def out(line=""):
    print(line, flush=True)


def say(line=""):
    summary.append(line)


def http(method, path, body=None, ctype="application/json", raw=False):
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    req = urllib.request.Request(API + path, data=data, method=method, headers=dict(HDR))
    if data is not None:
        req.add_header("Content-Type", ctype)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            b = r.read()
            return r.status, (b if raw else (json.loads(b) if b else None))
    except urllib.error.HTTPError as e:
        b = e.read()
        try:
            return e.code, json.loads(b)
        except ValueError:
            return e.code, b


def iso(s):
    """'2026-11-27T07:47:31.613Z' -> epoch seconds (UTC)."""
    import calendar
    base, frac = s.rstrip("Z").split(".")
    return calendar.timegm(time.strptime(base, "%Y-%m-%dT%H:%M:%S")) + float("0." + frac)


LOG_TS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z) worker-0 \w+: (.*)$")
STAMP = re.compile(r"^(\d{9,}\.\d+)$")


def run_job(spec, label):
    """Submits spec, waits for its end; the start and its steps (seconds)."""
    t_submit = time.time()
    st, j = http("POST", "/jobs", spec)
    if st != 201:
        sys.exit(f"bench/images: submit answered {st}: {j}")
    jid = j["id"]
    end = time.time() + 300
    while True:
        st, j = http("GET", f"/jobs/{jid}")
        if j["state"] in ("succeeded", "failed", "cancelled"):
            break
        if time.time() > end:
            sys.exit(f"bench/images: job {jid} ({label}) still {j['state']} after 300 s")
        time.sleep(0.1)
    if j["state"] != "succeeded":
        st, lg = http("GET", f"/jobs/{jid}/logs?task=worker-0", raw=True)
        sys.exit(f"bench/images: job {jid} ({label}) {j['state']}: {j.get('reason')}\n{lg.decode(errors='replace')}")
    first = None
    steps = {}
    for _ in range(100):  # the agent ships logs once a second
        st, lg = http("GET", f"/jobs/{jid}/logs?task=worker-0", raw=True)
        for line in lg.decode(errors="replace").splitlines():
            m = STAMP.match(line.strip())
            if m and first is None:
                first = float(m.group(1))
            m = LOG_TS.match(line)
            if m:
                t, msg = iso(m.group(1)), m.group(2)
                if "attempt" in msg and "command" in msg and "worker_log" not in steps:
                    steps["worker_log"] = t  # the worker's first line
                if msg.startswith("started ") and "exec" not in steps:
                    steps["exec"] = t  # fork+exec of the program (podman run in an image)
        if first is not None:
            break
        time.sleep(0.1)
    if first is None:
        sys.exit(f"bench/images: job {jid} ({label}) printed no time stamp:\n{lg.decode(errors='replace')}")
    st, ev = http("GET", f"/jobs/{jid}/events")
    placed = next((iso(e["time"]) for e in ev["events"] if e.get("to") == "starting"), None)
    task = j["tasks"][0]
    r = {
        "job": jid,
        "task": task["id"],
        "start": first - t_submit,
        # the steps: submit -> placed (scheduler) -> worker started (agent)
        # -> the worker's first log line -> the program exec'd -> its first line
        "placed": (placed - t_submit) if placed else float("nan"),
        "worker": iso(task["started_at"]) - t_submit,
        "worker_log": steps.get("worker_log", float("nan")) - t_submit,
        "exec": steps.get("exec", float("nan")) - t_submit,
    }
    return r


def settle():
    time.sleep(0.5)


def med(v):
    return statistics.median(v)


def p90(v):
    s = sorted(v)
    if len(s) == 1:
        return s[0]
    k = 0.9 * (len(s) - 1)
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def ms(x):
    return f"{x * 1000:7.1f}"


# ------------------------------------------------------------------ 1. image vs host
HOST = {"name": "host-start", "command": {"argv": ["date", "+%s.%N"]}, "resources": {"workers": 1},
        "max_restarts": 0}
IMG = {"name": "image-start", "command": {"argv": ["date", "+%s.%N"]},
       "environment": {"image": args.image, "pull": "if_not_present"}, "resources": {"workers": 1},
       "max_restarts": 0}

out("== warm-up: one host job, then one image job (the team's first use pulls the image)")
w = run_job(HOST, "host warm-up")
out(f"raw warmup host job={w['job']} start_ms={ms(w['start']).strip()}")
settle()
t0 = time.time()
w = run_job(IMG, "image warm-up (pull)")
out(f"raw warmup image job={w['job']} start_ms={ms(w['start']).strip()} (includes the pull)")
st, ev = http("GET", f"/jobs/{w['job']}/events")
pull_note = [e["reason"] for e in ev["events"] if e.get("kind") == "image"]
for p in pull_note:
    out(f"raw warmup image event: {p}")
settle()
w2 = run_job(IMG, "image warm-up 2")
out(f"raw warmup image2 job={w2['job']} start_ms={ms(w2['start']).strip()}")
settle()

out(f"== {args.runs} host and {args.runs} image jobs, alternating (host, image, host, image, ...)")
out("raw kind job start_ms placed_ms worker_ms worker_log_ms exec_ms")
res = {"host": [], "image": []}
for i in range(args.runs):
    for kind, spec in (("host", HOST), ("image", IMG)):
        r = run_job(spec, kind)
        res[kind].append(r)
        out(f"raw {kind:5s} {r['job']:4d} {ms(r['start'])} {ms(r['placed'])} {ms(r['worker'])} "
            f"{ms(r['worker_log'])} {ms(r['exec'])}")
        settle()


def podman_run(argv):
    """Wall time of argv, and (when it prints a time stamp) the time to its first line."""
    t_wall = time.time()
    t = time.perf_counter()
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    d = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit(f"bench/images: {' '.join(argv)} exited {p.returncode}: {p.stderr.decode()[-500:]}")
    m = STAMP.match(p.stdout.decode().strip().split("\n")[0]) if p.stdout.strip() else None
    return d, (float(m.group(1)) - t_wall) if m else None


# the worker's podman run (executor/container.c, ctr_argv), less the env and labels;
# the task's uid and limits as an isolated task gets them
hard_nofile = int(subprocess.run(["sh", "-c", "ulimit -Hn"], capture_output=True, text=True).stdout.strip() or 1048576)
hard_nofile = min(hard_nofile, 1048576)
voldir = os.path.join(args.work, "podman-vol")
os.makedirs(voldir, exist_ok=True)
os.chown(voldir, 200123, 200123)
# (podman's own default rlimits are above this machine's hard limits: runc
# would be refused them without CAP_SYS_RESOURCE, so the hard limits are given)
ULIMITS = [f"--ulimit=nofile={hard_nofile}:{hard_nofile}", "--ulimit=nproc=4096:4096"]
BARE = ["podman", "run", "--rm", "--network", "host"] + ULIMITS + [args.local_image]
FLAGGED = ["podman", "run", "--rm", "--pull=never", "--network=host", "--log-driver=none",
           "--user=200123:200123", "--security-opt=no-new-privileges", "--cap-drop=all",
           "--memory=1024m", "--memory-swap=1024m", "--shm-size=512m", "--pids-limit=4096",
           "--cpu-shares=1024"] + ULIMITS + [
           f"--volume={voldir}:{voldir}:rw", f"--workdir={voldir}", "--", args.local_image]
EXISTS = ["podman", "image", "exists", args.image]
HOSTDATE = ["date", "+%s.%N"]
PODMAN = (("true", BARE + ["true"]), ("date", BARE + HOSTDATE), ("flags", FLAGGED + HOSTDATE),
          ("exists", EXISTS), ("host", HOSTDATE))
out(f"== bare podman, {args.runs} each, alternating")
for k, argv in PODMAN:
    out(f"raw podman-{k}: " + " ".join(argv))
out("raw podman-KIND wall_ms [first_line_ms]")
bare = {k: [] for k, _ in PODMAN}
first = {k: [] for k, _ in PODMAN}
podman_run(BARE + ["true"])  # warm
for i in range(args.runs):
    for k, argv in PODMAN:
        d, f = podman_run(argv)
        bare[k].append(d)
        if f is not None:
            first[k].append(f)
        out(f"raw podman-{k} {ms(d)}" + (f" {ms(f)}" if f is not None else ""))

hs = [r["start"] for r in res["host"]]
im = [r["start"] for r in res["image"]]
diffs = [b - a for a, b in zip(hs, im)]
say(f"1. Start: submit (just before POST /jobs) to the program's first line, `date +%s.%N`, "
    f"1-worker command job, {args.runs} host and {args.runs} image jobs alternating; image cached (if_not_present)")
say(f"                          median      p90      min      max   (ms)")
say(f"   host task            {ms(med(hs))}  {ms(p90(hs))}  {ms(min(hs))}  {ms(max(hs))}")
say(f"   image task           {ms(med(im))}  {ms(p90(im))}  {ms(min(im))}  {ms(max(im))}")
say(f"   image - host         {ms(med(im) - med(hs))}  (difference of medians; median of pairwise "
    f"differences {ms(med(diffs)).strip()}, p90 {ms(p90(diffs)).strip()})")
say(f"   image / host          {med(im) / med(hs):6.2f}x")
say(f"   target: an image task starts within 300 ms of a host task: "
    f"{'met' if med(im) - med(hs) <= 0.3 else 'NOT met'}")
say("   where the time goes (median of each step, ms; from the job's timeline and the worker's log, 1 ms resolution):")
STEPS = (("submit -> placed (scheduler)", None, "placed"),
         ("placed -> worker process started (agent)", "placed", "worker"),
         ("worker started -> its first log line", "worker", "worker_log"),
         ("-> program started (rendezvous; image: the cache check)", "worker_log", "exec"),
         ("-> program's first line (image: podman run)", "exec", "start"))
say(f"     {'':58s}    host   image   image-host")
for name, a, b in STEPS:
    hv = med([r[b] - (r[a] if a else 0) for r in res["host"]])
    iv = med([r[b] - (r[a] if a else 0) for r in res["image"]])
    say(f"     {name:58s} {ms(hv)} {ms(iv)}  {ms(iv - hv)}")
say(f"   bare podman, {args.runs} each alternating, image cached (ms):"
    f"{'':22s}wall median   p90   first line median   p90")
for k, what in (("true", "podman run --rm --network host --ulimit.. IMAGE true"),
                ("date", "the same, IMAGE date +%s.%N"),
                ("flags", "with the worker's flags (--user, limits, volume, ...), date"),
                ("exists", "podman image exists REF (the worker's per-task check)"),
                ("host", "date +%s.%N on the host (fork + exec from Python)")):
    fl = f"   {ms(med(first[k]))}  {ms(p90(first[k]))}" if first[k] else ""
    say(f"     {what:66s} {ms(med(bare[k]))}  {ms(p90(bare[k]))}   {fl}")
say(f"   first image job of the team on the node (pull from a loopback registry): "
    f"{ms(w['start']).strip()} ms; {'; '.join(pull_note)}")

# ------------------------------------------------------------------ 2. context
ctx = os.path.join(args.work, "ctx")
total = args.ctx_mib * 1024 * 1024
os.makedirs(ctx)
per = total // args.ctx_files
for i in range(args.ctx_files):
    d = os.path.join(ctx, f"d{i // 10:02d}")
    os.makedirs(d, exist_ok=True)
    n = per if i < args.ctx_files - 1 else total - per * (args.ctx_files - 1)
    with open(os.path.join(d, f"f{i:03d}.bin"), "wb") as f:
        f.write(os.urandom(n))
subprocess.run(["chmod", "-R", "a+rX", ctx], check=True)
cli = [args.bin]
CLI_ENV = dict(os.environ, TRAINYARD_URL=args.url, TRAINYARD_TOKEN=args.token)


def push():
    t = time.perf_counter()
    p = subprocess.run(cli + ["context", "push", ctx, "--json"], capture_output=True, text=True, env=CLI_ENV)
    d = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit(f"bench/images: context push exited {p.returncode}: {p.stdout}{p.stderr}")
    try:
        cid = json.loads(p.stdout)["id"]
    except (ValueError, KeyError):
        cid = re.search(r"sha256:[0-9a-f]{64}", p.stdout + p.stderr).group(0)
    return d, cid, (p.stderr.strip().splitlines() or [""])[-1][:200]


def delete(cid):
    st, _ = http("DELETE", f"/contexts/{cid}")
    if st not in (204, 404):
        sys.exit(f"bench/images: DELETE {cid} answered {st}")


out(f"== context: {args.ctx_files} files of random bytes, {total} bytes in all")
d, cid, said = push()
out(f"raw push-first {ms(d)}  {said}")
st, blob = http("GET", f"/contexts/{cid}", raw=True)
tgz = os.path.join(args.work, "ctx.tar.gz")
with open(tgz, "wb") as f:
    f.write(blob)
out(f"raw packed {len(blob)} bytes, id {cid}")
d, _, said = push()
out(f"raw push-again {ms(d)}  {said}")
cpush, ccurl, ccurl_tt, again, cver, ctar = [], [], [], [], [], []
out("raw kind wall_ms [curl time_total_ms http]")
for i in range(args.ctx_runs):
    delete(cid)
    d, c2, said = push()
    if c2 != cid:
        sys.exit(f"bench/images: the same folder packed as {c2}, not {cid}")
    cpush.append(d)
    out(f"raw push {ms(d)}  {said}")
    d, _, said = push()
    again.append(d)
    out(f"raw push-present {ms(d)}  {said}")
    delete(cid)
    t = time.perf_counter()
    p = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code} %{time_total}",
                        "-H", "Authorization: " + HDR["Authorization"],
                        "-H", "Content-Type: application/gzip", "--data-binary", "@" + tgz, API + "/contexts"],
                       capture_output=True, text=True)
    d = time.perf_counter() - t
    code, tt = p.stdout.split()
    if code != "201":
        sys.exit(f"bench/images: curl upload answered {code}")
    ccurl.append(d)
    ccurl_tt.append(float(tt))
    out(f"raw curl {ms(d)} {float(tt) * 1000:.1f} {code}")
    t = time.perf_counter()
    subprocess.run([args.bin, "version"], stdout=subprocess.DEVNULL, check=True)
    d = time.perf_counter() - t
    cver.append(d)
    out(f"raw cli-version {ms(d)}")
    t = time.perf_counter()
    subprocess.run(["tar", "-C", ctx, "-czf", os.path.join(args.work, "ref.tgz"), "."], check=True)
    d = time.perf_counter() - t
    ctar.append(d)
    out(f"raw tar-czf {ms(d)}")

# fetch + unpack on the node: no context / not cached / cached, alternating
CTX_HOST = json.loads(json.dumps(HOST))
CTX_HOST["name"] = "ctx-start"
CTX_HOST["command"]["context"] = cid
cache_file = os.path.join(args.cache_dir, "contexts", cid[7:] + ".tar.gz")
FETCHED = re.compile(r"task (\d+): context sha256:[0-9a-f]+\.\.\. fetched \((\d+) bytes, (\d+) ms\)")


def fetched_for(task):
    for _ in range(50):
        with open(args.up_log, errors="replace") as f:
            for m in FETCHED.finditer(f.read()):
                if int(m.group(1)) == task:
                    return int(m.group(2)), int(m.group(3)) / 1000.0
        time.sleep(0.1)
    return None, float("nan")


jobs = {"none": [], "cold": [], "warm": []}
fetch_ms = []
out("raw kind job start_ms placed_ms worker_ms worker_log_ms exec_ms [fetched bytes, ms]")
for i in range(args.ctx_runs):
    for kind in ("none", "cold", "warm"):
        if kind == "cold" and os.path.exists(cache_file):
            os.unlink(cache_file)
        if kind == "warm" and not os.path.exists(cache_file):
            sys.exit("bench/images: the context is not in the agent's cache after a cold run")
        r = run_job(HOST if kind == "none" else CTX_HOST, "context " + kind)
        extra = ""
        if kind == "cold":
            nb, fm = fetched_for(r["task"])
            if nb is None:
                sys.exit(f"bench/images: no 'fetched' line for task {r['task']} in {args.up_log}")
            fetch_ms.append(fm)
            extra = f" fetched {nb} bytes in {fm * 1000:.0f} ms"
        jobs[kind].append(r)
        out(f"raw ctx-{kind:4s} {r['job']:4d} {ms(r['start'])} {ms(r['placed'])} {ms(r['worker'])} "
            f"{ms(r['worker_log'])} {ms(r['exec'])}{extra}")
        time.sleep(1.0)  # the task's unpacked copy goes with it

say("")
say(f"2. A {args.ctx_mib} MiB context: {args.ctx_files} files of random bytes, packed {len(blob)} bytes; "
    f"median of {args.ctx_runs} (the context deleted before each upload, so each is a 201)")
say(f"                                                            median      p90      min   (ms)")
say(f"   trainyard context push DIR (pack + upload), wall      {ms(med(cpush))}  {ms(p90(cpush))}  {ms(min(cpush))}")
say(f"   curl POST of the packed tar alone, wall                {ms(med(ccurl))}  {ms(p90(ccurl))}  {ms(min(ccurl))}"
    f"   (curl's time_total {ms(med(ccurl_tt)).strip()})")
say(f"     so packing takes about                               {ms(med(cpush) - med(ccurl))}"
    f"   (the CLI's own start, `trainyard version`: {ms(med(cver)).strip()})")
say(f"     for reference: GNU tar -czf of the folder, wall      {ms(med(ctar))}  {ms(p90(ctar))}  {ms(min(ctar))}")
say(f"   context push again, already on the server (200), wall  {ms(med(again))}  {ms(p90(again))}  {ms(min(again))}")
say(f"   on the node: agent's fetch (GET /contexts/ID to cache) {ms(med(fetch_ms))}  {ms(p90(fetch_ms))}  {ms(min(fetch_ms))}")
sn = [r["start"] for r in jobs["none"]]
sc = [r["start"] for r in jobs["cold"]]
sw = [r["start"] for r in jobs["warm"]]
say(f"   start (submit to first line), host job, no context     {ms(med(sn))}  {ms(p90(sn))}  {ms(min(sn))}")
say(f"     with the context, not cached on the node             {ms(med(sc))}  {ms(p90(sc))}  {ms(min(sc))}"
    f"   (+{ms(med(sc) - med(sn)).strip()}: fetch + unpack)")
say(f"     with the context, cached on the node                 {ms(med(sw))}  {ms(p90(sw))}  {ms(min(sw))}"
    f"   (+{ms(med(sw) - med(sn)).strip()}: unpack)")
pe = {k: [r["exec"] - r["placed"] for r in jobs[k]] for k in jobs}
say(f"   placed -> program started (the node's part; no scheduler or log-shipping noise):")
for f, nm in ((med, "median"), (min, "min")):
    say(f"     {nm}: no context {ms(f(pe['none'])).strip()}, not cached {ms(f(pe['cold'])).strip()} "
        f"(+{ms(f(pe['cold']) - f(pe['none'])).strip()}), cached {ms(f(pe['warm'])).strip()} "
        f"(+{ms(f(pe['warm']) - f(pe['none'])).strip()})")
say(f"   a 2nd, 3rd ... task of a job on the same node pays the unpack only; the fetch is once per node")

out("")
out("== summary")
for line in summary:
    out(line)
# the result line (last): the figures docs/command-jobs.md states, in ms
r1 = lambda v: round(v * 1000, 1)
out(json.dumps({"bench": "images", "runs": args.runs, "ctx_runs": args.ctx_runs,
                "host_start_ms": r1(med(hs)), "image_start_ms": r1(med(im)),
                "image_minus_host_ms": r1(med(im) - med(hs)), "image_over_host": round(med(im) / med(hs), 2),
                "context_push_ms": r1(med(cpush)), "curl_upload_ms": r1(med(ccurl)),
                "context_fetch_ms": r1(med(fetch_ms)),
                "start_no_context_ms": r1(med(sn)), "start_context_cold_ms": r1(med(sc)),
                "start_context_cached_ms": r1(med(sw))}))
