#!/usr/bin/env python3
"""Mixed precision through pslite.torch (issue 40 items 1 and 3), as one
node of `pslite launch -s 2 -w 2`; each check prints a line that the test
counts (once per worker), and `PASS amp <rank>` at the end.

- GradScaler, plain form (``scaler.scale(loss).backward();
  scaler.step(opt); scaler.update()``, init_scale 2**16), float64: the
  model after STEPS steps equals one process training on the global batch
  without a scaler (relative 1e-12: the scale is a power of two).
- Horovod's form (``opt.synchronize(); scaler.unscale_(opt);
  clip_grad_norm_; with opt.skip_synchronize(): scaler.step(opt)``): equal
  to one process with the same clipping, and every gradient pushed once
  per step.
- an overflow in one worker's gradients: every worker skips that step
  (the averages overflow everywhere) and halves its scale; the models
  stay equal.
- autocast bfloat16 on a float32 model with GradScaler: the update is one
  process's within bfloat16's rounding (the bug this guards against made it
  65 536 times too large).
- bfloat16 and float16 parameters: the averaged gradient is exactly the
  float32 mean of the workers' gradients rounded once; the step is SGD's
  on it; broadcast_parameters copies them exactly.
- gradient_predivide_factor f: the gradient is exactly (sum of g/f) * (f/W);
  average=False with f != 1 is refused.
- skip_synchronize(): a step while gradients are not summed yet is refused.
"""

import copy
import sys

import torch

import pslite
import pslite.torch as pt

STEPS = 4
BATCH = 16


class Net(torch.nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.a = torch.nn.Linear(6, 16).to(dtype)
        self.b = torch.nn.Linear(16, 3).to(dtype)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def data(dtype):
    g = torch.Generator().manual_seed(11)
    return [(torch.randn(BATCH, 6, generator=g).to(dtype),
             torch.randint(0, 3, (BATCH,), generator=g)) for _ in range(STEPS)]


def shard(t, rank, size):
    n = t.shape[0] // size
    return t[rank * n:(rank + 1) * n]


def start(dtype, seed):
    """A model (each worker from its own seed) made rank 0's by broadcast."""
    torch.manual_seed(seed + pt.rank())
    model = Net(dtype)
    pt.broadcast_parameters(model.state_dict(), root_rank=0)
    return model


def loss_of(model, x, y):
    return torch.nn.functional.cross_entropy(model(x), y)


def relative(model, alone):
    return max(((p - q).abs().max() / q.abs().max()).item()
               for p, q in zip(model.parameters(), alone.parameters()))


def alone_steps(model, batches, clip=None, autocast=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16) if autocast else None
    for x, y in batches:
        opt.zero_grad()
        if autocast:
            with torch.autocast("cpu", dtype=autocast):
                loss = loss_of(model, x, y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss_of(model, x, y).backward()
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()


def scaler_plain_form():
    rank, size = pt.rank(), pt.size()
    model = start(torch.float64, 1)
    alone = copy.deepcopy(model)
    opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                  named_parameters=model.named_parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    batches = data(torch.float64)
    for x, y in batches:
        opt.zero_grad()
        loss = loss_of(model, shard(x, rank, size), shard(y, rank, size))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    alone_steps(alone, batches)
    err = relative(model, alone)
    assert err < 1e-12, f"GradScaler plain form: relative difference {err:.3g} from one process"
    print("GradScaler plain form: equals one process on the global batch", flush=True)


def scaler_horovod_form():
    rank, size = pt.rank(), pt.size()
    model = start(torch.float64, 2)
    alone = copy.deepcopy(model)
    opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                  named_parameters=model.named_parameters())
    pushes = []
    push = opt._push
    opt._push = lambda entry: (pushes.append(entry.name), push(entry))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    batches = data(torch.float64)
    for x, y in batches:
        opt.zero_grad()
        loss = loss_of(model, shard(x, rank, size), shard(y, rank, size))
        scaler.scale(loss).backward()
        opt.synchronize()
        opt.synchronize()  # again: nothing more is sent
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        with opt.skip_synchronize():
            scaler.step(opt)
        scaler.update()
    alone_steps(alone, batches, clip=0.5)
    err = relative(model, alone)
    assert err < 1e-12, f"Horovod's form: relative difference {err:.3g} from one process"
    expected = STEPS * len(list(model.parameters()))
    assert len(pushes) == expected, f"{len(pushes)} gradients pushed, expected {expected}"
    print("synchronize + skip_synchronize: equals one process, each gradient pushed once",
          flush=True)


def scaler_skips_together():
    rank, size = pt.rank(), pt.size()
    model = start(torch.float64, 7)
    before = copy.deepcopy(model)
    opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  named_parameters=model.named_parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    x, y = data(torch.float64)[0]
    for step in range(2):
        opt.zero_grad()
        loss = loss_of(model, shard(x, rank, size), shard(y, rank, size))
        if rank == 1 and step == 0:
            loss = loss * float("inf")  # this worker's gradients overflow
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        if step == 0:
            for p, q in zip(model.parameters(), before.parameters()):
                assert torch.equal(p, q), "a worker stepped on an overflowed average"
            assert scaler.get_scale() == 2.0 ** 15, scaler.get_scale()
    everyone = pt.broadcast_object(copy.deepcopy(model.state_dict()), root_rank=0)
    for name, t in model.state_dict().items():
        assert torch.equal(t, everyone[name]), f"{name}: the workers' models differ"
    print("GradScaler: an overflow on one worker skips the step on every worker", flush=True)


def autocast_bfloat16():
    rank, size = pt.rank(), pt.size()
    model = start(torch.float32, 3)
    alone = copy.deepcopy(model)
    before = copy.deepcopy(model)
    opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                  named_parameters=model.named_parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    batches = data(torch.float32)
    for x, y in batches:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_of(model, shard(x, rank, size), shard(y, rank, size))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    alone_steps(alone, batches, autocast=torch.bfloat16)
    worst = 0.0
    for p, q, b in zip(model.parameters(), alone.parameters(), before.parameters()):
        ours, theirs = p - b, q - b
        worst = max(worst, ((ours - theirs).abs().max() / theirs.abs().max()).item())
    assert worst < 0.05, f"autocast bfloat16: the update differs by {worst:.3g} (relative)"
    print(f"autocast bfloat16 + GradScaler: the update is one process's (relative "
          f"{worst:.2g})", flush=True)


def half_parameters(dtype, compression=None):
    """With `compression` "fp16" ("bf16") too: the gradients cross as
    16-bit values both ways, and the answer is still the mean rounded once."""
    rank, size = pt.rank(), pt.size()
    model = start(dtype, 4)
    mine = pt.broadcast_object(copy.deepcopy(model.state_dict()), root_rank=0)
    for name, t in model.state_dict().items():
        assert torch.equal(t, mine[name]), f"{dtype} {name} differs after the broadcast"
    copies = [copy.deepcopy(model) for _ in range(size)]
    opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                  named_parameters=model.named_parameters(),
                                  compression=compression)
    x, y = data(torch.float32)[0]
    x = x.to(dtype)
    opt.zero_grad()
    loss_of(model, shard(x, rank, size), shard(y, rank, size)).backward()
    for r, c in enumerate(copies):
        loss_of(c, shard(x, r, size), shard(y, r, size)).backward()
    stepped = copy.deepcopy(copies[0])
    for (name, p), *theirs, q in zip(model.named_parameters(),
                                     *[c.parameters() for c in copies], stepped.parameters()):
        mean = (sum(t.grad.float() for t in theirs) * (1.0 / size)).to(dtype)
        assert p.grad.dtype == dtype, f"{name}: gradient is {p.grad.dtype}"
        assert torch.equal(p.grad, mean), f"{dtype} {name}: the gradient is not the mean"
        q.grad = mean
    opt.step()
    torch.optim.SGD(stepped.parameters(), lr=0.5).step()
    for (name, p), q in zip(model.named_parameters(), stepped.parameters()):
        assert torch.equal(p, q), f"{dtype} {name}: the step differs from SGD's"
    print(f"{dtype} parameters{' with ' + compression if compression else ''}: the gradient "
          f"is the float32 mean rounded once", flush=True)


