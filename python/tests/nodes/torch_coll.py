#!/usr/bin/env python3
"""pslite.torch beside DistributedOptimizer (issue 40 items 4-6, 8, 9), as
one node of `pslite launch` (or alone, mode `single`):

  topology    torchrun's variables (set by the launcher, then by init()) and
              local_rank/local_size/cross_rank/cross_size/is_initialized
  collectives allreduce/allgather/broadcast/barrier and their async and
              in-place forms equal their definitions
  mismatch    a float64 model on rank 1 and a float32 one on rank 0, then a
              different hidden size: broadcast_parameters and
              DistributedOptimizer name the parameter, shapes and dtypes
  sparse      nn.Embedding(sparse=True)/EmbeddingBag under
              DistributedOptimizer equal one process on the global batch
  ddp         pslite.torch.DistributedDataParallel equals one process on the
              global batch (float64), with no_sync() and an unused layer
  single      plain `python`: one worker of size 1, everything the identity

Prints `PASS <mode> <rank>` at the end.
"""

import copy
import os
import sys
import time

import torch

MODE = sys.argv[1]
before = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
role = os.environ.get("DMLC_ROLE")

import pslite  # noqa: E402
import pslite.torch as pt  # noqa: E402

initialized_before = MODE in ("topology", "single") and pt.is_initialized()
pt.init()  # servers and the scheduler serve here, then exit
torch.set_num_threads(1)
rank, size = pt.rank(), pt.size()


def close(a, b, tol=0.0):
    assert a.dtype == b.dtype and a.shape == b.shape, (a, b)
    err = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
    assert err <= tol, f"{a} != {b} (difference {err})"


def topology():
    assert role == "worker" and pt.is_initialized() and not initialized_before
    # The launcher's guess before init() is the job's rank.
    assert before == {"RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(rank),
                      "LOCAL_WORLD_SIZE": str(size)}, before
    assert os.environ["RANK"] == str(rank) and os.environ["WORLD_SIZE"] == str(size)
    assert os.environ["LOCAL_RANK"] == str(rank) and os.environ["LOCAL_WORLD_SIZE"] == str(size)
    assert (pt.local_rank(), pt.local_size(), pt.cross_rank(), pt.cross_size()) == \
        (rank, size, 0, 1), (pt.local_rank(), pt.local_size(), pt.cross_rank(), pt.cross_size())
    # DistributedSampler reads them without arguments.
    import torch.distributed as dist
    from torch.utils.data.distributed import DistributedSampler
    assert not dist.is_initialized()
    sampler = DistributedSampler(list(range(12)), num_replicas=int(os.environ["WORLD_SIZE"]),
                                 rank=int(os.environ["RANK"]), shuffle=False)
    assert list(sampler) == list(range(rank, 12, size)), list(sampler)
    print(f"topology rank {rank} of {size}: local {pt.local_rank()} of {pt.local_size()}",
          flush=True)


