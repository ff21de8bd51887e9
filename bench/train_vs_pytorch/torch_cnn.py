#!/usr/bin/python3
"""torch_cnn.py - the PyTorch side of bench/train_vs_pytorch/cnn.sh: the
model of examples/fashion_mnist_cnn.json (the Keras tutorial CNN) in PyTorch
eager mode, one thread:

  conv2d 32 3x3 'same' relu -> max_pool 2 -> conv2d 64 3x3 relu ->
  max_pool 2 -> flatten -> dense 128 relu -> dropout 0.3 -> dense 10
  (softmax in the loss)

Keras' initialisers (glorot_uniform kernels = xavier_uniform_, zero biases),
Adam lr 0.001 betas (0.9, 0.999) eps 1e-7, sparse categorical
cross-entropy, batch 128 (--batch), shuffled each epoch. Channels-first
(torch's native layout); the engine is channels-last, which only permutes the
first dense layer's rows.

Data as the engine's validation_split 0.1: the first 54000 training images
train, the last 6000 are evaluated after each epoch (not timed, as the
engine), the 10k test split is evaluated at the end. Evaluation runs in
batches of 128, as the engine's model_evaluate does.

usage: torch_cnn.py EPOCHS SEED [DATA_DIR] [--limit N] [--profile STEPS]
                    [--batch B] [--dropout R] [--validation-split F]
  --limit N        at most N training and N test examples (as trainyard's --limit)
  --profile STEPS  after the run, profile STEPS more training steps with
                   torch.autograd.profiler and print the top ops by self CPU
                   time to stderr (not part of the timing)
Prints one JSON line with samples_per_sec (training steps only, as the
engine measures: batch gather + forward + backward + update) and test
accuracy."""
import argparse
import gzip
import json
import sys
import time

import numpy as np
import torch

VALIDATION_SPLIT = 0.1
BATCH = 128  # --batch changes it (the accuracy run takes the example's)
DROPOUT = 0.3


def load(d, prefix):
    with gzip.open(f"{d}/{prefix}-images-idx3-ubyte.gz") as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(f"{d}/{prefix}-labels-idx1-ubyte.gz") as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    return torch.from_numpy(x.astype(np.float32) / 255.0), torch.from_numpy(y.astype(np.int64))


def make_model():
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(64 * 6 * 6, 128), torch.nn.ReLU(), torch.nn.Dropout(DROPOUT),
        torch.nn.Linear(128, 10))
    for mod in model:  # Keras' initialisers: glorot_uniform kernels, zero biases
        if isinstance(mod, (torch.nn.Linear, torch.nn.Conv2d)):
            torch.nn.init.xavier_uniform_(mod.weight)
            torch.nn.init.zeros_(mod.bias)
    return model


def evaluate(model, lossf, x, y):
    model.eval()
    loss, correct = 0.0, 0
    with torch.no_grad():
        for i in range(0, x.shape[0], BATCH):
            out = model(x[i:i + BATCH])
            loss += lossf(out, y[i:i + BATCH]).item() * out.shape[0]
            correct += (out.argmax(1) == y[i:i + BATCH]).sum().item()
    n = max(x.shape[0], 1)
    return loss / n, correct / n


def main():
    global BATCH, DROPOUT, VALIDATION_SPLIT
    ap = argparse.ArgumentParser()
    ap.add_argument("epochs", type=int)
    ap.add_argument("seed", type=int)
    ap.add_argument("data", nargs="?", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--profile", type=int, default=0)
    ap.add_argument("--batch", type=int, default=BATCH)
    ap.add_argument("--dropout", type=float, default=DROPOUT)
    ap.add_argument("--validation-split", type=float, default=VALIDATION_SPLIT)
    a = ap.parse_args()
    BATCH, DROPOUT, VALIDATION_SPLIT = a.batch, a.dropout, a.validation_split
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    torch.manual_seed(a.seed)
    x, y = load(a.data, "train")
    xte, yte = load(a.data, "t10k")
    if a.limit > 0:
        x, y, xte, yte = x[:a.limit], y[:a.limit], xte[:a.limit], yte[:a.limit]
    keep = int(x.shape[0] * (1.0 - VALIDATION_SPLIT) + 1e-9)  # Keras: the last 10% validate
    xtr, ytr, xva, yva = x[:keep], y[:keep], x[keep:], y[keep:]
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.001, betas=(0.9, 0.999), eps=1e-7)
    lossf = torch.nn.CrossEntropyLoss()
    n = xtr.shape[0]
    train_time, seen = 0.0, 0

    def step(idx):
        xb, yb = xtr[idx], ytr[idx]
        opt.zero_grad()
        out = model(xb)
        loss = lossf(out, yb)
        loss.backward()
        opt.step()
        return loss.detach() * yb.shape[0], (out.detach().argmax(1) == yb).sum()

    for ep in range(a.epochs):
        model.train()
        perm = torch.randperm(n)
        lsum, correct = torch.zeros(()), torch.zeros((), dtype=torch.int64)
        t0 = time.perf_counter()
        for i in range(0, n, BATCH):
            l, c = step(perm[i:i + BATCH])
            lsum += l
            correct += c
        secs = time.perf_counter() - t0
        train_time += secs
        seen += n
        vl, va = evaluate(model, lossf, xva, yva)
        print(f"epoch {ep + 1}/{a.epochs} - {secs:.2f}s - loss: {lsum.item() / n:.4f} - "
              f"accuracy: {correct.item() / n:.4f} - val_loss: {vl:.4f} - val_accuracy: {va:.4f} - "
              f"{n / secs:.0f} samples/s", flush=True)
    tl, ta = evaluate(model, lossf, xte, yte)
    print(json.dumps({"epochs": a.epochs, "train_examples": n,
                      "samples_per_sec": round(seen / train_time, 1) if train_time > 0 else 0.0,
                      "test_loss": round(tl, 6), "test_accuracy": round(ta, 6)}), flush=True)

    if a.profile > 0:
        model.train()
        perm = torch.randperm(n)
        for i in range(3):  # warm
            step(perm[i * BATCH:(i + 1) * BATCH])
        with torch.autograd.profiler.profile() as prof:
            for i in range(a.profile):
                j = (i * BATCH) % max(n - BATCH, 1)
                step(perm[j:j + BATCH])
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), file=sys.stderr)


if __name__ == "__main__":
    main()
