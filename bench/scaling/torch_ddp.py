"""torch_ddp.py - the PyTorch side of bench/scaling: the seed MLP
(784-256 relu dropout 0.4 - 128 relu dropout 0.3 - 10, RMSprop 0.001,
cross-entropy) on Fashion-MNIST as 2 processes x 1 thread, batch 64 each:
  sync:   DistributedDataParallel over gloo (gradients all-reduced every step,
          global batch 128);
  unsync: the same 2 processes, each training its own model alone.
Throughput = the two processes' examples / their training time, summed.

usage: /usr/bin/python3 torch_ddp.py sync|unsync EPOCHS [DATA_DIR]; one JSON line.
"""
import gzip, json, os, socket, struct, sys, time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn


def load(dir_):
    with gzip.open(os.path.join(dir_, "train-images-idx3-ubyte.gz")) as f:
        _, n, r, c = struct.unpack(">IIII", f.read(16))
        x = np.frombuffer(f.read(), dtype=np.uint8).reshape(n, r * c).astype(np.float32) / 255.0
    with gzip.open(os.path.join(dir_, "train-labels-idx1-ubyte.gz")) as f:
        f.read(8)
        y = np.frombuffer(f.read(), dtype=np.uint8).astype(np.int64)
    return torch.from_numpy(x), torch.from_numpy(y)


def run(rank, mode, epochs, dir_, port, q):
    torch.set_num_threads(1)
    torch.manual_seed(1)
    x, y = load(dir_)
    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Dropout(0.4),
                          nn.Linear(256, 128), nn.ReLU(), nn.Dropout(0.3), nn.Linear(128, 10))
    if mode == "sync":
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.RMSprop(model.parameters(), lr=0.001, alpha=0.9, eps=1e-7)
    loss_fn = nn.CrossEntropyLoss()
    n = x.shape[0]
    g = torch.Generator().manual_seed(7)
    seen, t_train = 0, 0.0
    for ep in range(epochs):
        order = torch.randperm(n, generator=g)
        # each process takes its half of every global batch of 128 (sync) or
        # batches of 64 of its own (unsync): 64 rows a step either way
        t0 = time.perf_counter()
        for b in range(0, n - 127, 128):
            idx = order[b + 64 * rank: b + 64 * rank + 64]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            seen += idx.shape[0]
        t_train += time.perf_counter() - t0
    if mode == "sync":
        dist.destroy_process_group()
    q.put((rank, seen / t_train, t_train))


def main():
    mode, epochs = sys.argv[1], int(sys.argv[2])
    dir_ = sys.argv[3] if len(sys.argv) > 3 else "/usr/share/datasets/fashion-mnist"
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=run, args=(r, mode, epochs, dir_, port, q)) for r in range(2)]
    for p in procs:
        p.start()
    res = [q.get() for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode != 0:
            sys.exit(1)
    res.sort()
    print(json.dumps({"mode": mode, "workers": 2, "batch_per_worker": 64,
                      "samples_per_sec": round(sum(r[1] for r in res)),
                      "worker_seconds": [round(r[2], 3) for r in res]}))


if __name__ == "__main__":
    main()
