"""An optional PyTorch helper: embedding rows that live on pslite's servers.

    import pslite.torch as pt
    rows = pt.embedding(kv, keys, dim)   # pulls the rows of `keys`
    loss(model(rows)).backward()         # pushes d loss / d rows for `keys`

`embedding` pulls the values of `keys` (sorted, unique `numpy.uint64`; each
key a row of `dim` float32) from the servers as a `(len(keys), dim)` tensor
that requires grad; its backward pushes the rows' gradient for the same
keys, and the servers' request handle applies it (an optimizer on the
servers, as `train_ctr.py`'s AdaGrad). The backward waits for its push, so
the next step's pull sees it on the servers that applied it. Needs
`torch`; pslite itself and its tests do not.
"""

import numpy as np
import torch


class _PullPush(torch.autograd.Function):
    @staticmethod
    def forward(ctx, anchor, kv, keys, dim):
        pulled = kv.pull(keys).take().vals
        ctx.kv, ctx.keys = kv, keys
        # A writable copy: the pulled array is a read-only view of the
        # received buffer, and torch tensors must be writable.
        return torch.from_numpy(np.array(pulled, dtype=np.float32).reshape(-1, dim))

    @staticmethod
    def backward(ctx, grad):
        g = np.ascontiguousarray(grad.detach().cpu().numpy(), dtype=np.float32).ravel()
        ctx.kv.push(ctx.keys, g).wait()
        return None, None, None, None


def embedding(kv, keys, dim):
    """The rows of `keys` from the servers, as a tensor whose gradient is
    pushed back to them on backward."""
    anchor = torch.zeros((), requires_grad=True)
    return _PullPush.apply(anchor, kv, np.asarray(keys, dtype=np.uint64), int(dim))
