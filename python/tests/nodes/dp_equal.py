#!/usr/bin/env python3
"""Data-parallel training through pslite.torch equals one process training
on the global batch, as one node of `pslite launch -s 2 -w W`.

Every worker starts from a different random model; broadcast_parameters
and broadcast_optimizer_state make them rank 0's (checked exactly). Then
STEPS steps of SGD with momentum (float32, and a float64 model too) on the
global batch split over the workers, with parts small enough
(PSLITE_PARTITION_BYTES) that every layer is cut and spread over the
servers; a layer used on one worker only (its gradient None elsewhere)
must not stall the rounds. Rank 0 also trains a copy alone on the whole
global batch from the same start and compares: equal within float rounding
(relative 1e-5 for float32, 1e-12 for float64). Prints `PASS dp <rank>`.
"""

import copy

import torch

import pslite.torch as pt

STEPS = 8
BATCH = 24


class Net(torch.nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.a = torch.nn.Linear(10, 32).to(dtype)
        self.b = torch.nn.Linear(32, 3).to(dtype)
        self.spare = torch.nn.Linear(3, 3).to(dtype)  # used by rank 0 only

    def forward(self, x, spare):
        y = self.b(torch.tanh(self.a(x)))
        return self.spare(y) if spare else y


def batches(dtype):
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(BATCH, 10, generator=g, dtype=dtype),
             torch.randint(0, 3, (BATCH,), generator=g)) for _ in range(STEPS)]


def train(model, opt, data, rank, size, spare):
    local = BATCH // size
    for x, y in data:
        xs, ys = x[rank * local:(rank + 1) * local], y[rank * local:(rank + 1) * local]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xs, spare), ys)
        loss.backward()
        opt.step()


def check(dtype, tol):
    rank, size = pt.rank(), pt.size()
    torch.manual_seed(100 + rank)
    model = Net(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    # A step's state on rank 0 only, so the optimizer-state broadcast matters.
    if rank == 0:
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        opt.step()
    opt = pt.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    pt.broadcast_parameters(model.state_dict(), root_rank=0)
    pt.broadcast_optimizer_state(opt, root_rank=0)
    start = pt.broadcast_object(copy.deepcopy(model.state_dict()), root_rank=0)
    for name, t in model.state_dict().items():
        assert torch.equal(t, start[name]), f"{name} differs after the broadcast"
    momentum = [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()
                if "momentum_buffer" in opt.state[p]]
    assert len(momentum) == 6, f"optimizer state not broadcast: {len(momentum)} buffers"
    alone = copy.deepcopy(model)
    alone_opt = torch.optim.SGD(alone.parameters(), lr=0.1, momentum=0.9)
    alone_opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # its own buffers
    data = batches(dtype)
    train(model, opt, data, rank, size, spare=False)
    if rank == 0:
        train(alone, alone_opt, data, 0, 1, spare=False)
        for (name, p), q in zip(model.named_parameters(), alone.parameters()):
            err = ((p - q).abs().max() / q.abs().max()).item()
            assert err < tol, f"{dtype} {name}: relative difference {err:.2e} (bound {tol})"
        print(f"{dtype}: data-parallel equals one process on the global batch", flush=True)
    # A layer with a gradient on rank 0 only: the others send zeros.
    train(model, opt, data[:2], rank, size, spare=(rank == 0))


pt.init()  # servers and the scheduler serve here, then exit
torch.set_num_threads(1)
check(torch.float32, 1e-5)
check(torch.float64, 1e-12)
print(f"PASS dp {pt.rank()}", flush=True)
