#!/usr/bin/env python3
"""PyTorch data parallelism across hosts at link speed (issue 39): torch's
DistributedDataParallel against `pslite.torch.DistributedOptimizer`, with
every process in its own network namespace (its "host") and each link
limited by tbf to RATE Gbit/s each way (tests/bench/links.py's network).

In one run, for each rate, model and number of workers W:
- `ddp`: torch.distributed with gloo, one rank per namespace, started with
  torchrun's variables (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE,
  LOCAL_RANK, LOCAL_WORLD_SIZE);
- pslite, in each mode of MODES: `servers` (S servers in namespaces of
  their own, `pslite torch-server`, plain float32 gradients), `fp16` and
  `bf16` (the same, gradients cast to 16 bits on the wire both ways),
  `onebit` (signs and a scale both ways, with error feedback),
  `colocated` (no server processes: each worker's process also serves a
  slice of the keys, PSLITE_COLOCATE=1, as `pslite launch --colocate`).
  Modes not built yet (`hosts`) are listed and skipped silently.

Models: python/examples/torch_bench.py's `large` (six 2048x2048 layers:
100 MB of float32 gradients a step, batch 8) and `resnet18` (torchvision's
when it imports, else the same layers built here: 11.7 M parameters, 47 MB;
inputs 3x32x32, batch 8, so that the step is the network's, not the CPU's).
Every process runs torch with one thread. A step is zero_grad, forward,
backward (both overlap the exchange with it) and the optimizer step; rank 0
reports its median step after --warmup steps. DDP and the modes run in turn
--repeat times and each figure is the median of its runs. Prints a table
and, per mode:

    RESULT torch_links rate=<g> model=<m> W=<w> mode=<mode> ddp_ms= pslite_ms= wire_ms=
        ddp_wire_ms= compute_ms=

`wire_ms` is the mode's bytes on its busiest link (one direction) x 8 /
rate, computed from DistributedOptimizer's plan (parts of
PSLITE_PARTITION_BYTES, each on the server with the fewest values so far): each worker sends and
receives every gradient once; each server receives and answers its parts
from every worker. `ddp_wire_ms` is a ring all-reduce's, 2 (W - 1) / W of
the gradients each way per rank. `compute_ms` is rank 0's step without any
exchange (measured in every run before the exchange starts, the other
ranks computing at the same time). Speed is never asserted: the script fails
only when something does not run. Needs root (ip netns, tc), the release
binaries (`cargo build --release --bins`) and a Python with torch and
pslite (`python/test.sh` installs it in its venv; run the script with that
venv's python, or give --python). Namespaces are removed at exit, also on
failure or Ctrl-C; those an earlier killed run left are removed at start.

    tests/bench/torch_links.py [--rate 1] [--rate 5] [--models large,resnet18]
                               [--workers 2,4] [--modes servers,fp16,bf16,onebit]
                               [--steps 8] [--repeat 1] [--env VAR=VALUE] [--small]
"""

import argparse
import atexit
import datetime
import os
import pathlib
import re
import signal
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve()
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(ROOT / "python" / "examples"))
import links  # noqa: E402  (Network, Node, namespaces' clean-up)
import summary  # noqa: E402  (load)

#: pslite's modes: compression spec and placement. None: not built yet
#: (listed so that a new mode is one line here and one in `wire_bytes`).
MODES = {
    "servers": {"compression": None},
    "fp16": {"compression": "fp16"},
    "bf16": {"compression": "bf16"},
    "onebit": {"compression": "onebit"},
    "colocated": {"compression": None, "colocate": True},  # servers inside the workers
    "hosts": None,  # issue 39 item 4: a reduction per host first
}
DEFAULT_MODES = [m for m, spec in MODES.items() if spec is not None]
PARTITION_BYTES = 4_096_000  # pslite.torch.DEFAULT_PARTITION_BYTES
MIN_VALUES = 16  # pslite::compression::MIN_VALUES: smaller parts go plain


