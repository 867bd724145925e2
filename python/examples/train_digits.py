#!/usr/bin/env python3
"""A small convolutional network on scikit-learn's bundled digits, trained
data-parallel through pslite's servers with `pslite.torch`:

    pslite launch -s 2 -w 2 -- python python/examples/train_digits.py

The data set is the 1 797 8x8 handwritten digits that ship inside
scikit-learn (`sklearn.datasets.load_digits`: nothing is downloaded), split
once (seeded) into 1 437 training and 360 test images. Every worker trains
on its own shard of the training set; `DistributedOptimizer` averages the
gradients over the workers through the servers before each step, so each
step is one step of the global batch (--batch images over all workers).
Rank 0's initial model and optimizer state are broadcast first, so every
worker holds the same model throughout. After training each worker
measures test accuracy and the job exits 0 only if it reaches --threshold
(0.95; an untrained network gets about 0.1). With --compression NAME the
gradients travel compressed (see `pslite.Compression`), with momentum
correction (the workers apply SGD's momentum before compressing; off with
--momentum-correction off).

Needs torch and scikit-learn (``pip install torch scikit-learn``).
"""

import argparse
import importlib.util
import os
import sys
import time

import numpy as np
import torch

import pslite
import pslite.torch as pt


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = torch.nn.Linear(32 * 4 * 4, 64)
        self.fc2 = torch.nn.Linear(64, 10)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def digits():
    """scikit-learn's bundled digits as (images (n, 8, 8), labels (n,)), read
    straight from the file inside the installed package: importing sklearn
    costs each worker a second or more of start-up."""
    spec = importlib.util.find_spec("sklearn")
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(root, "datasets", "data", "digits.csv.gz")
        if os.path.exists(path):
            table = np.loadtxt(path, delimiter=",")
            return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits  # a layout without the file

    bunch = load_digits()
    return bunch.images, bunch.target


def data():
    images, target = digits()
    x = torch.from_numpy((images / 16.0).astype(np.float32)).unsqueeze(1)
    y = torch.from_numpy(target.astype(np.int64))
    order = torch.from_numpy(np.random.default_rng(0).permutation(len(y)))
    test = order[:360]
    train = order[360:]
    return x[train], y[train], x[test], y[test]


def accuracy(model, x, y):
    with torch.no_grad():
        return (model(x).argmax(dim=1) == y).float().mean().item()


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--batch", type=int, default=64, help="global batch (all workers)")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--threshold", type=float, default=0.95)
    ap.add_argument("--compression", default=None,
                    help="compress the gradients: onebit, topk[:K], randomk[:K] or 2bit[:T] "
                         "(error feedback on the workers; the servers' sums come back "
                         "compressed too)")
    ap.add_argument("--momentum-correction", choices=("auto", "on", "off"), default="auto",
                    help="with --compression: the workers apply SGD's momentum before "
                         "compressing (Deep Gradient Compression's momentum correction; auto: "
                         "on with a compressor) or not (off: the optimizer's own momentum)")
    ap.add_argument("--momentum-masking", action="store_true",
                    help="with momentum correction and topk/randomk: clear the velocity where "
                         "a value was sent (Deep Gradient Compression's momentum factor masking)")
    args = ap.parse_args()

    pt.init()  # servers and the scheduler serve here, then exit
    rank, size = pt.rank(), pt.size()
    torch.manual_seed(1000 + rank)  # different initial models: the broadcast makes them one
    torch.set_num_threads(1)

    def log(msg):
        print(f"worker {rank}: {msg}", flush=True)

    x, y, test_x, test_y = data()
    # Every worker takes the same number of steps per epoch (a round of the
    # servers' sums needs every worker): as many as the smallest shard has.
    smallest = len(y) // size
    shard = torch.arange(rank, len(y), size)
    x, y = x[shard], y[shard]
    local = max(1, args.batch // size)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    compression = args.compression
    if compression and args.momentum_masking:
        compression = pslite.Compression(compression, compress_answers=True,
                                         momentum_masking=True)
    opt = pt.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                  compression=compression,
                                  momentum_correction={"auto": None, "on": True,
                                                       "off": False}[args.momentum_correction])
    pt.broadcast_parameters(model.state_dict(), root_rank=0)
    pt.broadcast_optimizer_state(opt, root_rank=0)
    log(f"compression {args.compression or 'none'}, momentum correction "
        f"{'on' if opt.momentum_correction else 'off'}"
        f"{' with masking' if args.momentum_masking and opt.momentum_correction else ''}")
    log(f"{len(y)} training images in my shard, batches of {local} (global {local * size}); "
        f"before training: test accuracy {accuracy(model, test_x, test_y):.4f}")
    steps = smallest // local
    t = time.time()
    for epoch in range(1, args.epochs + 1):
        perm = torch.from_numpy(np.random.default_rng(epoch * 100 + rank).permutation(len(y)))
        model.train()
        total = 0.0
        for step in range(steps):
            idx = perm[step * local:(step + 1) * local]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            total += loss.item()
        log(f"epoch {epoch}/{args.epochs}: mean loss {total / steps:.4f}, "
            f"test accuracy {accuracy(model, test_x, test_y):.4f}")
    acc = accuracy(model, test_x, test_y)
    ok = acc >= args.threshold
    log(f"test accuracy {acc:.4f} after {time.time() - t:.1f} s (threshold {args.threshold}): "
        f"{'ok' if ok else 'BELOW THRESHOLD'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
