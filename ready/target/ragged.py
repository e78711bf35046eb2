"""Ragged batches over the hybrid target: B sequences in one static cache, each at its own length.

The single-sequence passes (`HybridLM.prefill/verify/commit`) keep one committed length for the
whole cache (`cache.length`). Batched speculative decoding needs one per row: each row accepts its
own number of drafts per round. `RaggedCache` is a `HybridCache` with a per-row length tensor, and
this module's passes read it:

- `prefill_row(model, cache, b, ids)`: the prompt of row b through the ordinary batch-1 prefill on
  a view of that row (`row_view`): the very computation of the single-sequence engine;
  `prefill_rows(model, cache, rows, prompts)`: several rows' prompts in one right-padded pass (the
  same values up to rounding; how the batched engine admits prompts on CUDA outside exact mode);
- `ragged_verify(model, ids, cache)`: the target's own verify pass (`HybridLM._run`, the same layers,
  kernels and compiled variants as a single sequence's) over a [B, T] block, row b at positions
  lengths[b] .. lengths[b] + T - 1: the cache's device counter is the per-row length vector, so the
  pass's positions are [B, T]. GDN layers are per row already (each token's inputs and window go to
  `pending_*`); attention writes each row's keys/values at its own positions in the shared padded KV
  buffer and attends over the whole buffer with a per-row mask (key j is seen by a query at position p
  iff j <= p), so whatever a longer row or an earlier occupant left beyond a row's length is never read;
- `ragged_commit(model, cache, n, advance)`: row b keeps its first n[b] verified tokens (the GDN
  commit replays them with a per-row count) and its length moves by advance[b] (0 for a finished row,
  whose state may then change but whose output no longer does).

Everything takes device tensors and never reads a length on the host, so `GraphedVerify` captures the
verify of a [B, T] block on a ragged cache once and replays it (CUDA), as it does for one sequence.

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
from ready.target.cache import HybridCache
from ready.target.config import TargetError


@dataclass
class RaggedCache(HybridCache):
    """A `HybridCache` whose rows have their own committed lengths.

    `lengths_t` [B] int64 on the device, which is also the cache's device counter `length_t` (what the
    passes read: positions [B, T]); the host `length` of the base class stays 0. Allocate with
    `new_ragged_cache`."""

    lengths_t: Optional[torch.Tensor] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.static = True  # attention always reads the whole buffer (per-row masks)
        if self.lengths_t is None:
            self.lengths_t = torch.zeros(self.batch_size, dtype=torch.long, device=self.ssm.device)
        self.length_t = self.lengths_t

    def reset(self) -> None:
        super().reset()
        self.lengths_t.zero_()

    def row_view(self, b: int) -> HybridCache:
        """Row b as a batch-1 `HybridCache` of views (writes go to this cache), not static, empty:
        what the single-sequence prefill runs on. Its length starts at 0."""
        s = slice(b, b + 1)
        return HybridCache(ssm=self.ssm[:, s], conv=self.conv[:, s], key=self.key[:, s], value=self.value[:, s],
                           pending_inputs=self.pending_inputs[:, s], pending_conv=self.pending_conv[:, s],
                           pending_states=None if self.pending_states is None else self.pending_states[:, :, s],
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
    return RaggedCache.allocate(model.config, batch_size, max_len, max_verify, model.device, model.dtype,
                                _layers.keeps_verify_states(model.device))


@torch.no_grad()
def prefill_row(model: Any, cache: RaggedCache, b: int, ids: torch.Tensor,
                capture_layers: Sequence[int] = (), last_logits_only: bool = False) -> Any:
    """Forget row b and run a prompt `ids` [P] (or [1, P]) through it: the batch-1 prefill on the row's
    view, so the row's states, KV and outputs are those of the single-sequence engine."""
    ids = ids.reshape(1, -1)
    view = cache.row_view(b)
    view.reset()  # zero the row's GDN state and conv window (prefill starts from them)
    out = model.prefill(ids, view, capture_layers, last_logits_only)
    cache.lengths_t[b] = ids.shape[1]
    return out


