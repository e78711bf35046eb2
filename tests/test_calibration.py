"""The confidence head's calibration (`ready.calibration`): per draft position, the predicted prefix
acceptance against the observed one, as DeepSpec's evaluator bins it (transcribed here in torch), with
rounds censored beyond their horizon or the drafts they verified; the verification record and its
MLflow metrics; and an evaluation of a DSpark drafter with a confidence head that records them."""

from __future__ import annotations

import pytest
import torch

from ready.calibration import (calibration, fit_sts, rescaled, rounds_of, sts_holdout, verification_metrics,
                               verification_summary)
from ready.config import DrafterConfig, ReaderConfig
from ready.decode import evaluate
from ready.decode.schedule import VerifySchedule
from ready.drafter import DSparkDrafter

from tiny_models import VOCAB, small_target


def deepspec_coarse_ece(probs: list[list[float]], targets: list[list[float]], bins: int = 20) -> list[float]:
    """DeepSpec `PerPositionConfidenceMetrics` (coarse bins) over rounds given as cumprod predictions and
    prefix labels per position: ECE per position."""
    K = max(len(p) for p in probs)
    count, pred, tgt = torch.zeros(K, bins, dtype=torch.float64), torch.zeros(K, bins, dtype=torch.float64), \
        torch.zeros(K, bins, dtype=torch.float64)
    for p, t in zip(probs, targets):
        pr = torch.tensor(p, dtype=torch.float64).clamp(1e-8, 1 - 1e-8)
        tg = torch.tensor(t, dtype=torch.float64)
        idx = (pr * bins).long().clamp(0, bins - 1)
        pos = torch.arange(pr.numel())
        flat = pos * bins + idx
        count.view(-1).scatter_add_(0, flat, torch.ones_like(pr))
        pred.view(-1).scatter_add_(0, flat, pr)
        tgt.view(-1).scatter_add_(0, flat, tg)
    out = []
    for j in range(K):
        w = count[j]
        denom = w.clamp_min(1e-12)
        out.append(float(((pred[j] / denom - tgt[j] / denom).abs() * w).sum() / w.sum()))
    return out


def test_calibration_is_deepspecs_per_position_ece_with_censored_rounds():
    g = torch.Generator().manual_seed(0)
    rounds, probs, targets = [], [], []
    for _ in range(300):
        conf = torch.rand(4, generator=g).tolist()
        a = int(torch.randint(0, 5, (1,), generator=g))
        h = int(torch.randint(0, 5, (1,), generator=g)) if torch.rand(1, generator=g) < 0.3 else 4
        a = min(a, h)
        rounds.append((conf, a, h))
        if h:  # DeepSpec truncates a proposal to its effective length (the drafts verified, cut at an EOS)
            cum = torch.tensor(conf, dtype=torch.float64).cumprod(0)[:h].tolist()
            probs.append(cum)
            targets.append([1.0 if a >= j else 0.0 for j in range(1, h + 1)])
    cal = calibration(rounds, 4)
    want = deepspec_coarse_ece(probs, targets)
    assert [p["ece"] for p in cal["positions"]] == pytest.approx(want, abs=1e-12)
    assert [p["n"] for p in cal["positions"]] == [sum(r[2] >= j for r in rounds) for j in range(1, 5)]
    n = [p["n"] for p in cal["positions"]]
    assert cal["ece"] == pytest.approx(sum(e * c for e, c in zip(want, n)) / sum(n))


def test_reliability_bins_by_hand():
    # position 1: predictions .95 (accepted), .95 (rejected), .05 (rejected); position 2: .95*.5 = .475 once
    rounds = [([0.95, 0.5], 2, 2), ([0.95, 0.1], 0, 2), ([0.05, 0.9], 0, 1)]
    cal = calibration(rounds, 2, bins=10)
    p1, p2 = cal["positions"]
    assert p1["n"] == 3 and p2["n"] == 2
    assert p1["reliability"] == [[0.0, 0.1, 1, 0.05, 0.0], [0.9, 1.0, 2, 0.95, 0.5]]
    assert p1["ece"] == pytest.approx((1 * 0.05 + 2 * 0.45) / 3)
    assert p1["brier"] == pytest.approx((0.05 ** 2 + 0.95 ** 2 + 0.05 ** 2) / 3)
    assert p2["reliability"] == [[0.0, 0.1, 1, pytest.approx(0.095), 0.0], [0.4, 0.5, 1, 0.475, 1.0]]
    assert calibration([], 2) is None


