"""Sampling at temperature > 0: the warped distribution, draws from given uniforms, and the
speculative acceptance rule that keeps the output exactly distributed as the target's.

- `warp(logits, T, top_p)`: softmax(logits / T), restricted to the nucleus (the most likely tokens
  whose mass before them is below top_p) and renormalised. Target (p) and drafter (q) both use it.
- `draw(probs, u)`: inverse-CDF draw with a uniform u in [0, 1) supplied by the caller. Uniforms come
  from one CPU generator per generation (seeded per prompt and sample), so a run is reproducible on
  any device, two rows decoding the same (prompt, sample) share their random numbers, and the drafter
  can draw inside a CUDA graph (the uniforms are a static input).
- `accept_law(p, q)`: per token x, the probability min(1, p(x)/q(x)) of accepting a draft x, and the
  residual normalise(max(0, p - q)) to sample from on rejection. A draft d drawn from q then yields
  min(p, q)(x) + max(0, p - q)(x) = p(x): the standard rule (Leviathan et al. 2023, Chen et al. 2023).
- `speculative_round`: one block. Draft j is accepted iff u_j < min(1, p_j(d_j)/q_j(d_j)); the first
  rejection at j draws the correction from the residual of j; a fully accepted block draws the bonus
  token from p_K. A deterministic drafter (n-gram) is a point mass q = one_hot(d).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Optional

import torch

from ready.decode.errors import DecodeError


@dataclass(frozen=True)
class SamplingParams:
    """Temperature (0 = greedy: the engine's greedy path, untouched), nucleus mass and base seed."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise DecodeError(f"temperature={self.temperature}; expected a number >= 0 (0 = greedy)")
        if not 0 < self.top_p <= 1:
            raise DecodeError(f"top_p={self.top_p}; expected a number in (0, 1]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class DraftSampling:
    """What a sampling drafter needs for one round: the warp and one uniform per draft position."""

    temperature: float
    top_p: float
    uniforms: torch.Tensor  # [B, K] float32 in [0, 1), on the drafter's device


def sample_seed(base: int, prompt_index: int, sample: int, stream: str = "") -> int:
    """The seed of one (prompt, sample) generation of a benchmark (`stream`): every row of a setting draws
    the same numbers for it, and other benchmarks draw independent ones."""
    key = f"ready-sample/{int(base)}/{stream}/{int(prompt_index)}/{int(sample)}"
    digest = hashlib.sha256(key.encode()).hexdigest()
    return int(digest[:15], 16)


def warp(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """Probabilities [..., V] of softmax(logits / T) kept to the top-p nucleus (float32, or float64 input kept)."""
    x = logits if logits.dtype == torch.float64 else logits.float()
    probs = torch.softmax(x / float(temperature), dim=-1)
    if top_p < 1.0:
        srt, idx = probs.sort(dim=-1, descending=True, stable=True)
        keep = (srt.cumsum(-1) - srt) < top_p  # the mass before a token is below top_p: the first always stays
        probs = probs * torch.zeros_like(keep).scatter(-1, idx, keep)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: probs [..., V] (need not sum to 1), u [...] in [0, 1) -> token ids [...].

    The first token whose cumulative mass exceeds u * total; never a zero-mass token (rounding that puts
    u * total at the very top falls back to the last token with mass). No host sync: graph-safe."""
    cdf = probs.cumsum(-1)
    x = (u.to(cdf.dtype) * cdf[..., -1]).unsqueeze(-1)
    tok = torch.searchsorted(cdf.contiguous(), x.contiguous(), right=True).squeeze(-1)
    v = probs.shape[-1]
    last = v - 1 - (probs > 0).flip(-1).to(torch.int8).argmax(-1)  # last token with mass
    return torch.where(tok >= v, last, tok)


def accept_law(p: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(accept [..., V], residual [..., V]): min(1, p/q) per token (1 where q = 0: never drafted) and
    normalise(max(0, p - q)), which is p itself where p <= q everywhere (no rejection is then possible)."""
    accept = torch.where(q > 0, (p / torch.where(q > 0, q, torch.ones_like(q))).clamp(max=1.0), torch.ones_like(q))
    res = (p - q).clamp(min=0.0)
    mass = res.sum(-1, keepdim=True)
    residual = torch.where(mass > 0, res / torch.where(mass > 0, mass, torch.ones_like(mass)), p)
    return accept, residual


def point_mass(drafts: torch.Tensor, vocab: int) -> torch.Tensor:
    """q of a deterministic drafter: one_hot(drafts) as float32 [..., K, V]."""
    return torch.nn.functional.one_hot(drafts, vocab).to(torch.float32)


def speculative_round(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, u_accept: torch.Tensor,
                      u_next: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One block under the standard rule: p [k+1, V] target, q [k, V] drafter, drafts [k], u_accept [k],
    u_next [] -> (A accepted drafts, the next token: residual of the first rejection or the bonus from p_k),
    both 0-dim tensors on p's device (no host sync). `speculative_rounds` with one row."""
    k = drafts.shape[0]
    n = torch.full((1,), k, dtype=torch.int64, device=p.device)
    n_acc, nxt = speculative_rounds(p[None], q[None], drafts[None], u_accept[None], u_next.reshape(1), n)
    return n_acc[0], nxt[0]


def speculative_rounds(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, u_accept: torch.Tensor,
                       u_next: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """B blocks at once (the batched engine's rows): p [B, K+1, V], q [B, K, V], drafts [B, K], u_accept
    [B, K], u_next [B], n [B] the drafts row b verified (1..K; drafts, q and p rows past it are ignored)
    -> (A [B], next tokens [B]): row b is the standard rule over its first n[b] drafts, the bonus token
    from p[b, n[b]] (no host sync)."""
    B, K = drafts.shape
    accept, residual = accept_law(p[:, :K], q)
    a_d = accept.gather(-1, drafts[..., None])[..., 0]
    verified = torch.arange(K, device=p.device)[None] < n[:, None]
    n_acc = ((u_accept < a_d) & verified).to(torch.int64).cumprod(-1).sum(-1)
    rows = torch.arange(B, device=p.device)
    # where the token after A accepted drafts comes from: the residual of the first rejection, or the bonus
    src = torch.where((n_acc < n)[:, None], residual[rows, n_acc.clamp(max=K - 1)], p[rows, n])
    return n_acc, draw(src, u_next)


def position_law(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The distribution [..., V] of the token the rule commits at one draft position, with the draft drawn
    from q (normalised, as `draw` does) and judged by `accept_law(p, q)`: equals p when the rule is exact."""
    p, q = p.double(), q.double()
    accept, residual = accept_law(p, q)
    drawn = q / q.sum(-1, keepdim=True)
    kept = drawn * accept
    return kept + (1.0 - kept.sum(-1, keepdim=True)) * residual


def params_from(temperature: float, top_p: float = 1.0, seed: int = 0) -> Optional[SamplingParams]:
    """SamplingParams for T > 0, None for greedy (the engine's default path)."""
    params = SamplingParams(float(temperature), float(top_p), int(seed))
    return None if params.greedy else params