# ------------------------------------------------------------------ models

def resnet18():
    """ResNet-18 for ImageNet's 1000 classes: torchvision's, or the same
    layers (the same parameter shapes, in the same order) built here."""
    import torch
    from torch import nn

    try:
        import torchvision  # noqa: F401
        return torchvision.models.resnet18(), "torchvision"
    except Exception:  # not installed, or not importable here (no PIL)
        pass

    def conv_bn(cin, cout, k, stride):
        return [nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout)]

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1, self.bn1 = conv_bn(cin, cout, 3, stride)
            self.conv2, self.bn2 = conv_bn(cout, cout, 3, 1)
            self.downsample = (nn.Sequential(*conv_bn(cin, cout, 1, stride))
                               if stride != 1 or cin != cout else None)

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return torch.relu(y + (x if self.downsample is None else self.downsample(x)))

    class ResNet18(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = conv_bn(3, 64, 7, 2)
            widths, cin = (64, 128, 256, 512), 64
            for i, w in enumerate(widths):
                stride = 1 if i == 0 else 2
                setattr(self, f"layer{i + 1}", nn.Sequential(Block(cin, w, stride), Block(w, w, 1)))
                cin = w
            self.fc = nn.Linear(512, 1000)

        def forward(self, x):
            x = torch.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 3, 2, 1)
            for i in range(4):
                x = getattr(self, f"layer{i + 1}")(x)
            return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))

    return ResNet18(), "built here"


def build(name):
    """(model, input shape, classes, batch, where the model comes from)."""
    if name == "resnet18":
        model, origin = resnet18()
        return model, (3, 32, 32), 1000, 8, origin
    import torch_bench
    model, inp, classes, batch = torch_bench.build(name)
    return model, (inp,), classes, batch, "torch_bench.py"


def train(model, opt, shape, classes, batch, steps, warmup, rank):
    import torch

    g = torch.Generator().manual_seed(rank)
    x = torch.randn(batch, *shape, generator=g)
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


def node(args):
    """One rank, in its namespace: DDP or a pslite worker."""
    import torch

    torch.set_num_threads(1)
    model, shape, classes, batch, origin = build(args.model)
    # The step without any exchange (every rank computes at once, as in
    # the runs): what the exchange adds is the rest.
    plain = torch.optim.SGD(model.parameters(), lr=0.0)
    compute = train(model, plain, shape, classes, batch, 3, 1, 0)
    if args.node == "ddp":
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank = dist.get_rank()
        net = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        ms = train(net, opt, shape, classes, batch, args.steps, args.warmup, rank)
        dist.destroy_process_group()
    else:
        import pslite.torch as pt

        pt.init()
        rank = pt.rank()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        compression = None if args.compression == "none" else args.compression
        opt = pt.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                      compression=compression)
        pt.broadcast_parameters(model.state_dict(), root_rank=0)
        ms = train(model, opt, shape, classes, batch, args.steps, args.warmup, rank)
        pt.shutdown()
    if rank == 0:
        print(f"STEP_MS {ms:.2f} COMPUTE_MS {compute:.2f} (model from {origin})", flush=True)


# --------------------------------------------------------------- the wire

def part_sizes(name, partition_bytes=PARTITION_BYTES):
    """Values of every part DistributedOptimizer cuts `name`'s gradients
    into, in plan order (model order; every parameter float32)."""
    model = build(name)[0]
    per_part = partition_bytes // 4
    out = []
    for p in model.parameters():
        if p.requires_grad:
            out += [min(per_part, p.numel() - at) for at in range(0, p.numel(), per_part)]
    return out


def wire_bytes(mode, n):
    """Bytes of a part of `n` float32 values on the wire in `mode` (the
    values frame; keys and metas are a few dozen bytes a part)."""
    if mode in ("servers", "colocated") or n < MIN_VALUES:
        return 4 * n
    if mode in ("fp16", "bf16"):
        return 2 * n
    if mode == "onebit":
        return 4 + (n + 7) // 8
    raise ValueError(f"no wire model for mode {mode}")


