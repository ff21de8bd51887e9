#!/usr/bin/env python3
"""torch_mlp_gpu.py - the PyTorch side of bench/gpu: the seed MLP
(784-256 relu-dropout 0.4-128 relu-dropout 0.3-10, softmax cross-entropy,
RMSprop lr 0.001 with Keras' rho 0.9 / eps 1e-7, Keras' initialisers) in
eager mode on one GPU, fp32 (TF32 off, PyTorch's default for matmuls).

The whole training set sits on the GPU and each batch is gathered there
(index_select of a device permutation): PyTorch's fastest eager input path,
so the comparison favours PyTorch (trainyard stages batches from the host).
Epoch 1 is a warm-up; epochs 2..E are timed to torch.cuda.synchronize().

usage: torch_mlp_gpu.py --batch B [--epochs E] [--data DIR] [--seed S]
prints one JSON line."""
import argparse
import gzip
import json
import os
import time

import numpy as np
import torch


def load(d, prefix):
    with gzip.open(f"{d}/{prefix}-images-idx3-ubyte.gz") as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)
    with gzip.open(f"{d}/{prefix}-labels-idx1-ubyte.gz") as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    return torch.from_numpy(x.astype(np.float32) / 255.0), torch.from_numpy(y.astype(np.int64))


def synthetic(n, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(784, 10, generator=torch.Generator().manual_seed(4242))
    x = torch.rand(n, 784, generator=g)
    return x, ((x - 0.5) @ w).argmax(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "torch.cuda.is_available() is False"}))
        return
    dev = torch.device("cuda")
    torch.manual_seed(a.seed)
    if os.path.exists(f"{a.data}/train-images-idx3-ubyte.gz"):
        src = "fashion-mnist"
        xtr, ytr = load(a.data, "train")
        xte, yte = load(a.data, "t10k")
    else:
        src = "synthetic"
        xtr, ytr = synthetic(60000, a.seed)
        xte, yte = synthetic(10000, a.seed + 1)
    xtr, ytr, xte, yte = xtr.to(dev), ytr.to(dev), xte.to(dev), yte.to(dev)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Dropout(0.4),
        torch.nn.Linear(256, 128), torch.nn.ReLU(), torch.nn.Dropout(0.3),
        torch.nn.Linear(128, 10)).to(dev)
    for mod in model:  # Keras' initialisers: glorot_uniform kernels, zero biases
        if isinstance(mod, torch.nn.Linear):
            torch.nn.init.xavier_uniform_(mod.weight)
            torch.nn.init.zeros_(mod.bias)
    opt = torch.optim.RMSprop(model.parameters(), lr=0.001, alpha=0.9, eps=1e-7)
    lossf = torch.nn.CrossEntropyLoss()
    n, bs = xtr.shape[0], a.batch
    t0, seen, steps = 0.0, 0, 0
    loss_sum = torch.zeros((), device=dev)
    for e in range(a.epochs):
        if e == 1:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss_sum.zero_()
        model.train()
        perm = torch.randperm(n, device=dev)
        for i in range(0, n, bs):
            idx = perm[i:i + bs]
            xb, yb = xtr.index_select(0, idx), ytr.index_select(0, idx)
            opt.zero_grad(set_to_none=True)
            loss = lossf(model(xb), yb)
            loss.backward()
            opt.step()
            loss_sum += loss.detach() * idx.numel()
            steps += 1
            if e > 0:
                seen += idx.numel()
    torch.cuda.synchronize()
    train_s = time.perf_counter() - t0
    model.eval()
    with torch.no_grad():
        acc = (model(xte).argmax(1) == yte).float().mean().item()
    print(json.dumps({"impl": "pytorch-eager", "torch": torch.__version__,
                      "device": torch.cuda.get_device_name(0), "data": src, "batch": bs,
                      "tf32": int(torch.backends.cuda.matmul.allow_tf32),
                      "epochs_timed": a.epochs - 1, "steps": steps,
                      "samples_per_sec": round(seen / train_s, 1),
                      "train_seconds": round(train_s, 4),
                      "loss": round(loss_sum.item() / max(seen, 1), 5),
                      "test_accuracy": round(acc, 5)}))


if __name__ == "__main__":
    main()
