"""Confidence-scheduled verification: how many of a round's K drafts each row verifies.

DSpark's confidence head (`ready.drafter.heads.ConfidenceHead`) scores every proposal of a block: for
draft position j (1..K), c_j = sigmoid(w . [h_j; W1[x_{j-1}]]), the predicted probability that draft j
is accepted given that drafts 1..j-1 were (trained on that acceptance under the decoding at
`train.loss.confidence_temperature`, `ready.train.loss.confidence_label`: greedy at the default 0). h_j is
the position's hidden state and x_{j-1} the token drafted before it (the anchor for j = 1), so c_j depends
on drafts 1..j-1 only. DSpark's authors schedule
verification with it in two ways, and this module states both (our code, following their rules):

- **threshold** (DeepSpec, `deepspec/eval/dspark/draft_ops.py`, `_confident_prefix_length`, and SGLang's
  first DSpark worker, sgl-project/sglang PR #29538, `DSparkWorkerV2._confident_prefix`): a row verifies
  the longest prefix of its drafts whose every step confidence is at least the threshold t, i.e.
  L = min{j : c_j < t} - 1 (K when there is none). DeepSpec proposes exactly those L drafts (0: the
  round verifies the anchor alone); SGLang caps the accepted length at L. Threshold 0 verifies the full
  block (DeepSpec's default; SGLang's too).
- **budget** (SGLang's merged scheduler, PR #30261, `sglang/kernels/ops/speculative/dspark/
  dspark_schedule.py`, `schedule_verify_lens_topk`): the batch verifies at most `budget` drafts over all
  its rows. Candidates are every row's predicted survivals S_j = c_1 ... c_j (the probability that draft
  j is accepted at all), at least `SURVIVAL_EPS`; the `budget` largest are chosen, ties broken by the
  lower position and then the lower row; a row verifies as many drafts as were chosen in it. S falls
  along a row and ties go to the lower position, so the chosen drafts of a row are a prefix of it.
  (SGLang picks the budget each step from a profiled cost table of verify time against batch tokens;
  here it is fixed: `budget` drafts per decoding row, `VerifySchedule.budget`.)

`VerifySchedule` (`eval.verify_schedule: confidence`, `eval.confidence_threshold`, `eval.verify_budget`)
applies the threshold (when > 0), then the budget (when > 0) among the drafts the threshold kept, and
never more than a row's `room` (the drafts its token budget can still keep).

Why the output stays exact. Greedy: the round accepts the longest prefix of the L verified drafts that
matches the target's argmaxes and appends the target's token after it, which is greedy decoding's next
A + 1 tokens whatever L is. Sampling: the standard rule applied to the first L drafts is exact for any L
that is a stopping time of the drafts: whether draft j is verified may depend on drafts 1..j-1, never on
draft j or later ones. Both rules are: c_j reads drafts 1..j-1; under the budget, draft j's rank among
the candidates depends on S_j, on the other rows (drawn with their own random numbers) and on the row's
earlier survivals, never on its later ones (S_{j'} <= S_j and j' > j rank after it). A rule that looked at
draft j itself would bias the committed token (tests/test_sampling_exact.py plants one and catches it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from ready.decode.errors import DecodeError

SCHEDULES = ("full", "confidence")
SURVIVAL_EPS = 1e-6  # SGLang's `DSparkScheduleConfig.survival_eps`: survivals below it are never verified


@dataclass(frozen=True)
class VerifySchedule:
    """Which drafts a round verifies: `full` (all of them) or `confidence` (module docstring): the
    threshold rule at `threshold` (> 0; 0 = off), then a batch budget of `budget` drafts per decoding row
    (> 0; 0 = off)."""

    kind: str = "full"
    threshold: float = 0.5
    budget: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise DecodeError(f"verify schedule {self.kind!r}; expected one of {list(SCHEDULES)}")
        if not 0.0 <= self.threshold <= 1.0:
            raise DecodeError(f"confidence threshold {self.threshold}; expected a number in [0, 1] (0 = no threshold)")
        if not self.budget >= 0.0:
            raise DecodeError(f"verify budget {self.budget}; expected drafts per decoding row >= 0 (0 = no budget)")

    @property
    def scheduled(self) -> bool:
        """Whether the drafter's confidences decide what is verified (a `confidence` schedule)."""
        return self.kind == "confidence"

    def lengths(self, confidence: Sequence[Optional[Sequence[float]]], room: Sequence[int]) -> list[int]:
        """Drafts each row verifies: `confidence[b]` row b's step confidences c_1..c_K (None: a row with
        nothing to decode), `room[b]` the most it may verify. Full: `room`."""
        if not self.scheduled:
            return [int(r) for r in room]
        caps = [min(int(r), threshold_length(c, self.threshold)) if c is not None else 0
                for c, r in zip(confidence, room)]
        if self.budget > 0:
            live = sum(c is not None for c in confidence)
            caps = budget_lengths(confidence, caps, budget_drafts(self.budget, live))
        return caps


def schedule_from(eval_cfg: Any) -> VerifySchedule:
    """The schedule a run's `eval` section chooses (`eval.verify_schedule`, `eval.confidence_threshold`,
    `eval.verify_budget`; absent keys: the full schedule's defaults)."""
    return VerifySchedule(str(getattr(eval_cfg, "verify_schedule", "full")),
                          float(getattr(eval_cfg, "confidence_threshold", 0.5)),
                          float(getattr(eval_cfg, "verify_budget", 0.0)))


def threshold_length(confidence: Sequence[float], threshold: float) -> int:
    """DeepSpec's / SGLang #29538's rule: the number of leading step confidences >= `threshold` (all of
    them when none is below; threshold 0 keeps the whole block)."""
    n = 0
    for c in confidence:
        if not c >= threshold:
            break
        n += 1
    return n


def survivals(confidence: Sequence[float]) -> list[float]:
    """S_j = c_1 ... c_j: the predicted probability that draft j is accepted."""
    out, s = [], 1.0
    for c in confidence:
        s *= float(c)
        out.append(s)
    return out


def budget_drafts(per_row: float, rows: int) -> int:
    """The batch's draft budget: `per_row` drafts per decoding row, rounded to the nearest count."""
    return int(round(float(per_row) * int(rows)))


def budget_lengths(confidence: Sequence[Optional[Sequence[float]]], caps: Sequence[int], budget: int) -> list[int]:
    """SGLang #30261's top-k rule: the `budget` largest survivals (>= SURVIVAL_EPS) over every row's first
    caps[b] drafts, ties to the lower position then the lower row; a row verifies as many as were chosen
    in it (a prefix of the row)."""
    cands = []
    for b, (c, cap) in enumerate(zip(confidence, caps)):
        if c is None:
            continue
        for j, s in enumerate(survivals(c)[:int(cap)]):
            if s >= SURVIVAL_EPS:
                cands.append((-s, j, b))
    cands.sort()
    out = [0] * len(caps)
    for _, _, b in cands[:max(0, int(budget))]:
        out[b] += 1
    return out


__all__ = ["SCHEDULES", "SURVIVAL_EPS", "VerifySchedule", "budget_drafts", "budget_lengths", "schedule_from",
           "survivals", "threshold_length"]
