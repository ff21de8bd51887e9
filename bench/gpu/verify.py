#!/usr/bin/env python3
"""verify.py - the steps of bench/gpu/verify.sh (which sets the library
paths and calls this): the device, the GPU tests, the benchmark, then
`trainyard up` from the bundle and GPU jobs through its API. Standard
library only (the GPU machine has python3 with PyTorch; no jq or curl
needed). Prints each step as it goes, and last one JSON object."""
import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

T0 = time.time()


def left(budget):
    return budget - (time.time() - T0)


def say(msg):
    print(f"verify [{time.time() - T0:5.0f} s] {msg}", flush=True)


def run(cmd, timeout, env=None, cwd=None):
    """(exit code or None on timeout, output)"""
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=max(timeout, 1),
                           env=env, cwd=cwd, text=True, errors="replace")
        return p.returncode, p.stdout
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode("utf-8", "replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return None, out
    except OSError as e:
        return 127, str(e)


def device_facts():
    d = {"gpus": 0}
    code, out = run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap",
                     "--format=csv,noheader"], 30)
    if code == 0:
        rows = [r.strip() for r in out.strip().splitlines() if r.strip()]
        d["gpus"] = len(rows)
        d["devices"] = rows
    else:
        d["nvidia_smi"] = "not found" if code == 127 else f"failed: {out.strip()[:200]}"
    code, out = run([sys.executable, "-c", "import torch, json; print(json.dumps({'torch': torch.__version__, "
                     "'cuda': torch.version.cuda, 'available': torch.cuda.is_available(), "
                     "'count': torch.cuda.device_count()}))"], 60)
    if code == 0:
        try:
            d["pytorch"] = json.loads(out.strip().splitlines()[-1])
        except ValueError:
            d["pytorch"] = out.strip()[-200:]
    else:
        d["pytorch"] = "not importable"
    d["host"] = socket.gethostname()
    return d


def check_binary(path, budget, no_gpu_reason, out_dir):
    """A check-framework binary: its summary, or skipped; its whole output in OUT/NAME.log."""
    # check_gpu_train runs the worker binary: the bundle's own
    env = dict(os.environ, CK_DEFAULT_TIMEOUT="300", TRAINYARD_BIN=os.path.abspath("bin/trainyard"))
    code, out = run([path], max(30, min(300, left(budget) - 200)), env=env)
    open(os.path.join(out_dir, os.path.basename(path) + ".log"), "w").write(out)
    m = re.search(r"(\d+)%: Checks: (\d+), Failures: (\d+), Errors: (\d+)", out)
    r = {"exit": code, "tail": out.strip().splitlines()[-6:]}
    if m:
        r.update(checks=int(m.group(2)), failures=int(m.group(3)), errors=int(m.group(4)))
    skips = len(re.findall(r"SKIP", out))
    if skips:
        r["skipped_cases"] = skips
    # check_gpu's per-case lines: "  CASE  params n=N max|d|=X at I (gpu G cpu C) over_tol=K"
    diffs = {}
    for l in out.splitlines():
        m2 = re.match(r"\s+(\S+)\s+(\S+)\s+n=\d+ max\|d\|=(\S+)", l)
        if m2:
            key = f"{m2.group(1)} {m2.group(2)}"
            diffs[key] = max(diffs.get(key, 0.0), float(m2.group(3)))
    r["largest_differences"] = diffs
    r["ok"] = code == 0
    if code is None:
        r["error"] = "timed out"
    if no_gpu_reason and skips:
        r["skipped"] = no_gpu_reason
    return r


class Api:
    def __init__(self, url, token):
        self.url, self.token = url.rstrip("/"), token

    def call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + "/api/v1" + path, data=data, method=method)
        req.add_header("Authorization", "Bearer " + self.token)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                text = r.read().decode()
                return r.status, (json.loads(text) if text.strip().startswith(("{", "[")) else text)
        except urllib.error.HTTPError as e:
            text = e.read().decode()
            try:
                return e.code, json.loads(text)
            except ValueError:
                return e.code, text

    def job(self, jid):
        return self.call("GET", f"/jobs/{jid}")[1]

    def wait(self, jid, want, timeout):
        end = time.time() + timeout
        while True:
            j = self.job(jid)
            st = j.get("state") if isinstance(j, dict) else None
            if st in want or st in ("succeeded", "failed", "cancelled") or time.time() > end:
                return j
            time.sleep(0.5)


def metrics(api, jid):
    st, m = api.call("GET", f"/jobs/{jid}/metrics?since=0&limit=1000")
    return m.get("metrics", []) if isinstance(m, dict) else []


