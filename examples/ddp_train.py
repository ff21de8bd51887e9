#!/usr/bin/env python3
"""ddp_train.py - a small PyTorch DistributedDataParallel job for trainyard's
command jobs (docs/command-jobs.md): a 784-64-10 MLP on a slice of
Fashion-MNIST, gloo backend, one process per task.

trainyard starts it once per worker with MASTER_ADDR, MASTER_PORT, RANK,
WORLD_SIZE and LOCAL_RANK set (init_method "env://"), TRAINYARD_CHECKPOINT_DIR
(a directory whose newest file becomes the job's checkpoint when the task
ends, and which is restored before a retry), and reads the lines it prints as
`trainyard-metric {json}` as the job's metrics (rank 0's).

  python3 examples/ddp_train.py [--steps N] [--batch B] [--lr LR] [--examples N]
                                [--fail-rank R] [--data DIR] [--device cpu|cuda]

--device cuda trains on the GPU of CUDA_VISIBLE_DEVICES (trainyard sets it
to the task's GPUs) with the NCCL backend; cpu (default) uses gloo.

Elastic jobs (resources.workers {"min", "max"}): --batch is the global batch
of TRAINYARD_WORKERS_MAX ranks; at WORLD_SIZE ranks each rank splits its share
into TRAINYARD_ACCUMULATION micro-batches (gradients accumulated under
ddp.no_sync(), the loss scaled to the global mean), so the model is the same
whatever the size. On SIGTERM (a resize, a preemption) every rank finishes
its step, rank 0 saves the checkpoint at that step and all exit: the next
attempt, at its new size, resumes from it.

--fail-rank R makes rank R exit with status 3 at attempt 1, after rank 0 saved
a checkpoint, while the other ranks wait to be stopped (the retry test: attempt 2
resumes from the checkpoint and succeeds).
Without trainyard: MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 WORLD_SIZE=1 RANK=0
python3 examples/ddp_train.py
"""
import argparse
import gzip
import json
import os
import signal
import struct
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

FASHION = "/usr/share/datasets/fashion-mnist"


def metric(**m):
    """One job metric (rank 0 only): trainyard numbers and ships it."""
    if dist.get_rank() == 0:
        print("trainyard-metric " + json.dumps(m), flush=True)


def save(state, path):
    """Whole or not at all: a temporary name starting with '.' (trainyard skips
    those), then rename, so a half-written file is never uploaded."""
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load(n, path=FASHION):
    """The first n training examples: (n, 784) floats in [0, 1], (n,) labels."""
    with gzip.open(os.path.join(path, "train-images-idx3-ubyte.gz")) as f:
        magic, count, rows, cols = struct.unpack(">IIII", f.read(16))
        n = min(n, count)
        x = torch.frombuffer(bytearray(f.read(n * rows * cols)), dtype=torch.uint8)
    with gzip.open(os.path.join(path, "train-labels-idx1-ubyte.gz")) as f:
        f.read(8)
        y = torch.frombuffer(bytearray(f.read(n)), dtype=torch.uint8)
    return x.view(n, rows * cols).float() / 255.0, y.long()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=64, help="global batch, split over the ranks")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--examples", type=int, default=4096)
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--data", default=os.environ.get("FASHION_MNIST_DIR", FASHION),
                   help="the Fashion-MNIST IDX files (default $FASHION_MNIST_DIR or " + FASHION + ")")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    a = p.parse_args()

    torch.manual_seed(0)
    dev = torch.device("cuda", 0) if a.device == "cuda" else torch.device("cpu")
    if a.device == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if a.device == "cuda" else "gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = json.loads(os.environ.get("TRAINYARD_CONFIG", "{}"))
    attempt = cfg.get("attempt", 1)
    print(f"rank {rank} of {world} joined (MASTER {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']},"
          f" LOCAL_RANK {os.environ.get('LOCAL_RANK')}, attempt {attempt})", flush=True)

    x, y = load(a.examples, a.data)
    x, y = x.to(dev), y.to(dev)
    model = nn.Sequential(nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 10)).to(dev)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[0] if a.device == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=a.lr)

    ckdir = os.environ.get("TRAINYARD_CHECKPOINT_DIR", "")
    ckpt = os.path.join(ckdir, "model.pt") if ckdir else ""
    start = 0
    if ckpt and os.path.exists(ckpt):
        state = torch.load(ckpt, map_location=dev)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
        print(f"rank {rank}: resumed from {ckpt} at step {start}", flush=True)

    # SIGTERM: stop after the step every rank is in, with a checkpoint there
    stop = {"asked": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__("asked", True))
    accum = max(1, int(os.environ.get("TRAINYARD_ACCUMULATION", "1")))
    print(f"rank {rank}: {accum} micro-batch(es) per step (global batch {a.batch},"
          f" {os.environ.get('TRAINYARD_WORKERS_MAX', world)} ranks at most)", flush=True)
    mean = torch.tensor(0.0, device=dev)
    t0 = time.time()
    for step in range(start, a.steps):
        # batch `step` of the global order, cut into world x accum micro-batches;
        # this rank's share is rows [b, e) of it
        g = (step * a.batch) % (x.shape[0] - a.batch)
        b, e = g + rank * a.batch // world, g + (rank + 1) * a.batch // world
        opt.zero_grad()
        total = torch.tensor(0.0, device=dev)
        for m in range(accum):
            mb, me = b + m * (e - b) // accum, b + (m + 1) * (e - b) // accum
            # sum over the micro-batch / the global batch, times world: DDP
            # averages over the ranks, so the step's gradient is the global mean
            loss = F.cross_entropy(ddp(x[mb:me]), y[mb:me], reduction="sum") * (world / a.batch)
            if m < accum - 1:
                with ddp.no_sync():
                    loss.backward()
            else:
                loss.backward()
            total += loss.detach() / world
        opt.step()
        mean = total.clone()
        dist.all_reduce(mean)
        flag = torch.tensor(1.0 if stop["asked"] else 0.0, device=dev)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() > 0:
            if rank == 0 and ckpt:
                save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1}, ckpt)
            print(f"rank {rank}: stopped by SIGTERM at step {step + 1} (world {world})", flush=True)
            dist.barrier()
            dist.destroy_process_group()
            sys.exit(0)
        metric(step=step + 1, epoch=0, loss=round(mean.item(), 6),
               samples_per_sec=round((step + 1 - start) * a.batch / (time.time() - t0), 1),
               total_steps=a.steps)
        if a.fail_rank >= 0 and attempt == 1 and step + 1 == a.steps // 2:
            if rank == 0:
                save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1}, ckpt)
                print(f"rank 0: checkpoint saved at step {step + 1}", flush=True)
            dist.barrier()  # the checkpoint is on disk before rank fail_rank fails
            if rank == a.fail_rank:
                print(f"rank {rank}: failing on purpose at step {step + 1} (attempt 1)", flush=True)
                sys.exit(3)
            # the gang has failed: trainyard stops this rank (SIGTERM)
            for _ in range(6000):
                if stop["asked"]:
                    sys.exit(143)
                time.sleep(0.1)
            sys.exit(1)

    with torch.no_grad():
        acc = (model(x).argmax(1) == y).float().mean().item()
    metric(kind="epoch", epoch=1, step=a.steps, loss=round(mean.item(), 6), accuracy=round(acc, 4))
    if rank == 0 and ckpt:
        save({"model": model.state_dict(), "opt": opt.state_dict(), "step": a.steps}, ckpt)
    print(f"rank {rank}: done, {a.steps} steps on {a.device} ({dist.get_backend()}), accuracy {acc:.4f}",
          flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
