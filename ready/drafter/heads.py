"""DSpark sequence heads: a light correction of each draft position's logits by the previous token.

The backbone drafts all K positions in parallel, so on its own position j cannot know which
token was drafted at j-1. A sequence head adds a bias to position j's logits that depends on
the previous token x_{j-1} (the anchor token for j = 1):

- `vanilla`: a low-rank bigram, bias = W2 W1[x_{j-1}]            (Markov, rank r)
- `gated`:   bias = W2 (sigmoid(G [h_j; W1[x_{j-1}]]) * W1[x_{j-1}])  (the hidden state gates the bigram)
- `rnn`:     a GRU-like state s_j over the drafted prefix, bias = W2 tanh(o_j)
- `none`:    no head (`NoHead`): the block logits are the LM head's logits of the draft layers, as in
             DFlash (DSpark without its Markov head; SpecForge's `DFlashDraftModel`)

Parameter names are DSpark's (`markov_w1` = W1, `markov_w2` = W2, `gate_proj` = G, `joint_proj`), so
a DSpark checkpoint's `markov_head.*` tensors load as they are. The optional confidence head
(`ConfidenceHead`, DSpark's acceptance predictor) reads a proposal's hidden state and, optionally,
the Markov embedding of its previous token.

Training is teacher-forced on the label tokens; drafting is greedy (or, at temperature > 0,
sampled: `sample` conditions each position on the token drawn before it), position by position.
All go through the same `step`, so they cannot disagree. W2 starts at zero: an untrained head adds
nothing to the backbone's logits.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ready import fastops
from ready.decode.sampling import draw, warp

MARKOV_TYPES = ("vanilla", "gated", "rnn")  # DSpark's Markov heads (`markov_head_type` of its config.json)
HEAD_TYPES = MARKOV_TYPES + ("none",)  # `drafter.head`; none = DFlash (no Markov head)


class SequenceHeadError(ValueError):
    """An unknown head type or a bad rank."""


def add_argmax(base: torch.Tensor, bias: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """One greedy position: float32(base) + bias into `out` [B, V] and its argmax [B]. Where Triton runs
    (`fastops.fused`), the kernels package's one pass over the logits (`ready_kernels.add_argmax`: the same
    sums, torch's argmax); elsewhere the torch ops it replaces."""
    fast = fastops.drafting_ops() if fastops.fused(base) else None
    if fast is not None:
        return fast.add_argmax(base, bias, out)
    torch.add(base.float(), bias, out=out)  # float32(base) first: a bf16 + bf16 add would round to bf16
    return out.argmax(-1)