def rfc3339(s):
    try:
        return time.mktime(time.strptime(s[:19], "%Y-%m-%dT%H:%M:%S")) + float("0" + s[19:].rstrip("Z"))
    except (ValueError, TypeError):
        return None


def job_figures(api, jid, submitted_at):
    j = api.job(jid)
    r = {"id": jid, "state": j.get("state"), "attempt": j.get("attempt"), "reason": (j.get("reason") or "")[:300]}
    prog = j.get("progress") or {}
    test = prog.get("test") or {}
    if "test_accuracy" in test:
        r["test_accuracy"] = test["test_accuracy"]
    ms = metrics(api, jid)
    sps = [m["samples_per_sec"] for m in ms if isinstance(m.get("samples_per_sec"), (int, float))]
    if sps:
        r["samples_per_sec"] = sps[-1]
    steps = [m for m in ms if m.get("kind") == "step" or ("step" in m and "loss" in m)]
    if steps and steps[0].get("time"):
        t = rfc3339(steps[0]["time"])
        if t is not None:
            # the server writes UTC; mktime took it as local time
            r["submit_to_first_step_s"] = round(t - time.timezone - submitted_at, 3)
    acc = [m.get("accuracy") for m in ms if m.get("kind") == "epoch" and m.get("accuracy") is not None]
    if "test_accuracy" not in r and acc:
        r["accuracy"] = acc[-1]
    return r


DEVICE = "gpu"


def children(pid):
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = open(f"/proc/{d}/stat").read()
            if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
                out.append(int(d))
        except (OSError, ValueError):
            pass
    return out


def workers_of(up_pid):
    """The `trainyard worker` processes of this `up`'s agent (not of any other
    service on the machine)."""
    found = []
    for agent in children(up_pid):
        for w in children(agent):
            try:
                if open(f"/proc/{w}/cmdline", "rb").read().split(b"\0")[1:2] == [b"worker"]:
                    found.append(w)
            except (OSError, IndexError):
                pass
    return found


def seed_mlp(name, data, epochs, strategy=None, workers=1, devices=1, every=1):
    spec = json.load(open("examples/fashion_mnist_mlp.json"))
    spec["name"] = name
    spec["data"] = dict(spec.get("data", {}), source="fashion-mnist", path=data)
    spec["data"].pop("limit", None)
    spec["fit"] = dict(spec.get("fit", {}), epochs=epochs)
    spec["resources"] = {"workers": workers, "devices_per_worker": devices, "device": DEVICE}
    spec["checkpoint"] = {"every_epochs": every, "keep": 2}
    spec["max_restarts"] = 2
    if strategy:
        spec["strategy"] = {"type": strategy}
    return spec


def submit(api, spec):
    t = time.time()
    st, j = api.call("POST", "/jobs", spec)
    if st != 201:
        return None, t, f"submit answered {st}: {json.dumps(j)[:300]}"
    return j["id"], t, None