def collectives():
    n = 40  # with PSLITE_PARTITION_BYTES=96, several parts per tensor
    base = torch.arange(n, dtype=torch.float64)
    every = [base * (r + 1) - r for r in range(size)]
    mine = every[rank]
    stack = torch.stack(every)
    for dtype in (torch.float32, torch.float64):
        t = mine.to(dtype)
        close(pt.allreduce(t), stack.mean(0).to(dtype), 1e-5)
        close(pt.allreduce(t, average=False), stack.sum(0).to(dtype))
        close(pt.allreduce(t, op=pt.Sum, name=f"sum {dtype}"), stack.sum(0).to(dtype))
        close(pt.allreduce(t, op=pt.Min), stack.amin(0).to(dtype))
        close(pt.allreduce(t, op=pt.Max), stack.amax(0).to(dtype))
        close(pt.allreduce(t[:5], op=pt.Product), stack[:, :5].prod(0).to(dtype))
        close(pt.allreduce(t, op=pt.Sum, prescale_factor=2.0, postscale_factor=0.5),
              stack.sum(0).to(dtype))
        u = t.clone()
        assert pt.allreduce_(u, average=False) is u
        close(u, stack.sum(0).to(dtype))
        assert torch.equal(t, mine.to(dtype)), "allreduce changed its input"
    close(pt.allreduce(mine.to(torch.int64), op=pt.Sum), stack.sum(0).to(torch.int64))
    close(pt.allreduce(mine.to(torch.float16), op=pt.Sum), stack.sum(0).to(torch.float16), 0.5)
    close(pt.allreduce(torch.tensor(float(rank))), torch.tensor(sum(range(size)) / size))
    try:
        pt.allreduce(mine.to(torch.int32))
        raise AssertionError("the average of an int32 tensor was accepted")
    except pslite.InvalidInput as e:
        assert "op=pslite.torch.Sum" in str(e), e
    # allgather: rank r sends r + 1 rows.
    rows = [torch.full((r + 1, 3), float(r)) + torch.arange(3.0) for r in range(size)]
    close(pt.allgather(rows[rank]), torch.cat(rows))
    close(pt.allgather(torch.tensor([rank, -rank], dtype=torch.int64), name="ints"),
          torch.tensor([x for r in range(size) for x in (r, -r)], dtype=torch.int64))
    close(pt.allgather(torch.tensor(float(rank))), torch.arange(float(size)))
    assert pt.allgather_object({"rank": rank}) == [{"rank": r} for r in range(size)]
    # broadcast from the last rank; in place too.
    root = size - 1
    close(pt.broadcast(mine, root), every[root])
    v = mine.to(torch.float32).clone()
    assert pt.broadcast_(v, root, name="v") is v
    close(v, every[root].to(torch.float32))
    b = torch.tensor([rank == root, rank != root])
    close(pt.broadcast(b, root), torch.tensor([True, False]))
    # Async: several in flight at once; named ones started in different
    # orders on different ranks.
    names = ["first", "second"] if rank % 2 == 0 else ["second", "first"]
    handles = {name: pt.allreduce_async(mine * (1 if name == "first" else 10), average=False,
                                        name=name) for name in names}
    h_gather = pt.allgather_async(rows[rank])
    h_bcast = pt.broadcast_async(mine, 0)
    h_inplace = pt.allreduce_async_(w := mine.clone(), op=pt.Max)
    deadline = time.monotonic() + 30
    while not pt.poll(handles["first"]):
        assert time.monotonic() < deadline, "poll() never said done"
        time.sleep(0.001)
    close(pt.synchronize(handles["first"]), stack.sum(0))
    close(pt.synchronize(handles["second"]), stack.sum(0) * 10)
    close(pt.synchronize(h_gather), torch.cat(rows))
    close(pt.synchronize(h_bcast), every[0])
    assert pt.synchronize(h_inplace) is w
    close(w, stack.amax(0))
    assert pt.poll(h_bcast)
    try:
        h = pt.allreduce_async(mine, name="twice")
        pt.allreduce_async(mine, name="twice")
        raise AssertionError("a name in flight twice was accepted")
    except pslite.InvalidInput as e:
        assert "already in flight" in str(e), e
    pt.synchronize(h)
    pt.barrier()
    print(f"collectives rank {rank}: equal their definitions", flush=True)


class Net(torch.nn.Module):
    def __init__(self, hidden, dtype):
        super().__init__()
        self.a = torch.nn.Linear(10, hidden).to(dtype)
        self.b = torch.nn.Linear(hidden, 3).to(dtype)


def mismatch():
    assert size == 2
    for case, model in (
            ("dtype", Net(32, torch.float64 if rank == 1 else torch.float32)),
            ("hidden", Net(16 if rank == 1 else 32, torch.float32))):
        try:
            pt.broadcast_parameters(model.state_dict(), root_rank=0)
            raise AssertionError(f"{case}: broadcast_parameters took different models")
        except pslite.InvalidInput as e:
            print(f"MISMATCH {case} broadcast_parameters: {e}", flush=True)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        try:
            pt.DistributedOptimizer(opt, named_parameters=model.named_parameters())
            raise AssertionError(f"{case}: DistributedOptimizer took different models")
        except pslite.InvalidInput as e:
            print(f"MISMATCH {case} DistributedOptimizer: {e}", flush=True)


