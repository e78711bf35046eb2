"""The rules of one decoding round, shared by every engine configuration: what a generation records,
how a verification turns into appended tokens (`settle_round`), how the next token is picked, how a
sampling round drafts, and the input checks. `ready.decode.engine` runs the rounds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch

from ready.decode.errors import DecodeError
from ready.decode.protocol import DraftStep, Drafter, describe
from ready.decode.sampling import DraftSampling, SamplingParams, draw, point_mass, warp
from ready.metrics import SequenceLog
from ready.target.config import EMBEDDINGS

# an acceptance rule: (drafts [K], target argmaxes [K+1]) -> accepted count A in 0..K
AcceptFn = Callable[[torch.Tensor, torch.Tensor], int]


@dataclass
class Generation:
    """The outcome of decoding one prompt."""

    prompt_len: int
    tokens: list[int]  # new tokens (first one from the prefill)
    proposals: int  # K (0 for autoregressive decoding)
    accepted: list[int] = field(default_factory=list)  # A_i per round (AR: one 0 per step)
    horizons: list[int] = field(default_factory=list)  # h_i per round
    committed: list[int] = field(default_factory=list)  # tokens appended per round (A_i + 1, less at the budget or EOS)
    # drafts verified per round (n_i <= K: fewer at the budget, or where the confidence schedule cut the
    # block, `ready.decode.schedule`); the round verified n_i + 1 tokens (the anchor too). Empty for AR
    verified: list[int] = field(default_factory=list)
    # per round, the drafter's confidence head's step confidences c_1..c_K of the drafted block (empty for
    # a drafter without one, and for AR): `ready.calibration` scores them against the accepted lengths
    confidence: list[list[float]] = field(default_factory=list)
    wall_s: float = 0.0  # prefill .. last token
    prefill_s: float = 0.0
    stop: str = "budget"  # "budget" | "eos"

    def log(self) -> SequenceLog:
        return SequenceLog(
            new_tokens=len(self.tokens), wall_s=self.wall_s, accepted=list(self.accepted),
            horizons=list(self.horizons), prefill_s=self.prefill_s, committed=list(self.committed),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RoundTrace:
    """One sampled round as the acceptance rule saw it (device tensors, for `ready.decode.dist_check`)."""

    start: int  # committed tokens before the round (the block's first token is tokens[start - 1])
    drafts: list[int]  # the k verified drafts
    logits: torch.Tensor  # [k+1, V] target logits of the verify (the target's dtype)
    p: torch.Tensor  # [k+1, V] warped target distribution
    q: torch.Tensor  # [k, V] the drafter's distribution the drafts were drawn from
    accepted: int  # A (raw, before the horizon cap)
    room: int = -1  # the drafts the round could verify before its schedule (min(K, budget left)); -1: unknown
    confidence: Optional[list[float]] = None  # the head's c_1..c_K of the round, when it has one


def greedy_count(drafts: Sequence[int], argmax: Sequence[int]) -> int:
    """Length of the longest prefix of `drafts` [K] equal to the target argmaxes `argmax[:K]` (host lists)."""
    a = 0
    while a < len(drafts) and drafts[a] == argmax[a]:
        a += 1
    return a


def greedy_accept(drafts: torch.Tensor, argmax: torch.Tensor) -> int:
    """`greedy_count` of tensors (an `AcceptFn`)."""
    return greedy_count(drafts.tolist(), argmax.tolist())


@dataclass
class RoundOutcome:
    accepted: int  # A, capped at the horizon
    horizon: int  # h
    tokens: list[int]  # tokens appended to the sequence this round
    commit: int  # verified tokens whose states the cache keeps (A + 1)
    eos: bool  # the sequence ended with EOS


def settle_round(drafts: list[int], argmax: list[int], accepted: int, remaining: int,
                 eos_token_id: Optional[int], proposals: Optional[int] = None) -> RoundOutcome:
    """Turn one verification into appended tokens, the horizon and the capped A.

    `drafts` [n] the verified drafts, `argmax` [n+1] (target greedy tokens after each verified token),
    `accepted` the raw accepted count (<= n), `remaining` the token budget left (>= 1), `proposals` K, the
    drafts the round proposed (default n: every proposed draft verified).

    The horizon is min(K, remaining), cut at an accepted EOS draft: only the budget and EOS censor. Where a
    verify schedule verified n < K drafts (`ready.decode.schedule`), draft n + 1 is a stop, observed and not
    accepted, exactly as a rejection: the schedule cuts where the confidence head is unsure, so the drafts it
    leaves are not missing at random and counting them as censored would bias tau up (`ready.metrics`). A
    round that verified n drafts and accepted all n has A = n.
    """
    n = len(drafts)
    k = n if proposals is None else int(proposals)
    if k < n:
        raise ValueError(f"settle_round: {n} verified drafts but only K={k} proposed")
    horizon = min(k, remaining)
    if eos_token_id is not None:
        for j in range(1, accepted + 1):  # an accepted EOS draft ends the sequence at position j
            if drafts[j - 1] == eos_token_id:
                horizon = min(horizon, j)
                break
    a = min(accepted, horizon)
    tokens = (drafts[:a] + [argmax[a]])[:remaining]
    eos = False
    if eos_token_id is not None and eos_token_id in tokens:
        tokens = tokens[: tokens.index(eos_token_id) + 1]
        eos = True
    return RoundOutcome(accepted=a, horizon=horizon, tokens=tokens, commit=a + 1, eos=eos)


def pick(logits: torch.Tensor, sampling: Optional[SamplingParams], gen: Optional[torch.Generator]) -> torch.Tensor:
    """The next token from logits [V]: argmax (greedy, `sampling` None), or a draw from the warped
    distribution with the next uniform of `gen` (the generation's CPU generator)."""
    if sampling is None:
        return logits.argmax(-1)
    probs = warp(logits, sampling.temperature, sampling.top_p)
    return draw(probs, torch.rand(1, generator=gen, dtype=torch.float32)[0].to(probs.device))


def _scorer(drafter: Drafter) -> Optional[Callable]:
    """The drafter's `draft_scored` when it has a confidence head to score with (else None)."""
    if getattr(drafter, "confidence_head", None) is None:
        return None
    return getattr(drafter, "draft_scored", None)


def greedy_draft(drafter: Drafter, step: DraftStep, k: int, vocab: int) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """K greedy drafts [B, K] and, from a drafter with a confidence head (`draft_scored`), its step
    confidences [B, K] (`ready.decode.schedule`; None otherwise: the drafter is asked to `propose`)."""
    scored = _scorer(drafter)
    if scored is None:
        return check_drafts(drafter.propose(step), k, vocab, drafter), None
    drafts, _, conf = scored(step)
    return check_drafts(drafts, k, vocab, drafter), conf


def sampled_draft(drafter: Drafter, step: DraftStep, sampling: SamplingParams, u: torch.Tensor,
                  vocab: int) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """K sampled drafts [1, K] of one sequence with its uniforms u [K] (on the device), the
    distribution q [K, V] they were drawn from (a point mass for a drafter without `sample`), and the
    confidence head's step confidences [1, K] of a drafter that has one (`draft_scored`; else None)."""
    k = u.shape[0]
    sample = getattr(drafter, "sample", None)
    if sample is None:
        drafts = check_drafts(drafter.propose(step), k, vocab, drafter)
        return drafts, point_mass(drafts[0].to(u.device), vocab), None
    scored = _scorer(drafter)
    params = DraftSampling(sampling.temperature, sampling.top_p, u[None])
    drafts, q, conf = scored(step, params) if scored is not None else (*sample(step, params), None)
    drafts = check_drafts(drafts, k, vocab, drafter)
    if not isinstance(q, torch.Tensor) or tuple(q.shape) != (1, k, vocab):
        got = tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__
        raise DecodeError(f"drafter {describe(drafter)} sampled with a distribution of shape {got}; "
                          f"expected probabilities of shape (1, {k}, {vocab})")
    return drafts, q[0], conf


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def target_device(target: Any) -> torch.device:
    return next(target.parameters()).device


def as_prompt(prompt: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """A prompt as a 1-D LongTensor (a [1, P] tensor is accepted too)."""
    ids = prompt if isinstance(prompt, torch.Tensor) else torch.tensor(list(prompt), dtype=torch.long)
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.dim() != 1:
        raise DecodeError(f"prompt has shape {tuple(ids.shape)}; expected a 1-D list of token ids (batch 1)")
    return ids.long()


def check_prompt(target: Any, prompt: torch.Tensor, max_new_tokens: int) -> None:
    """Raise DecodeError for an empty prompt, ids outside the vocabulary or too long a sequence."""
    cfg = target.config
    if prompt.numel() == 0:
        raise DecodeError("prompt is empty; expected at least one token id")
    if max_new_tokens < 1:
        raise DecodeError(f"max_new_tokens={max_new_tokens}; expected an integer >= 1")
    lo, hi = int(prompt.min()), int(prompt.max())
    if lo < 0 or hi >= cfg.vocab_size:
        raise DecodeError(f"prompt holds token id {lo if lo < 0 else hi}; expected ids in 0..{cfg.vocab_size - 1}")
    ctx = int(cfg.max_position_embeddings)
    if prompt.numel() + max_new_tokens > ctx:
        raise DecodeError(
            f"prompt of {prompt.numel()} tokens + max_new_tokens {max_new_tokens} exceeds the model's context of "
            f"{ctx} tokens (config.max_position_embeddings); shorten the prompt or lower max_new_tokens"
        )


def check_drafter(target: Any, drafter: Drafter) -> None:
    """Raise DecodeError if the drafter cannot work with this target."""
    k = getattr(drafter, "proposals", None)
    if not isinstance(k, int) or k < 1:
        raise DecodeError(f"drafter {describe(drafter)} proposes K={k!r} tokens per round; expected an integer >= 1")
    vocab = getattr(drafter, "vocab_size", None)
    if vocab != target.config.vocab_size:
        raise DecodeError(
            f"drafter {describe(drafter)} has vocabulary size {vocab}; expected the target's {target.config.vocab_size}"
        )
    n_layers = target.config.num_hidden_layers
    bad = [i for i in getattr(drafter, "capture_layers", []) if not EMBEDDINGS <= i < n_layers]
    if bad:
        raise DecodeError(f"drafter {describe(drafter)} asks for target layers {bad}; expected ids in 0..{n_layers - 1} "
                          f"(or {EMBEDDINGS} for the token embeddings)")


def check_drafts(drafts: Any, k: int, vocab: int, drafter: Drafter) -> torch.Tensor:
    if not isinstance(drafts, torch.Tensor) or tuple(drafts.shape) != (1, k) or drafts.dtype != torch.long:
        got = (tuple(drafts.shape), drafts.dtype) if isinstance(drafts, torch.Tensor) else type(drafts).__name__
        raise DecodeError(f"drafter {describe(drafter)} proposed {got}; expected a LongTensor of shape (1, {k})")
    lo, hi = (int(v) for v in torch.stack([drafts.min(), drafts.max()]).tolist())
    if lo < 0 or hi >= vocab:
        raise DecodeError(f"drafter {describe(drafter)} proposed token id {lo if lo < 0 else hi}; expected ids in 0..{vocab - 1}")
    return drafts