def placement(parts, servers):
    """The server of each part, as pslite.torch places them: on the server
    with the fewest values so far (the lowest rank of those)."""
    load, out = [0] * servers, []
    for n in parts:
        j = min(range(servers), key=lambda i: (load[i], i))
        load[j] += n
        out.append(j)
    return out


def wire_ms(mode, parts, workers, servers, gbit):
    """The busiest link's bytes in one direction x 8 / rate: a worker's
    (every part once each way) or a server's (its parts, from and to every
    worker)."""
    per_server = [0] * servers
    for server, n in zip(placement(parts, servers), parts):
        per_server[server] += wire_bytes(mode, n)
    worker = sum(wire_bytes(mode, n) for n in parts)
    if MODES[mode].get("colocate"):
        # A worker's host also holds server j: out go its parts for the
        # other servers and its server's answers to the other workers.
        busiest = max(worker - mine + (workers - 1) * mine for mine in per_server)
        return busiest * 8 / (gbit * 1e9) * 1e3
    busiest = max(worker, workers * max(per_server))
    return busiest * 8 / (gbit * 1e9) * 1e3


def ring_ms(parts, workers, gbit):
    """A ring all-reduce's busiest link: 2 (W - 1) / W of the gradients."""
    total = 4 * sum(parts)
    return 2 * (workers - 1) / workers * total * 8 / (gbit * 1e9) * 1e3


# --------------------------------------------------------------- the runs

