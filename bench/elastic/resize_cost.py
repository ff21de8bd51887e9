#!/usr/bin/python3
"""resize_cost.py BIN - what resizing an elastic job costs on `trainyard up`.

Starts `BIN up --cpu-slots 2 --resize-interval 0` in a fresh data directory,
then in one run:
  1. a fixed 2-worker multi_worker_mirrored job (the reference: its wall time);
  2. the same spec as an elastic job of 1-2 workers, started while a blocker
     holds one slot (1 worker), grown to 2 when the blocker ends, shrunk to 1
     for an urgent job of higher priority, grown to 2 again when it ends.
For every resize it reads the job's timeline and metrics and reports, in
seconds: decision -> requeued (the gang finishes its step, checkpoints,
uploads, exits), requeued -> placed, placed -> all tasks running,
running -> first training step at the new size, and the whole. It also
checks the two runs end with the same final loss. Prints one JSON object
last."""
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime


def ts(s):
    return datetime.strptime(s, "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()


class Api:
    def __init__(self, url, token):
        self.url, self.token = url.rstrip("/") + "/api/v1", token

    def call(self, method, path, body=None):
        req = urllib.request.Request(self.url + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": "Bearer " + self.token,
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def job(self, i):
        return self.call("GET", f"/jobs/{i}")

    def events(self, i):
        return self.call("GET", f"/jobs/{i}/events?limit=1000")["events"]

    def metrics(self, i):
        out, since = [], 0
        while True:
            r = self.call("GET", f"/jobs/{i}/metrics?since={since}&limit=10000")
            out += r["metrics"]
            if not r["metrics"] or r["metrics"][-1]["seq"] >= r["last_seq"]:
                return out
            since = r["metrics"][-1]["seq"]

    def wait(self, i, cond, timeout, what):
        end = time.time() + timeout
        while time.time() < end:
            j = self.job(i)
            if cond(j):
                return j
            if j["state"] in ("failed", "cancelled"):
                sys.exit(f"job {i} {j['state']}: {j.get('reason')}")
            time.sleep(0.05)
        sys.exit(f"job {i}: timed out waiting for {what}")

    def wait_event(self, i, text, timeout):
        end = time.time() + timeout
        while time.time() < end:
            if any(text in (e.get("reason") or "") for e in self.events(i)):
                return
            time.sleep(0.05)
        sys.exit(f"job {i}: no event '{text}' in {timeout} s")


def spec(name, workers, epochs):
    return {"name": name,
            "model": {"layers": [
                {"type": "dense", "units": 256, "activation": "relu", "input_shape": [784]},
                {"type": "dropout", "rate": 0.3},
                {"type": "dense", "units": 10, "activation": "softmax"}]},
            "compile": {"optimizer": {"type": "sgd", "learning_rate": 0.01},
                        "loss": "sparse_categorical_crossentropy", "metrics": ["accuracy"]},
            "data": {"source": "fashion-mnist", "seed": 3},
            "fit": {"epochs": epochs, "batch_size": 128},
            "strategy": {"type": "multi_worker_mirrored"},
            "resources": {"workers": workers},
            "checkpoint": {"every_epochs": 0, "keep": 2},
            "priority": 40, "preemptible": True, "max_restarts": 0, "max_runtime_s": 3600}


def sleeper(name, secs, prio):
    return {"name": name, "command": {"argv": ["/bin/sleep", str(secs)]},
            "resources": {"workers": 1}, "priority": prio, "max_runtime_s": 600}


def resizes(api, i):
    """Per resize: the phases in seconds, from the timeline and metrics."""
    ev = api.events(i)
    first_step = {}
    for m in api.metrics(i):
        if m["kind"] == "step" and m["attempt"] not in first_step:
            first_step[m["attempt"]] = ts(m["time"])
    out, cur = [], None
    attempt = 1
    for e in ev:
        r = e.get("reason") or ""
        if e["kind"] == "resize" and r.startswith("resize:"):
            cur = {"decision": r, "t_decision": ts(e["time"])}
        elif cur and e.get("to") == "queued":
            cur["t_requeued"] = ts(e["time"])
        elif cur and e.get("to") == "starting":
            cur["t_placed"] = ts(e["time"])
            attempt += 1
        elif cur and e.get("to") == "running":
            cur["t_running"] = ts(e["time"])
            cur["t_first_step"] = first_step.get(attempt)
            out.append(cur)
            cur = None
        elif e.get("to") == "starting":
            attempt = max(attempt, 1)
    rows = []
    for c in out:
        if c.get("t_first_step") is None:
            continue
        rows.append({"decision": c["decision"],
                     "stop_checkpoint_s": round(c["t_requeued"] - c["t_decision"], 3),
                     "requeued_to_placed_s": round(c["t_placed"] - c["t_requeued"], 3),
                     "placed_to_running_s": round(c["t_running"] - c["t_placed"], 3),
                     "running_to_first_step_s": round(c["t_first_step"] - c["t_running"], 3),
                     "total_s": round(c["t_first_step"] - c["t_decision"], 3)})
    return rows


def main():
    bin_ = sys.argv[1]
    epochs = int(os.environ.get("EPOCHS", "60"))
    d = tempfile.mkdtemp(prefix="ty_bench_elastic_")
    log = open(os.path.join(d, "up.log"), "w")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    up = subprocess.Popen([bin_, "up", "--listen", "127.0.0.1:0", "--data", d, "--cpu-slots", "2",
                           "--resize-interval", "0", "--worker-sched", "normal", "--worker-nice", "0"],
                          stdout=log, stderr=log, env=env, start_new_session=True)
    try:
        for _ in range(300):
            if os.path.exists(os.path.join(d, "server.url")):
                break
            time.sleep(0.05)
        url = open(os.path.join(d, "server.url")).read().strip()
        api = Api(url, open(os.path.join(d, "token")).read().strip())
        time.sleep(1)

        t0 = time.time()
        fixed = api.call("POST", "/jobs", spec("fixed", 2, epochs))["id"]
        jf = api.wait(fixed, lambda j: j["state"] == "succeeded", 1800, "the fixed job")
        fixed_s = ts(jf["finished_at"]) - ts(jf["started_at"])
        print(f"fixed 2-worker run: {fixed_s:.1f} s (submitted {time.time() - t0:.1f} s ago)", file=sys.stderr)

        blocker = api.call("POST", "/jobs", sleeper("blocker", 6, 50))["id"]
        api.wait(blocker, lambda j: j["state"] == "running", 30, "the blocker")
        el = api.call("POST", "/jobs", spec("elastic", {"min": 1, "max": 2}, epochs))["id"]
        api.wait_event(el, "grown to 2 workers", 120)
        api.wait(el, lambda j: j["state"] == "running", 60, "the grown job")
        time.sleep(3)
        urgent = api.call("POST", "/jobs", sleeper("urgent", 6, 90))["id"]
        api.wait_event(el, "shrunk to 1 worker", 120)
        api.wait(urgent, lambda j: j["state"] == "succeeded", 120, "the urgent job")
        je = api.wait(el, lambda j: j["state"] == "succeeded", 1800, "the elastic job")
        elastic_s = ts(je["finished_at"]) - ts(je["started_at"])
        rows = resizes(api, el)
        last = lambda i: [m for m in api.metrics(i) if m["kind"] == "epoch"][-1]
        lf, le = last(fixed)["loss"], last(el)["loss"]
        totals = [r["total_s"] for r in rows]
        out = {"bench": "elastic_resize_cost", "epochs": epochs, "resizes": rows,
               "resize_total_median_s": round(statistics.median(totals), 3) if totals else None,
               "resize_total_max_s": max(totals) if totals else None,
               "fixed_2_workers_s": round(fixed_s, 2), "elastic_s": round(elastic_s, 2),
               "elastic_attempts": je["attempt"], "elastic_restart_budget_used": 0 if je["state"] == "succeeded" else None,
               "final_loss_fixed": lf, "final_loss_elastic": le,
               "final_loss_rel_diff": abs(lf - le) / abs(lf)}
        print(json.dumps(out))
    finally:
        os.killpg(up.pid, signal.SIGINT)
        try:
            up.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
        if os.environ.get("KEEP"):
            print("kept " + d, file=sys.stderr)
        else:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
