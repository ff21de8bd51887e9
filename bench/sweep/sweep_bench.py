"""sweep_bench.py OUT - run the grid and the ASHA sweep of bench/sweep/run.sh,
each on a fresh `trainyard up`, and write the comparison to OUT.

Knobs (environment): BIN, EPOCHS (max_epochs, default 9), LIMIT (examples
of Fashion-MNIST's training set, default all 60000), LRS and BATCHES (comma
lists), CONCURRENT (default 2), SLOTS (the agent's CPU slots, default 2),
ONLY (grid or asha: run that one alone, to time a trial)."""
import json, os, platform, signal, subprocess, sys, tempfile, time, urllib.request

BIN = os.environ.get("BIN", "build/trainyard")
EPOCHS = int(os.environ.get("EPOCHS", "9"))
LIMIT = int(os.environ.get("LIMIT", "60000"))
LRS = [float(x) for x in os.environ.get("LRS", "0.0003,0.001,0.003,0.01").split(",")]
BATCHES = [int(x) for x in os.environ.get("BATCHES", "32,64,128").split(",")]
CONCURRENT = int(os.environ.get("CONCURRENT", "2"))
SLOTS = int(os.environ.get("SLOTS", "2"))
ONLY = os.environ.get("ONLY", "")

# A small MLP (784-128-10) on a slice of Fashion-MNIST, a fifth of it held out
# for validation; the data seed is fixed, so every trial sees the same split.
JOB = {
    "name": "fmnist-mlp",
    "model": {"layers": [{"type": "flatten", "input_shape": [28, 28]},
                         {"type": "dense", "units": 128, "activation": "relu"},
                         {"type": "dense", "units": 10, "activation": "softmax"}]},
    "compile": {"optimizer": {"type": "adam", "learning_rate": 0.001},
                "loss": "sparse_categorical_crossentropy", "metrics": ["accuracy"]},
    "data": {"source": "fashion-mnist", "limit": LIMIT, "validation_split": 0.2, "seed": 42},
    "fit": {"epochs": EPOCHS, "batch_size": 64},
    "max_runtime_s": 3600,
}
PARAMS = {"compile.optimizer.learning_rate": {"values": LRS}, "fit.batch_size": {"values": BATCHES}}
SEARCH = {"metric": "val_accuracy", "mode": "max", "max_concurrent": CONCURRENT, "parameters": PARAMS}


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

    def api(self, path, body=None):
        req = urllib.request.Request(self.url + "/api/v1" + path, method="POST" if body is not None else "GET",
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": "Bearer " + self.token, "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())


def run_sweep(name, search):
    with Up() as up:
        t0 = time.monotonic()
        s = up.api("/sweeps", {"name": name, "job": JOB, "search": dict(SEARCH, **search)})
        while s["state"] == "running":
            time.sleep(1)
            s = up.api(f"/sweeps/{s['id']}")
        wall = time.monotonic() - t0
        if s["state"] != "succeeded":
            raise SystemExit(f"{name}: the sweep ended {s['state']}: {s.get('reason')}")
        # the best of each trial's epochs, as the sweep ranks them, from its job's metrics
        return {"name": name, "wall_s": wall, "epochs": sum(t["epochs"] for t in s["trials"]),
                "best": s["best"], "trials": s["trials"], "reason": s["reason"]}


def loadavg():
    return " ".join(open("/proc/loadavg").read().split()[:3])


def describe(r):
    lines = [f"{r['name']}: wall {r['wall_s']:.1f} s, {r['epochs']} epochs trained in all, "
             f"best val_accuracy {r['best']['metric']:.4f} (trial {r['best']['trial']}: {json.dumps(r['best']['params'])})",
             f"  {r['reason']}; {len({json.dumps(t['params'], sort_keys=True) for t in r['trials']})} distinct configurations",
             "  trial  lr        batch  state      epochs  val_accuracy"]
    for t in sorted(r["trials"], key=lambda t: -(t["metric"] if t["metric"] is not None else -1)):
        p = t["params"]
        lines.append(f"  {t['trial']:5d}  {p['compile.optimizer.learning_rate']:<8g}  {p['fit.batch_size']:5d}  "
                     f"{t['state']:<9s}  {t['epochs']:6d}  {t['metric'] if t['metric'] is not None else float('nan'):.4f}")
    return lines


def main():
    out = sys.argv[1]
    head = [f"bench/sweep/run.sh  {time.strftime('%Y-%m-%d %H:%M:%S %Z')}  host {platform.node()}, {os.cpu_count()} CPUs",
            f"binary {BIN}; trainyard up --cpu-slots {SLOTS}; max_concurrent {CONCURRENT}",
            f"Fashion-MNIST, {LIMIT} training examples (validation_split 0.2), MLP 784-128-10 (adam)",
            f"grid {len(LRS)} learning rates {LRS} x {len(BATCHES)} batch sizes {BATCHES} = {len(LRS) * len(BATCHES)} trials; "
            f"grid: {EPOCHS} epochs each; asha: max_epochs {EPOCHS}, min_epochs 1, reduction_factor 3, seed 0 "
            f"(its trials draw their values from the same lists, so some repeat and some are never tried)",
            f"load average before: {loadavg()}"]
    print("\n".join(head), flush=True)
    runs = []
    if ONLY in ("", "grid"):
        runs.append(run_sweep("grid", {"method": "grid"}))
        print("\n".join(describe(runs[-1])) + f"\nload average: {loadavg()}", flush=True)
    if ONLY in ("", "asha"):
        runs.append(run_sweep("asha", {"method": "asha", "max_epochs": EPOCHS, "min_epochs": 1, "reduction_factor": 3}))
        print("\n".join(describe(runs[-1])) + f"\nload average: {loadavg()}", flush=True)
    body = head[:]
    for r in runs:
        body += describe(r)
    ok = True
    if len(runs) == 2:
        g, a = runs
        gap = g["best"]["metric"] - a["best"]["metric"]
        share = a["epochs"] / g["epochs"]
        c1 = gap <= 0.005
        c2 = share <= 0.40
        ok = c1 and c2
        body += ["",
                 f"best val_accuracy: grid {g['best']['metric']:.4f}, asha {a['best']['metric']:.4f} (asha {-gap:+.4f})",
                 f"epochs trained: grid {g['epochs']}, asha {a['epochs']} ({share:.0%} of the grid's)",
                 f"wall time: grid {g['wall_s']:.1f} s, asha {a['wall_s']:.1f} s ({a['wall_s'] / g['wall_s']:.0%} of the grid's)",
                 f"check: asha's best within 0.005 of the grid's best: {'PASS' if c1 else 'FAIL'}",
                 f"check: asha trains at most 40% of the grid's epochs: {'PASS' if c2 else 'FAIL'}"]
    body.append(f"load average after: {loadavg()}")
    text = "\n".join(body) + "\n"
    if not ONLY:
        with open(out, "w") as f:
            f.write(text)
    if len(runs) == 2:
        print("\n".join(body[-6:]))
    if not ONLY:
        print(f"written to {out}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
