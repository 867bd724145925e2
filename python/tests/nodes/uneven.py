#!/usr/bin/env python3
"""Uneven inputs through pslite.torch (issue 40 item 2), as one node of
`pslite launch -s 2 -w 2`: rank r has STEPS - 3 r batches.

``uneven.py join``: each worker trains on its batches, then calls
`pt.join()`, which returns the last rank to join (rank 0: it has the most
batches); rank 0's model is broadcast to all. It must equal one process
running the rules: each step, the sum of the gradients of the ranks that
still have a batch, divided by the number of workers (a joined rank counts
as zeros). A second epoch of one step each and another join() then work as
usual. Prints `PASS uneven <rank>`.

``uneven.py nojoin``: the same without join(): rank 1 prints `FINISHED
<time>` and ends; rank 0, still training, must fail with
pslite.WorkerFinished naming rank 1 and the parameter that waits: it prints
`REFUSED <time> <message>` and raises. ``uneven.py nojoin-ddp``: the same
with `pt.DistributedDataParallel` instead of DistributedOptimizer.
"""

import copy
import sys
import time

import torch

import pslite
import pslite.torch as pt

STEPS = 6
BATCH = 8


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(5, 12).double()
        self.b = torch.nn.Linear(12, 3).double()

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def batches(rank):
    g = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(BATCH, 5, generator=g, dtype=torch.float64),
             torch.randint(0, 3, (BATCH,), generator=g))
            for _ in range(STEPS - 3 * rank)]


def loss_of(model, x, y):
    return torch.nn.functional.cross_entropy(model(x), y)


def alone(model, size):
    """One process under the rules: per step, the gradients of the ranks
    that still have a batch, summed and divided by `size`."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = [batches(r) for r in range(size)]
    for step in range(max(len(d) for d in data)):
        opt.zero_grad()
        for d in data:
            if step < len(d):
                (loss_of(model, *d[step]) / size).backward()
        opt.step()


pt.init()  # servers and the scheduler serve here, then exit
torch.set_num_threads(1)
rank, size = pt.rank(), pt.size()
mode = sys.argv[1]
torch.manual_seed(1)
model = Net()
start = copy.deepcopy(model)
if mode == "nojoin-ddp":
    # The DistributedDataParallel wrapper names a finished worker as well.
    model = pt.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
else:
    opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                  named_parameters=model.named_parameters())
try:
    for x, y in batches(rank):
        opt.zero_grad()
        loss_of(model, x, y).backward()
        opt.step()
except pslite.WorkerFinished as e:
    print(f"REFUSED {time.time():.3f} {e}", flush=True)
    raise
if mode.startswith("nojoin"):
    print(f"FINISHED {time.time():.3f}", flush=True)
    sys.exit(0)
last = pt.join()
assert last == 0, f"join() returned {last}: rank 0 has the most batches, so it joins last"
pt.broadcast_parameters(model.state_dict(), root_rank=last)
if rank == 0:
    alone(start, size)
    for (name, p), q in zip(model.named_parameters(), start.parameters()):
        err = ((p - q).abs().max() / q.abs().max()).item()
        assert err < 1e-12, f"{name}: relative difference {err:.2e} from the rules"
    print("join: equals one process under the rules", flush=True)
# Another epoch: the rounds need every worker again, and join() again.
x, y = batches(rank)[0]
opt.zero_grad()
loss_of(model, x, y).backward()
opt.step()
again = pt.join()
assert again in range(size), again
print(f"PASS uneven {rank}", flush=True)
