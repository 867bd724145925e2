#!/usr/bin/env python3
"""Momentum correction in pslite.torch is Deep Gradient Compression's
update, as one node of `pslite launch -s 1 -w 2`.

Two parameters of 20 values in two param groups (momentum 0.9 with
weight decay 0.01; Nesterov's momentum 0.5 without), gradients known in
advance (each worker's differs), `topk:3` on the pushes (a deterministic
compressor; answers whole). After STEPS steps each worker compares its
parameters with the update written out here in float64:

    g = grad + wd * w;  u = m * u + g;  v += u (nesterov: g + m * u)
    sent = the 3 largest |v|;  v = 0 where sent (and u, with masking)
    w -= lr * mean over workers of sent

and the same optimizer with ``momentum_correction=False`` with the update
it stands for (error feedback on the gradient, then SGD's own momentum and
weight decay on the average). Also: param_groups keep their momentum;
state_dict() holds the worker's residuals and (corrected) its velocities
as SGD's momentum buffers; a checkpoint loaded into a new optimizer
carries on exactly. Prints `PASS dgc <rank>`.
"""

import io

import numpy as np
import torch

import pslite
import pslite.torch as pt

N, K, STEPS, LR = 20, 3, 4, 0.1
GROUPS = [dict(momentum=0.9, nesterov=False, weight_decay=0.01),
          dict(momentum=0.5, nesterov=True, weight_decay=0.0)]


def grad(rank, step, which):
    """A worker's gradient: magnitudes far apart, so the top 3 are clear."""
    i = np.arange(N)
    base = ((i * 7 + step * 5 + which * 3) % N + 1.0) * 0.37
    sign = np.where((i + rank + step) % 3 == 0, -1.0, 1.0)
    return base * sign * (1.0 + 0.5 * rank)


def top(v):
    sent = np.zeros_like(v)
    at = np.argsort(-np.abs(v), kind="stable")[:K]
    sent[at] = v[at]
    return sent


def hand(start, size, corrected, mask):
    """The parameters after STEPS steps, written out."""
    ws = [w.copy() for w in start]
    u = [[np.zeros(N) for _ in GROUPS] for _ in range(size)]
    v = [[np.zeros(N) for _ in GROUPS] for _ in range(size)]
    buf = [None for _ in GROUPS]
    for step in range(STEPS):
        for j, gr in enumerate(GROUPS):
            m, wd = gr["momentum"], gr["weight_decay"]
            sent = []
            for r in range(size):
                g = grad(r, step, j)
                if corrected:
                    g = g + wd * ws[j]
                    u[r][j] = m * u[r][j] + g
                    v[r][j] += g + m * u[r][j] if gr["nesterov"] else u[r][j]
                else:
                    v[r][j] += g
                s = top(v[r][j])
                v[r][j] -= s
                if corrected and mask:
                    u[r][j][s != 0] = 0.0
                sent.append(s)
            avg = np.mean(sent, axis=0)
            if corrected:
                ws[j] = ws[j] - LR * avg
            else:
                d = avg + wd * ws[j]
                buf[j] = d.copy() if buf[j] is None else m * buf[j] + d
                d = d + m * buf[j] if gr["nesterov"] else buf[j]
                ws[j] = ws[j] - LR * d
    return ws, u, v


def make(start, corrected, mask, average=True):
    """Parameters from `start` and their DistributedOptimizer."""
    params = [torch.nn.Parameter(w.clone()) for w in start]
    opt = torch.optim.SGD([dict(params=[p], **gr) for p, gr in zip(params, GROUPS)], lr=LR)
    return params, pt.DistributedOptimizer(
        opt, named_parameters=[("a", params[0]), ("b", params[1])],
        compression=pslite.Compression(f"topk:{K}", momentum_masking=mask),
        momentum_correction=corrected, average=average)


def steps(params, opt, first):
    """STEPS steps from step `first`; the parameters after them."""
    for step in range(first, first + STEPS):
        opt.zero_grad()
        loss = sum((p * torch.from_numpy(grad(pt.rank(), step, j))).sum()
                   for j, p in enumerate(params))
        loss.backward()
        opt.step()
    return [p.detach().numpy().copy() for p in params]


