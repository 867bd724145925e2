#!/usr/bin/env python3
"""DLRM on a synthetic Criteo-shaped data set, trained three ways side by side:
pslite (embedding rows on 2 servers, `pslite.torch.EmbeddingBag`), TorchRec
(row-wise sharded tables over W gloo ranks on CPU) and plain single-process
PyTorch (`nn.EmbeddingBag`).

    python python/examples/dlrm.py                  # 10 M rows, W = 2 and 4
    python python/examples/dlrm.py --small          # CI size, about a minute
    python python/examples/dlrm.py --trainers pslite --workers 2 --small

This process is the driver: it starts each trainer as its own job (pslite:
`python -m pslite launch --torch -s 2 -w W`; TorchRec: W processes of the
interpreter in `--torchrec-python`, default ~/.cache/pslite/torchrec-venv,
made by torchrec_venv.sh; plain: one process), reads each one's RESULT line,
follows its processes' peak RSS, and prints per W

    RESULT dlrm rows=R W=W trainer=T sps=... auc=... worker_rss_mb=... server_rss_mb=...
    RESULT dlrm rows=R W=W pslite_sps= torchrec_sps= pslite_auc= torchrec_auc= worker_rss_mb=

(`worker_rss_mb` of the summary is pslite's largest worker; `plain_*` figures
stand in when TorchRec cannot run, and say why).

Data (nothing downloaded): every sample has 13 dense features and 26
categorical ids, table t's ids drawn from a power law over its rows (table
sizes are Criteo Kaggle's cardinalities scaled to --rows in total). The label
is a Bernoulli draw of sigmoid(hidden logit): a fixed linear function of the
dense features plus a hidden effect per (table, id) taken from a hash (so no
table of truths is stored), so frequent ids carry learnable signal. Samples
come in blocks of 256 made from (seed, block): every trainer, at every W,
trains on the same global batches in the same order (worker r takes its
share of each global batch) and is scored on the same held-out blocks.

Model (the same in every trainer, dense weights from the same seed): bottom
MLP over the dense features, one embedding bag per table (sum), the pairwise
dot products of the 27 vectors, a top MLP over them and the bottom output.
Optimizers: embeddings row-wise AdaGrad (each row's accumulator adds the
mean of its squared gradient; fbgemm's EXACT_ROWWISE_ADAGRAD in TorchRec,
the servers' `RowWiseAdaGrad` in pslite, written out here for the plain
baseline), dense parameters AdaGrad (synchronous: `DistributedOptimizer` in
pslite, DDP in TorchRec). pslite holds the 26 tables in one server-side
`EmbeddingBag` (table t's id i is key i + t * 2^40), so a step is one pull
and one push.
"""

import argparse
import os
import re
import resource
import socket
import subprocess
import sys
import threading
import time

import numpy as np

DENSE = 13
TABLES = 26
BLOCK = 256
#: Criteo Kaggle (Display Advertising Challenge) cardinalities, scaled to --rows.
CRITEO = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
          27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572]
TABLE_STRIDE = 1 << 40
M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


# --------------------------------------------------------------------- data

def table_sizes(rows):
    total = sum(CRITEO)
    return [max(2, round(c * rows / total)) for c in CRITEO]


