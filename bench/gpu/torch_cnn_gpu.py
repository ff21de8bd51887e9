#!/usr/bin/env python3
"""torch_cnn_gpu.py - the PyTorch side of bench/gpu's CNN: the model of
gpu_bench --model cnn in eager mode on one GPU, fp32:

  conv2d 32 3x3 'same' relu -> max_pool 2 -> conv2d 64 3x3 relu ->
  max_pool 2 -> flatten -> dense 128 relu -> dropout 0.3 -> dense 10
  (softmax in the loss; examples/fashion_mnist_cnn.json's model)

Keras' initialisers (glorot_uniform kernels = xavier_uniform_, zero biases),
Adam lr 0.001 betas (0.9, 0.999) eps 1e-7, sparse
categorical cross-entropy. Convolutions through cuDNN with
cudnn.benchmark on (it picks the fastest algorithm for these shapes) and
TF32 off for convolutions and matmuls (fp32, as trainyard's default; cuDNN
would otherwise use TF32 for convolutions). Channels-first, torch's native
layout (trainyard is channels-last; the arithmetic is the same).

The whole training set sits on the GPU and each batch is gathered there
(index_select of a device permutation): PyTorch's fastest eager input path,
so the comparison favours PyTorch (trainyard stages batches from the host).
Epoch 1 is a warm-up; epochs 2..E are timed to torch.cuda.synchronize().

usage: torch_cnn_gpu.py --batch B [--epochs E] [--data DIR] [--seed S]
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
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(f"{d}/{prefix}-labels-idx1-ubyte.gz") as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    return torch.from_numpy(x.astype(np.float32) / 255.0), torch.from_numpy(y.astype(np.int64))


def synthetic(n, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(784, 10, generator=torch.Generator().manual_seed(4242))
    x = torch.rand(n, 784, generator=g)
    return x.reshape(n, 1, 28, 28), ((x - 0.5) @ w).argmax(1)


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
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
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
        torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(64 * 6 * 6, 128), torch.nn.ReLU(), torch.nn.Dropout(0.3),
        torch.nn.Linear(128, 10)).to(dev)
    for mod in model:  # Keras' initialisers: glorot_uniform kernels, zero biases
        if isinstance(mod, (torch.nn.Linear, torch.nn.Conv2d)):
            torch.nn.init.xavier_uniform_(mod.weight)
            torch.nn.init.zeros_(mod.bias)
    opt = torch.optim.Adam(model.parameters(), lr=0.001, betas=(0.9, 0.999), eps=1e-7)
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
    correct = 0
    with torch.no_grad():
        for i in range(0, xte.shape[0], 1000):
            correct += (model(xte[i:i + 1000]).argmax(1) == yte[i:i + 1000]).sum().item()
    print(json.dumps({"impl": "pytorch-eager", "model": "cnn", "torch": torch.__version__,
                      "device": torch.cuda.get_device_name(0), "data": src, "batch": bs,
                      "tf32": 0, "cudnn_benchmark": 1,
                      "epochs_timed": a.epochs - 1, "steps": steps,
                      "samples_per_sec": round(seen / train_s, 1),
                      "train_seconds": round(train_s, 4),
                      "loss": round(loss_sum.item() / max(seen, 1), 5),
                      "test_accuracy": round(correct / xte.shape[0], 5)}))


if __name__ == "__main__":
    main()
