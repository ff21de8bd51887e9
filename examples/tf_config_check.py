#!/usr/bin/env python3
"""tf_config_check.py - checks, in every task of a trainyard command job, that
the cluster is described as TensorFlow and torch.distributed read it
(docs/command-jobs.md), with no TensorFlow needed:

- TF_CONFIG is exactly {"cluster": {"worker": [...]}, "task": {"type": "worker",
  "index": i}} (plus "ps" when the job has parameter servers; no "chief" job:
  worker 0 is the chief, as TensorFlow's multi_worker_util.is_chief and
  Kubeflow's TFJob have it), each address "host:port";
- its own index is RANK, the worker list has WORLD_SIZE entries, worker 0 is
  MASTER_ADDR:MASTER_PORT, and its own port can be bound (it is free for it);
- LOCAL_RANK is 0 of LOCAL_WORLD_SIZE 1 (one process per task, its own devices);
- TRAINYARD_CONFIG, TRAINYARD_CHECKPOINT_DIR and CUDA_VISIBLE_DEVICES are set.

Prints "TF_CONFIG ok: task worker I of N" and exits 0, or names what is wrong
and exits 1.
"""
import json
import os
import socket
import sys


def fail(msg):
    print(f"TF_CONFIG check failed: {msg}", flush=True)
    sys.exit(1)


def check_addr(a, where):
    if not isinstance(a, str) or a.count(":") < 1:
        fail(f"{where} is not a 'host:port' string: {a!r}")
    host, port = a.rsplit(":", 1)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        fail(f"{where} is not a 'host:port' string: {a!r}")
    return host, int(port)


def main():
    raw = os.environ.get("TF_CONFIG")
    if raw is None:
        fail("TF_CONFIG is not set")
    tf = json.loads(raw)
    if not isinstance(tf, dict) or set(tf) != {"cluster", "task"}:
        fail(f"top-level keys are {sorted(tf) if isinstance(tf, dict) else type(tf)}, want cluster and task")
    cluster, task = tf["cluster"], tf["task"]
    if not isinstance(cluster, dict) or "worker" not in cluster or not set(cluster) <= {"worker", "ps"}:
        fail(f"cluster has jobs {sorted(cluster)}, want worker (and ps only with parameter servers)")
    for job, addrs in cluster.items():
        if not isinstance(addrs, list) or not addrs:
            fail(f"cluster.{job} is not a non-empty list")
        for i, a in enumerate(addrs):
            check_addr(a, f"cluster.{job}[{i}]")
    if not isinstance(task, dict) or set(task) != {"type", "index"}:
        fail(f"task has keys {sorted(task) if isinstance(task, dict) else type(task)}, want type and index")
    if task["type"] != "worker" or type(task["index"]) is not int:
        fail(f"task is {task}, want type 'worker' and an integer index")

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if task["index"] != rank:
        fail(f"task.index {task['index']} is not RANK {rank}")
    if len(cluster["worker"]) != world:
        fail(f"{len(cluster['worker'])} workers in TF_CONFIG but WORLD_SIZE is {world}")
    if len(set(cluster["worker"])) != world:
        fail(f"two workers share an address: {cluster['worker']}")
    master = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    if cluster["worker"][0] != master:
        fail(f"worker 0 is {cluster['worker'][0]} but MASTER_ADDR:MASTER_PORT is {master}")
    if os.environ.get("LOCAL_RANK") != "0" or os.environ.get("LOCAL_WORLD_SIZE") != "1":
        fail("LOCAL_RANK/LOCAL_WORLD_SIZE are not 0/1 (one process per task, its own devices)")

    host, port = check_addr(cluster["worker"][rank], "my address")
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind
    try:
        s.bind(("", port))  # the port announced for this task is free for it
    except OSError as e:
        fail(f"cannot bind my port {port}: {e}")
    finally:
        s.close()

    ty = json.loads(os.environ["TRAINYARD_CONFIG"])
    for k in ("job", "attempt", "task", "api", "token", "checkpoint_dir", "node_local"):
        if k not in ty:
            fail(f"TRAINYARD_CONFIG lacks {k}")
    if ty["task"] != task or ty["checkpoint_dir"] != os.environ["TRAINYARD_CHECKPOINT_DIR"]:
        fail("TRAINYARD_CONFIG disagrees with TF_CONFIG or TRAINYARD_CHECKPOINT_DIR")
    nl = ty["node_local"]
    if not 0 <= nl["index"] < nl["count"] <= world:
        fail(f"TRAINYARD_CONFIG node_local {nl} is not an index among the node's workers")
    if not os.access(ty["checkpoint_dir"], os.W_OK):
        fail("the checkpoint directory is not writable")
    if "CUDA_VISIBLE_DEVICES" not in os.environ:
        fail("CUDA_VISIBLE_DEVICES is not set")
    print(f"TF_CONFIG ok: task worker {rank} of {world}, {cluster['worker'][rank]}, "
          f"chief {cluster['worker'][0]}, CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r}",
          flush=True)
    if rank == 0:
        print("trainyard-metric " + json.dumps({"step": 1, "tf_config_ok": True, "workers": world}),
              flush=True)


if __name__ == "__main__":
    main()
