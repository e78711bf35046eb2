"""Prompt-lookup (n-gram) drafter: a training-free baseline that needs no checkpoint.

It looks for the latest earlier occurrence of the context's last n tokens (n from `max_ngram`
down to `min_ngram`) and proposes the K tokens that followed it. When the continuation runs
into the end of the context, it keeps copying from its own proposal, which extends a
repeating pattern with its period. Without any match it proposes the last token K times.
"""

from __future__ import annotations

import torch

from ready.decode.errors import DecodeError
from ready.decode.protocol import DraftStep


class NgramDrafter:
    """Implements the `Drafter` protocol with prompt lookup over the committed tokens."""

    def __init__(self, vocab_size: int, proposals: int = 7, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if proposals < 1:
            raise DecodeError(f"n-gram drafter: K={proposals} proposals per round; expected an integer >= 1")
        if not (1 <= min_ngram <= max_ngram):
            raise DecodeError(f"n-gram drafter: n-gram sizes {min_ngram}..{max_ngram}; expected 1 <= min_ngram <= max_ngram")
        self.vocab_size = vocab_size
        self.proposals = proposals
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.capture_layers: list[int] = []

    def begin(self, prompt_ids: torch.Tensor) -> None:
        """Prompt lookup keeps no state between rounds."""

    def propose(self, step: DraftStep) -> torch.Tensor:
        rows = [self.propose_row(row) for row in step.tokens.detach().cpu()]
        return torch.tensor(rows, dtype=torch.long, device=step.tokens.device)

    def propose_row(self, tokens: torch.Tensor) -> list[int]:
        """K draft tokens for one sequence of committed tokens (1-D)."""
        start = self.match_start(tokens)
        seq = tokens.tolist()
        if start is None:
            return [seq[-1]] * self.proposals
        out = list(seq)
        for i in range(self.proposals):
            out.append(out[start + i])  # start + i < len(out): copying may read its own proposal
        return out[len(seq):]

    def match_start(self, tokens: torch.Tensor) -> int | None:
        """Index just after the latest earlier occurrence of the longest matching suffix n-gram."""
        t = tokens.numel()
        for n in range(min(self.max_ngram, t - 1), self.min_ngram - 1, -1):
            suffix = tokens[t - n:]
            windows = tokens[: t - 1].unfold(0, n, 1)  # windows ending before the last token
            hits = (windows == suffix).all(dim=1).nonzero()
            if hits.numel():
                return int(hits[-1]) + n
        return None
