"""The lossless check at temperature > 0: the first rounds of every sampled generation, checked in
distribution (greedy rows keep `check_greedy`).

A sampled output cannot be compared token for token with AR. What can be checked exactly is that
every committed token was drawn from the target's distribution given the committed prefix. For each
traced round (`Engine.generate(..., trace_rounds=R)`, `RoundTrace`) two things are checked:

- the rule (`rule_err`): at every judged draft position j, the distribution of the token the rule
  commits there, with the draft drawn from the drafter's q_j as the drafter reported it (normalised,
  as `draw` does) and judged by the engine's `accept_law(p_j, q_j)`, computed in float64
  (`position_law`), must equal p_j within RULE_TOL = 1e-6. The drafted token must have q_j > 0
  (else q is not what it was drawn from). Together: an unnormalised or mismatched q, a wrong rule,
  or a wrong warp on either side fails.
- the states (`state_err`): the target logits the rule used at every committed position (the
  verify after the committed prefix: rejected drafts must leave no trace) against one
  teacher-forced pass of the target over prompt + output, within the greedy check's tie margin
  (`TIE_REL` of the dtype times max(|top-1 logit|, std)); `state_err` is the largest deviation over
  its margin (<= 1 passes). The bonus/correction draw from p needs no other check.

- the schedule (`schedule`, a confidence schedule without a batch budget): a round verified exactly the
  drafts the threshold rule keeps from the confidences it read, min(room, L(c)) (`ready.decode.schedule`);
  with a budget, at most that many (the budget depends on the other rows). The rule and state checks then
  cover the verified drafts; why a truncation that is a stopping time of the drafts keeps the law exact is
  proven by tests/test_sampling_exact.py (the integrated law under the schedule, and a planted
  schedule that reads the draft it decides on, caught).

What this cannot see: whether the drafter's tokens really came from the q it reported (a drafter
that samples from one distribution and reports another passes the rule check). The empirical test
(tests/test_sampling_exact.py: chi-square over many sampled continuations) covers that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from ready.decode.sampling import position_law
from ready.decode.schedule import threshold_length

RULE_TOL = 1e-6


@dataclass
class DistValidity:
    """The distribution check of one sampled generation."""

    dist_valid: int  # rule and states within tolerance on every checked round
    rounds: int  # rounds checked
    rule_err: float = 0.0  # largest |law - p| over judged positions (<= RULE_TOL)
    state_err: float = 0.0  # largest target-logit deviation over its margin at committed positions (<= 1)
    failure: Optional[dict] = None  # the first check that failed


def teacher_forced_logits(target: Any, prompt: torch.Tensor, tokens: Sequence[int]) -> torch.Tensor:
    """The target's float32 logits [N, V] that predicted each of the N new `tokens` (one forward over
    prompt + tokens[:-1], no cache)."""
    device = next(target.parameters()).device
    ids = torch.cat([prompt.to(device).long(), torch.tensor(list(tokens[:-1]), dtype=torch.long, device=device)])
    with torch.inference_mode():
        logits = target(ids[None]).logits[0]
    p = prompt.numel()
    return logits[p - 1:p - 1 + len(tokens)].float()


def rule_error(p: torch.Tensor, q: torch.Tensor) -> float:
    """Largest |position_law(p_j, q_j) - p_j| over rows j (p normalised in float64)."""
    if q.shape[0] == 0:
        return 0.0
    p = p[: q.shape[0]].double()
    target = p / p.sum(-1, keepdim=True)
    return float((position_law(p, q) - target).abs().max())


def scheduled_length(schedule: Any, trace: Any) -> Optional[int]:
    """The drafts the threshold rule keeps in a traced round, min(room, L(c)) (None: the round's room or
    confidences were not traced)."""
    if trace.room < 0 or trace.confidence is None:
        return None
    return min(int(trace.room), threshold_length(trace.confidence, float(schedule.threshold)))


def check_distribution(target: Any, prompt: torch.Tensor, tokens: Sequence[int], traces: Sequence[Any],
                       tie_rel: float, schedule: Optional[Any] = None) -> DistValidity:
    """Check a sampled generation's traced rounds (module docstring). `prompt` 1-D ids, `tokens` the
    generation's new tokens, `traces` its `RoundTrace`s, `tie_rel` the margin's relative size,
    `schedule` the engine's `VerifySchedule` (None: the full one)."""
    if not traces:
        return DistValidity(dist_valid=1, rounds=0)
    full = prompt.tolist() + list(tokens)
    p_len = prompt.numel()
    tf = teacher_forced_logits(target, prompt, tokens).float().cpu()  # row i predicts tokens[i]; on the host beside the traces
    rule_err, state_err, failure = 0.0, 0.0, None
    for r, tr in enumerate(traces):
        if schedule is not None and getattr(schedule, "scheduled", False) and failure is None:
            expected = scheduled_length(schedule, tr)
            n = len(tr.drafts)
            if expected is not None and (n > expected or (schedule.budget <= 0 and n != expected)):
                failure = {"round": r, "check": "schedule", "verified": n, "expected": expected,
                           "reason": "the round verified drafts its confidence schedule does not keep"}
        q = tr.q.detach().double().cpu()
        p = tr.p.detach().double().cpu()
        drafts = list(tr.drafts)
        err = rule_error(p, q)
        rule_err = max(rule_err, err)
        if err > RULE_TOL and failure is None:
            failure = {"round": r, "check": "rule", "error": err, "tolerance": RULE_TOL}
        for j, d in enumerate(drafts):
            if not float(q[j, d]) > 0 and failure is None:
                failure = {"round": r, "check": "support", "position": j + 1, "token": int(d),
                           "reason": "a draft drawn where the drafter's q has no mass"}
        logits = tr.logits.detach().float().cpu()
        for j in range(len(drafts) + 1):  # p_j follows tokens[:start + j]; only committed prefixes count
            if j and (tr.start + j - 1 >= len(full) or full[tr.start + j - 1] != drafts[j - 1]):
                break
            i = tr.start + j - p_len
            if i >= len(tokens):
                break
            row = tf[i]
            margin = tie_rel * max(abs(float(row.max())), float(row.std()))
            dev = float((logits[j] - row).abs().max())
            ratio = dev / margin if margin > 0 else (0.0 if dev == 0 else float("inf"))
            state_err = max(state_err, ratio)
            if ratio > 1.0 and failure is None:
                failure = {"round": r, "check": "states", "position": tr.start + j, "deviation": dev,
                           "margin": margin}
    return DistValidity(dist_valid=int(failure is None), rounds=len(traces), rule_err=rule_err,
                        state_err=state_err, failure=failure)
