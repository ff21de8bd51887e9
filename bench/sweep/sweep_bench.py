"""sweep_bench.py OUT - ASHA against the full grid, side by side (bench/sweep/run.sh).

Two search spaces of a small MLP on Fashion-MNIST, each run as a grid (every
combination to max_epochs) and as ASHA (the same combinations, rungs of 1, 3,
9 epochs), each sweep on a fresh `trainyard up` with the same max_concurrent,
grid and ASHA alternating within each round (grid first in odd rounds, ASHA
first in even ones), so both see the same machine:

  small  6 learning rates x 2 batch sizes on a 4,000-image slice (an epoch is
         a few hundredths of a second: what a trial costs besides training
         shows here)
  full   4 learning rates x 3 batch sizes on the whole training set (60,000
         images, an epoch about half a second)

For every sweep: its wall time (POST /sweeps to the sweep's end, from the
sweep's own created_at/finished_at), the epochs its trials trained, its best
val_accuracy, and where the time of its trial jobs went, per phase, from
their timelines (GET /jobs/{id}/events) and their workers' log lines:
  decide   a trial job ended -> the controller scored it (its sweep event)
  place    queued (submitted, or requeued by a promotion) -> running
  start    running -> the worker's first training step (process, metrics
           and checkpoint fetch, data load, model)
  train    first step -> the worker's last line (epochs, validation,
           checkpoints, the rung decisions asked in between)
  finish   the worker's last line -> the job's end (metrics and checkpoint
           delivered, exit, status)
summed over every attempt of every trial (slot-seconds).

Checks per round and space: ASHA's best within 0.005 of the grid's; ASHA's
wall time at most 60% of the grid's; ASHA's epochs at most 40% of the grid's.
Prints a table per sweep and the summary, writes it all to OUT, and prints
one JSON line last. Exit 1 when a check fails.

Knobs (environment): BIN; ROUNDS (default 3); SPACES (comma list of small,
full; default both); CONCURRENT (max_concurrent, default 2); SLOTS (the
agent's CPU slots, default 2). SMOKE=1: one round of one tiny space (a
600-image slice, 2 learning rates x 1 batch size, 2 epochs), in seconds; the
checks are reported but do not fail it (too small to mean anything): the
JSON line says "checked": false, and "pass" is true once both sweeps ended
succeeded (a sweep that does not fails the run, exit 1)."""
import datetime, json, os, platform, re, signal, subprocess, sys, tempfile, time, urllib.request

BIN = os.environ.get("BIN", "build/trainyard")
SMOKE = os.environ.get("SMOKE", "") not in ("", "0")
ROUNDS = 1 if SMOKE else int(os.environ.get("ROUNDS", "3"))
CONCURRENT = int(os.environ.get("CONCURRENT", "2"))
SLOTS = int(os.environ.get("SLOTS", "2"))

SPACES = {
    "small": {"limit": 4000, "epochs": 9, "lrs": [0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03], "batches": [32, 128]},
    "full": {"limit": 60000, "epochs": 9, "lrs": [0.0003, 0.001, 0.003, 0.01], "batches": [32, 64, 128]},
    "smoke": {"limit": 600, "epochs": 2, "lrs": [0.001, 0.01], "batches": [64]},
}
if SMOKE:
    RUN_SPACES = ["smoke"]
else:
    RUN_SPACES = [s for s in os.environ.get("SPACES", "small,full").split(",") if s]
    for s in RUN_SPACES:
        if s not in ("small", "full"):
            raise SystemExit(f"SPACES: unknown space {s!r} (small, full)")

BEST_GAP, WALL_SHARE, EPOCH_SHARE = 0.005, 0.60, 0.40
PHASES = ["decide", "place", "start", "train", "finish"]