def predivide():
    rank, size = pt.rank(), pt.size()
    for f in (3.0, 1.0):
        model = start(torch.float64, 5)
        copies = [copy.deepcopy(model) for _ in range(size)]
        opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      named_parameters=model.named_parameters(),
                                      gradient_predivide_factor=f)
        x, y = data(torch.float64)[0]
        opt.zero_grad()
        loss_of(model, shard(x, rank, size), shard(y, rank, size)).backward()
        for r, c in enumerate(copies):
            loss_of(c, shard(x, r, size), shard(y, r, size)).backward()
        for (name, p), *theirs in zip(model.named_parameters(),
                                      *[c.parameters() for c in copies]):
            if f == 1:
                want = sum(t.grad for t in theirs) * (1.0 / size)
            else:
                want = sum(t.grad / f for t in theirs) * (f / size)
            assert torch.equal(p.grad, want), f"predivide {f} {name}: not (sum g/f) * f/size"
        opt.step()
    try:
        pt.DistributedOptimizer(torch.optim.SGD(Net(torch.float64).parameters(), lr=0.1),
                                average=False, gradient_predivide_factor=2.0)
    except pslite.InvalidInput as e:
        assert "average=True" in str(e), e
    else:
        raise AssertionError("average=False with gradient_predivide_factor=2 was taken")
    print("gradient_predivide_factor: (sum of g/f) * f/size exactly", flush=True)


def skip_refused():
    rank, size = pt.rank(), pt.size()
    model = start(torch.float64, 6)
    opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  named_parameters=model.named_parameters(),
                                  backward_passes_per_step=2)
    x, y = data(torch.float64)[0]
    loss_of(model, shard(x, rank, size), shard(y, rank, size)).backward()
    try:
        with opt.skip_synchronize():
            opt.step()
    except pslite.InvalidInput as e:
        assert "synchronize()" in str(e), e
    else:
        raise AssertionError("a step before the sums was taken inside skip_synchronize()")
    opt.synchronize()  # every worker: the round completes
    print("skip_synchronize: a step before the sums is refused", flush=True)


pt.init()  # servers and the scheduler serve here, then exit
torch.set_num_threads(1)
only = sys.argv[1:]
checks = [scaler_plain_form, scaler_horovod_form, scaler_skips_together, autocast_bfloat16,
          lambda: half_parameters(torch.bfloat16), lambda: half_parameters(torch.float16),
          lambda: half_parameters(torch.float16, pt.Compression.fp16),
          lambda: half_parameters(torch.bfloat16, pt.Compression.bf16),
          predivide, skip_refused]
for check in checks:
    if not only or getattr(check, "__name__", "") in only:
        check()
print(f"PASS amp {pt.rank()}", flush=True)
