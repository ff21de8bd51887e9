#!/usr/bin/python3
"""torch_mlp.py - the PyTorch side of bench/train_vs_pytorch: the seed MLP
(784-256 relu-dropout0.4-128 relu-dropout0.3-10, softmax cross-entropy,
RMSprop lr 0.001 with Keras' rho 0.9 / epsilon 1e-7, batch 128) on
Fashion-MNIST, one thread, shuffled each epoch like the engine.

usage: torch_mlp.py EPOCHS SEED [DATA_DIR]; prints one JSON line with
samples_per_sec (training steps only, as the engine measures) and the test
accuracy."""
import gzip
import json
import sys
import time

import numpy as np
import torch


def load(d, prefix):
    with gzip.open(f"{d}/{prefix}-images-idx3-ubyte.gz") as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)
    with gzip.open(f"{d}/{prefix}-labels-idx1-ubyte.gz") as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    return torch.from_numpy(x.astype(np.float32) / 255.0), torch.from_numpy(y.astype(np.int64))


def main():
    epochs, seed = int(sys.argv[1]), int(sys.argv[2])
    d = sys.argv[3] if len(sys.argv) > 3 else "/usr/share/datasets/fashion-mnist"
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    xtr, ytr = load(d, "train")
    xte, yte = load(d, "t10k")
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Dropout(0.4),
        torch.nn.Linear(256, 128), torch.nn.ReLU(), torch.nn.Dropout(0.3),
        torch.nn.Linear(128, 10))
    for mod in model:  # Keras' initialisers: glorot_uniform kernels, zero biases
        if isinstance(mod, torch.nn.Linear):
            torch.nn.init.xavier_uniform_(mod.weight)
            torch.nn.init.zeros_(mod.bias)
    opt = torch.optim.RMSprop(model.parameters(), lr=0.001, alpha=0.9, eps=1e-7)
    lossf = torch.nn.CrossEntropyLoss()
    n, bs = xtr.shape[0], 128
    train_time, seen = 0.0, 0
    for _ in range(epochs):
        model.train()
        perm = torch.randperm(n)
        t0 = time.perf_counter()
        for i in range(0, n, bs):
            idx = perm[i:i + bs]
            xb, yb = xtr[idx], ytr[idx]
            opt.zero_grad()
            loss = lossf(model(xb), yb)
            loss.backward()
            opt.step()
        train_time += time.perf_counter() - t0
        seen += n
    model.eval()
    with torch.no_grad():
        acc = (model(xte).argmax(1) == yte).float().mean().item()
    print(json.dumps({"epochs": epochs, "samples_per_sec": round(seen / train_time, 1),
                      "test_accuracy": round(acc, 6)}))


if __name__ == "__main__":
    main()
