#!/usr/bin/env python3
"""python/examples/dlrm.py across hosts (issue 41 item 4): the same DLRM
trained by pslite and by TorchRec with every process in its own network
namespace (its "host") and each link limited by tbf to RATE Gbit/s each way
(tests/bench/links.py's network), in one run.

- pslite: the scheduler in namespace 0, S servers (`pslite torch-server`,
  the tables' rows) in 1..S, W workers (`dlrm.py --run pslite`) after them;
- TorchRec: W gloo ranks (`dlrm.py --run torchrec`, torchrun-style address
  of rank 0) in the workers' namespaces, the tables sharded over the ranks.

Prints each trainer's RESULT line and, per W,

    RESULT dlrm_links rate=<g> rows=R W=W pslite_sps= torchrec_sps= pslite_auc= torchrec_auc=
        worker_rss_mb=

Arguments it does not know go to dlrm.py's trainers as they are (e.g.
`--rows 1000000 --samples 262144`, `--small`). Speed is never asserted: the
script fails only when a trainer does not run. Needs root (ip netns, tc),
`target/release/pslite`, a Python with torch and pslite (--python; python/
test.sh's venv) and the TorchRec venv of python/examples/torchrec_venv.sh
(--torchrec-python; without it only pslite runs, and the summary says so).
Namespaces are removed at exit, also on failure.

    tests/bench/dlrm_links.py [--rate 1] [--workers 2,4] [--servers 2] [dlrm.py options]
"""

import argparse
import atexit
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DLRM = ROOT / "python" / "examples" / "dlrm.py"
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(DLRM.parent))
import links  # noqa: E402
from dlrm import field  # noqa: E402


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run(net, logs, label, nodes_spec, timeout, trainer):
    """Starts (namespace, env, argv) nodes; waits; the trainer's RESULT line."""
    nodes = []
    try:
        for n, (i, env, argv) in enumerate(nodes_spec):
            env = dict(env, OMP_NUM_THREADS=1, HOME=os.environ.get("HOME", "/root"))
            nodes.append(links.Node(net, i, f"{label}-{n}", env, argv, logs))
        deadline = time.monotonic() + timeout
        failed = [x for x in nodes if x.wait(deadline) != 0]
        if failed:
            tail = "\n".join(failed[0].text().splitlines()[-15:])
            raise RuntimeError(f"{failed[0].name} failed ({failed[0].log}):\n{tail}")
        for x in nodes:
            for line in x.text().splitlines():
                at = line.find("RESULT dlrm ")
                if at >= 0 and f" trainer={trainer} " in line:
                    return line[at:]
        raise RuntimeError(f"{label}: no RESULT line in {[str(x.log) for x in nodes]}")
    finally:
        for x in nodes:
            if x.proc.poll() is None:
                x.kill()
        net.reap()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=1.0, help="Gbit/s each way on every link")
    ap.add_argument("--workers", default="2,4")
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--python", default=sys.executable, help="a Python with torch and pslite")
    ap.add_argument("--torchrec-python", default="~/.cache/pslite/torchrec-venv/bin/python")
    ap.add_argument("--pslite", default=str(ROOT / "target" / "release" / "pslite"))
    ap.add_argument("--timeout", type=float, default=1800, help="seconds a trainer may take")
    args, rest = ap.parse_known_args()
    workers = [int(w) for w in args.workers.split(",") if w]
    if os.geteuid() != 0:
        sys.exit("dlrm_links.py needs root (ip netns, tc)")
    if not os.access(args.pslite, os.X_OK):
        sys.exit(f"{args.pslite} is missing: cargo build --release --bins")
    torchrec = os.path.expanduser(args.torchrec_python)
    why_not = None
    if not os.access(torchrec, os.X_OK):
        why_not = f"{torchrec} is missing (python/examples/torchrec_venv.sh makes it)"
    links.sweep_stale()
    logs = pathlib.Path(tempfile.mkdtemp(prefix="pslite-dlrm-links."))
    net = links.Network(nodes=1 + args.servers + max(workers))
    ok = False

    def cleanup():
        net.teardown()
        log(f"logs: {logs}" if not ok else "")

    atexit.register(cleanup)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: sys.exit(128 + signum))
    net.setup()
    net.limit(args.rate)
    port = 29500 + os.getpid() % 1000
    for w in workers:
        port += 1
        first = 1 + args.servers
        common = {"DMLC_NUM_SERVER": args.servers, "DMLC_NUM_WORKER": w,
                  "DMLC_PS_ROOT_URI": net.ip(0), "DMLC_PS_ROOT_PORT": port,
                  "PS_START_TIMEOUT": 120}
        spec = [(0, dict(common, DMLC_ROLE="scheduler", DMLC_NODE_HOST=net.ip(0)),
                 [args.pslite, "scheduler"])]
        spec += [(1 + s, dict(common, DMLC_ROLE="server", DMLC_NODE_HOST=net.ip(1 + s)),
                  [args.pslite, "torch-server"]) for s in range(args.servers)]
        spec += [(first + r, dict(common, DMLC_ROLE="worker", DMLC_NODE_HOST=net.ip(first + r)),
                  [args.python, DLRM, "--run", "pslite", *rest]) for r in range(w)]
        log(f"{args.rate} Gbit/s, W={w}: pslite")
        ps = run(net, logs, f"pslite-W{w}", spec, args.timeout, "pslite")
        print(ps, flush=True)
        tr = None
        if why_not is None:
            port += 1
            spec = [(first + r, {"GLOO_SOCKET_IFNAME": "net0"},
                     [torchrec, DLRM, "--run", "torchrec", "--rank", r, "--world", w,
                      "--port", port, "--master-addr", net.ip(first), *rest])
                    for r in range(w)]
            log(f"{args.rate} Gbit/s, W={w}: torchrec")
            tr = run(net, logs, f"torchrec-W{w}", spec, args.timeout, "torchrec")
            print(tr, flush=True)
        summary = (f"RESULT dlrm_links rate={args.rate:g} rows={field(ps, 'rows')} W={w} "
                   f"pslite_sps={field(ps, 'sps')} torchrec_sps={field(tr, 'sps')} "
                   f"pslite_auc={field(ps, 'auc')} torchrec_auc={field(tr, 'auc')} "
                   f"worker_rss_mb={field(ps, 'worker_rss_mb')}")
        print(summary + (f"  (torchrec: {why_not})" if why_not else ""), flush=True)
    ok = True
    return 0


if __name__ == "__main__":
    sys.exit(main())