def _mix(x):
    """splitmix64's finaliser, elementwise on uint64 (wrapping)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class Synthetic:
    """Criteo-shaped samples from a seed: `block(k)` is always the same."""

    def __init__(self, sizes, seed, zipf=1.1, id_scale=2.0):
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.seed = seed
        self.zipf = zipf
        rng = np.random.default_rng(seed)
        self.w_dense = rng.normal(0.0, 1.0, DENSE) / np.sqrt(DENSE)
        self.id_scale = id_scale  # the std of the sum of the 26 hidden id effects
        self.bias = -0.5

    def _ids(self, rng, n):
        # Power law over ranks 0..size-1 (inverse CDF of a truncated continuous
        # Pareto), ranks scattered over the rows by a prime multiplier.
        u = rng.random((n, TABLES))
        s = self.sizes.astype(np.float64)
        a = 1.0 - self.zipf
        r = np.floor(((np.power(s, a) - 1.0) * u + 1.0) ** (1.0 / a)) - 1.0
        r = np.clip(r, 0, s - 1).astype(np.int64)
        return (r * 1_000_000_007) % self.sizes

    def effect(self, ids):
        """The hidden effect of (table, id), N(0, id_scale^2 / 26) by hash."""
        t = np.arange(TABLES, dtype=np.uint64)
        h = _mix(ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + t * np.uint64(1 << 40)
                 + np.uint64(self.seed))
        u1 = ((h >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)
        u2 = ((_mix(h) >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)
        z = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
        return z * (self.id_scale / np.sqrt(TABLES))

    def block(self, k):
        rng = np.random.default_rng([self.seed, k])
        dense = rng.lognormal(0.0, 1.0, (BLOCK, DENSE))
        x = np.log1p(dense) - 1.0
        ids = self._ids(rng, BLOCK)
        logit = x @ self.w_dense * 1.5 + self.effect(ids).sum(axis=1) + self.bias
        y = (rng.random(BLOCK) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
        return x.astype(np.float32), ids, y

    def blocks(self, ks):
        parts = [self.block(k) for k in ks]
        return tuple(np.concatenate(p) for p in zip(*parts))


def auc(y, p):
    """Area under the ROC curve (Mann-Whitney, ties share their mean rank)."""
    y = np.asarray(y, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    order = np.argsort(p, kind="mergesort")
    ps = p[order]
    ranks = np.empty(len(p))
    starts = np.r_[0, np.flatnonzero(np.diff(ps)) + 1]
    ends = np.r_[starts[1:], len(p)]
    mean_rank = (starts + ends + 1) / 2.0
    ranks[order] = np.repeat(mean_rank, ends - starts)
    pos = y.sum()
    neg = len(y) - pos
    if pos == 0 or neg == 0:
        return float("nan")
    return float((ranks[y > 0.5].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


# -------------------------------------------------------------------- model

def dense_part(args):
    """Bottom MLP, dot interaction, top MLP: `forward(x, emb[B, 26, D])`."""
    import torch
    from torch import nn

    torch.set_num_threads(args.threads)

    def mlp(sizes, last_relu):
        layers = []
        for i in range(len(sizes) - 1):
            layers.append(nn.Linear(sizes[i], sizes[i + 1]))
            if i < len(sizes) - 2 or last_relu:
                layers.append(nn.ReLU())
        return nn.Sequential(*layers)

    class Dense(nn.Module):
        def __init__(self):
            super().__init__()
            d = args.dim
            self.bottom = mlp([DENSE, *args.bottom, d], True)
            n = TABLES + 1
            self.pairs = n * (n - 1) // 2
            self.top = mlp([d + self.pairs, *args.top, 1], False)
            li, lj = torch.tril_indices(n, n, offset=-1)
            self.register_buffer("li", li, persistent=False)
            self.register_buffer("lj", lj, persistent=False)

        def forward(self, x, emb):
            b = self.bottom(x)
            z = torch.cat([b.unsqueeze(1), emb], dim=1)
            inter = torch.bmm(z, z.transpose(1, 2))[:, self.li, self.lj]
            return self.top(torch.cat([b, inter], dim=1)).squeeze(1)

    torch.manual_seed(args.seed)
    return Dense()


def schedule(args, world, rank):
    """This rank's blocks of each global batch, and of the held-out set."""
    per_batch = args.batch // BLOCK
    mine = per_batch // world
    steps = args.samples // args.batch
    train = [[s * per_batch + rank * mine + j for j in range(mine)] for s in range(steps)]
    first_test = 1 << 40
    test_blocks = args.test // BLOCK
    test = [first_test + k for k in range(rank, test_blocks, world)]
    return train, test


def loop(args, world, rank, data, step_fn, predict_fn, barrier, gather, log, prefetch=None,
         flush=None):
    """Trains on this rank's share, returns (sps, auc, seconds) as this rank
    measured (auc over every rank's held-out predictions). With `prefetch`,
    the next batch's ids are handed to it before each step."""
    import torch

    train, test = schedule(args, world, rank)
    barrier()
    t0 = time.perf_counter()
    batch = [torch.from_numpy(a) for a in data.blocks(train[0])]
    for s in range(len(train)):
        x, ids, y = batch
        if s + 1 < len(train):
            batch = [torch.from_numpy(a) for a in data.blocks(train[s + 1])]
            if prefetch is not None:
                prefetch(batch[1])
        step_fn(x, ids, y)
        if args.log_every and s % args.log_every == 0 and rank == 0:
            log(f"step {s}/{len(train)}, {time.perf_counter() - t0:.1f} s")
    if flush is not None:
        flush()
    barrier()
    elapsed = time.perf_counter() - t0
    sps = len(train) * args.batch / elapsed
    preds, labels = [], []
    with torch.no_grad():
        for k in test:
            x, ids, y = data.block(k)
            preds.append(predict_fn(torch.from_numpy(x), torch.from_numpy(ids)))
            labels.append(torch.from_numpy(y))
    p = gather(torch.cat(preds)).numpy()
    y = gather(torch.cat(labels)).numpy()
    return sps, auc(y, p), elapsed


