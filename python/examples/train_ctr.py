#!/usr/bin/env python3
"""A click-through-rate model trained through pslite: the parameters live on
the servers (AdaGrad applied there, as in `pslite demo`), the model runs in
NumPy on the workers.

    pslite launch -s 2 -w 2 -- python python/examples/train_ctr.py

Data (synthetic, every worker its own shard from a seed): each sample has
FIELDS categorical feature ids drawn from a power law over FEATURES hashed
ids; its click probability is sigmoid of the sum of hidden per-id weights,
and 5% of labels are flipped. The model: an embedding row of DIM floats per
feature id (sum-pooled over the fields), a hidden layer of HIDDEN tanh
units, a logistic output. Every parameter is a row of DIM floats on the
servers: feature id i is key i * (2^64 // ROWS) (spread over every
server's key range), the dense layers' rows follow the feature ids. A
step pulls the rows of the batch's ids and the dense rows in one request,
runs forward and backward in NumPy and pushes the gradients of the same
rows; the servers apply AdaGrad. Workers train asynchronously (no barrier
per step), then each evaluates on held-out data.

Exits 0 only if every worker's held-out accuracy reaches --threshold
(default 0.8; the untrained model gets about 0.5, the labels' noise caps
it near 0.87, the default run gets about 0.83 in about a second). With PyTorch importable, `--torch` runs the same model in torch:
`pslite.torch.embedding` (an autograd function) pulls every row a batch
needs, embedding and dense, and its backward pushes their gradients.
"""

import argparse
import sys
import time

import numpy as np

import pslite

