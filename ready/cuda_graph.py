"""The one way this project captures a CUDA graph.

`capture(fn, warmup, what)` runs `fn` `warmup` times on a side stream (allocator, torch.compile, Triton
autotuning: everything that must not happen inside a capture), then captures one more call into a
`torch.cuda.CUDAGraph` and returns it with that call's outputs: static tensors that every
`graph.replay()` overwrites. Callers copy their inputs into static buffers before a replay and read
the outputs after it. With `fallback` (the default) a capture that fails warns once, naming `what`,
and returns (None, None): the caller runs `fn` eagerly, slower but with the same numbers.

Used by the target's graphed verify (`ready.target.graphs`, one sequence or a ragged batch), the drafter's
draft step (`ready.drafter.model`), the batched draft step (`ready.decode.batch_draft`) and the benchmarks.
"""

from __future__ import annotations

import statistics
import warnings
from typing import Callable, Optional, TypeVar

import torch

T = TypeVar("T")


def capture(fn: Callable[[], T], warmup: int = 2, what: str = "a CUDA graph",
            fallback: bool = True) -> tuple[Optional[torch.cuda.CUDAGraph], Optional[T]]:
    """(graph, outputs of the captured call), or (None, None) when the capture failed and `fallback`."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.no_grad():
            for _ in range(warmup):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), torch.no_grad():
            out = fn()
        return graph, out
    except Exception as e:  # pragma: no cover - depends on the device; the caller stays correct eagerly
        if not fallback:
            raise
        warnings.warn(f"{what}: CUDA-graph capture failed ({type(e).__name__}: {e}); running eagerly",
                      RuntimeWarning, stacklevel=3)
        return None, None


def replay_us(graph: torch.cuda.CUDAGraph, calls: int = 1, repeats: int = 10) -> float:
    """Median device µs per call of a graph that holds `calls` calls, over `repeats` replays (benchmarks)."""
    graph.replay()
    torch.cuda.synchronize()
    times: list[float] = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return statistics.median(times)