def rowwise_init(args, n, gen=None):
    import torch
    return torch.empty(n, args.dim).uniform_(-args.init, args.init, generator=gen)


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def result_line(args, world, trainer, sps, auc_, worker_rss, server_rss):
    return (f"RESULT dlrm rows={args.rows} W={world} trainer={trainer} sps={sps:.0f} "
            f"auc={auc_:.4f} worker_rss_mb={worker_rss:.0f} server_rss_mb={server_rss:.0f}")


# --------------------------------------------------------------- trainers

def run_plain(args):
    """One process: nn.EmbeddingBag per table (sparse gradients), row-wise
    AdaGrad written out, AdaGrad on the dense part."""
    import torch
    from torch import nn

    data = Synthetic(table_sizes(args.rows), args.seed)
    sizes = table_sizes(args.rows)
    model = dense_part(args)
    gen = torch.Generator().manual_seed(args.seed + 1)
    bags = [nn.EmbeddingBag(n, args.dim, mode="sum", sparse=True, _weight=rowwise_init(args, n, gen))
            for n in sizes]
    accs = [torch.full((n,), args.initial_acc) for n in sizes]
    dense_opt = torch.optim.Adagrad(model.parameters(), lr=args.dense_lr, eps=args.eps)
    offsets = None

    def embed(ids):
        nonlocal offsets
        if offsets is None or offsets.numel() != ids.shape[0]:
            offsets = torch.arange(ids.shape[0])
        return torch.stack([bag(ids[:, t], offsets) for t, bag in enumerate(bags)], dim=1)

    def step(x, ids, y):
        loss = nn.functional.binary_cross_entropy_with_logits(model(x, embed(ids)), y)
        dense_opt.zero_grad()
        for bag in bags:
            bag.weight.grad = None
        loss.backward()
        dense_opt.step()
        with torch.no_grad():
            for bag, acc in zip(bags, accs):
                g = bag.weight.grad.coalesce()
                rows, vals = g.indices()[0], g.values()
                acc[rows] += (vals * vals).mean(dim=1)
                bag.weight[rows] -= args.lr * vals / (acc[rows].sqrt() + args.eps).unsqueeze(1)

    def predict(x, ids):
        return torch.sigmoid(model(x, embed(ids)))

    sps, a, elapsed = loop(args, 1, 0, data, step, predict, lambda: None, lambda t: t, log)
    log(f"plain: {elapsed:.1f} s")
    print(result_line(args, 1, "plain", sps, a, peak_rss_mb(), 0), flush=True)


