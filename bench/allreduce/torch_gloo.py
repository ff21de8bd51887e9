"""torch_gloo.py - torch.distributed's all_reduce (gloo backend, float32 sum,
in place) between N local processes, timed exactly as comm_bench times ours:
per size 3 + 5 warm-up calls (the last 5 size the repetitions: about
--rep-ms each, rank 0's count broadcast), REPS repetitions between
barriers, the median time per call.

    /usr/bin/python3 torch_gloo.py [--ranks 2] [--reps 7] [--rep-ms 150] BYTES...

Prints one JSON object per size from rank 0 (gbps: algorithm bandwidth,
bytes / time per all-reduce). One intra-op thread per process.
"""
import argparse
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, args, port):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    maxn = max(args.bytes) // 4
    buf = (torch.arange(maxn, dtype=torch.float32) % 97) * 1e-3
    for nbytes in args.bytes:
        t = buf[: nbytes // 4]
        for _ in range(3):
            dist.all_reduce(t)
        t0 = time.perf_counter()
        for _ in range(5):
            dist.all_reduce(t)
        per = (time.perf_counter() - t0) / 5
        k = torch.tensor([min(100000, max(3, int(args.rep_ms / 1000.0 / per)))], dtype=torch.int64)
        dist.broadcast(k, 0)
        k = int(k.item())
        times = []
        for _ in range(args.reps):
            dist.barrier()
            a = time.perf_counter()
            for _ in range(k):
                dist.all_reduce(t)
            dist.barrier()
            times.append((time.perf_counter() - a) / k)
        med = statistics.median(times)
        if rank == 0:
            print(json.dumps({"impl": "gloo", "torch": torch.__version__, "ranks": args.ranks,
                              "bytes": t.numel() * 4, "iters": k, "us": round(med * 1e6, 2),
                              "us_min": round(min(times) * 1e6, 2),
                              "gbps": round(t.numel() * 4 / med / 1e9, 3)}), flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--rep-ms", type=int, default=150)
    ap.add_argument("bytes", type=int, nargs="+")
    args = ap.parse_args()
    mp.spawn(worker, args=(args, free_port()), nprocs=args.ranks, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