def up_and_jobs(bundle, out, budget, n_gpu_smi):
    r = {}
    data_dir = os.path.join(out, "service")
    subprocess.run(["rm", "-rf", data_dir])
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    log = open(os.path.join(out, "up.log"), "w")
    up = subprocess.Popen(["bin/trainyard", "up", "--listen", f"127.0.0.1:{port}", "--data", data_dir,
                           "--data-root", bundle, "--cpu-slots", "4", "--worker-sched", "normal",
                           "--worker-nice", "0", "--isolation", os.environ.get("VERIFY_ISOLATION", "auto")],
                          stdout=log, stderr=subprocess.STDOUT)
    try:
        url = None
        for _ in range(300):
            try:
                url = open(os.path.join(data_dir, "server.url")).read().strip()
                break
            except OSError:
                if up.poll() is not None:
                    break
                time.sleep(0.1)
        if not url:
            r["up"] = {"ok": False, "error": "trainyard up did not start: see " + log.name}
            return r
        api = Api(url, open(os.path.join(data_dir, "token")).read().strip())
        cl = {}
        for _ in range(100):
            st, cl = api.call("GET", "/cluster")
            if isinstance(cl, dict) and cl.get("nodes"):
                break
            time.sleep(0.2)
        nodes = cl.get("nodes", []) if isinstance(cl, dict) else []
        gpus = int((cl.get("utilisation") or {}).get("gpus", 0)) if isinstance(cl, dict) else 0
        r["up"] = {"ok": bool(nodes), "url": url, "nodes": len(nodes), "gpus_reported": gpus,
                   "isolation": nodes[0].get("isolation") if nodes else None,
                   "memory_mb": nodes[0].get("memory_mb") if nodes else None}
        say(f"up: {len(nodes)} node(s), {gpus} GPU(s) reported by the agent")
        data = "data" if os.path.exists(os.path.join(bundle, "data", "train-images-idx3-ubyte.gz")) else ""
        if DEVICE == "cpu":
            gpus = 2  # the rehearsal: the same jobs on 2 CPU slots each way
            r["rehearsal"] = "VERIFY_REHEARSE=1: the GPU jobs' flows on CPU slots (device cpu, gloo)"
        elif gpus == 0:
            why = ("the agent found no GPU (nvidia-smi lists %d; a binary without CUDA, or no driver)" % n_gpu_smi
                   if n_gpu_smi else "no GPU on this machine")
            for k in ("default_1gpu", "accumulation_1gpu", "mirrored_all_gpus", "multi_worker_mirrored_2gpus", "ddp_nccl_command",
                      "cancel", "sigkill_resume"):
                r[k] = {"skipped": why}
            return r

        def one(key, spec, timeout):
            if left(budget) < 40:
                r[key] = {"skipped": "out of time (VERIFY_BUDGET_S)"}
                return None
            jid, t, err = submit(api, spec)
            if err:
                r[key] = {"ok": False, "error": err}
                return None
            api.wait(jid, (), min(timeout, left(budget) - 30))
            r[key] = job_figures(api, jid, t)
            r[key]["ok"] = r[key]["state"] == "succeeded"
            say(f"{key}: {r[key]['state']} {json.dumps({k: v for k, v in r[key].items() if k != 'reason'})}")
            return jid

        if not data:
            r["data"] = "no Fashion-MNIST in the bundle: the jobs below cannot run"
        one("default_1gpu", seed_mlp("gpu-default", data, 3), 180)
        # the same job in 2 micro-batches a step: the same sums, so the same model
        acc = seed_mlp("gpu-accumulate", data, 3)
        acc["fit"]["gradient_accumulation_steps"] = 2
        one("accumulation_1gpu", acc, 180)
        a_acc, d_acc = (r.get(k, {}).get("test_accuracy") for k in ("accumulation_1gpu", "default_1gpu"))
        if "ok" in r.get("accumulation_1gpu", {}):
            r["accumulation_1gpu"]["default_test_accuracy"] = d_acc
            r["accumulation_1gpu"]["ok"] = (r["accumulation_1gpu"]["ok"] and a_acc is not None and d_acc is not None
                                            and abs(a_acc - d_acc) <= 0.01)
        one("mirrored_all_gpus", dict(seed_mlp("gpu-mirrored", data, 3, devices=gpus), strategy={
            "type": "mirrored"}), 180)
        if gpus >= 2:
            one("multi_worker_mirrored_2gpus", seed_mlp("gpu-mwm", data, 3, "multi_worker_mirrored", workers=2),
                180)
        else:
            r["multi_worker_mirrored_2gpus"] = {"skipped": f"the machine has {gpus} GPU (2 needed)"}
        ddp = json.load(open("examples/ddp_train.json"))
        ddp["name"] = "gpu-ddp-nccl"
        ddp["command"]["argv"][0] = sys.executable  # the python3 that has PyTorch here
        ddp["command"]["argv"] += ["--device", "cuda" if DEVICE == "gpu" else "cpu", "--data",
                                   os.path.join(bundle, "data")]
        w = 2 if gpus >= 2 else 1
        ddp["resources"] = {"workers": w, "device": DEVICE}
        jid = one("ddp_nccl_command", ddp, 240)
        if jid:
            st, ck = api.call("GET", f"/jobs/{jid}/checkpoints")
            r["ddp_nccl_command"]["checkpoints"] = len(ck.get("checkpoints", [])) if isinstance(ck, dict) else 0
            st, logtext = api.call("GET", f"/jobs/{jid}/logs?task=worker-0")
            r["ddp_nccl_command"]["backend"] = ("nccl" if isinstance(logtext, str) and "(nccl)" in logtext else
                                                "gloo" if isinstance(logtext, str) and "(gloo)" in logtext else None)
            r["ddp_nccl_command"]["ok"] = r["ddp_nccl_command"]["ok"] and r["ddp_nccl_command"]["backend"] == (
                "nccl" if DEVICE == "gpu" else "gloo") and r["ddp_nccl_command"]["checkpoints"] > 0
            r["ddp_nccl_command"]["metrics"] = len(metrics(api, jid))
            r["ddp_nccl_command"]["workers"] = w
        # cancel: a long job, cancelled once running
        if left(budget) > 60:
            jid, t, err = submit(api, seed_mlp("gpu-cancel", data, 200))
            if err:
                r["cancel"] = {"ok": False, "error": err}
            else:
                api.wait(jid, ("running",), 60)
                c0 = time.time()
                st, _ = api.call("POST", f"/jobs/{jid}/cancel")
                j = api.wait(jid, (), 60)
                r["cancel"] = {"ok": j.get("state") == "cancelled", "state": j.get("state"), "status": st,
                               "seconds_to_cancelled": round(time.time() - c0, 2)}
        else:
            r["cancel"] = {"skipped": "out of time (VERIFY_BUDGET_S)"}
        # a worker killed with SIGKILL resumes from its checkpoint on the GPU
        if left(budget) > 90:
            # long enough on a GPU (about 650k samples/s) for the kill to find the worker
            jid, t, err = submit(api, seed_mlp("gpu-kill", data, 12 if DEVICE == "cpu" else 300,
                                               every=1 if DEVICE == "cpu" else 10))
            if err:
                r["sigkill_resume"] = {"ok": False, "error": err}
            else:
                killed = None
                end = time.time() + 120
                while time.time() < end and killed is None:
                    st, ck = api.call("GET", f"/jobs/{jid}/checkpoints")
                    if isinstance(ck, dict) and ck.get("checkpoints"):
                        for p in workers_of(up.pid):
                            try:
                                os.kill(p, signal.SIGKILL)
                                killed = p
                            except OSError:
                                pass
                    time.sleep(0.3)
                api.wait(jid, (), min(240, left(budget) - 20))
                f = job_figures(api, jid, t)
                st, ev = api.call("GET", f"/jobs/{jid}/events")
                f["killed_pid"] = killed
                f["ok"] = f["state"] == "succeeded" and (f.get("attempt") or 0) >= 2 and killed is not None
                st, lg = api.call("GET", f"/jobs/{jid}/logs?task=worker-0")
                f["resumed"] = isinstance(lg, str) and "resum" in lg
                r["sigkill_resume"] = f
        else:
            r["sigkill_resume"] = {"skipped": "out of time (VERIFY_BUDGET_S)"}
        return r
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(30)
        except subprocess.TimeoutExpired:
            up.kill()
        log.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=540)
    a = ap.parse_args()
    global DEVICE
    if os.environ.get("VERIFY_REHEARSE") == "1":
        DEVICE = "cpu"
    os.chdir(a.bundle)
    res = {"verify": "gpu", "bundle": a.bundle,
           "version": open("VERSION").read().strip() if os.path.exists("VERSION") else "unknown"}
    dev = device_facts()
    res["device"] = dev
    say(f"device: {json.dumps(dev)}")
    no_gpu = None if dev.get("gpus") else "no GPU on this machine (nvidia-smi: %s)" % dev.get("nvidia_smi", "none")
    say("check_gpu ...")
    res["check_gpu"] = check_binary("bin/check_gpu", a.budget, no_gpu, a.out)
    say("check_gpu_train ...")
    res["check_gpu_train"] = check_binary("bin/check_gpu_train", a.budget, no_gpu, a.out)
    if no_gpu:
        res["bench"] = {"skipped": no_gpu}
    elif left(a.budget) > 300:
        say("bench/gpu/run.sh ...")
        env = dict(os.environ, ROUNDS=os.environ.get("ROUNDS", "1"), EPOCHS=os.environ.get("EPOCHS", "3"))
        code, out = run(["bench/gpu/run.sh", a.bundle], min(240, left(a.budget) - 150), env=env)
        last = [l for l in out.strip().splitlines() if l.startswith("{")]
        try:
            res["bench"] = json.loads(last[-1]) if last else {"ok": False, "exit": code, "tail": out[-500:]}
        except ValueError:
            res["bench"] = {"ok": False, "exit": code, "tail": out[-500:]}
        open(os.path.join(a.out, "bench.log"), "w").write(out)
    else:
        res["bench"] = {"skipped": "out of time (VERIFY_BUDGET_S)"}
    say("trainyard up and jobs ...")
    res.update(up_and_jobs(a.bundle, a.out, a.budget, dev.get("gpus", 0)))
    ran = {k: v for k, v in res.items() if isinstance(v, dict) and "ok" in v}
    res["failed"] = sorted(k for k, v in ran.items() if not v["ok"])
    res["skipped"] = sorted(k for k, v in res.items() if isinstance(v, dict) and "skipped" in v)
    res["seconds"] = round(time.time() - T0, 1)
    text = json.dumps(res)
    open(os.path.join(a.out, "verify.json"), "w").write(text + "\n")
    print(text, flush=True)
    return 1 if res["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