def run_pslite(args):
    """A worker of `pslite launch --torch`: the tables on the servers, the
    dense part averaged synchronously by DistributedOptimizer."""
    import torch
    from torch import nn

    import pslite.torch as pt

    pt.init()  # servers serve here and exit
    world, rank = pt.size(), pt.rank()
    data = Synthetic(table_sizes(args.rows), args.seed)
    model = dense_part(args)
    pt.broadcast_parameters(model.state_dict(), root_rank=0)
    bag = pt.EmbeddingBag(
        args.dim, mode="sum", name="dlrm", seed=args.seed + 1,
        init=("uniform", -args.init, args.init),
        optimizer=pt.RowWiseAdaGrad(lr=args.lr, eps=args.eps, initial_accumulator=args.initial_acc))
    dense_opt = pt.DistributedOptimizer(
        torch.optim.Adagrad(model.parameters(), lr=args.dense_lr, eps=args.eps),
        named_parameters=model.named_parameters())
    shift = torch.arange(TABLES, dtype=torch.int64) * TABLE_STRIDE

    def keys(ids):  # one bag of one id per (sample, table)
        return (ids + shift).reshape(-1, 1)

    def embed(ids):
        return bag(keys(ids)).view(ids.shape[0], TABLES, args.dim)

    def step(x, ids, y):
        dense_opt.zero_grad()
        loss = nn.functional.binary_cross_entropy_with_logits(model(x, embed(ids)), y)
        loss.backward()  # pushes the rows' gradients; the servers apply row-wise AdaGrad
        dense_opt.step()

    def predict(x, ids):
        return torch.sigmoid(model(x, embed(ids)))

    sps, a, elapsed = loop(args, world, rank, data, step, predict, pt.barrier, pt.allgather,
                           lambda m: log(f"rank {rank}: {m}"), flush=bag.flush,
                           prefetch=(lambda ids: bag.prefetch(keys(ids))) if args.prefetch else None)
    rss = pt.allgather(torch.tensor([peak_rss_mb()]))
    if rank == 0:
        held = pt.embedding_stats()
        log(f"pslite W={world}: {elapsed:.1f} s; the servers hold "
            f"{sum(h['rows'] for h in held)} rows (of {args.rows}: rows are made on first "
            f"touch), {sum(h['store_bytes'] for h in held) / 2**20:.0f} MB of tables")
        # the servers' RSS is the driver's to measure (it sees their processes)
        print(result_line(args, world, "pslite", sps, a, float(rss.max()), 0), flush=True)
    pt.shutdown()