FEATURES = 1 << 16
DIM = 8
HIDDEN = 16
FIELDS = 10
#: Rows of the dense part: W1 (DIM x HIDDEN), b1, w2 (HIDDEN), b2, padded to whole rows.
DENSE = DIM * HIDDEN + HIDDEN + HIDDEN + 1
DENSE_ROWS = -(-DENSE // DIM)
ROWS = FEATURES + DENSE_ROWS
STEP = np.uint64(np.iinfo(np.uint64).max // ROWS)
DENSE_KEYS = (np.arange(FEATURES, ROWS, dtype=np.uint64) * STEP)


def keys_of(ids):
    return ids.astype(np.uint64) * STEP


# ------------------------------------------------------------------ servers

class AdaGrad:
    """The servers' request handle: every row of the model, AdaGrad on push.
    Each server touches only the rows of its key range."""

    def __init__(self, lr, seed=0):
        rng = np.random.default_rng(seed)
        self.w = rng.normal(0.0, 0.1, size=(ROWS, DIM)).astype(np.float32)
        self.g2 = np.zeros((ROWS, DIM), dtype=np.float32)
        self.lr = np.float32(lr)

    def __call__(self, meta, pairs, server):
        rows = (pairs.keys // STEP).astype(np.int64)
        if meta.push:
            g = pairs.vals.reshape(-1, DIM)
            self.g2[rows] += g * g
            self.w[rows] -= self.lr * g / (np.sqrt(self.g2[rows]) + np.float32(1e-6))
        if meta.pull:
            server.response(meta, pslite.KVPairs(pairs.keys, self.w[rows].ravel()))
        else:
            server.response(meta)


# --------------------------------------------------------------------- data

def hidden_weights():
    return np.random.default_rng(12345).normal(0.0, 1.0, size=FEATURES).astype(np.float32)


def draw_ids(rng, n):
    """FIELDS ids per sample, field f from its own slice of the id space, a
    power law within it (a few ids very frequent, most rare)."""
    width = FEATURES // FIELDS
    ranks = np.minimum(rng.zipf(1.2, size=(n, FIELDS)) - 1, width - 1)
    return (ranks * 7919) % width + np.arange(FIELDS) * width


def make_data(seed, n, truth):
    """Samples and labels: the click logit is the sum of the ids' hidden
    weights, centred so that half the samples click; 5% of labels flipped."""
    centre = np.median(truth[draw_ids(np.random.default_rng(0), 20_000)].sum(axis=1))
    rng = np.random.default_rng(seed)
    ids = draw_ids(rng, n)
    logit = 3.0 * (truth[ids].sum(axis=1) - centre)
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
    flip = rng.random(n) < 0.05
    y[flip] = 1.0 - y[flip]
    return ids.astype(np.int64), y


# ------------------------------------------------------------ NumPy model

def unpack_dense(rows):
    flat = rows.ravel()[:DENSE]
    at = 0
    w1 = flat[at:at + DIM * HIDDEN].reshape(DIM, HIDDEN)
    at += DIM * HIDDEN
    b1 = flat[at:at + HIDDEN]
    at += HIDDEN
    w2 = flat[at:at + HIDDEN]
    at += HIDDEN
    return w1, b1, w2, flat[at]


def pack_dense(gw1, gb1, gw2, gb2):
    flat = np.zeros(DENSE_ROWS * DIM, dtype=np.float32)
    flat[:DENSE] = np.concatenate([gw1.ravel(), gb1, gw2, [gb2]])
    return flat


def pull_rows(kv, ids):
    """The embedding rows of the unique ids and the dense rows, one request."""
    uniq, inverse = np.unique(ids, return_inverse=True)
    keys = np.concatenate([keys_of(uniq), DENSE_KEYS])
    rows = kv.pull(keys).take().vals.reshape(-1, DIM)
    return keys, uniq, inverse.reshape(ids.shape), rows[:uniq.size], rows[uniq.size:]


def forward(emb_rows, inverse, dense):
    w1, b1, w2, b2 = unpack_dense(dense)
    x = emb_rows[inverse].sum(axis=1)
    h = np.tanh(x @ w1 + b1)
    p = 1.0 / (1.0 + np.exp(-(h @ w2 + b2)))
    return x, h, p


def train_step(kv, ids, y):
    keys, uniq, inverse, emb, dense = pull_rows(kv, ids)
    w1, b1, w2, b2 = unpack_dense(dense)
    x, h, p = forward(emb, inverse, dense)
    d = (p - y) / y.size
    gw2, gb2 = h.T @ d, d.sum()
    dpre = np.outer(d, w2) * (1.0 - h * h)
    gw1, gb1 = x.T @ dpre, dpre.sum(axis=0)
    dx = dpre @ w1.T
    gemb = np.zeros((uniq.size, DIM), dtype=np.float32)
    np.add.at(gemb, inverse, dx[:, None, :])
    grads = np.concatenate([gemb.ravel(), pack_dense(gw1, gb1, gw2, gb2)]).astype(np.float32)
    return kv.push(keys, grads)


def evaluate(kv, ids, y, batch=4096):
    correct, loss = 0, 0.0
    for at in range(0, y.size, batch):
        bi, by = ids[at:at + batch], y[at:at + batch]
        _, _, inverse, emb, dense = pull_rows(kv, bi)
        p = forward(emb, inverse, dense)[2]
        correct += int(((p > 0.5) == (by > 0.5)).sum())
        loss += float(-(by * np.log(p + 1e-7) + (1 - by) * np.log(1 - p + 1e-7)).sum())
    return correct / y.size, loss / y.size


def train_numpy(kv, ids, y, args, log):
    pending = None
    for epoch in range(1, args.epochs + 1):
        t = time.time()
        for at in range(0, y.size, args.batch):
            push = train_step(kv, ids[at:at + args.batch], y[at:at + args.batch])
            if pending is not None:
                pending.wait()  # one push in flight while the next batch computes
            pending = push
        log(f"epoch {epoch}/{args.epochs} done in {time.time() - t:.2f} s")
    pending.wait()


# ------------------------------------------------------------ torch model

def train_torch(kv, ids, y, args, log):
    """The same model and steps as the NumPy run, in torch: every row (the
    batch's embedding rows and the dense layers' rows) comes from the
    servers through `pslite.torch.embedding` in one pull, and the backward
    pass pushes every row's gradient, which the servers' AdaGrad applies.
    The model lives on the servers only, so the held-out accuracy (the NumPy
    forward over the servers' rows) measures what torch trained."""
    import torch

    import pslite.torch as pt

    # Tiny tensors: more threads only spin against the servers for the cores.
    torch.set_num_threads(1)
    for epoch in range(1, args.epochs + 1):
        t = time.time()
        for at in range(0, y.size, args.batch):
            bi = ids[at:at + args.batch]
            uniq, inverse = np.unique(bi, return_inverse=True)
            keys = np.concatenate([keys_of(uniq), DENSE_KEYS])
            rows = pt.embedding(kv, keys, DIM)
            emb, dense = rows[:uniq.size], rows[uniq.size:].reshape(-1)[:DENSE]
            w1 = dense[:DIM * HIDDEN].reshape(DIM, HIDDEN)
            b1 = dense[DIM * HIDDEN:DIM * HIDDEN + HIDDEN]
            w2 = dense[DIM * HIDDEN + HIDDEN:DIM * HIDDEN + 2 * HIDDEN]
            b2 = dense[DENSE - 1]
            x = emb[torch.from_numpy(inverse.reshape(bi.shape))].sum(dim=1)
            logit = torch.tanh(x @ w1 + b1) @ w2 + b2
            target = torch.from_numpy(y[at:at + args.batch])
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, target)
            loss.backward()  # pushes the gradient of every pulled row
        log(f"epoch {epoch}/{args.epochs} (torch) done in {time.time() - t:.2f} s")


# ------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=50_000, help="training samples per worker")
    ap.add_argument("--test", type=int, default=10_000, help="held-out samples")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--lr", type=float, default=0.1, help="AdaGrad learning rate (servers)")
    ap.add_argument("--threshold", type=float, default=0.8)
    ap.add_argument("--torch", action="store_true", help="train with pslite.torch (needs torch)")
    args = ap.parse_args()

    po = pslite.Postoffice.from_env()
    po.start()
    server = None
    ok = True
    if po.is_server:
        server = pslite.KVServer(po)
        server.set_request_handle(AdaGrad(args.lr))
    elif po.is_worker:
        rank = po.my_rank()

        def log(msg):
            print(f"worker {rank}: {msg}", flush=True)

        truth = hidden_weights()
        ids, y = make_data(100 + rank, args.samples, truth)
        test_ids, test_y = make_data(7, args.test, truth)
        kv = pslite.KVWorker(po)
        acc0, loss0 = evaluate(kv, test_ids, test_y)
        log(f"before training: held-out accuracy {acc0:.4f}, loss {loss0:.4f}")
        po.barrier(pslite.WORKER_GROUP)  # nobody trains before everyone measured
        t = time.time()
        if args.torch:
            train_torch(kv, ids, y, args, log)
        else:
            train_numpy(kv, ids, y, args, log)
        po.barrier(pslite.WORKER_GROUP)  # every worker's last push is in
        acc, loss = evaluate(kv, test_ids, test_y)
        ok = acc >= args.threshold
        log(f"held-out accuracy {acc:.4f}, loss {loss:.4f} after {time.time() - t:.1f} s "
            f"(threshold {args.threshold}): {'ok' if ok else 'BELOW THRESHOLD'}")
        kv.close()
    po.finalize()
    if server is not None:
        server.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
