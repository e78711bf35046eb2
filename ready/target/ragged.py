"""Ragged batches over the hybrid target: B sequences in one static cache, each at its own length.

The single-sequence passes (`HybridLM.prefill/verify/commit`) keep one committed length for the
whole cache (`cache.length`). Batched speculative decoding needs one per row: each row accepts its
own number of drafts per round. `RaggedCache` is a `HybridCache` with a per-row length tensor, and
this module's passes read it:

- `prefill_row(model, cache, b, ids)`: the prompt of row b through the ordinary batch-1 prefill on
  a view of that row (`row_view`): the very computation of the single-sequence engine;
- `ragged_verify(model, ids, cache)`: one forward of a [B, T] block, row b at positions
  lengths[b] .. lengths[b] + T - 1. GDN layers are per row already (each token's inputs and
  window go to `pending_*`); attention writes each row's keys/values at its own positions in the shared
  padded KV buffer and attends over the whole buffer with a per-row mask (key j is seen by a query
  at position p iff j <= p), so whatever a longer row or an earlier occupant left beyond a row's
  length is never read;
- `ragged_commit(model, cache, n, advance)`: row b keeps its first n[b] verified tokens (the GDN
  commit replays them with a per-row count) and its length moves by advance[b] (0 for a finished row,
  whose state may then change but whose output no longer does).

Everything takes device tensors and never reads a length on the host, so `RaggedGraphedVerify`
captures the verify of a [B, T] block once and replays it (CUDA). The attention here is the
target's (same weights and ops, `ready.target.layers`) with per-row positions.

Exact mode (`model.exact`, read per pass as `HybridLM.verify` does): every op is the target's
row-invariant one (exact linears and norms, the fixed key-block-order `exact_attention` with per-row
key counts, the GDN token-by-token recurrence), so a row's logits and states have the same bits in a
batch of B as in the single-sequence engine's verify, in any dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

import ready.target.layers as _layers
from ready.cuda_graph import capture
from ready.target.cache import HybridCache
from ready.target.config import EMBEDDINGS, TargetError
from ready.target.layers import apply_rotary, rotary
from ready.target.model import TargetOutput


@dataclass
class RaggedCache(HybridCache):
    """A `HybridCache` whose rows have their own committed lengths.

    `lengths_t` [B] int64 on the device (what the passes read); `length`, `length_t` and `pending`
    of the base class are unused by the ragged passes. Allocate with `new_ragged_cache`."""

    lengths_t: Optional[torch.Tensor] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.static = True  # attention always reads the whole buffer (per-row masks)
        if self.lengths_t is None:
            self.lengths_t = torch.zeros(self.batch_size, dtype=torch.long, device=self.ssm.device)

    def reset(self) -> None:
        super().reset()
        self.lengths_t.zero_()

    def row_view(self, b: int) -> HybridCache:
        """Row b as a batch-1 `HybridCache` of views (writes go to this cache), not static, empty:
        what the single-sequence prefill runs on. Its length starts at 0."""
        s = slice(b, b + 1)
        return HybridCache(ssm=self.ssm[:, s], conv=self.conv[:, s], key=self.key[:, s], value=self.value[:, s],
                           pending_inputs=self.pending_inputs[:, s], pending_conv=self.pending_conv[:, s],
                           length_t=torch.zeros((), dtype=torch.long, device=self.ssm.device))


def new_ragged_cache(model: Any, batch_size: int, max_len: int, max_verify: int = 16, spare: int = 0) -> RaggedCache:
    """A `RaggedCache` for `model` with B rows of up to `max_len` positions each. `spare`: positions
    allowed past the target's context (a batched round verifies up to K tokens past a row's budget; they
    are never committed, and keeping them in the buffer means no write ever has to be clamped)."""
    if max_len > model.config.max_position_embeddings + spare:
        raise TargetError(f"max_len {max_len} exceeds the target's context of "
                          f"{model.config.max_position_embeddings} tokens")
    if batch_size < 1:
        raise TargetError(f"batch_size {batch_size}; expected an integer >= 1")
    return RaggedCache.allocate(model.config, batch_size, max_len, max_verify, model.device, model.dtype)


@torch.no_grad()
def prefill_row(model: Any, cache: RaggedCache, b: int, ids: torch.Tensor,
                capture_layers: Sequence[int] = ()) -> Any:
    """Forget row b and run a prompt `ids` [P] (or [1, P]) through it: the batch-1 prefill on the row's
    view, so the row's states, KV and outputs are those of the single-sequence engine."""
    ids = ids.reshape(1, -1)
    view = cache.row_view(b)
    view.reset()  # zero the row's GDN state and conv window (prefill starts from them)
    out = model.prefill(ids, view, capture_layers)
    cache.lengths_t[b] = ids.shape[1]
    return out