def run(corrected, mask=False):
    rank, size = pt.rank(), pt.size()
    torch.manual_seed(5)  # the same start everywhere
    params, opt = make([torch.randn(N, dtype=torch.float64) for _ in GROUPS], corrected, mask)
    start = [p.detach().numpy().copy() for p in params]
    assert opt.momentum_correction == corrected
    steps(params, opt, 0)
    want, u, v = hand(start, size, corrected, mask)
    for j, (p, w) in enumerate(zip(params, want)):
        got = p.detach().numpy()
        err = np.abs(got - w).max() / np.abs(w).max()
        # The compressor works in float32.
        assert err < 1e-5, f"corrected={corrected} mask={mask} group {j}: {got} != {w} ({err:.1e})"
        moved = np.abs(got - start[j]).max()
        assert moved > 0.1, f"group {j} hardly moved ({moved})"
    state = opt.state_dict()
    for gr, saved in zip(GROUPS, state["param_groups"]):
        for name, value in gr.items():
            assert saved[name] == value, f"param group {name}: {saved[name]} != {value}"
    # The compressors' state is in state_dict(): with momentum correction
    # the worker's velocity as SGD's momentum buffer; the residuals too.
    for j, held in sorted(state["state"].items()):
        residual = held["pslite_residual"].numpy()
        assert np.abs(residual - v[rank][j]).max() < 1e-5, f"residual {j}: {residual}"
        buffer = held["momentum_buffer"].numpy()
        if corrected:
            assert np.abs(buffer - u[rank][j]).max() < 1e-5, f"velocity {j}: {buffer}"
    assert len(state["state"]) == 2, state["state"]
    print(f"momentum_correction={corrected} masking={mask}: the update written out",
          flush=True)


def resume(corrected, mask=False, average=True):
    """A checkpoint taken after STEPS steps and loaded into a new optimizer
    (new keys, fresh compressors) carries on exactly as the first one did;
    without its state the same steps end elsewhere. With `average=False`
    (the servers sum) the saved momentum buffers are the worker count
    times the velocities, as SGD's buffer of the sums would be."""
    torch.manual_seed(5)
    params, opt = make([torch.randn(N, dtype=torch.float64) for _ in GROUPS], corrected, mask,
                       average)
    at = [torch.from_numpy(w) for w in steps(params, opt, 0)]
    saved = opt.state_dict()
    if corrected:
        scale = 1 if average else pt.size()
        for j, p in enumerate(params):
            entry = opt._by_param[id(p)]  # one part: 20 values
            velocity, _ = entry.kv.compression_state(int(entry.parts[0].keys[0]))
            buffer = saved["state"][j]["momentum_buffer"].numpy()
            assert np.abs(buffer - scale * velocity).max() < 1e-6, f"buffer {j}: {buffer}"
    checkpoint = io.BytesIO()
    torch.save(saved, checkpoint)
    carried_on = steps(params, opt, STEPS)
    params, opt = make(at, corrected, mask, average)
    checkpoint.seek(0)
    opt.load_state_dict(torch.load(checkpoint))
    resumed = steps(params, opt, STEPS)
    params, opt = make(at, corrected, mask, average)
    fresh = steps(params, opt, STEPS)
    for j in range(len(GROUPS)):
        err = np.abs(resumed[j] - carried_on[j]).max()
        assert err < 1e-9, f"corrected={corrected} group {j}: resumed {err:.1e} off"
        off = np.abs(fresh[j] - carried_on[j]).max()
        assert off > 1e-3, f"corrected={corrected} group {j}: fresh state only {off:.1e} off"
    print(f"momentum_correction={corrected} masking={mask} average={average}: resumed exactly",
          flush=True)


pt.init()  # servers and the scheduler serve here, then exit
torch.set_num_threads(1)
run(True)
run(True, mask=True)
run(False)
resume(True)
resume(True, mask=True)
resume(False)
resume(True, average=False)
print(f"PASS dgc {pt.rank()}", flush=True)