def run_torchrec(args):
    """Rank `--rank` of `--world` gloo ranks: an EmbeddingBagCollection
    sharded row-wise by DistributedModelParallel (fused row-wise AdaGrad in
    the backward), the dense part under DDP with AdaGrad."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.modules.embedding_configs import PoolingType
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    world, rank = args.world, args.rank
    dist.init_process_group("gloo", init_method=f"tcp://{args.master_addr}:{args.port}",
                            rank=rank, world_size=world)
    sizes = table_sizes(args.rows)
    data = Synthetic(sizes, args.seed)
    names = [f"c{t}" for t in range(TABLES)]
    configs = [EmbeddingBagConfig(name=f"t{t}", embedding_dim=args.dim, num_embeddings=n,
                                  feature_names=[names[t]], pooling=PoolingType.SUM,
                                  weight_init_min=-args.init, weight_init_max=args.init)
               for t, n in enumerate(sizes)]

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
            self.dense = dense_part(args)

        def forward(self, x, kjt):
            emb = self.ebc(kjt).values().view(x.shape[0], TABLES, args.dim)
            return self.dense(x, emb)

    class Sharder(EmbeddingBagCollectionSharder):
        # TorchRec 1.9 offers ROW_WISE on cuda/tpu/mtia only; asked for on cpu
        def sharding_types(self, compute_device_type):
            return [args.torchrec_sharding]

    sharder = Sharder(fused_params={
        "optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": args.lr,
        "eps": args.eps})
    constraints = {f"t{t}": ParameterConstraints(sharding_types=[args.torchrec_sharding])
                   for t in range(TABLES)}
    model = Model()
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=world, compute_device="cpu"), constraints=constraints)
    pg = dist.GroupMember.WORLD
    plan = planner.collective_plan(model, [sharder], pg)
    model = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan,
                                     sharders=[sharder])
    dense_params = dict(in_backward_optimizer_filter(model.named_parameters()))
    dense_opt = torch.optim.Adagrad(list(dense_params.values()), lr=args.dense_lr, eps=args.eps)

    def kjt_of(ids):
        n = ids.shape[0]
        return KeyedJaggedTensor.from_lengths_sync(
            keys=names, values=ids.t().reshape(-1), lengths=torch.ones(n * TABLES, dtype=torch.int32))

    def step(x, ids, y):
        dense_opt.zero_grad()
        loss = nn.functional.binary_cross_entropy_with_logits(model(x, kjt_of(ids)), y)
        loss.backward()  # the tables' fused optimizer runs in here
        dense_opt.step()

    def predict(x, ids):
        return torch.sigmoid(model(x, kjt_of(ids)))

    def gather(t):
        parts = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(parts, t.contiguous())
        return torch.cat(parts)

    sps, a, elapsed = loop(args, world, rank, data, step, predict, dist.barrier, gather,
                           lambda m: log(f"rank {rank}: {m}"))
    rss = gather(torch.tensor([peak_rss_mb()]))
    if rank == 0:
        log(f"torchrec W={world}: {elapsed:.1f} s")
        print(result_line(args, world, "torchrec", sps, a, float(rss.max()), 0), flush=True)
    dist.destroy_process_group()


def log(msg):
    print(f"dlrm: {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ driver

class PeakRss:
    """Follows the peak RSS (VmHWM) of a process's descendants by their
    DMLC_ROLE (a process that is gone keeps its last reading)."""

    def __init__(self, root_pid, period=0.25):
        self.root, self.period = root_pid, period
        self.peak = {}  # pid -> (role, MB)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _children(self):
        kids = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/stat") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                    kids.setdefault(ppid, []).append(int(d))
                except (OSError, ValueError, IndexError):
                    pass
        out, todo = [], [self.root]
        while todo:
            pid = todo.pop()
            out.append(pid)
            todo.extend(kids.get(pid, []))
        return out

    def _read(self, pid):
        try:
            with open(f"/proc/{pid}/status") as f:
                hwm = re.search(r"VmHWM:\s+(\d+) kB", f.read())
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            return
        role = next((e[10:].decode() for e in env if e.startswith(b"DMLC_ROLE=")), "")
        if hwm and role:
            self.peak[pid] = (role, int(hwm.group(1)) / 1024.0)

    def _run(self):
        while not self.done.wait(self.period):
            for pid in self._children():
                self._read(pid)

    def stop(self):
        self.done.set()
        self.thread.join()

    def max_of(self, role):
        return max((mb for r, mb in self.peak.values() if r == role), default=0.0)


def trainer_argv(args, trainer):
    argv = ["--run", trainer, "--rows", str(args.rows), "--samples", str(args.samples),
            "--test", str(args.test), "--batch", str(args.batch), "--dim", str(args.dim),
            "--bottom", ",".join(map(str, args.bottom)), "--top", ",".join(map(str, args.top)),
            "--lr", str(args.lr), "--dense-lr", str(args.dense_lr), "--eps", str(args.eps),
            "--init", str(args.init), "--initial-acc", str(args.initial_acc),
            "--seed", str(args.seed), "--threads", str(args.threads),
            "--torchrec-sharding", args.torchrec_sharding,
            *(["--prefetch"] if args.prefetch else []), "--log-every", str(args.log_every)]
    return [os.path.abspath(__file__), *argv]


def collect(procs, timeout, trainer, world):
    """Waits for the processes; returns the RESULT line of `trainer` or why not."""
    deadline = time.monotonic() + timeout
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            return None, f"{trainer} W={world}: timed out after {timeout} s"
        outs.append(out or "")
    for out in outs:
        for line in out.splitlines():
            # (a line of a launched worker comes after its "[worker r (node n)] ")
            at = line.find("RESULT dlrm ")
            if at >= 0 and f" trainer={trainer} " in line:
                return line[at:], None
    codes = [p.returncode for p in procs]
    return None, f"{trainer} W={world}: no RESULT line (exit codes {codes})"


def launch_pslite(args, world):
    argv = [sys.executable, "-m", "pslite", "launch", "--torch", "-s", str(args.servers),
            "-w", str(world), "--timeout", str(args.timeout), "--",
            sys.executable, *trainer_argv(args, "pslite")]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    rss = PeakRss(p.pid)
    line, why = collect([p], args.timeout + 30, "pslite", world)
    rss.stop()
    if line:
        line = re.sub(r"server_rss_mb=\d+", f"server_rss_mb={rss.max_of('server'):.0f}", line)
    return line, why


def launch_torchrec(args, world):
    py = os.path.expanduser(args.torchrec_python)
    if not os.access(py, os.X_OK):
        return None, f"torchrec: {py} is missing (make it with python/examples/torchrec_venv.sh)"
    check = subprocess.run([py, "-c", "import torchrec, fbgemm_gpu"], capture_output=True,
                           text=True)
    if check.returncode != 0:
        err = (check.stderr.strip().splitlines() or ["?"])[-1]
        return None, f"torchrec: does not load in {py}: {err}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([py, *trainer_argv(args, "torchrec"), "--rank", str(r),
                               "--world", str(world), "--port", str(port)],
                              stdout=subprocess.PIPE, text=True)
             for r in range(world)]
    return collect(procs, args.timeout, "torchrec", world)


def launch_plain(args):
    p = subprocess.Popen([sys.executable, *trainer_argv(args, "plain")], stdout=subprocess.PIPE,
                         text=True)
    return collect([p], args.timeout, "plain", 1)


def field(line, name):
    m = re.search(rf"\b{name}=(\S+)", line or "")
    return m.group(1) if m else "NA"


def drive(args):
    results, failures = {}, []
    if "plain" in args.trainers:
        line, why = launch_plain(args)
        results[("plain", 1)] = line
        print(line or f"dlrm: {why}", flush=True)
        failures += [why] if why else []
    for world in args.workers:
        for trainer, launch in (("pslite", launch_pslite), ("torchrec", launch_torchrec)):
            if trainer in args.trainers:
                line, why = launch(args, world)
                results[(trainer, world)] = line
                print(line or f"dlrm: {why}", flush=True)
                failures += [why] if why else []
        ps, tr, pl = (results.get(("pslite", world)), results.get(("torchrec", world)),
                      results.get(("plain", 1)))
        summary = (f"RESULT dlrm rows={args.rows} W={world} pslite_sps={field(ps, 'sps')} "
                   f"torchrec_sps={field(tr, 'sps')} pslite_auc={field(ps, 'auc')} "
                   f"torchrec_auc={field(tr, 'auc')} worker_rss_mb={field(ps, 'worker_rss_mb')}")
        if tr is None and pl is not None:
            summary += f" plain_sps={field(pl, 'sps')} plain_auc={field(pl, 'auc')}"
        print(summary, flush=True)
    return 1 if any(results.get((t, w)) is None and t != "torchrec"
                    for t in args.trainers for w in (args.workers if t != "plain" else [1])) else 0


def ints(text):
    return [int(v) for v in text.split(",") if v]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true",
                    help="CI size: 200 000 rows, 98 304 samples, W = 2, pslite and plain")
    ap.add_argument("--rows", type=int, default=10_000_000, help="rows of the 26 tables in all")
    ap.add_argument("--samples", type=int, default=1_048_576, help="training samples (global)")
    ap.add_argument("--test", type=int, default=65_536, help="held-out samples")
    ap.add_argument("--batch", type=int, default=4096, help="global batch (a multiple of 256 W)")
    ap.add_argument("--workers", type=ints, default=[2, 4], help="W values, e.g. 2,4")
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--trainers", type=lambda s: s.split(","), default=["pslite", "torchrec", "plain"])
    ap.add_argument("--torchrec-python", default="~/.cache/pslite/torchrec-venv/bin/python")
    ap.add_argument("--prefetch", action="store_true",
                    help="pslite: pull the next batch's rows while this one trains (rows one "
                    "step stale)")
    ap.add_argument("--torchrec-sharding", default="row_wise",
                    help="TorchRec's sharding type (row_wise, table_wise, ...)")
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--bottom", type=ints, default=[64], help="bottom MLP hidden sizes")
    ap.add_argument("--top", type=ints, default=[128, 64], help="top MLP hidden sizes")
    ap.add_argument("--lr", type=float, default=0.05, help="embeddings' row-wise AdaGrad")
    ap.add_argument("--dense-lr", type=float, default=0.02, help="dense AdaGrad")
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--init", type=float, default=0.05, help="rows start uniform(-init, init)")
    ap.add_argument("--initial-acc", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per trainer process")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per trainer's job")
    ap.add_argument("--log-every", type=int, default=0, help="log every N steps (rank 0)")
    ap.add_argument("--run", choices=["pslite", "torchrec", "plain"], help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--master-addr", default="127.0.0.1", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.small:
        args.rows, args.samples, args.test = 200_000, 98_304, 16_384
        args.batch, args.timeout = 2048, 120
        if "--workers" not in sys.argv:
            args.workers = [2]
        if "--trainers" not in sys.argv:
            args.trainers = ["pslite", "plain"]
    lcm = BLOCK * 4
    args.test = max(lcm, args.test // lcm * lcm)
    bad = [w for w in args.workers if w < 1 or args.batch % (BLOCK * w)]
    if bad or args.batch < BLOCK:
        ap.error(f"--batch must be a multiple of {BLOCK} times every W, got {args.batch} "
                 f"for W = {args.workers}")
    if args.samples < args.batch:
        ap.error(f"--samples must be at least --batch ({args.batch}), got {args.samples}")
    if args.run:
        return {"pslite": run_pslite, "torchrec": run_torchrec, "plain": run_plain}[args.run](args)
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