class Bags(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 4, sparse=True, dtype=torch.float64)
        self.bag = torch.nn.EmbeddingBag(20, 4, mode="sum", sparse=True, dtype=torch.float64)
        self.out = torch.nn.Linear(8, 2, dtype=torch.float64)

    def forward(self, ids):
        return self.out(torch.cat([self.emb(ids).sum(1), self.bag(ids)], 1))


def train_steps(model, opt, data, rank, size, sparse_checked=None):
    for ids, y in data:
        local = len(ids) // size
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(
            model(ids[rank * local:(rank + 1) * local]), y[rank * local:(rank + 1) * local])
        loss.backward()
        if sparse_checked is not None:
            opt.synchronize()
            sparse_checked.append(model.emb.weight.grad.is_sparse)
        opt.step()


def sparse():
    torch.manual_seed(5)
    model = Bags()  # the same start everywhere
    g = torch.Generator().manual_seed(9)
    data = [(torch.randint(0, 20, (12, 3), generator=g), torch.randint(0, 2, (12,), generator=g))
            for _ in range(4)]
    alone = copy.deepcopy(model)
    opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                  named_parameters=model.named_parameters())
    checked = []
    train_steps(model, opt, data, rank, size, checked)
    assert all(checked), "the averaged gradient of a sparse embedding is not sparse"
    train_steps(alone, torch.optim.SGD(alone.parameters(), lr=0.5), data, 0, 1)
    for (name, p), q in zip(model.named_parameters(), alone.parameters()):
        err = (p - q).abs().max().item()
        assert err < 1e-12, f"{name}: differs from one process by {err}"
    # SparseAdam takes the sparse averages (a fresh model: one optimizer
    # per parameter).
    model = Bags()
    pt.broadcast_parameters(model.state_dict(), root_rank=0)
    dense = [p for n, p in model.named_parameters() if n.startswith("out")]
    embs = [model.emb.weight, model.bag.weight]
    opt = pt.DistributedOptimizer(torch.optim.SparseAdam(embs, lr=0.01))
    opt2 = pt.DistributedOptimizer(torch.optim.SGD(dense, lr=0.1))
    ids, y = data[0]
    opt.zero_grad()
    opt2.zero_grad()
    torch.nn.functional.cross_entropy(model(ids), y).backward()
    opt.step()
    opt2.step()
    for p in model.parameters():
        close(p.detach(), pt.broadcast(p.detach(), 0))
    print(f"sparse rank {rank}: equals one process on the global batch", flush=True)


