"""CUDA graphs for the engine's fixed-shape target forwards.

Where they apply: the verify forward of a full round ([1, K+1] tokens) and the AR step
([1, 1]) are captured once per cache (`ready.target.GraphedVerify` over a `static` cache:
attention reads the whole preallocated KV with positions from `cache.length_t`) and replayed
every round. Prefill, the shortened last round at the token budget, the drafter, the
argmax/acceptance bookkeeping and `commit` (a state copy) run eagerly. On CPU the same runner
calls the static-cache verify eagerly (no graph), which is how the CPU tests cover this path.
On CUDA the graphed passes run the target's torch.compile'd layers (compiled while the graph is
warmed up; `HybridLM.graphs_compile`), and capturing the K+1 graph also runs the shortened
rounds' eager verify once, so that nothing compiles inside a timed generation.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from ready.target import GraphedVerify


class GraphRunner:
    """verify/step for one engine: one captured graph per block length, per cache (one sequence's static
    cache, or a ragged cache of B rows: `ready.target.ragged`)."""

    def __init__(self, target: Any, capture_layers: list[int], short_rounds: bool = True) -> None:
        """`short_rounds`: the engine also verifies shorter blocks eagerly (one sequence's last round at
        its budget), so capturing a block length warms those up too."""
        self.target, self.capture, self.short_rounds = target, list(capture_layers), short_rounds
        self.graphs: dict[int, GraphedVerify] = {}
        self.cache_id: Optional[int] = None

    def invalidate(self) -> None:
        """Forget captured graphs (the cache they point at was replaced)."""
        self.graphs.clear()
        self.cache_id = None

    def prepare(self, cache: Any) -> None:
        """Put a freshly allocated cache in static mode before anything runs on it."""
        if self.cache_id != id(cache):
            self.invalidate()
            self.cache_id = id(cache)
        cache.static = True

    def verify(self, block: Any, cache: Any) -> Any:
        self.prepare(cache)
        t = block.shape[1]
        if t not in self.graphs:
            self.graphs[t] = GraphedVerify(self.target, cache, t, self.capture)
            self._warm_short_rounds(cache, t)
        return self.graphs[t](block)

    def warm(self, cache: Any, lengths: Sequence[int]) -> None:
        """Capture the graphs of these block lengths now (a confidence schedule verifies any length; capturing
        one mid-generation would put its compile inside the timed decode). The cache holds no pending tokens
        (it was just sized or committed); the captures leave its committed contents as they were."""
        self.prepare(cache)
        for t in lengths:
            if t not in self.graphs:
                self.graphs[t] = GraphedVerify(self.target, cache, t, self.capture)
                self._warm_short_rounds(cache, t)

    def _warm_short_rounds(self, cache: Any, t: int) -> None:
        """Run the eager verify once for every shorter block (2..t-1 tokens: the last round at the
        token budget) and drop the result, so the Triton kernels specialised on the block length
        compile here, in the warm-up that captures the graph, not inside a timed generation."""
        if not self.short_rounds or cache.key.device.type != "cuda" or cache.pending:
            return
        for s in range(2, t):
            if cache.length + s > cache.max_len:
                break
            ids = torch.zeros(cache.batch_size, s, dtype=torch.long, device=cache.key.device)
            self.target.verify(ids, cache, capture_layers=self.capture)
            cache.pending = 0  # nothing committed: the live state and the KV below `length` are untouched

    def step(self, tok: Any, cache: Any) -> Any:
        out = self.verify(tok, cache)
        self.target.commit(cache, 1)
        return out
