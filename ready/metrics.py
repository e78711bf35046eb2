"""Decoding metrics: acceptance, tau, throughput, speedup, gain and draft-prefix survival.

What every number in every table means (the one definition `reports.stats`, the reports and the
MLflow metrics all read):

- Round i is one target verification of a drafted block of K tokens. A_i in 0..K is the
  number of drafts accepted (the longest prefix equal to the target's greedy argmax); the
  round appends the accepted drafts plus the target's correction (its bonus token when all K
  match), c_i = A_i + 1 tokens, fewer when the token budget or EOS cuts it (`committed`).
  Autoregressive decoding is the K = 0 case: every step is a round with A_i = 0.
- The horizon h_i in 0..K is the number of draft positions that could still be observed in
  round i: min(K, tokens left in the budget, position of an accepted EOS draft). Positions
  past the horizon are *censored* (nobody can tell whether they would have been accepted)
  and A_i is capped at h_i. Only the budget and EOS censor: where a verify schedule
  (`ready.decode.schedule`) verified n_i < K drafts, the horizon is still the budget's and
  position n_i + 1 is a stop (observed, not accepted), as a rejection is. The schedule stops
  where the confidence head is unsure, so the drafts it leaves are not missing at random;
  censoring them would bias every P_j, and tau, up.
- Draft-prefix survival (cumulative, not conditional), j = 1..K:
      P_j = hits_j / N_j,   hits_j = #{i : h_i >= j, A_i >= j},   N_j = #{i : h_i >= j}.
  A round with h_i < j is left out of N_j, never counted as a rejection. P_j is None when
  no round observed position j.
- tau = 1 + sum_j P_j: the tokens a verification round commits, E[A + 1] = 1 + sum_j
  P(A >= j), read from the censored survival, so a round the budget (or EOS) cut counts for
  the positions it observed and no further. Without cut rounds (h_i = K, c_i = A_i + 1 for
  every round) it is sum_i c_i / #rounds; with them, that plain ratio would count a cut
  round's missing tokens as rejections and pull every row's tau, and every gain, towards 1.
  tau is None when some position j <= K was never observed (no round reached it).
- Pooling: a benchmark pools the rounds of all its sequences (sums of hits_j and N_j), and
  `overall` pools every benchmark's rounds the same way (`overall`, `reports.stats.OVERALL`):
  a ratio of sums, never a mean of the benchmarks' values.
- TPS = new tokens / wall time. The clock of one generation (see `ready.decode.engine`)
  starts just before the target's prefill of the prompt and stops once the last new token
  is known: it includes prefill, drafting, verification, commits and the Python loop; it
  excludes tokenisation, cache allocation and warm-up runs. On CUDA the device is
  synchronised at both ends. Pooled TPS = sum of new tokens / sum of wall times.
  `prefill_s` is recorded separately, so decode-only throughput can be derived.
- speedup = TPS / TPS_AR on the same prompts and budget; gain_pct(x, base) = 100 (x/base - 1).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Sequence

import numpy as np
from numpy.typing import ArrayLike


@dataclass
class SequenceLog:
    """What one generation recorded (one prompt, one method)."""

    new_tokens: int
    wall_s: float
    accepted: list[int] = field(default_factory=list)  # A_i per round
    horizons: list[int] = field(default_factory=list)  # h_i per round
    prefill_s: float = 0.0
    committed: list[int] = field(default_factory=list)  # c_i per round, tokens appended (a record; tau reads A and h)

    @property
    def rounds(self) -> int:
        return len(self.accepted)


def check_rounds(accepted: Sequence[int], horizons: Sequence[int], proposals: int) -> None:
    """Raise ValueError unless 0 <= A_i <= h_i <= K for every round."""
    if len(accepted) != len(horizons):
        raise ValueError(f"accepted ({len(accepted)} rounds) and horizons ({len(horizons)} rounds) differ in length")
    for i, (a, h) in enumerate(zip(accepted, horizons)):
        if not (0 <= a <= h <= proposals):
            raise ValueError(f"round {i}: expected 0 <= A <= h <= K, got A={a}, h={h}, K={proposals}")


def tau_of_counts(hits: ArrayLike, observed: ArrayLike) -> np.ndarray:
    """tau = 1 + sum_j hits_j / observed_j over the last axis (the module docstring's rule); NaN where
    some position was never observed. Works on one count vector [K] or a stack [..., K] of them."""
    h, n = np.asarray(hits, dtype=np.float64), np.asarray(observed, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(n > 0, h / np.where(n > 0, n, 1.0), np.nan)
    return 1.0 + p.sum(-1)


def _tau_or_none(hits: Sequence[int], observed: Sequence[int], rounds: int) -> Optional[float]:
    if rounds == 0:
        return None
    value = float(tau_of_counts(hits, observed))
    return value if math.isfinite(value) else None


def tau(accepted: Sequence[int], horizons: Sequence[int], proposals: int) -> Optional[float]:
    """Committed tokens per round, 1 + sum_j P_j with censoring past each round's horizon; None when
    there was no round or a position j <= K was never observed."""
    hits, observed = survival_counts(accepted, horizons, proposals)
    return _tau_or_none(hits, observed, len(accepted))


def survival_counts(accepted: Sequence[int], horizons: Sequence[int], proposals: int) -> tuple[list[int], list[int]]:
    """Per draft position j = 1..K: (#rounds with A_i >= j among observed, N_j observed)."""
    check_rounds(accepted, horizons, proposals)
    hits = [0] * proposals
    observed = [0] * proposals
    for a, h in zip(accepted, horizons):
        for j in range(1, h + 1):
            observed[j - 1] += 1
            hits[j - 1] += int(a >= j)
    return hits, observed


def survival(accepted: Sequence[int], horizons: Sequence[int], proposals: int) -> list[Optional[float]]:
    """Cumulative draft-prefix survival P_1..P_K with censoring past each round's horizon."""
    hits, observed = survival_counts(accepted, horizons, proposals)
    return [h / n if n else None for h, n in zip(hits, observed)]


def tps(new_tokens: int, wall_s: float) -> float:
    """Tokens per second; 0 when no time was measured (nothing was generated)."""
    return new_tokens / wall_s if wall_s > 0 else 0.0


def speedup(tps_method: float, tps_ar: float) -> Optional[float]:
    """TPS relative to autoregressive decoding on the same prompts; None without an AR figure."""
    return tps_method / tps_ar if tps_ar > 0 else None


def gain_pct(value: Optional[float], baseline: Optional[float]) -> Optional[float]:
    """Relative gain in percent, 100 (value / baseline - 1); None if either is missing."""
    if value is None or baseline is None or baseline == 0:
        return None
    return 100.0 * (value / baseline - 1.0)


@dataclass
class Metrics:
    """One method on one benchmark (or `overall`); JSON-serialisable via `to_dict`."""

    benchmark: str
    method: str
    proposals: int  # K (0 for AR)
    prompts: int
    rounds: int
    new_tokens: int
    wall_s: float
    prefill_s: float
    tau: Optional[float]
    tps: float
    survival: list[Optional[float]]  # P_1 .. P_K
    survival_n: list[int]  # N_1 .. N_K (rounds that observed position j)
    accept_hist: list[int]  # number of rounds with A = 0 .. K
    speedup: Optional[float] = None  # vs AR, set by `with_ar`
    lossless: Optional[int] = None  # 1/0, set by the evaluation that compared against AR

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def mlflow_metrics(self, prefix: Optional[str] = None) -> dict[str, float]:
        """Flat `<benchmark>/<name>` numbers as the MLflow contract names them (docs/interfaces.md)."""
        p = (prefix or self.benchmark) + "/"
        out: dict[str, float] = {p + "tps": self.tps, p + "rounds": float(self.rounds), p + "new_tokens": float(self.new_tokens)}
        if self.tau is not None:
            out[p + "tau"] = self.tau
        if self.speedup is not None:
            out[p + "speedup"] = self.speedup
        if self.lossless is not None:
            out[p + "lossless"] = float(self.lossless)
        for j, value in enumerate(self.survival, start=1):
            if value is not None:
                out[f"{p}survival_{j}"] = value
        return out


def summarize(logs: Sequence[SequenceLog], benchmark: str, method: str, proposals: int) -> Metrics:
    """Pool the rounds of every sequence of one benchmark into its metrics (tau from the pooled survival)."""
    accepted = [a for log in logs for a in log.accepted]
    horizons = [h for log in logs for h in log.horizons]
    hits, observed = survival_counts(accepted, horizons, proposals)
    hist = [0] * (proposals + 1)
    for a in accepted:
        hist[a] += 1
    new_tokens = sum(log.new_tokens for log in logs)
    wall = sum(log.wall_s for log in logs)
    return Metrics(
        benchmark=benchmark,
        method=method,
        proposals=proposals,
        prompts=len(logs),
        rounds=len(accepted),
        new_tokens=new_tokens,
        wall_s=wall,
        prefill_s=sum(log.prefill_s for log in logs),
        tau=_tau_or_none(hits, observed, len(accepted)),
        tps=tps(new_tokens, wall),
        survival=[h / n if n else None for h, n in zip(hits, observed)],
        survival_n=observed,
        accept_hist=hist,
    )


def with_ar(metrics: Metrics, ar: Metrics) -> Metrics:
    """Set `metrics.speedup` from the AR run on the same prompts (returns the same object)."""
    metrics.speedup = speedup(metrics.tps, ar.tps)
    return metrics


def _hits(m: Metrics) -> list[int]:
    """Rounds with A >= j among those that observed j, per position (P_j × N_j, exact integers)."""
    return [round(p * n) if p is not None else 0 for p, n in zip(m.survival, m.survival_n)]


def overall(per_benchmark: Sequence[Metrics], ar: Optional[Sequence[Metrics]] = None) -> Metrics:
    """Every benchmark's rounds pooled (ratios of sums, the module docstring): survival and tau from the
    summed hits_j and N_j, TPS from the summed tokens and wall times; counts are summed; lossless is 1
    only if every benchmark is lossless; the speedup is the pooled TPS over AR's pooled TPS."""
    if not per_benchmark:
        raise ValueError("overall() needs at least one benchmark's metrics")
    methods = {m.method for m in per_benchmark}
    sizes = {m.proposals for m in per_benchmark}
    if len(methods) != 1 or len(sizes) != 1:
        raise ValueError(f"overall() mixes methods {sorted(methods)} / proposals {sorted(sizes)}")
    k = sizes.pop()
    lossless = [m.lossless for m in per_benchmark]
    hits = [sum(_hits(m)[j] for m in per_benchmark) for j in range(k)]
    observed = [sum(m.survival_n[j] for m in per_benchmark) for j in range(k)]
    rounds = sum(m.rounds for m in per_benchmark)
    new_tokens = sum(m.new_tokens for m in per_benchmark)
    wall = sum(m.wall_s for m in per_benchmark)
    out = Metrics(
        benchmark="overall",
        method=methods.pop(),
        proposals=k,
        prompts=sum(m.prompts for m in per_benchmark),
        rounds=rounds,
        new_tokens=new_tokens,
        wall_s=wall,
        prefill_s=sum(m.prefill_s for m in per_benchmark),
        tau=_tau_or_none(hits, observed, rounds),
        tps=tps(new_tokens, wall),
        survival=[h / n if n else None for h, n in zip(hits, observed)],
        survival_n=observed,
        accept_hist=[sum(m.accept_hist[a] for m in per_benchmark) for a in range(k + 1)],
        lossless=None if any(v is None for v in lossless) else int(all(lossless)),
    )
    if ar:
        out.speedup = speedup(out.tps, overall(ar).tps)
    return out
