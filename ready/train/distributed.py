"""Data-parallel training over torch.distributed: who this process is, and the collectives training needs.

A training run is data-parallel when torchrun starts it (`ready launch` under torchrun), or when
`train.devices = N > 1` makes a plain process hand its training to the launcher its caller gave
(`ready.train.pipeline`'s `launch`; a sweep row's starts torchrun). Every process (rank) holds the
frozen target and the drafter; per step each rank takes its contiguous slice of the same global
batch (same sequence ids, same anchors) and DDP sums the gradients, so N ranks follow one
process's loss curve up to floating-point rounding. Rank 0 alone logs and writes files
(checkpoints, artifacts); the others wait at a barrier where a file must exist before they go on.

Backend: NCCL when the ranks train on CUDA (each rank pinned to GPU LOCAL_RANK), gloo on CPU.
Outside torchrun (`world().size == 1`) every helper here is a no-op or a plain call, so the
single-process code path is unchanged.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Iterator, TypeVar

import torch
import torch.distributed as dist

# Rank 0 may spend long stretches alone (writing a large artifact, pretraining the embedded
# target) while the other ranks wait at a barrier; the default NCCL timeout (10 min) is too short.
TIMEOUT = timedelta(hours=2)
T = TypeVar("T")


class DistributedError(RuntimeError):
    """The process group cannot be formed as asked (e.g. more ranks on a host than GPUs)."""


@dataclass(frozen=True)
class World:
    """This process's place in the data-parallel group (rank 0 of 1 outside torchrun)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.size > 1


def world() -> World:
    """The current group, or a world of one when torch.distributed is not initialised."""
    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
    return World()


def under_torchrun() -> bool:
    """Whether torchrun (or an equivalent launcher) started this process: RANK and WORLD_SIZE are set."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init_from_env(device: str) -> World:
    """Join the group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).

    `device` is where the ranks train: "cuda" -> NCCL, each rank on GPU LOCAL_RANK (so that a bare
    "cuda" means that GPU from here on); "cpu" -> gloo. Without torchrun's variables, or with a
    group already formed, nothing changes."""
    if not under_torchrun() or (dist.is_available() and dist.is_initialized()):
        return world()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "cuda":
        visible = torch.cuda.device_count()
        if local >= visible:
            raise DistributedError(f"process LOCAL_RANK={local} has no GPU: {visible} visible on this host "
                                   f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); "
                                   f"expected --nproc-per-node (train.devices) <= {visible}")
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", timeout=TIMEOUT, device_id=torch.device("cuda", local))
    else:
        dist.init_process_group("gloo", timeout=TIMEOUT)
    return world()


def shutdown() -> None:
    """Leave the group (end of a torchrun'd training)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def shard(n: int, w: World | None = None) -> slice:
    """This rank's contiguous part of n items (sizes differ by at most one)."""
    w = w or world()
    return slice(w.rank * n // w.size, (w.rank + 1) * n // w.size)


def barrier() -> None:
    """Wait for every rank (no-op for one process)."""
    if world().active:
        dist.barrier()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """The elementwise sum of `t` over the ranks (a new tensor; `t` itself for one process)."""
    if not world().active:
        return t
    out = t.clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def main_decides(fn: Callable[[], T]) -> T:
    """`fn()` evaluated on rank 0 and handed to every rank, so that all ranks take the same branch
    (e.g. "is this artifact already built?" asked once, not racing a filesystem)."""
    if not world().active:
        return fn()
    box = [fn() if world().main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order, on every rank (picklable objects; `[obj]` for one process)."""
    if not world().active:
        return [obj]
    out: list[Any] = [None] * world().size
    dist.all_gather_object(out, obj)
    return out


@contextlib.contextmanager
def main_first() -> Iterator[None]:
    """Rank 0 runs the body first, then the others (a cache build that all ranks then read)."""
    w = world()
    if w.active and not w.main:
        dist.barrier()
    try:
        yield
    finally:
        if w.active and w.main:
            dist.barrier()


__all__ = ["DistributedError", "TIMEOUT", "World", "all_reduce_sum", "barrier", "gather_objects", "init_from_env",
           "main_decides", "main_first", "shard", "shutdown", "under_torchrun", "world"]