def job_spec(space):
    """A small MLP (784-128-10) on a slice of Fashion-MNIST, a fifth of it held
    out for validation; the data seed is fixed, so every trial sees the same split."""
    sp = SPACES[space]
    return {
        "name": "fmnist-mlp",
        "model": {"layers": [{"type": "flatten", "input_shape": [28, 28]},
                             {"type": "dense", "units": 128, "activation": "relu"},
                             {"type": "dense", "units": 10, "activation": "softmax"}]},
        "compile": {"optimizer": {"type": "adam", "learning_rate": 0.001},
                    "loss": "sparse_categorical_crossentropy", "metrics": ["accuracy"]},
        "data": {"source": "fashion-mnist", "limit": sp["limit"], "validation_split": 0.2, "seed": 42},
        "fit": {"epochs": sp["epochs"], "batch_size": 64},
        "max_runtime_s": 3600,
    }


def search(space, method):
    sp = SPACES[space]
    s = {"method": method, "metric": "val_accuracy", "mode": "max", "max_concurrent": CONCURRENT,
         "parameters": {"compile.optimizer.learning_rate": {"values": sp["lrs"]},
                        "fit.batch_size": {"values": sp["batches"]}}}
    if method == "asha":
        s.update({"max_epochs": sp["epochs"], "min_epochs": 1, "reduction_factor": 3, "seed": 0})
    return s


def ts(iso):
    return datetime.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


