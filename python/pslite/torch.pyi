import os
from contextlib import AbstractContextManager
from typing import Any, Iterable, Mapping, Optional, TypeVar, Union

import numpy as np
import numpy.typing as npt
import torch

from ._pslite import Compression as _Compression, KVWorker, Postoffice

DEFAULT_PARTITION_BYTES: int

Opt = TypeVar("Opt", bound=torch.optim.Optimizer)

def init(po: Optional[Postoffice] = None) -> None: ...
def shutdown() -> None: ...
def rank() -> int: ...
def size() -> int: ...
def local_rank() -> int: ...
def local_size() -> int: ...
def cross_rank() -> int: ...
def cross_size() -> int: ...
def is_initialized() -> bool: ...
def join() -> int: ...
class Compression:
    none: None
    fp16: str
    bf16: str
    onebit: str

def DistributedOptimizer(optimizer: Opt,
                         named_parameters: Optional[Iterable[tuple[str, torch.Tensor]]] = None,
                         compression: Union[_Compression, str, None] = None,
                         backward_passes_per_step: int = 1,
                         average: bool = True,
                         momentum_correction: Optional[bool] = None,
                         gradient_predivide_factor: float = 1.0) -> Opt: ...
def broadcast_parameters(params: Union[Mapping[str, Any], Iterable[tuple[str, torch.Tensor]]],
                         root_rank: int = 0) -> None: ...
def broadcast_object(obj: Any, root_rank: int = 0) -> Any: ...
def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0) -> None: ...
def embedding(kv: KVWorker, keys: npt.ArrayLike, dim: int) -> torch.Tensor: ...

#: Reduction operations of allreduce (op=).
Average: str
Sum: str
Min: str
Max: str
Product: str

class Handle:
    """A collective in flight (`synchronize`, `poll`); made by the *_async calls."""
    def __init__(self, steps: Any, what: str, name: Optional[str], calls: Any) -> None: ...
    def poll(self) -> bool: ...
    def synchronize(self) -> Any: ...

def allreduce(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
              op: Optional[str] = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0) -> torch.Tensor: ...
def allreduce_(tensor: torch.Tensor, average: Optional[bool] = None, name: Optional[str] = None,
               op: Optional[str] = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0) -> torch.Tensor: ...
def allreduce_async(tensor: torch.Tensor, average: Optional[bool] = None,
                    name: Optional[str] = None, op: Optional[str] = None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Handle: ...
def allreduce_async_(tensor: torch.Tensor, average: Optional[bool] = None,
                     name: Optional[str] = None, op: Optional[str] = None,
                     prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Handle: ...
def allgather(tensor: torch.Tensor, name: Optional[str] = None) -> torch.Tensor: ...
def allgather_async(tensor: torch.Tensor, name: Optional[str] = None) -> Handle: ...
def allgather_object(obj: Any, name: Optional[str] = None) -> list[Any]: ...
def broadcast(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None) -> torch.Tensor: ...
def broadcast_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None) -> torch.Tensor: ...
def broadcast_async(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None) -> Handle: ...
def broadcast_async_(tensor: torch.Tensor, root_rank: int,
                     name: Optional[str] = None) -> Handle: ...
def synchronize(handle: Handle) -> torch.Tensor: ...
def poll(handle: Handle) -> bool: ...
def barrier() -> None: ...

class DistributedDataParallel(torch.nn.Module):
    module: torch.nn.Module
    def __init__(self, module: torch.nn.Module, broadcast_buffers: bool = True) -> None: ...
    def forward(self, *args: Any, **kwargs: Any) -> Any: ...
    def no_sync(self) -> AbstractContextManager[None]: ...

# Embedding tables on the servers (python/pslite/_torch_embedding.py).
class SGD:
    lr: float
    def __init__(self, lr: float) -> None: ...

class RowWiseAdaGrad:
    lr: float
    eps: float
    initial_accumulator: float
    def __init__(self, lr: float = 0.01, eps: float = 1e-8,
                 initial_accumulator: float = 0.0) -> None: ...

class RowWiseAdam:
    lr: float
    betas: tuple[float, float]
    eps: float
    def __init__(self, lr: float = 0.001, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None: ...

EmbeddingOptimizer = Union[SGD, RowWiseAdaGrad, RowWiseAdam]
EmbeddingInit = Union[str, tuple[Any, ...]]

class EmbeddingBag(torch.nn.Module):
    embedding_dim: int
    mode: str
    name: str
    seed: int
    table: int
    optimizer: EmbeddingOptimizer
    init: EmbeddingInit
    include_last_offset: bool
    expire_after: int
    admit_after: int
    cache_rows: int
    cache_staleness: int
    forwards: int
    pull_requests: int
    rows_pulled: int
    def __init__(self, embedding_dim: int, *, mode: str = "sum",
                 optimizer: Optional[EmbeddingOptimizer] = None,
                 init: EmbeddingInit = ("uniform", -0.05, 0.05), name: Optional[str] = None,
                 seed: int = 0, include_last_offset: bool = False, expire_after: int = 0,
                 admit_after: int = 0, cache_rows: int = 0,
                 cache_staleness: int = 0) -> None: ...
    def forward(self, input: torch.Tensor, offsets: Optional[torch.Tensor] = None,
                per_sample_weights: Optional[torch.Tensor] = None) -> torch.Tensor: ...
    def prefetch(self, ids: torch.Tensor) -> None: ...
    def flush(self) -> None: ...
    @classmethod
    def from_export(cls, path: Union[str, os.PathLike[str]], name: Optional[str] = None, *,
                    mode: str = "sum", unknown: str | None = None,
                    include_last_offset: bool = False) -> EmbeddingBag: ...

class Embedding(torch.nn.Module):
    embedding_dim: int
    name: str
    seed: int
    table: int
    optimizer: EmbeddingOptimizer
    init: EmbeddingInit
    expire_after: int
    admit_after: int
    cache_rows: int
    cache_staleness: int
    forwards: int
    pull_requests: int
    rows_pulled: int
    def __init__(self, embedding_dim: int, *, optimizer: Optional[EmbeddingOptimizer] = None,
                 init: EmbeddingInit = ("uniform", -0.05, 0.05), name: Optional[str] = None,
                 seed: int = 0, expire_after: int = 0, admit_after: int = 0,
                 cache_rows: int = 0, cache_staleness: int = 0) -> None: ...
    def forward(self, ids: torch.Tensor) -> torch.Tensor: ...
    def prefetch(self, ids: torch.Tensor) -> None: ...
    def flush(self) -> None: ...
    @classmethod
    def from_export(cls, path: Union[str, os.PathLike[str]], name: Optional[str] = None, *,
                    unknown: str | None = None) -> Embedding: ...

def embedding_stats() -> list[dict[str, int]]: ...
def embedding_clock() -> int: ...

# Checkpoints and serving (python/pslite/_torch_serving.py).
def checkpoint(label: str = "pslite.torch.checkpoint",
               timeout: float = 600.0) -> dict[str, Any]: ...

class ExportedTable:
    name: str
    table: int
    embedding_dim: int
    init: EmbeddingInit
    seed: int
    optimizer: EmbeddingOptimizer
    ids: np.ndarray
    rows: np.ndarray
    def __len__(self) -> int: ...
    def lookup(self, ids: Any, unknown: str | None = None) -> np.ndarray: ...

def load_tables(path: Union[str, os.PathLike[str]]) -> dict[str, ExportedTable]: ...