@torch.no_grad()
def prefill_rows(model: Any, cache: RaggedCache, rows: Sequence[int], prompts: Sequence[torch.Tensor],
                 capture_layers: Sequence[int] = ()) -> Any:
    """Forget rows `rows` and prefill prompt i into row rows[i], all in one pass: the prompts right-padded to
    the longest into an empty cache of len(rows) rows (`HybridCache.ends`: each row's GDN state and conv window
    are those after its own last token), whose states and K/V are then copied into the rows. One pass of
    len(rows) x the longest prompt's tokens, not len(rows) passes of one prompt each (a prefill of a few
    hundred tokens leaves most of a large GPU idle). The same values as `prefill_row` up to the rounding of the larger matmuls.
    Returns logits [n, 1, V] at each prompt's last token and the captured features [n, P_max, C, D] (row i's
    first len_i positions are its own)."""
    if len(rows) != len(prompts) or not rows:
        raise TargetError(f"{len(prompts)} prompts for rows {list(rows)}; expected one prompt per row, at least one")
    dev = cache.ssm.device
    lengths = [int(p.numel()) for p in prompts]
    longest = max(lengths)
    if min(lengths) < 1 or longest > cache.max_len:
        raise TargetError(f"prompt lengths {lengths}; expected 1..{cache.max_len} tokens (the cache's rows)")
    ids = torch.zeros(len(rows), longest, dtype=torch.long, device=dev)  # pads: token 0, computed, never kept
    for i, p in enumerate(prompts):
        ids[i, :lengths[i]] = p.reshape(-1).to(dev)
    ends = torch.tensor(lengths, dtype=torch.long, device=dev)
    padded = HybridCache.allocate(model.config, len(rows), longest, 1, dev, model.dtype, keep_states=False, ends=ends)
    out = model.prefill(ids, padded, capture_layers, last_logits_only=True)
    at = torch.tensor(list(rows), dtype=torch.long, device=dev)
    cache.ssm[:, at] = padded.ssm
    cache.conv[:, at] = padded.conv
    cache.key[:, at, :, :longest] = padded.key
    cache.value[:, at, :, :longest] = padded.value
    cache.lengths_t[at] = ends
    return out


@torch.no_grad()
def ragged_verify(model: Any, ids: torch.Tensor, cache: RaggedCache, capture_layers: Sequence[int] = ()) -> Any:
    """Score a [B, T] block, row b after its lengths[b] committed tokens; each token's GDN inputs and
    windows go to `cache.pending_*` (nothing committed). Returns logits [B, T, V] and the captured hidden
    outputs [B, T, C, D]."""
    B, T = ids.shape
    if B != cache.batch_size:
        raise TargetError(f"ragged verify of {B} rows on a cache of {cache.batch_size}; expected one row per cache row")
    if T > cache.max_verify:
        raise TargetError(f"verify block of {T} tokens exceeds the cache's max_verify={cache.max_verify}")
    return model._run(ids, "verify", cache, capture_layers)


@torch.no_grad()
def ragged_commit(model: Any, cache: RaggedCache, n: torch.Tensor, advance: Optional[torch.Tensor] = None) -> None:
    """Row b keeps the state after its n[b]-th verified token (1..T; LongTensor [B] on the device),
    (`commit_gdn`: replayed with the arithmetic of `model`'s verify, or the state it kept), and its length moves by
    advance[b] (default n). KV past a row's length needs no truncation: the attention mask never
    reads beyond it."""
    _layers.commit_gdn(cache.ssm, cache.conv, cache.pending_inputs, cache.pending_conv, n,
                       bool(getattr(model, "exact", False)), cache.pending_states)
    cache.lengths_t += n if advance is None else advance
    cache.pending = 0
