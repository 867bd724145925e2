#!/usr/bin/env python3
"""Repeated runs give the same bits (issue 40 item 7), as one node of
`pslite launch -s 2 -w 4`: every worker trains a float64 model on data of
its own scale (rank r's inputs times 10**r, so the order in which the
servers add the workers' gradients changes the rounding), pausing a random
0-3 ms before each backward pass (from the OS's entropy, not seeded) so
that the parts reach the servers in a different order every run. Prints
`PARAMS <sha256 of every parameter's bytes>`: the test runs the job twice
and compares.
"""

import hashlib
import random
import time

import torch

import pslite.torch as pt

STEPS = 12

pt.init()
rank = pt.rank()
torch.manual_seed(5)
model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.Tanh(),
                            torch.nn.Linear(64, 5)).to(torch.float64)
opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                              named_parameters=model.named_parameters())
g = torch.Generator().manual_seed(rank)
jitter = random.SystemRandom()
for _ in range(STEPS):
    x = torch.randn(16, 20, generator=g, dtype=torch.float64) * 10.0 ** rank
    y = torch.randint(0, 5, (16,), generator=g)
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    time.sleep(jitter.random() * 0.003)
    loss.backward()
    opt.step()
digest = hashlib.sha256()
for p in model.parameters():
    digest.update(p.detach().numpy().tobytes())
print(f"PARAMS {digest.hexdigest()}", flush=True)