def _ragged_attention(attn: Any, x: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      pos: torch.Tensor, exact: bool = False) -> torch.Tensor:
    """The target's gated attention (`layers.Attention`) with per-row positions pos [B, T] over the
    shared buffers key/value [B, H_kv, L, hd]; `exact`: its row-invariant ops."""
    B, T, _ = x.shape
    L = key.shape[2]
    q, k, v, gate = attn.project(x, exact)
    cos, sin = rotary(pos.reshape(-1), attn.rot_dim, attn.cfg.rope_theta, q.dtype, exact)
    cos, sin = cos.view(B, 1, T, -1), sin.view(B, 1, T, -1)
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    # positions past the buffer (a finished row's junk block near the end) land on the last slot,
    # which lies beyond every live row's committed length
    idx = pos.clamp(max=L - 1)[:, None, :, None].expand(B, attn.n_kv, T, attn.hd)
    key.scatter_(2, idx, k)
    value.scatter_(2, idx, v)
    return attn.attend(q, key, value, pos, gate, exact)


def _ragged_layer(layer: Any, x: torch.Tensor, slot: Any, kv: Optional[tuple], pos: torch.Tensor,
                  exact: bool = False) -> torch.Tensor:
    """One pre-norm block of a ragged verify (`layers.decoder_layer_forward` in verify mode)."""
    h = layer.input_layernorm(x, exact)
    if kv is None:
        h, _ = layer.linear_attn(h, "verify", slot, None, exact)
    else:
        h = _ragged_attention(layer.self_attn, h, kv[0], kv[1], pos, exact)
    x = x + h
    return layer.mlp(layer.post_attention_layernorm(x, exact), exact, residual=x)


_COMPILED: dict[bool, Any] = {}


def _compiled_layer(exact: bool) -> Any:
    """The torch.compile'd layer (exact mode: its own variant that rounds every 16-bit cast as eager code
    does, as `HybridLM.compile_layers` makes for the single-sequence graphs)."""
    if exact not in _COMPILED:
        opts = {"options": {"emulate_precision_casts": True}} if exact else {}
        _COMPILED[exact] = torch.compile(_ragged_layer, dynamic=False, **opts)
    return _COMPILED[exact]


def _run_ragged(model: Any, ids: torch.Tensor, cache: RaggedCache, capture_layers: Sequence[int] = (),
                compiled: bool = False) -> Any:
    B, T = ids.shape
    if B != cache.batch_size:
        raise TargetError(f"ragged verify of {B} rows on a cache of {cache.batch_size}; expected one row per cache row")
    if T > cache.max_verify:
        raise TargetError(f"verify block of {T} tokens exceeds the cache's max_verify={cache.max_verify}")
    capture = model._check_capture(capture_layers)
    exact = bool(getattr(model, "exact", False))
    pos = cache.lengths_t[:, None] + torch.arange(T, device=ids.device)
    fn = _compiled_layer(exact) if compiled else _ragged_layer
    x = model.model.embed_tokens(ids)
    hidden = {EMBEDDINGS: x} if EMBEDDINGS in capture else {}
    for lid, layer in enumerate(model.model.layers):
        gi = model._gdn_index.get(lid, -1)
        if gi >= 0:
            x = fn(layer, x, cache.gdn_slots[gi], None, pos, exact)
        else:
            ai = model._attn_index[lid]
            x = fn(layer, x, None, (cache.key[ai], cache.value[ai]), pos, exact)
        if lid in capture:
            hidden[lid] = x
    h = model.model.norm(x, exact)
    logits = model.head(h, exact)
    if len(model.model.layers) - 1 in hidden:  # as the model pass: the last layer's feature is final-normed
        hidden[len(model.model.layers) - 1] = h
    hid = torch.stack([hidden[i] for i in capture], dim=2) if capture else None
    return TargetOutput(logits=logits, hidden=hid)


