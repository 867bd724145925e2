import numpy.typing as npt
import torch

from ._pslite import KVWorker

def embedding(kv: KVWorker, keys: npt.ArrayLike, dim: int) -> torch.Tensor: ...
