"""The DSpark / ReaDy draft step for B ragged rows at once (the engine's slots), over static buffers.

Row b drafts exactly as the single-sequence draft step (`ready.drafter.DSparkDrafter.draft`) would at its
own context length, reading row b of the target cache (or of a donor state buffer, the state placebo);
one CUDA graph per engine (batch size) on CUDA.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ready.cuda_graph import capture
from ready.reader import StateSource
from ready.target.ragged import RaggedCache


def is_block_drafter(drafter: Any) -> bool:
    """A DSpark / ReaDy drafter (its class says `batch_draft = True`: `BatchDraft` drives its draft step);
    anything else is asked row by row."""
    return getattr(type(drafter), "batch_draft", False) is True


class BatchDraft:
    """The DSpark / ReaDy draft step for B ragged rows over static buffers.

    Per row b with n[b] context tokens (committed tokens but the last; = the cache row's length):
    the drafter's context keys/values live in per-layer buffers [B, H_kv, cap, hd]; a row's prompt
    rows are projected when it is admitted (`admit`), and every step re-projects its last K+1 rows
    (no row gains more per round), as the single-sequence static draft step does. The block (anchor +
    K mask rows: K+1 rows) sits at positions n[b] .. n[b]+K, attends to context rows < n[b] (the last `context_window` of them
    when set; `DSparkDrafter.buffered_context`: the split-key kernel in 16-bit on CUDA, else a per-row
    mask), and the reader reads row b of the target cache. The same
    drafter weights and pieces as `DSparkDrafter.draft`; one CUDA graph per engine (batch size)."""

    def __init__(self, drafter: Any, cache: RaggedCache, features: torch.Tensor, cuda_graphs: bool,
                 states: Optional[torch.Tensor] = None, mode: Optional[tuple[float, float]] = None) -> None:
        """`states`: what the reader reads, shaped like `cache.ssm` (default the cache itself; a donor
        state buffer for the state placebo). `mode`: None drafts greedily, (temperature, top_p) samples
        with the uniforms handed to each call."""
        self.d, self.mode = drafter, mode
        self.cache, self.features = cache, features
        B, cap = cache.batch_size, features.shape[1]
        self.B, self.cap, self.K = B, cap, drafter.proposals
        dev, dt = features.device, drafter.fc.weight.dtype
        attn = drafter.layers[0].self_attn
        self.hkv, self.hd = attn.num_kv_heads, attn.head_dim
        with torch.inference_mode(False):  # plain tensors: written in place in and out of inference mode
            shape = (B, self.hkv, cap, self.hd)
            self.k = [torch.zeros(shape, device=dev, dtype=dt) for _ in drafter.layers]
            self.v = [torch.zeros(shape, device=dev, dtype=dt) for _ in drafter.layers]
            self.tok = torch.zeros(B, dtype=torch.long, device=dev)
            self.rows_b = torch.arange(B, device=dev)
            self.ar_r = torch.arange(self.K + 1, device=dev)
            self.u = torch.zeros(B, self.K, dtype=torch.float32, device=dev)  # sampling: a static input
        ssm = cache.ssm if states is None else states
        self.src = StateSource.from_cache(ssm, drafter._gdn_indices, B) if drafter.reader_enabled else None
        self.graphs = cuda_graphs and dev.type == "cuda"
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        self.out: Optional[tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]] = None
        self.failed = False

    @torch.no_grad()
    def admit(self, b: int, n: int) -> None:
        """Project the context rows 0..n-1 of row b (its prompt's features)."""
        if n <= 0:
            return
        d = self.d
        ctx = d._context(self.features[b:b + 1, :n])
        cos, sin = d._rope(torch.arange(n, device=ctx.device)[None])
        for i, layer in enumerate(d.layers):
            k, v = layer.self_attn.kv(ctx, cos, sin)
            self.k[i][b:b + 1, :, :n] = k
            self.v[i][b:b + 1, :, :n] = v

    def _body(self) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        d, B, K = self.d, self.B, self.K
        n = self.cache.lengths_t
        rows = (n - (K + 1)).clamp(min=0)[:, None] + self.ar_r  # [B, K+1]; rows >= n are masked below
        rows = rows.clamp(max=self.cap - 1)
        ctx = d._context(self.features[self.rows_b[:, None], rows])
        cos, sin = d._rope(rows)
        for i, layer in enumerate(d.layers):
            layer.self_attn.store_kv(ctx, cos, sin, self.k[i], self.v[i], rows)
        read = None
        if self.src is not None:
            src = self.src
            read = lambda reader, h: reader(h, src)  # noqa: E731
        cos, sin = d._rope(n[:, None] + self.ar_r)
        context = d.buffered_context(self.k, self.v, n)  # row b's block after its n[b] context rows
        h = d._backbone(d._block_input(self.tok), cos, sin, context, None, read)[:, 1:]
        return d._finish(d._logits(h), self.tok, h, self.mode, self.u)

    def _capture(self, warmup: int = 2) -> None:
        # the warm-up calls write the same context rows the replay will
        self.graph, self.out = capture(self._body, warmup, "batched draft step")
        self.failed = self.graph is None

    @torch.no_grad()
    def __call__(self, tok: torch.Tensor,
                 uniforms: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """(drafts [B, K], logits or, sampled, q [B, K, V], the confidence head's step confidences [B, K] or
        None without one: `DSparkDrafter.block_confidence`) after the anchors `tok` [B] (each row's last
        committed token); sampled with `uniforms` [B, K]."""
        self.tok.copy_(tok)
        if uniforms is not None:
            self.u.copy_(uniforms)
        if self.graphs and self.graph is None and not self.failed:
            self._capture()
        if self.graph is None:
            return self._body()
        self.graph.replay()  # greedy: the logits stay in the graph's memory (nothing reads them; no copy)
        conf = None if self.out[2] is None else self.out[2].clone()
        return self.out[0].clone(), (self.out[1].clone() if self.mode is not None else self.out[1]), conf