@torch.no_grad()
def ragged_verify(model: Any, ids: torch.Tensor, cache: RaggedCache, capture_layers: Sequence[int] = ()) -> Any:
    """Score a [B, T] block, row b after its lengths[b] committed tokens; each token's GDN inputs and
    windows go to `cache.pending_*` (nothing committed). Returns logits [B, T, V] and the captured hidden
    outputs [B, T, C, D]."""
    return _run_ragged(model, ids, cache, capture_layers)


@torch.no_grad()
def ragged_commit(model: Any, cache: RaggedCache, n: torch.Tensor, advance: Optional[torch.Tensor] = None) -> None:
    """Row b keeps the state after its n[b]-th verified token (1..T; LongTensor [B] on the device),
    replayed with the arithmetic of `model`'s verify (its exact mode), and its length moves by
    advance[b] (default n). KV past a row's length needs no truncation: the attention mask never
    reads beyond it."""
    _layers.commit_gdn(cache.ssm, cache.conv, cache.pending_inputs, cache.pending_conv, n,
                       bool(getattr(model, "exact", False)))
    cache.lengths_t += n if advance is None else advance


class RaggedGraphedVerify:
    """`ragged_verify` of [B, T] blocks on one cache, replayed from a CUDA graph (eager off CUDA).

    Positions come from `cache.lengths_t` on the device, so one capture serves every round. On CUDA
    the layers run compiled (torch.compile) inside the graph when the target's `graphs_compile()`
    says so; a failed capture warns once and stays eager. The target's exact mode is read at capture
    (a graph replays the mode it was captured in, as `GraphedVerify`)."""

    def __init__(self, model: Any, cache: RaggedCache, tokens: int, capture_layers: Sequence[int] = (),
                 warmup: int = 2) -> None:
        self.model, self.cache, self.tokens = model, cache, tokens
        self.capture_layers = list(capture_layers)
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        self.out: Any = None
        with torch.inference_mode(False):
            self.ids = torch.zeros(cache.batch_size, tokens, dtype=torch.long, device=model.device)
        if model.device.type != "cuda":
            return
        compiled = model.graphs_compile()
        if compiled:
            import torch._dynamo as dynamo  # a plain `import torch._dynamo` here would make `torch` local

            dcfg = dynamo.config
            for name in ("recompile_limit", "cache_size_limit"):
                if hasattr(dcfg, name):
                    setattr(dcfg, name, max(getattr(dcfg, name), 64))
        saved = cache.lengths_t.clone()  # warm-ups and the capture write pending states and junk KV only
        self.graph, self.out = capture(lambda: _run_ragged(model, self.ids, cache, self.capture_layers, compiled=compiled),
                                       warmup, f"ragged verify of a [{cache.batch_size}, {tokens}] block")
        cache.lengths_t.copy_(saved)

    def __call__(self, block: torch.Tensor) -> Any:
        if tuple(block.shape) != tuple(self.ids.shape):
            raise ValueError(f"graphed ragged verify takes blocks of shape {tuple(self.ids.shape)}; "
                             f"got {tuple(block.shape)}")
        if self.graph is None:
            return ragged_verify(self.model, block, self.cache, self.capture_layers)
        self.ids.copy_(block)
        self.graph.replay()
        return self.out
