"""The drafter protocol: what the decoding engine asks of any drafter (n-gram, DSpark, ReaDy).

A drafter proposes a block of K tokens that should follow the last committed token. The
engine hands it everything it may condition on in one `DraftStep`: the committed tokens, the
target's hidden features of those tokens (from the target layers the drafter asked for), and
the target with its cache of committed states (the ReaDy reader reads `cache.ssm`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:  # the target package is only needed for type names here
    from ready.target import HybridCache, HybridLM


@dataclass
class DraftStep:
    """The context of one drafting round.

    `tokens` and `features` are views of the engine's static buffers: valid during the
    `propose` call only; a drafter that keeps them must copy them.
    """

    tokens: torch.Tensor  # [B, T] every committed token (prompt + generated)
    # [B, T-1, C, D] target features of tokens[:, :-1] (C = len(capture_layers)); the last
    # committed token has not been through the target yet. None when capture_layers is empty.
    features: Optional[torch.Tensor]
    target: "HybridLM"
    cache: "HybridCache"  # committed states (cache.ssm, cache.conv, KV up to cache.length)


@runtime_checkable
class Drafter(Protocol):
    """Anything that proposes `proposals` tokens per round from a `DraftStep`.

    A round verifies the anchor + K = `proposals` tokens (K + 1; a DSpark checkpoint's block_size)."""

    proposals: int  # K, tokens proposed per round
    vocab_size: int  # must equal the target's vocabulary size
    capture_layers: list[int]  # target model layer ids whose hidden output the engine captures

    def begin(self, prompt_ids: torch.Tensor) -> None:
        """Start new sequence(s); `prompt_ids` is [B, P]."""
        ...

    def propose(self, step: DraftStep) -> torch.Tensor:
        """Return the next K draft tokens, LongTensor [B, K]."""
        ...

    # Optional, for sampling at temperature > 0 (`ready.decode.sampling`):
    #   def sample(self, step: DraftStep, sampling: DraftSampling) -> tuple[LongTensor [B, K], Tensor [B, K, V]]
    # draws position j from q_j (conditioned on the token drawn at j-1) with `draw(q_j, uniforms[:, j])` and
    # returns q. A drafter without it is deterministic: the engine takes `propose`'s tokens as point masses.
    # Optional, a confidence head (an attribute `confidence_head` that is not None) and
    #   def draft_scored(self, step: DraftStep, sampling: DraftSampling | None = None)
    #       -> tuple[LongTensor [B, K], logits or q [B, K, V] | None, confidences [B, K]]
    # the block's drafts (greedy, or sampled as `sample` does) with the head's step confidences c_j (float32 in
    # [0, 1], reading drafts 1..j-1 only): the engine then asks for this instead of propose / sample, records
    # the confidences (`ready.calibration`) and a confidence schedule verifies by them (`ready.decode.schedule`).
    # Optional, for the batched engine (`ready.decode.batch_draft`): a class attribute `batch_draft = True` says the
    # drafter has DSpark's layout (fc, layers, heads, reader), whose draft step `BatchDraft` runs for B ragged
    # rows at once (`ready.drafter.DSparkDrafter`); any other drafter is asked row by row.


def describe(drafter: Any) -> str:
    """A short name for messages and logs."""
    return type(drafter).__name__