def test_calibration_scores_only_the_positions_a_round_verified():
    """Issue 74 item 5: a scheduled round's horizon is the budget's (K here), but the target never judged a
    draft past the schedule's cut: position j counts only where j <= min(horizon, verified)."""
    conf = [[0.9, 0.8, 0.2], [0.7, 0.3, 0.1], [0.2, 0.9, 0.9], [0.9, 0.9, 0.9]]
    scheduled = [{"verified": [3, 1, 0, 3], "accepted": [2, 1, 0, 2], "horizons": [3, 3, 3, 2], "confidence": conf}]
    assert rounds_of(scheduled) == [(conf[0], 2, 3), (conf[1], 1, 1), (conf[2], 0, 0), (conf[3], 2, 2)]
    cal = calibration(rounds_of(scheduled), 3)
    assert [p["n"] for p in cal["positions"]] == [3, 2, 1]
    # the same rounds as the verified positions alone observe them
    assert cal == calibration([(conf[0], 2, 3), (conf[1], 1, 1), (conf[3], 2, 2)], 3)


def test_calibration_of_full_schedule_rounds_is_unchanged_by_verified():
    """Under the full schedule a round verifies min(K, budget left) >= its horizon drafts: reading `verified`
    changes no number (nor for records written before it)."""
    g = torch.Generator().manual_seed(1)
    rec = {"verified": [], "accepted": [], "horizons": [], "confidence": []}
    for i in range(200):
        room = 4 if i % 5 else int(torch.randint(1, 5, (1,), generator=g))  # the budget's last rounds
        h = room if i % 7 else max(1, room - 1)  # an accepted EOS cuts the horizon below the drafts verified
        rec["verified"].append(room)
        rec["horizons"].append(h)
        rec["accepted"].append(min(h, int(torch.randint(0, 5, (1,), generator=g))))
        rec["confidence"].append(torch.rand(4, generator=g).tolist())
    bare = {k: v for k, v in rec.items() if k != "verified"}
    assert rounds_of([rec]) == rounds_of([bare])
    assert calibration(rounds_of([rec]), 4) == calibration(rounds_of([bare]), 4)


def test_verification_record_and_its_mlflow_metrics():
    recs = [{"verified": [3, 1, 0], "accepted": [2, 1, 0], "horizons": [3, 3, 3],
             "confidence": [[0.9, 0.8, 0.2], [0.7, 0.3, 0.1], [0.2, 0.9, 0.9]]},
            {"verified": [3], "accepted": [3], "horizons": [2], "confidence": [[0.9, 0.9, 0.9]]}]
    v = verification_summary(recs, 3, {"verify_schedule": "confidence", "confidence_threshold": 0.5})
    assert v["rounds"] == 4 and v["verified_per_round"] == pytest.approx((7 + 4) / 4)
    assert v["verified_drafts_per_round"] == pytest.approx(7 / 4) and v["verify_schedule"] == "confidence"
    assert len(rounds_of(recs)) == 4 and v["calibration"]["positions"][0]["n"] == 3
    m = verification_metrics({"benchmarks": {"humaneval": {"verification": v}, "old": {}}, "verification": v})
    assert m["humaneval/verified_per_round"] == m["overall/verified_per_round"] == v["verified_per_round"]
    assert m["humaneval/ece"] == v["calibration"]["ece"] and "humaneval/ece_1" in m and "old/ece" not in m