class Bench:
    def __init__(self, args, net, logs):
        self.args, self.net, self.logs = args, net, logs
        self.pslite = pathlib.Path(args.bin_dir) / "pslite"
        self.port = 29400 + os.getpid() % 1000
        self.runs = 0
        self.compute = []  # rank 0's step without exchange, every run
        self.env = dict(kv.split("=", 1) for kv in args.env or [])

    def node_argv(self, model, mode, compression="none"):
        return [self.args.python, HERE, "--node", mode, "--model", model,
                "--compression", compression, "--steps", self.args.steps,
                "--warmup", self.args.warmup]

    def start(self, nodes, i, label, env, argv):
        env = dict(env, OMP_NUM_THREADS=1, HOME=os.environ.get("HOME", "/root"), **self.env)
        nodes.append(links.Node(self.net, i, f"{self.runs:03d}-{label}", env, argv, self.logs))

    def finish(self, nodes):
        """Waits for every node; rank 0's step time (it prints it)."""
        try:
            deadline = time.monotonic() + self.args.timeout
            failed = [n for n in nodes if n.wait(deadline) != 0]
            if failed:
                raise RuntimeError(f"{', '.join(n.name for n in failed)} failed; last lines of "
                                   f"{failed[0].log}:\n"
                                   + "\n".join(failed[0].text().splitlines()[-15:]))
            for n in nodes:
                m = re.search(r"STEP_MS ([0-9.]+) COMPUTE_MS ([0-9.]+)", n.text())
                if m:
                    self.compute.append(float(m.group(2)))
                    return float(m.group(1))
            raise RuntimeError(f"no STEP_MS line in {[str(n.log) for n in nodes]}")
        finally:
            for n in nodes:
                if n.proc.poll() is None:
                    n.kill()
            self.net.reap()

    def ddp(self, model, workers):
        """W ranks in the workers' namespaces (1 + S .. S + W)."""
        self.runs += 1
        self.port += 1
        first = 1 + self.args.servers_for(workers)
        nodes = []
        for rank in range(workers):
            env = {"MASTER_ADDR": self.net.ip(first), "MASTER_PORT": self.port, "RANK": rank,
                   "WORLD_SIZE": workers, "LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 1,
                   "GLOO_SOCKET_IFNAME": "net0"}
            self.start(nodes, first + rank, f"ddp-{model}-W{workers}-rank{rank}", env,
                       self.node_argv(model, "ddp"))
        return self.finish(nodes)

    def pslite_run(self, model, workers, mode):
        """Scheduler in namespace 0, S servers in 1..S (native
        `pslite torch-server`), W workers after them."""
        self.runs += 1
        self.port += 1
        servers = self.args.servers_for(workers)
        compression = MODES[mode]["compression"] or "none"
        colocate = MODES[mode].get("colocate", False)
        common = {"DMLC_NUM_SERVER": workers if colocate else servers, "DMLC_NUM_WORKER": workers,
                  "DMLC_PS_ROOT_URI": self.net.ip(0), "DMLC_PS_ROOT_PORT": self.port,
                  "PS_START_TIMEOUT": 120}
        nodes = []
        roles = ["scheduler"] + ["server"] * servers + ["worker"] * workers
        for i, role in enumerate(roles):
            if colocate and role == "server":
                continue  # the workers' processes serve (PSLITE_COLOCATE=1)
            env = dict(common, DMLC_ROLE=role, DMLC_NODE_HOST=self.net.ip(i))
            if colocate and role == "worker":
                env["PSLITE_COLOCATE"] = 1
            argv = {"scheduler": [self.pslite, "scheduler"],
                    "server": [self.pslite, "torch-server"]}.get(
                        role, self.node_argv(model, "pslite", compression))
            self.start(nodes, i, f"{mode}-{model}-W{workers}-{role}{i}", env, argv)
        return self.finish(nodes)

    def one(self, rate, model, workers):
        """DDP and every mode, --repeat times in turn; RESULT lines."""
        servers = self.args.servers_for(workers)
        parts = part_sizes(model, int(self.env.get("PSLITE_PARTITION_BYTES", PARTITION_BYTES)))
        runs = {"ddp": []} | {m: [] for m in self.args.modes}
        self.compute = []
        for r in range(self.args.repeat):
            log(f"rate {rate} Gbit/s, {model}, W={workers}, S={servers}: run {r + 1}")
            runs["ddp"].append(self.ddp(model, workers))
            for mode in self.args.modes:
                runs[mode].append(self.pslite_run(model, workers, mode))
        ddp = statistics.median(runs["ddp"])
        ring = ring_ms(parts, workers, rate)
        rows = []
        for mode in self.args.modes:
            ps = statistics.median(runs[mode])
            on = workers if MODES[mode].get("colocate") else servers
            wire = wire_ms(mode, parts, workers, on, rate)
            rows.append((mode, ps, wire))
            print(f"RESULT torch_links rate={rate} model={model} W={workers} mode={mode} "
                  f"ddp_ms={ddp:.1f} pslite_ms={ps:.1f} wire_ms={wire:.1f} ddp_wire_ms={ring:.1f} "
                  f"compute_ms={statistics.median(self.compute):.1f}", flush=True)
        runs_text = "  ".join(f"{k} {' '.join(f'{v:.0f}' for v in vs)}" for k, vs in runs.items())
        log(f"  runs (ms): {runs_text}")
        return (rate, model, workers, servers, ddp, ring, rows, sum(parts) * 4 / 1e6)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def table(rows, origin):
    print("\n| rate | model | W, S | mode | DDP ms | pslite ms | pslite / DDP | wire ms "
          "| pslite / wire | DDP / its wire |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for rate, model, w, s, ddp, ring, modes, mb in rows:
        for mode, ps, wire in modes:
            print(f"| {rate} | {model} ({mb:.0f} MB) | {w}, {s} | {mode} | {ddp:.0f} | {ps:.0f} "
                  f"| {ps / ddp:.2f} | {wire:.0f} | {ps / wire:.2f} | {ddp / ring:.2f} |")
    print(f"\n(resnet18: {origin})" if origin else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", action="append", help="link rate in Gbit/s (repeat or comma-separate)")
    ap.add_argument("--models", default="large,resnet18")
    ap.add_argument("--workers", default="2,4")
    ap.add_argument("--servers", type=int, default=0, help="servers (default: as many as workers)")
    ap.add_argument("--modes", default=",".join(DEFAULT_MODES),
                    help=f"pslite's modes, of {', '.join(MODES)} (modes not built yet are skipped)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=600, help="seconds a run may take")
    ap.add_argument("--python", default=sys.executable, help="a Python with torch and pslite")
    ap.add_argument("--bin-dir", default=str(ROOT / "target" / "release"))
    ap.add_argument("--small", action="store_true",
                    help="CI: the small model, W=2, 1 Gbit/s, a few steps (figures mean little)")
    ap.add_argument("--keep-logs", action="store_true")
    ap.add_argument("--env", action="append", metavar="VAR=VALUE",
                    help="an environment variable for every process (e.g. PSLITE_PARTITION_BYTES=)")
    ap.add_argument("--node", choices=["ddp", "pslite"], help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--compression", default="none", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.node:
        return node(args)
    if args.small:
        args.models, args.workers, args.rate = "small", "2", ["1"]
        args.steps, args.warmup, args.timeout = 4, 1, 120
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        sys.exit(f"--modes: unknown {', '.join(unknown)} (known: {', '.join(MODES)})")
    args.modes = [m for m in modes if MODES[m] is not None]
    args.servers_for = lambda w: args.servers or w
    for kv in args.env or []:
        if "=" not in kv:
            sys.exit(f"--env {kv}: expected VAR=VALUE")
    rates = links.parse_rates(args.rate)
    workers = [int(w) for w in args.workers.split(",")]
    if os.geteuid() != 0:
        if args.small:
            print("SKIP torch_links.py --small: needs root (ip netns, tc)")
            return 0
        sys.exit("torch_links.py needs root (ip netns, tc)")
    if not (pathlib.Path(args.bin_dir) / "pslite").exists():
        sys.exit(f"{args.bin_dir}/pslite is missing: cargo build --release --bins")
    check = subprocess.run([args.python, "-c", "import torch, pslite.torch"], capture_output=True,
                           text=True)
    if check.returncode != 0:
        sys.exit(f"{args.python} cannot import torch and pslite.torch (give --python):\n"
                 + check.stderr[-500:])

    links.sweep_stale()
    logs = pathlib.Path(subprocess.run(["mktemp", "-d", "/tmp/pslite-torch-links.XXXXXX"],
                                       capture_output=True, text=True, check=True).stdout.strip())
    most = max(workers)
    net = links.Network(nodes=1 + max(args.servers_for(w) for w in workers) + most)
    ok = False

    def cleanup():
        net.teardown()
        if ok and not args.keep_logs:
            subprocess.run(["rm", "-rf", str(logs)])
        else:
            log(f"logs: {logs}")

    atexit.register(cleanup)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: sys.exit(128 + signum))
    commit = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                            capture_output=True, text=True).stdout.strip()
    start = datetime.datetime.now(datetime.timezone.utc)
    print(f"# PyTorch across hosts\n\nMeasured {start:%Y-%m-%d %H:%M} UTC at {commit}, "
          f"{os.cpu_count()} cores, load average {summary.load()} at start; every process in its "
          f"own network namespace, each link limited by tbf each way; {args.steps} steps after "
          f"{args.warmup}, median of rank 0, median of {args.repeat} run(s).\n", flush=True)
    net.setup()
    bench = Bench(args, net, logs)
    rows = []
    for rate in rates:
        net.limit(rate)
        for model in args.models.split(","):
            for w in workers:
                rows.append(bench.one(rate, model, w))
    table(rows, resnet18()[1] if "resnet18" in args.models.split(",") else "")
    print(f"\nload average at the end: {summary.load()}")
    ok = True
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RuntimeError as e:
        sys.exit(f"torch_links.py: {e}")
