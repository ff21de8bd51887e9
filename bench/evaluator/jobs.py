#!/usr/bin/env python3
"""jobs.py URL TOKEN SCHED ROUNDS EPOCHS - runs the benchmark job without and
with an evaluator, alternating, ROUNDS times; one JSON line per job."""
import json, statistics, sys, time, urllib.request

url, token, sched, rounds, epochs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])

def api(path, body=None):
    req = urllib.request.Request(url + "/api/v1" + path, data=json.dumps(body).encode() if body else None,
                                 headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req))

def spec(evaluator):
    return {"name": "bench-eval" if evaluator else "bench-plain",
            "model": {"layers": [{"type": "flatten", "input_shape": [28, 28]},
                                 {"type": "dense", "units": 128, "activation": "relu"},
                                 {"type": "dense", "units": 10, "activation": "softmax"}]},
            "compile": {"optimizer": {"type": "adam", "learning_rate": 0.001},
                        "loss": "sparse_categorical_crossentropy", "metrics": ["accuracy"]},
            "data": {"source": "fashion-mnist", "limit": 30000, "validation_split": 0.3, "seed": 7},
            "fit": {"epochs": epochs, "batch_size": 64},
            "strategy": {"type": "mirrored"},
            "resources": {"workers": 1, "devices_per_worker": 2, "device": "cpu", "memory": "2GiB",
                          "evaluator": evaluator},
            "checkpoint": {"every_epochs": 1, "keep": 100}}

for _ in range(rounds):
    for evaluator in (False, True):
        job = api("/jobs", spec(evaluator))["id"]
        while api(f"/jobs/{job}")["state"] not in ("succeeded", "failed", "cancelled"):
            time.sleep(0.5)
        state = api(f"/jobs/{job}")["state"]
        ms = api(f"/jobs/{job}/metrics?kind=epoch&limit=1000")["metrics"]
        sps = [m["samples_per_sec"] for m in ms if m["epoch"] >= 2]
        ev = api(f"/jobs/{job}/metrics?kind=eval&limit=1000")["metrics"]
        print(json.dumps({"worker_sched": sched, "evaluator": evaluator, "job": job, "state": state,
                          "samples_per_sec": statistics.mean(sps) if sps else 0, "epochs": len(ms),
                          "eval_metrics": len(ev)}), flush=True)
