#!/usr/bin/env python3
"""train.py - a team's own PyTorch project, sent with its job:

  trainyard submit examples/pytorch-project/job.json --context examples/pytorch-project

The folder is packed (less what .trainyardignore names), uploaded, and each
task starts in its own copy of it, so `python3 train.py` and the imports of
its own modules (model.py here) work as they do on the laptop. Two ranks,
gloo, DistributedDataParallel, synthetic data: a linear regression whose loss
falls to the noise, reported as the job's metrics; the weights saved in
TRAINYARD_CHECKPOINT_DIR (restored on a retry) and uploaded at the end.
"""
import json
import os

import torch
import torch.distributed as dist

from model import Regressor

dist.init_process_group("gloo")  # MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE from trainyard
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
true_w = torch.randn(16, 1)
gen = torch.Generator().manual_seed(1 + rank)  # each rank its own shard
model = torch.nn.parallel.DistributedDataParallel(Regressor(16))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
ckpt = os.path.join(os.environ.get("TRAINYARD_CHECKPOINT_DIR", "."), "model.pt")
if os.path.exists(ckpt):
    model.module.load_state_dict(torch.load(ckpt))
for step in range(1, 201):
    x = torch.randn(64, 16, generator=gen)
    y = x @ true_w + 0.01 * torch.randn(64, 1, generator=gen)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if rank == 0 and step % 20 == 0:
        print("trainyard-metric " + json.dumps({"kind": "step", "step": step, "loss": loss.item()}), flush=True)
if rank == 0:
    torch.save(model.module.state_dict(), ckpt)
    print(f"rank 0 of {world}: done in {os.getcwd()}", flush=True)
dist.destroy_process_group()
