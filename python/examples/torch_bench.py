#!/usr/bin/env python3
"""pslite's DistributedOptimizer side by side with torch's
DistributedDataParallel (gloo on 127.0.0.1, launched as torchrun would: one
process per rank with MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE and
LOCAL_RANK), in one run:

    python python/examples/torch_bench.py

For each model (``small``: an MLP of 0.2 M parameters; ``large``: six
2048x2048 layers, 25 M parameters, about 100 MB of float32 gradients per
step) and each number of workers (2 and 4), the same training steps run
three times: DDP, pslite (`pslite launch -s SERVERS -w W`, shared memory
between the processes of this host), and pslite with PS_SHM=0 (ZeroMQ over
TCP loopback only). Every process runs torch with one thread. A step is
zero_grad, forward, backward (DDP and pslite both overlap the gradient
exchange with it) and the optimizer step; the first --warmup steps are not
timed, and each run reports rank 0's median step time. The three run in
turn --repeat times (so that a busy moment of a shared machine falls on
all of them alike) and each figure is the median of its runs:

    RESULT torch <model> W=<n> ddp_ms=<..> pslite_ms=<..> pslite_shm0_ms=<..>

With --colocate, pslite also runs with its servers inside the workers'
processes (`pslite launch --colocate`, W servers), with shared memory and
with PS_SHM=0, adding pslite_colocated_ms=<..> pslite_colocated_shm0_ms=<..>.

Needs torch. Run from a venv where `pip install ./python` put pslite.
"""

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)


def build(model):
    import torch

    if model == "small":
        layers = [torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)]
        return torch.nn.Sequential(*layers), 784, 10, 32
    layers = []
    for _ in range(6):
        layers += [torch.nn.Linear(2048, 2048), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(2048, 10))
    return torch.nn.Sequential(*layers), 2048, 10, 8


def train(model, opt, inp, classes, batch, steps, warmup, rank):
    import torch

    g = torch.Generator().manual_seed(rank)
    x = torch.randn(batch, inp, generator=g)
    y = torch.randint(0, classes, (batch,), generator=g)
    times = []
    for i in range(warmup + steps):
        t = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if i >= warmup:
            times.append((time.perf_counter() - t) * 1000.0)
    return statistics.median(times)


def node_ddp(args):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, inp, classes, batch = build(args.model)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    ms = train(ddp, opt, inp, classes, batch, args.steps, args.warmup, rank)
    if rank == 0:
        print(f"STEP_MS {ms:.2f}", flush=True)
    dist.destroy_process_group()


def node_pslite(args):
    import torch

    import pslite.torch as pt

    torch.set_num_threads(1)
    pt.init()
    model, inp, classes, batch = build(args.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    opt = pt.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    pt.broadcast_parameters(model.state_dict(), root_rank=0)
    ms = train(model, opt, inp, classes, batch, args.steps, args.warmup, pt.rank())
    if pt.rank() == 0:
        print(f"STEP_MS {ms:.2f}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def step_ms(output, what):
    m = re.search(r"STEP_MS ([0-9.]+)", output)
    if not m:
        sys.exit(f"{what}: no STEP_MS line; output:\n{output}")
    return float(m.group(1))


def node_args(args, mode):
    return [sys.executable, HERE, "--node", mode, "--model", args.model_one,
            "--steps", str(args.steps), "--warmup", str(args.warmup)]


def run_ddp(args, workers):
    port = free_port()
    procs = []
    for rank in range(workers):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   WORLD_SIZE=str(workers), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(workers),
                   OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(node_args(args, "ddp"), env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=args.timeout)[0] for p in procs]
    for p, out in zip(procs, outs):
        if p.returncode != 0:
            sys.exit(f"DDP rank failed ({p.returncode}):\n{out}")
    return step_ms(outs[0], "DDP")


def run_pslite(args, workers, shm, colocate=False):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env = {k: v for k, v in env.items() if not k.startswith(("DMLC_", "PS_"))}
    if not shm:
        env["PS_SHM"] = "0"
    shape = ["--colocate"] if colocate else ["-s", str(args.servers)]
    cmd = [sys.executable, "-m", "pslite", "launch", *shape, "-w", str(workers),
           "--timeout", str(args.timeout), "--", *node_args(args, "pslite")]
    run = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, timeout=args.timeout + 30)
    if run.returncode != 0:
        sys.exit(f"pslite launch failed ({run.returncode}):\n{run.stdout}")
    return step_ms(run.stdout, "pslite")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="small,large")
    ap.add_argument("--workers", default="2,4")
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--colocate", action="store_true",
                    help="also run pslite with its servers in the workers' processes "
                         "(`pslite launch --colocate`), with shared memory and with PS_SHM=0")
    ap.add_argument("--node", choices=["ddp", "pslite"], help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.node == "ddp":
        return node_ddp(args)
    if args.node == "pslite":
        return node_pslite(args)
    for model in args.models.split(","):
        args.model_one = model
        for workers in [int(w) for w in args.workers.split(",")]:
            runs = {"ddp": [], "ps": [], "ps0": []}
            if args.colocate:
                runs.update(col=[], col0=[])
            for _ in range(args.repeat):
                runs["ddp"].append(run_ddp(args, workers))
                runs["ps"].append(run_pslite(args, workers, shm=True))
                runs["ps0"].append(run_pslite(args, workers, shm=False))
                if args.colocate:
                    runs["col"].append(run_pslite(args, workers, shm=True, colocate=True))
                    runs["col0"].append(run_pslite(args, workers, shm=False, colocate=True))
            print(f"# {model} W={workers} runs (ms): "
                  + "  ".join(f"{k} {' '.join(f'{v:.0f}' for v in vs)}" for k, vs in runs.items()),
                  flush=True)
            ddp, ps, ps0 = (statistics.median(runs[k]) for k in ("ddp", "ps", "ps0"))
            colocated = ""
            if args.colocate:
                col, col0 = (statistics.median(runs[k]) for k in ("col", "col0"))
                colocated = (f" pslite_colocated_ms={col:.1f} pslite_colocated_shm0_ms={col0:.1f}"
                             f"  (colocated/DDP {col / ddp:.2f}, PS_SHM=0 {col0 / ddp:.2f})")
            print(f"RESULT torch {model} W={workers} ddp_ms={ddp:.1f} pslite_ms={ps:.1f} "
                  f"pslite_shm0_ms={ps0:.1f}  (pslite/DDP {ps / ddp:.2f}, "
                  f"PS_SHM=0 {ps0 / ddp:.2f}){colocated}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
