#!/usr/bin/env python3
"""Embedding tables larger than a worker (issue 41 item 3): a table of
--rows rows of --dim float32 values held by --servers servers of a
`pslite launch --torch` job, made by --workers workers that each touch
their share of the ids in chunks and then train on random ids all over the
table, while each worker stays small. Prints

    RESULT emb_size rows=R dim=D row_gb=.. servers=S workers=W store_bytes_per_row=..
        server_rss_bytes_per_row=.. target_bytes_per_row=.. worker_rss_mb=.. fill_s=.. steps_per_s=..

row_gb is the rows' own bytes (rows * dim * 4); store_bytes_per_row what the
servers' stores allocated for them (slab, optimizer state, index);
server_rss_bytes_per_row how much the servers' resident memory grew a row;
target_bytes_per_row the issue's 1.2 * dim * 4 + 16 (row-wise AdaGrad's
state included in the store); worker_rss_mb the largest worker's peak
resident memory (ru_maxrss). The default, 16.8 M rows of dim 64, is 4.3 GB
of rows on 4 servers (about 5 GB of memory in all); `--rows 200000` is a
quick check; `EMB_SIZE_TRACE=1` prints each worker's resident, anonymous
and shared memory every 8 pulls of the fill. Run from the repository, with a Python that has torch; the
`pslite` command comes from --pslite (default target/release/pslite).
"""

import argparse
import os
import re
import resource
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rss_now_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def worker(args):
    import torch

    import pslite.torch as pt

    pt.init()
    r, w = pt.rank(), pt.size()
    emb = pt.Embedding(args.dim, optimizer=pt.RowWiseAdaGrad(lr=0.05),
                       init=("uniform", -0.05, 0.05), name="big")
    before = pt.embedding_stats()
    at_init = rss_now_mb()
    pt.barrier()
    t0 = time.perf_counter()
    # Worker r makes rows r, r + w, r + 2w, ...: every row once in all.
    with torch.no_grad():
        for at in range(r, args.rows, w * args.chunk):
            emb(torch.arange(at, min(args.rows, at + w * args.chunk), w, dtype=torch.int64))
            if os.environ.get("EMB_SIZE_TRACE") and (at // (w * args.chunk)) % 8 == 0:
                st = dict(line.split(":", 1) for line in open("/proc/self/status"))
                print(f"TRACE rank={r} at={at} rss_mb={rss_now_mb():.0f} anon={st['RssAnon'].strip()} "
                      f"shmem={st['RssShmem'].strip()} threads={st['Threads'].strip()}", flush=True)
    emb.flush()
    pt.barrier()
    fill = time.perf_counter() - t0
    after_fill = rss_now_mb()
    # Training steps on ids drawn from the whole table: pulls, pooled
    # loss, pushes of the rows' gradients to the servers.
    gen = torch.Generator().manual_seed(r)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        ids = torch.randint(0, args.rows, (args.batch,), generator=gen)
        loss = emb(ids).square().sum()
        loss.backward()
    emb.flush()
    pt.barrier()
    steps = args.steps / (time.perf_counter() - t0)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"WORKER rank={r} rss_mb={rss_mb:.1f} after_init_mb={at_init:.1f} "
          f"after_fill_mb={after_fill:.1f} after_steps_mb={rss_now_mb():.1f}", flush=True)
    if r == 0:
        after = pt.embedding_stats()
        made = sum(a["rows"] - b["rows"] for a, b in zip(after, before))
        store = sum(a["store_bytes"] - b["store_bytes"] for a, b in zip(after, before))
        rss = sum(a["rss_bytes"] - b["rss_bytes"] for a, b in zip(after, before))
        assert made == args.rows, (made, args.rows)
        print(f"SERVERS rows={made} store_bytes_per_row={store / made:.1f} "
              f"server_rss_bytes_per_row={rss / made:.1f} fill_s={fill:.1f} "
              f"steps_per_s={steps:.1f}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=16_777_216)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=65_536, help="ids a worker pulls at once")
    ap.add_argument("--steps", type=int, default=50, help="training steps after the fill")
    ap.add_argument("--batch", type=int, default=16_384, help="ids a training step touches")
    ap.add_argument("--pslite", default=os.path.join(REPO, "target", "release", "pslite"))
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--env", action="append", default=[], metavar="VAR=VALUE",
                    help="a variable for every node (e.g. PS_MALLOC_TUNE=0)")
    ap.add_argument("--run", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run:
        return worker(args)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_"))}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    for kv in args.env:
        var, eq, value = kv.partition("=")
        if not eq:
            sys.exit(f"--env {kv}: expected VAR=VALUE")
        env[var] = value
    cmd = [args.pslite, "launch", "--torch", "-s", str(args.servers), "-w", str(args.workers),
           "--", sys.executable, os.path.abspath(__file__), "--run",
           "--rows", str(args.rows), "--dim", str(args.dim), "--chunk", str(args.chunk),
           "--steps", str(args.steps), "--batch", str(args.batch)]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    out = run.stdout + run.stderr
    servers = re.search(r"SERVERS rows=(\d+) (.*)", run.stdout)
    workers = [float(m) for m in re.findall(r"WORKER rank=\d+ rss_mb=([0-9.]+)", run.stdout)]
    if run.returncode != 0 or not servers or len(workers) != args.workers:
        sys.exit(f"emb_size: the job failed (exit {run.returncode}):\n{out[-4000:]}")
    for line in re.findall(r"(?:WORKER|TRACE) .*", run.stdout):
        print(line, flush=True)
    row_gb = args.rows * args.dim * 4 / 1e9
    print(f"RESULT emb_size rows={args.rows} dim={args.dim} row_gb={row_gb:.2f} "
          f"servers={args.servers} workers={args.workers} {servers.group(2)} "
          f"target_bytes_per_row={1.2 * args.dim * 4 + 16:.1f} "
          f"worker_rss_mb={max(workers):.0f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