class Spare(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(10, 16, dtype=torch.float64)
        self.b = torch.nn.Linear(16, 3, dtype=torch.float64)
        self.spare = torch.nn.Linear(3, 3, dtype=torch.float64)  # rank 0 only
        self.register_buffer("seen", torch.zeros(1, dtype=torch.float64))

    def forward(self, x, spare=False):
        y = self.b(torch.tanh(self.a(x)))
        return self.spare(y) if spare else y


def ddp():
    torch.manual_seed(100 + rank)  # different starts: the wrapper broadcasts rank 0's
    inner = Spare()
    model = pt.DistributedDataParallel(inner)
    assert model.module is inner
    start = pt.broadcast_object(copy.deepcopy(inner.state_dict()), root_rank=0)
    for name, t in inner.state_dict().items():
        assert torch.equal(t, start[name]), f"{name} differs after construction"
    assert list(model.state_dict())[0].startswith("module."), list(model.state_dict())
    alone = copy.deepcopy(inner)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    alone_opt = torch.optim.SGD(alone.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(3)
    batch = 12
    data = [(torch.randn(batch, 10, generator=g, dtype=torch.float64),
             torch.randint(0, 3, (batch,), generator=g)) for _ in range(5)]
    loss_fn = torch.nn.functional.cross_entropy
    local = batch // size
    for step, (x, y) in enumerate(data):
        xs, ys = x[rank * local:(rank + 1) * local], y[rank * local:(rank + 1) * local]
        opt.zero_grad()
        if step % 2:
            # Two halves, the first accumulated locally under no_sync().
            h = local // 2
            with model.no_sync():
                (loss_fn(model(xs[:h]), ys[:h], reduction="sum") / local).backward()
            (loss_fn(model(xs[h:]), ys[h:], reduction="sum") / local).backward()
        else:
            loss_fn(model(xs), ys).backward()
        # backward() has returned: the averages are in p.grad already.
        opt.step()
        alone_opt.zero_grad()
        loss_fn(alone(x), y).backward()
        alone_opt.step()
    for (name, p), q in zip(inner.named_parameters(), alone.parameters()):
        err = ((p - q).abs().max() / q.abs().max()).item()
        assert err < 1e-12, f"{name}: relative difference {err:.2e} from one process"
    # A layer used on rank 0 only: the others send zeros, nobody hangs.
    opt.zero_grad()
    loss_fn(model(data[0][0][:local], spare=(rank == 0)), data[0][1][:local]).backward()
    assert inner.spare.weight.grad is not None
    # Half precision: summed as float32, the mean rounded once (as
    # DistributedOptimizer does).
    for dtype in (torch.bfloat16, torch.float16):
        torch.manual_seed(7)
        half = torch.nn.Linear(6, 4).to(dtype)
        wrapped = pt.DistributedDataParallel(half)
        copies = [copy.deepcopy(half) for _ in range(size)]
        xh = torch.randn(2 * size, 6, generator=torch.Generator().manual_seed(8)).to(dtype)
        wrapped(xh[2 * rank:2 * rank + 2]).float().pow(2).sum().backward()
        for r, c in enumerate(copies):
            c(xh[2 * r:2 * r + 2]).float().pow(2).sum().backward()
        for (name, p), *theirs in zip(half.named_parameters(), *[c.parameters() for c in copies]):
            mean = (sum(t.grad.float() for t in theirs) * (1.0 / size)).to(dtype)
            assert p.grad.dtype == dtype, f"{dtype} {name}: gradient is {p.grad.dtype}"
            assert torch.equal(p.grad, mean), f"{dtype} {name}: not the float32 mean rounded once"
    print(f"ddp rank {rank}: equals one process on the global batch", flush=True)


def single():
    assert role is None and (rank, size) == (0, 1) and pt.is_initialized()
    assert not initialized_before
    assert (pt.local_rank(), pt.local_size(), pt.cross_rank(), pt.cross_size()) == (0, 1, 0, 1)
    assert os.environ["RANK"] == "0" and os.environ["WORLD_SIZE"] == "1"
    t = torch.arange(6, dtype=torch.float32)
    close(pt.allreduce(t), t)
    close(pt.allreduce(t, op=pt.Sum), t)
    close(pt.allgather(t), t)
    close(pt.broadcast(t, 0), t)
    close(pt.synchronize(pt.allreduce_async(t)), t)
    assert pt.poll(pt.broadcast_async(t, 0))
    pt.barrier()
    torch.manual_seed(1)
    model = Net(8, torch.float64)
    alone = copy.deepcopy(model)
    pt.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                  named_parameters=model.named_parameters(),
                                  compression="topk:0.5")
    pt.broadcast_optimizer_state(opt, root_rank=0)
    alone_opt = torch.optim.SGD(alone.parameters(), lr=0.1, momentum=0.9)
    ddp = pt.DistributedDataParallel(copy.deepcopy(model))
    ddp_opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(6, 10, dtype=torch.float64)
    for m, o in ((model, opt), (alone, alone_opt), (ddp.module, ddp_opt)):
        for _ in range(3):
            o.zero_grad()
            m.b(m.a(x)).square().sum().backward()
            o.step()
    for p, q, r in zip(model.parameters(), alone.parameters(), ddp.module.parameters()):
        assert torch.equal(p, q) and torch.equal(r, q)
    print("single: one worker of size 1", flush=True)


{"topology": topology, "collectives": collectives, "mismatch": mismatch, "sparse": sparse,
 "ddp": ddp, "single": single}[MODE]()
print(f"PASS {MODE} {rank}", flush=True)
