"""CUDA-graph capture of the target's fixed-shape verify pass.

A decode round always verifies the same number of tokens, so the whole target forward can be
captured once and replayed: the cache must be `static` (attention over the whole preallocated
KV, positions from a device tensor), and the block is copied into a static input buffer.
On CPU the same object simply calls `model.verify` (no graph), so callers need no branches.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ready.cuda_graph import capture
from ready.target.cache import HybridCache
from ready.target.model import HybridLM, TargetOutput


class GraphedVerify:
    """`verify(block)` for blocks of exactly `tokens` tokens, replayed from a CUDA graph."""

    def __init__(self, model: HybridLM, cache: HybridCache, tokens: int, capture_layers: Sequence[int] = (), warmup: int = 2):
        self.model, self.cache, self.tokens = model, cache, tokens
        self.capture_layers = list(capture_layers)
        self.graph = None
        cache.static = True
        self.ids = torch.zeros(cache.batch_size, tokens, dtype=torch.long, device=model.device)
        if model.device.type != "cuda":
            return
        saved = (cache.length, cache.length_t.clone())
        compiled = model.graphs_compile()  # torch.compile'd layers (CUDA default; compiles in the warm-up)
        self.graph, self.out = capture(
            lambda: model._run(self.ids, "verify", cache, self.capture_layers, compiled=compiled),
            warmup, f"target verify of {tokens} tokens", fallback=False)
        cache.length, _ = saved[0], cache.length_t.copy_(saved[1])

    def __call__(self, block: torch.Tensor) -> TargetOutput:
        if block.shape != self.ids.shape:
            raise ValueError(f"graphed verify takes blocks of shape {tuple(self.ids.shape)}; got {tuple(block.shape)}")
        if self.graph is None:
            return self.model.verify(block, self.cache, self.capture_layers)
        self.model._check_room(self.cache, self.tokens)
        self.ids.copy_(block)
        self.graph.replay()
        self.cache.pending = self.tokens
        return self.out