class Up:
    """`trainyard up` on a temporary data directory and a free port."""
    def __enter__(self):
        self.dir = tempfile.mkdtemp(prefix="ty_bench_sweep_")
        self.log = open(os.path.join(self.dir, "server.log"), "ab")
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
        self.proc = subprocess.Popen([BIN, "up", "--listen", "127.0.0.1:0", "--data", self.dir, "--cpu-slots", str(SLOTS)],
                                     stdout=self.log, stderr=self.log, env=env)
        url_file = os.path.join(self.dir, "server.url")
        for _ in range(600):
            if os.path.exists(url_file) and os.path.getsize(url_file) > 0:
                break
            if self.proc.poll() is not None:
                raise SystemExit(f"trainyard up exited; see {self.dir}/server.log")
            time.sleep(0.05)
        else:
            self.proc.kill()
            self.proc.wait()
            raise SystemExit(f"trainyard up did not start listening in 30 s; see {self.dir}/server.log")
        self.url = open(url_file).read().strip()
        self.token = open(os.path.join(self.dir, "token")).read().strip()
        return self

    def __exit__(self, *exc):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        subprocess.run(["rm", "-rf", self.dir])

    def get(self, path, body=None, text=False):
        req = urllib.request.Request(self.url + "/api/v1" + path, method="POST" if body is not None else "GET",
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": "Bearer " + self.token, "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            data = r.read()
        return data.decode() if text else json.loads(data)


LOG_LINE = re.compile(r"^(\S+Z) worker-0 \w+: (.*)$")


def phases(up, s):
    """Slot-seconds per phase over every attempt of every trial job (see the
    module's comment), and the number of attempts (worker processes)."""
    out = {p: 0.0 for p in PHASES}
    attempts = 0
    for t in s["trials"]:
        if not t["job_id"]:
            continue
        jid = t["job_id"]
        ev = up.get(f"/jobs/{jid}/events?limit=1000")["events"]
        queued, ended = None, None
        for e in ev:
            at = ts(e["time"])
            if e["kind"] == "state" and e["to"] == "queued":
                queued = at
            elif e["kind"] == "state" and e["to"] == "running" and queued is not None:
                out["place"] += at - queued
                queued = None
            elif e["kind"] == "state" and e["to"] in ("succeeded", "failed", "cancelled"):
                ended = at
            elif e["kind"] == "sweep" and ended is not None and re.search(r" (paused|succeeded|failed|cancelled): ", e["reason"] or ""):
                out["decide"] += at - ended
                ended = None
        # the worker's lines, attempt by attempt: started, first step, last line
        log = up.get(f"/jobs/{jid}/logs?task=worker-0", text=True)
        running = [ts(e["time"]) for e in ev if e["kind"] == "state" and e["to"] == "running"]
        ends = [ts(e["time"]) for e in ev if e["kind"] == "state" and e["to"] in ("succeeded", "failed", "cancelled")]
        cur = None
        for line in log.splitlines():
            m = LOG_LINE.match(line)
            if not m:
                continue
            at, msg = ts(m.group(1)), m.group(2)
            if re.match(r"job \d+ attempt \d+:", msg):
                if cur:
                    attempts += 1
                    close_attempt(out, cur, running, ends)
                cur = {"first": None, "last": at}
            elif cur:
                if msg.startswith("first training step") and cur["first"] is None:
                    cur["first"] = at
                cur["last"] = at
        if cur:
            attempts += 1
            close_attempt(out, cur, running, ends)
    return out, attempts


def close_attempt(out, cur, running, ends):
    """Adds one attempt's start, train and finish: running is the job's
    ->running times, ends its ->end times, matched to the attempt by time."""
    if cur["first"] is None:
        return
    r = max([x for x in running if x <= cur["first"]], default=None)
    e = min([x for x in ends if x >= cur["last"]], default=None)
    if r is not None:
        out["start"] += cur["first"] - r
    out["train"] += cur["last"] - cur["first"]
    if e is not None:
        out["finish"] += e - cur["last"]


def run_sweep(space, method):
    with Up() as up:
        s = up.get("/sweeps", {"name": f"{space}-{method}", "job": job_spec(space), "search": search(space, method)})
        while s["state"] == "running":
            time.sleep(0.2)
            s = up.get(f"/sweeps/{s['id']}")
        if s["state"] != "succeeded":
            raise SystemExit(f"{space} {method}: the sweep ended {s['state']}: {s.get('reason')}")
        ph, attempts = phases(up, s)
        return {"space": space, "method": method, "wall_s": ts(s["finished_at"]) - ts(s["created_at"]),
                "epochs": sum(t["epochs"] for t in s["trials"]), "best": s["best"]["metric"],
                "best_params": s["best"]["params"], "trials": s["trials"], "reason": s["reason"],
                "phases": ph, "attempts": attempts, "load": loadavg()}


def loadavg():
    return " ".join(open("/proc/loadavg").read().split()[:3])


def describe(r):
    ph = ", ".join(f"{p} {r['phases'][p]:.1f}" for p in PHASES)
    lines = [f"{r['space']} {r['method']}: wall {r['wall_s']:.2f} s, {r['epochs']} epochs trained, "
             f"{r['attempts']} worker processes, best val_accuracy {r['best']:.4f} ({json.dumps(r['best_params'])}); "
             f"load {r['load']}",
             f"  slot-seconds: {ph}",
             f"  {r['reason']}",
             "  trial  lr        batch  state      epochs  val_accuracy"]
    for t in sorted(r["trials"], key=lambda t: -(t["metric"] if t["metric"] is not None else -1)):
        p = t["params"]
        lines.append(f"  {t['trial']:5d}  {p['compile.optimizer.learning_rate']:<8g}  {p['fit.batch_size']:5d}  "
                     f"{t['state']:<9s}  {t['epochs']:6d}  {t['metric'] if t['metric'] is not None else float('nan'):.4f}")
    return lines


def listed(runs, key, spec):
    return ", ".join(format(r[key], spec) for r in runs)


def main():
    out = sys.argv[1]
    head = [f"bench/sweep/run.sh  {time.strftime('%Y-%m-%d %H:%M:%S %Z')}  host {platform.node()}, {os.cpu_count()} CPUs"
            f"{'  (SMOKE)' if SMOKE else ''}",
            f"binary {BIN}; trainyard up --cpu-slots {SLOTS}; max_concurrent {CONCURRENT}; {ROUNDS} round(s), "
            f"grid and asha alternating",
            "MLP 784-128-10 (adam) on Fashion-MNIST, validation_split 0.2; asha: min_epochs 1, reduction_factor 3, seed 0"]
    for s in RUN_SPACES:
        sp = SPACES[s]
        head.append(f"space {s}: {sp['limit']} examples, {len(sp['lrs'])} learning rates {sp['lrs']} x "
                    f"{len(sp['batches'])} batch sizes {sp['batches']}, max_epochs {sp['epochs']}")
    head.append(f"load average before: {loadavg()}")
    print("\n".join(head), flush=True)
    body = head[:]
    results = {s: {"grid": [], "asha": []} for s in RUN_SPACES}
    doc = {"bench": "sweep", "smoke": SMOKE, "rounds": ROUNDS, "max_concurrent": CONCURRENT, "spaces": {}}
    try:
        for rnd in range(ROUNDS):
            for s in RUN_SPACES:
                order = ["grid", "asha"] if rnd % 2 == 0 else ["asha", "grid"]
                for method in order:
                    r = run_sweep(s, method)
                    results[s][method].append(r)
                    lines = [f"round {rnd + 1}:"] + describe(r)
                    print("\n".join(lines), flush=True)
                    body += lines
    except (SystemExit, OSError) as e:
        # a sweep that did not succeed, or a server that did not start or answer
        print(f"bench-sweep: {e}", file=sys.stderr, flush=True)
        doc.update({"checked": not SMOKE, "pass": False, "error": str(e)})
        print(json.dumps(doc, separators=(",", ":")), flush=True)
        sys.exit(1)
    summary, ok = [""], True
    for s in RUN_SPACES:
        g, a = results[s]["grid"], results[s]["asha"]
        walls = [x["wall_s"] / y["wall_s"] for x, y in zip(a, g)]
        gaps = [y["best"] - x["best"] for x, y in zip(a, g)]
        eshare = [x["epochs"] / y["epochs"] for x, y in zip(a, g)]
        c_best = all(d <= BEST_GAP for d in gaps)
        c_wall = all(w <= WALL_SHARE for w in walls)
        c_ep = all(e <= EPOCH_SHARE for e in eshare)
        ok = ok and c_best and c_wall and c_ep
        ph = {m: {p: round(sum(x["phases"][p] for x in results[s][m]) / len(results[s][m]), 2) for p in PHASES}
              for m in ("grid", "asha")}
        summary += [f"space {s}:",
                    f"  wall time: grid {listed(g, 'wall_s', '.2f')} s; asha {listed(a, 'wall_s', '.2f')} s; "
                    f"asha/grid {', '.join(format(w, '.2f') for w in walls)}",
                    f"  epochs: grid {listed(g, 'epochs', 'd')}; asha {listed(a, 'epochs', 'd')}",
                    f"  best val_accuracy: grid {listed(g, 'best', '.4f')}; asha {listed(a, 'best', '.4f')}",
                    f"  slot-seconds per sweep (mean): grid {ph['grid']}; asha {ph['asha']}",
                    f"  check: asha's best within {BEST_GAP} of the grid's: {'PASS' if c_best else 'FAIL'}",
                    f"  check: asha's wall time at most {WALL_SHARE:.0%} of the grid's: {'PASS' if c_wall else 'FAIL'}",
                    f"  check: asha's epochs at most {EPOCH_SHARE:.0%} of the grid's: {'PASS' if c_ep else 'FAIL'}"]
        doc["spaces"][s] = {"grid_wall_s": [round(x["wall_s"], 3) for x in g],
                            "asha_wall_s": [round(x["wall_s"], 3) for x in a],
                            "wall_ratio": [round(w, 3) for w in walls],
                            "grid_epochs": [x["epochs"] for x in g], "asha_epochs": [x["epochs"] for x in a],
                            "grid_best": [round(x["best"], 4) for x in g], "asha_best": [round(x["best"], 4) for x in a],
                            "phases_s": ph,
                            "checks": {"best": c_best, "wall": c_wall, "epochs": c_ep}}
    summary.append(f"load average after: {loadavg()}")
    body += summary
    print("\n".join(summary))
    if not SMOKE:
        os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
        with open(out, "w") as f:
            f.write("\n".join(body) + "\n")
        print(f"written to {out}")
    # SMOKE: the sweeps ran to their end (run_sweep exits otherwise); the
    # checks are reported, but a tiny space says nothing about them
    doc["checked"] = not SMOKE
    doc["pass"] = ok or SMOKE
    print(json.dumps(doc, separators=(",", ":")), flush=True)
    sys.exit(0 if doc["pass"] else 1)


if __name__ == "__main__":
    main()