class VanillaHead(nn.Module):
    """Low-rank bigram bias W2 W1[x_{j-1}]."""

    def __init__(self, vocab_size: int, rank: int, hidden: int):
        super().__init__()
        self.rank = rank
        self.markov_w1 = nn.Embedding(vocab_size, rank)  # W1
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)  # W2
        nn.init.normal_(self.markov_w1.weight, std=0.02)
        nn.init.zeros_(self.markov_w2.weight)

    def init_state(self, like: torch.Tensor) -> Optional[torch.Tensor]:
        return None

    def step(self, state: Optional[torch.Tensor], prev: torch.Tensor, hidden: torch.Tensor) -> tuple[Optional[torch.Tensor], torch.Tensor]:
        """One position: prev [...] token ids, hidden [..., D] -> (new state, bias [..., V])."""
        return state, self.markov_w2(self.markov_w1(prev))

    def block_logits(self, base: torch.Tensor, prev: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Teacher-forced: base [..., K, V] (fp32 logits), prev [..., K] (x_{j-1} per position), hidden [..., K, D]."""
        state = self.init_state(hidden[..., 0, :])
        out = []
        for j in range(base.shape[-2]):
            state, bias = self.step(state, prev[..., j], hidden[..., j, :])
            out.append(base[..., j, :] + bias)  # bias promoted to base's dtype on load (no copy of its own)
        return torch.stack(out, dim=-2)

    @torch.no_grad()
    def greedy(self, base: torch.Tensor, first_prev: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft greedily: base [B, K, V] (the LM head's logits, any float dtype), first_prev [B] (the anchor
        token), hidden [B, K, D] -> (tokens [B, K], the float32 corrected logits they were drawn from
        [B, K, V]; the same sums as block_logits over float32 base)."""
        state = self.init_state(hidden[:, 0])
        prev, toks = first_prev, []
        logits = base.new_empty(base.shape, dtype=torch.float32)  # each position's sum lands here: no stack
        for j in range(base.shape[1]):
            state, bias = self.step(state, prev, hidden[:, j])
            prev = add_argmax(base[:, j], bias, logits[:, j])
            toks.append(prev)
        return torch.stack(toks, dim=1), logits

    @torch.no_grad()
    def sample(self, base: torch.Tensor, first_prev: torch.Tensor, hidden: torch.Tensor, temperature: float,
               top_p: float, uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft by sampling: position j is drawn from q_j = warp(base_j + bias(x_{j-1})) with uniforms[:, j],
        x_{j-1} the token drawn at j-1 -> (tokens [B, K], q [B, K, V] float32). No host sync (graph-safe)."""
        state = self.init_state(hidden[:, 0])
        prev, toks, probs = first_prev, [], []
        for j in range(base.shape[1]):
            state, bias = self.step(state, prev, hidden[:, j])
            probs.append(warp(base[:, j] + bias, temperature, top_p))
            prev = draw(probs[-1], uniforms[:, j])
            toks.append(prev)
        return torch.stack(toks, dim=1), torch.stack(probs, dim=1)


class GatedHead(VanillaHead):
    """Bigram bias gated by the position's hidden state."""

    def __init__(self, vocab_size: int, rank: int, hidden: int):
        super().__init__(vocab_size, rank, hidden)
        self.gate_proj = nn.Linear(hidden + rank, rank)

    def step(self, state, prev, hidden):
        e = self.markov_w1(prev)
        g = torch.sigmoid(self.gate_proj(torch.cat([hidden.to(e.dtype), e], dim=-1)))
        return state, self.markov_w2(g * e)


class RNNHead(VanillaHead):
    """GRU-like recurrent state over the drafted prefix: position j sees x_{<j}, not only x_{j-1}."""

    def __init__(self, vocab_size: int, rank: int, hidden: int):
        super().__init__(vocab_size, rank, hidden)
        self.joint_proj = nn.Linear(2 * rank + hidden, 3 * rank)  # -> [update gate; candidate; output]

    def init_state(self, like: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*like.shape[:-1], self.rank, device=like.device, dtype=self.joint_proj.weight.dtype)

    def step(self, state, prev, hidden):
        e = self.markov_w1(prev)
        gate, cand, out = self.joint_proj(torch.cat([state, e, hidden.to(e.dtype)], dim=-1)).chunk(3, dim=-1)
        gate = torch.sigmoid(gate)
        state = gate * state + (1 - gate) * torch.tanh(cand)
        return state, self.markov_w2(torch.tanh(out))


class NoHead(nn.Module):
    """DFlash: no sequence head. Every position's logits are the backbone's (the LM head over the
    draft layers' output), so all K proposals are drawn in parallel. Same interface as the Markov
    heads (rank 0, no parameters, nothing in the state_dict), so training and every drafting path,
    the CUDA-graph bodies included, call it the same way."""

    rank = 0

    def block_logits(self, base: torch.Tensor, prev: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Teacher-forced block logits: the backbone's, unchanged (prev and hidden are not read)."""
        return base

    @torch.no_grad()
    def greedy(self, base: torch.Tensor, first_prev: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy draft: (argmax of base [B, K], base [B, K, V] in float32; the argmax of the LM head's
        bf16 logits is that of their float32 values)."""
        return base.argmax(-1), base.float()

    @torch.no_grad()
    def sample(self, base: torch.Tensor, first_prev: torch.Tensor, hidden: torch.Tensor, temperature: float,
               top_p: float, uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Sampled draft: q_j = warp(base_j), position j drawn with uniforms[:, j] -> (tokens [B, K], q [B, K, V]
        float32). No host sync (graph-safe)."""
        probs = warp(base, temperature, top_p)
        return draw(probs, uniforms), probs


class ConfidenceHead(nn.Module):
    """DSpark's acceptance predictor: one logit per proposal from its hidden state (and, with
    `with_markov`, the Markov embedding W1[x_{j-1}] of its previous token)."""

    def __init__(self, hidden: int, markov_rank: int = 0):
        super().__init__()
        self.with_markov = markov_rank > 0
        self.proj = nn.Linear(hidden + markov_rank, 1)

    def forward(self, hidden: torch.Tensor, prev_embedding: Optional[torch.Tensor] = None) -> torch.Tensor:
        """hidden [..., D] (+ prev_embedding [..., r]) -> acceptance logits [...] in fp32."""
        x = torch.cat([hidden, prev_embedding.to(hidden.dtype)], dim=-1) if self.with_markov else hidden
        return self.proj(x).squeeze(-1).float()


def build_head(kind: str, vocab_size: int, rank: int, hidden: int) -> VanillaHead | NoHead:
    """The sequence head named by `drafter.head` (`none`: DFlash's plain logits; the rank is not read)."""
    if kind == "none":
        return NoHead()
    classes = {"vanilla": VanillaHead, "gated": GatedHead, "rnn": RNNHead}
    if kind not in classes:
        raise SequenceHeadError(f"drafter.head: {kind!r} is unknown; expected one of {list(HEAD_TYPES)}")
    if rank < 1:
        raise SequenceHeadError(f"drafter.head_rank: {rank}; expected an integer >= 1")
    return classes[kind](vocab_size, rank, hidden)
