"""How well DSpark's confidence head predicts acceptance, and what a verify schedule verified.

Calibration, per draft position j = 1..K, as DeepSpec's evaluator measures it
(`deepspec/eval/dspark/confidence_head.py`, `PerPositionConfidenceMetrics`): the head's predicted prefix
acceptance S_j = c_1 ... c_j (the cumulative product of its step confidences, `ready.decode.schedule`)
against the observed 1{A >= j} of the round (A accepted drafts). A round observes position j only when
j <= its horizon (min(K, the token budget left), cut at an accepted EOS: `ready.metrics`) and j <= the
drafts it verified (`verified`: under a confidence schedule the target never judged a draft past the
schedule's cut, so whether it would have accepted it is unknown; tau counts that position as a stop, but
calibration has no outcome to score the head's prediction against); beyond it nothing is counted. Under
the full schedule a round verifies min(K, budget left) drafts, never fewer than its horizon, so only the
horizon cuts. Records without `verified` (written before it) are read by their horizons alone. Per
position: the predictions binned into `BINS` equal bins of [0, 1] (DeepSpec's 20), the expected
calibration error ECE_j = sum over bins of (n_bin / n) |mean predicted - mean observed|, the Brier score,
and the reliability bins themselves; over positions, the ECE and Brier weighted by the positions' counts
(DeepSpec's `ece_mean`). DeepSpec collects
calibration only at threshold 0 (every draft verified); under a confidence schedule a row verifies only
the drafts its head was confident in, so its calibration covers those rounds' verified positions alone
(a selected sample: compare rows at the full schedule for the head's calibration as such).

`verification_summary` is one benchmark's record (evaluation.json `verification`): the schedule, drafts
and tokens verified per round (tokens = drafts + the anchor), and the calibration; `verification_metrics`
flattens an evaluation's records into MLflow metrics (docs/interfaces.md "MLflow").
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Optional, Sequence

import torch

BINS = 20  # DeepSpec's CONFIDENCE_NUM_BINS
EPS = 1e-8  # predictions clamped to [EPS, 1 - EPS] before binning (DeepSpec's EPS_PROB)
STS_GRID = tuple(round(0.25 + 0.05 * i, 2) for i in range(76))  # temperatures 0.25 .. 4.0, STS's 1-D search

# one round: (the head's step confidences c_1..c_K, accepted drafts A, observed horizon h: the last
# position whose outcome the round observed, min(its horizon, the drafts it verified))
Round = tuple[Sequence[float], int, int]


def rounds_of(records: Iterable[Any]) -> list[Round]:
    """Every scored round of generation records (`Generation`s, or evaluation.json prompt records with
    `confidence`, `accepted`, `horizons` and `verified`): rounds without confidences (no head, AR) are
    skipped; each round's h is min(horizon, drafts verified) (the horizon alone where `verified` is
    absent)."""
    out: list[Round] = []
    for r in records:
        get = r.get if isinstance(r, Mapping) else (lambda k, d=None, r=r: getattr(r, k, d))
        conf, acc, hor = get("confidence") or [], get("accepted") or [], get("horizons") or []
        ver = get("verified") or []
        for i, (c, a, h) in enumerate(zip(conf, acc, hor)):
            if c:
                out.append((c, int(a), min(int(h), int(ver[i])) if i < len(ver) else int(h)))
    return out


def calibration(rounds: Sequence[Round], proposals: int, bins: int = BINS) -> Optional[dict[str, Any]]:
    """Per-position calibration of the head's predicted prefix acceptance (module docstring); None when no
    round was scored."""
    if not rounds:
        return None
    positions = []
    total_n = ece_sum = brier_sum = 0.0
    for j in range(1, int(proposals) + 1):
        n = [0] * bins
        pred = [0.0] * bins
        obs = [0.0] * bins
        brier = 0.0
        for conf, a, h in rounds:
            if j > h or j > len(conf):
                continue
            s = 1.0
            for c in conf[:j]:
                s *= float(c)
            s = min(max(s, EPS), 1.0 - EPS)
            y = 1.0 if a >= j else 0.0
            k = min(int(s * bins), bins - 1)
            n[k] += 1
            pred[k] += s
            obs[k] += y
            brier += (s - y) ** 2
        count = sum(n)
        if not count:
            positions.append({"position": j, "n": 0, "pred_mean": None, "obs_mean": None, "ece": None,
                              "brier": None, "reliability": []})
            continue
        ece = sum(abs(pred[k] - obs[k]) for k in range(bins)) / count  # sum_k n_k/N |pred_k/n_k - obs_k/n_k|
        rel = [[k / bins, (k + 1) / bins, n[k], pred[k] / n[k], obs[k] / n[k]] for k in range(bins) if n[k]]
        positions.append({"position": j, "n": count, "pred_mean": sum(pred) / count, "obs_mean": sum(obs) / count,
                          "ece": ece, "brier": brier / count, "reliability": rel})
        total_n += count
        ece_sum += ece * count
        brier_sum += brier
    return {"bins": bins, "n": int(total_n), "ece": ece_sum / total_n if total_n else None,
            "brier": brier_sum / total_n if total_n else None, "positions": positions}


def rescaled(conf: Sequence[float], temperatures: Sequence[float]) -> list[float]:
    """Step confidences c_j through their positions' temperatures: sigmoid(logit(c_j) / T_j) (order-preserving;
    SGLang's DSPARK worker applies `dspark_confidence_temperatures` so)."""
    out = []
    for c, t in zip(conf, temperatures):
        c = min(max(float(c), EPS), 1.0 - EPS)
        out.append(1.0 / (1.0 + math.exp(-math.log(c / (1.0 - c)) / float(t))))
    return out