@pytest.mark.parametrize("schedule", ["full", "confidence"])
def test_evaluate_records_verification_and_calibration(schedule):
    target = small_target()
    torch.manual_seed(2)
    d = DSparkDrafter(DrafterConfig(proposals=3, num_layers=1, head_rank=8, confidence_head=True),
                      ReaderConfig(enabled=False), target).eval()
    with torch.no_grad():
        d.confidence_head.proj.weight.normal_(0.0, 0.15)
    ps = [[(7 * i + j) % VOCAB for j in range(5 + i)] for i in range(4)]
    res = evaluate(target, d, ps, 12, warmup=0, progress=False, concurrency=2,
                   verify_schedule=VerifySchedule(schedule, 0.5))
    assert res.lossless_exact == 1
    v = res.verification
    assert v["verify_schedule"] == schedule and v["rounds"] == res.metrics.rounds
    assert v["verified_per_round"] == pytest.approx(sum(n + 1 for p in res.prompts for n in p.verified) / v["rounds"])
    assert v["calibration"]["n"] > 0 and all(len(p.confidence) == len(p.accepted) for p in res.prompts)
    # every position the calibration counted was verified in its round
    seen = [min(h, n) for p in res.prompts for h, n in zip(p.horizons, p.verified)]
    assert [q["n"] for q in v["calibration"]["positions"]] == [sum(s >= j for s in seen) for j in (1, 2, 3)]
    if schedule == "full":
        assert v["verified_drafts_per_round"] > 2.5  # the budget's last rounds alone verify fewer than K = 3
    assert evaluate(target, None, ps, 6, warmup=0, progress=False).verification is None


# --- sequential temperature scaling (DSpark's STS) --------------------------------------------------------------

def _chain_rounds(n: int, k: int, head_temperature: float, seed: int = 0) -> list[tuple[list[float], int, int]]:
    """Rounds whose step acceptances are Bernoulli(sigmoid(z_j)) given the prefix, reported by a head that says
    sigmoid(z_j * head_temperature): over-confident above 1. Every round observes all k positions."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        z = torch.randn(k, generator=g) * 1.5 + 1.0
        true = torch.sigmoid(z)
        accepted = 0
        while accepted < k and float(torch.rand(1, generator=g)) < float(true[accepted]):
            accepted += 1
        out.append(([float(c) for c in torch.sigmoid(z * head_temperature)], accepted, k))
    return out


def test_sts_finds_the_temperature_that_undoes_an_over_confident_head():
    rounds = _chain_rounds(4000, 3, head_temperature=2.0)
    temps = fit_sts(rounds, 3)
    assert temps[0] == pytest.approx(2.0, abs=0.25)  # c' = sigmoid(logit(c) / T): T = 2 gives back sigmoid(z)
    before = calibration(rounds, 3)["ece"]
    after = calibration([(rescaled(c, temps), a, h) for c, a, h in rounds], 3)["ece"]
    assert after < before / 2


def test_sts_leaves_a_calibrated_head_near_temperature_one_and_fits_left_to_right():
    rounds = _chain_rounds(4000, 3, head_temperature=1.0, seed=1)
    assert fit_sts(rounds, 3)[0] == pytest.approx(1.0, abs=0.25)
    # a position no round observes keeps temperature 1; rescaling is order-preserving and T = 1 is the identity
    assert fit_sts([([0.9, 0.8], 2, 1)], 2)[1] == 1.0
    assert rescaled([0.2, 0.7], [1.0, 1.0]) == pytest.approx([0.2, 0.7])
    assert rescaled([0.2, 0.7], [3.0, 3.0])[0] < rescaled([0.2, 0.7], [3.0, 3.0])[1]


def test_sts_holdout_fits_on_even_prompts_and_scores_the_odd_ones():
    rounds = _chain_rounds(2000, 2, head_temperature=2.5, seed=2)
    records = [{"confidence": [c], "accepted": [a], "horizons": [h], "verified": [h]} for c, a, h in rounds]
    out = sts_holdout(records, 2)
    assert out["fit_rounds"] == out["holdout_rounds"] == 1000
    assert out["temperatures"] == fit_sts(rounds_of(records[0::2]), 2)
    assert out["holdout_ece_after"] < out["holdout_ece_before"]
    assert sts_holdout(records[:1], 2) is None  # nothing to score