def fit_sts(rounds: Sequence[Round], proposals: int, grid: Sequence[float] = STS_GRID,
            bins: int = BINS) -> list[float]:
    """Sequential temperature scaling (DSpark's STS): for j = 1..K, left to right, the temperature T_j on `grid`
    that minimises ECE_j of the predicted prefix acceptance S_j = c'_1 ... c'_j (c' = `rescaled`), the earlier
    positions' temperatures fixed; 1.0 where no round observes position j (ties: the temperature nearest 1)."""
    temps: list[float] = []
    t = torch.tensor([float(x) for x in grid], dtype=torch.float64)
    for j in range(1, int(proposals) + 1):
        seen = [r for r in rounds if j <= r[2] and j <= len(r[0])]
        if not seen:
            temps.append(1.0)
            continue
        prefix = torch.tensor([math.prod(rescaled(c[:j - 1], temps)) for c, _, _ in seen], dtype=torch.float64)
        c = torch.tensor([float(c[j - 1]) for c, _, _ in seen], dtype=torch.float64).clamp(EPS, 1.0 - EPS)
        hits = torch.tensor([1.0 if a >= j else 0.0 for _, a, _ in seen], dtype=torch.float64)
        pred = (prefix[None] * torch.sigmoid(torch.logit(c)[None] / t[:, None])).clamp(EPS, 1.0 - EPS)  # [G, n]
        at = (pred * bins).long().clamp(max=bins - 1)
        gap = torch.zeros(len(t), bins, dtype=torch.float64).scatter_add_(1, at, pred - hits[None])
        ece = gap.abs().sum(1) / len(seen)
        order = sorted(range(len(t)), key=lambda g: (float(ece[g]), abs(math.log(float(t[g])))))
        temps.append(float(t[order[0]]))
    return temps


def sts_holdout(records: Sequence[Any], proposals: int) -> Optional[dict[str, Any]]:
    """STS fitted on the even-indexed records (prompts) and scored on the odd ones, never split by position (as
    SGLang's calibration tool splits): the temperatures, and the held-out ECE before and after. None without
    scored rounds on both halves."""
    fit, held = rounds_of(records[0::2]), rounds_of(records[1::2])
    if not fit or not held:
        return None
    temps = fit_sts(fit, proposals)
    before = calibration(held, proposals)
    after = calibration([(rescaled(c, temps), a, h) for c, a, h in held], proposals)
    return {"temperatures": temps, "fit_rounds": len(fit), "holdout_rounds": len(held),
            "holdout_ece_before": before["ece"], "holdout_ece_after": after["ece"]}


def verification_summary(records: Sequence[Any], proposals: int, schedule: Mapping[str, Any]) -> dict[str, Any]:
    """One benchmark's verification record: `schedule` (the eval keys that chose it), rounds, drafts and
    tokens verified per round (pooled over the records' rounds), and `calibration` (None without scores)."""
    verified = [int(n) for r in records for n in ((r.get("verified") if isinstance(r, Mapping)
                                                   else getattr(r, "verified", None)) or [])]
    rounds = len(verified)
    return {**dict(schedule), "rounds": rounds,
            "verified_drafts_per_round": sum(verified) / rounds if rounds else None,
            "verified_per_round": (sum(verified) + rounds) / rounds if rounds else None,
            "calibration": calibration(rounds_of(records), proposals)}


def verification_metrics(evaluation: Mapping[str, Any]) -> dict[str, float]:
    """Flat MLflow metrics of an evaluation record's `verification` entries: `<b>/verified_per_round`,
    `<b>/ece`, `<b>/brier`, `<b>/ece_<j>` per benchmark b and `overall/...` (absent where not measured)."""
    out: dict[str, float] = {}
    entries = [(b, rec.get("verification")) for b, rec in (evaluation.get("benchmarks") or {}).items()]
    entries.append(("overall", evaluation.get("verification")))
    for name, v in entries:
        if not v:
            continue
        if v.get("verified_per_round") is not None:
            out[f"{name}/verified_per_round"] = float(v["verified_per_round"])
        cal = v.get("calibration")
        if cal and cal.get("ece") is not None:
            out[f"{name}/ece"] = float(cal["ece"])
            out[f"{name}/brier"] = float(cal["brier"])
            for p in cal["positions"]:
                if p["ece"] is not None:
                    out[f"{name}/ece_{p['position']}"] = float(p["ece"])
    return out


__all__ = ["BINS", "Round", "STS_GRID", "calibration", "fit_sts", "rescaled", "rounds_of", "sts_holdout",
           "verification_metrics", "verification_summary"]
