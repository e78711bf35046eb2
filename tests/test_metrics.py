"""Metrics on hand-built acceptance logs, checked against values worked out by hand."""

import json
import math

import numpy as np
import pytest

from ready.metrics import (
    Metrics, SequenceLog, gain_pct, overall, speedup, summarize, survival, survival_counts, tau, tps, with_ar,
)

# K = 3. Six rounds (A_i, h_i); rounds 4-6 were cut by the budget or EOS (h < K).
#   r1 (3,3) all accepted         r4 (2,2) cut after 2, both accepted -> position 3 censored
#   r2 (0,3) rejected at 1        r5 (0,1) cut after 1, rejected      -> positions 2,3 censored
#   r3 (1,3) rejected at 2        r6 (1,1) cut after 1, accepted      -> positions 2,3 censored
ACCEPTED = [3, 0, 1, 2, 0, 1]
HORIZONS = [3, 3, 3, 2, 1, 1]


def test_tau_is_one_plus_the_censored_survival_summed_over_positions():
    # 1 + P_1 + P_2 + P_3 = 1 + 4/6 + 2/4 + 1/3: the cut rounds r4-r6 count for the positions they observed
    assert tau(ACCEPTED, HORIZONS, 3) == pytest.approx(2.5)
    # without cut rounds it is the plain committed tokens per round, (4 + 1 + 2) / 3
    assert tau(ACCEPTED[:3], HORIZONS[:3], 3) == pytest.approx(7 / 3)
    assert tau([0, 0, 0], [0, 0, 0], 0) == 1.0  # AR: one token a step
    assert tau([], [], 3) is None
    assert tau([1, 2], [2, 2], 4) is None  # positions 3 and 4 never observed: no tau to report


def test_a_token_budget_does_not_bias_tau():
    """2,000 generations of a drafter whose rounds accept A = min(K, Geometric) drafts, each stopped by a
    40-token budget that cuts its last rounds: tau from the censored survival recovers the drafter's
    E[A + 1] (within 0.5 %), while the plain committed-tokens-per-round ratio falls short by several
    percent, because it counts the tokens a cut round could not append as rejections."""
    rng = np.random.default_rng(0)
    k, budget, p = 6, 40, 0.72
    true = 1 + sum(p ** j for j in range(1, k + 1))  # E[min(K, G) + 1] = 1 + Σ_j P(A >= j), P(A >= j) = p^j
    accepted, horizons, committed = [], [], []
    for _ in range(2000):
        made = 1  # the prefill token
        while made < budget:
            left = budget - made
            h = min(k, left)
            a = min(int(rng.geometric(1 - p)) - 1, h)
            c = min(a + 1, left)
            accepted.append(a), horizons.append(h), committed.append(c)
            made += c
    plain = sum(committed) / len(committed)
    assert tau(accepted, horizons, k) == pytest.approx(true, rel=0.005)
    assert plain < 0.97 * true  # 4.7 % short here


def test_survival_is_cumulative_and_leaves_censored_rounds_out():
    # j=1: all 6 rounds observed, A>=1 in r1,r3,r4,r6            -> 4/6
    # j=2: r1..r4 observed (h>=2), A>=2 in r1,r4                  -> 2/4
    # j=3: r1..r3 observed (h>=3), A>=3 in r1                     -> 1/3
    assert survival(ACCEPTED, HORIZONS, 3) == pytest.approx([4 / 6, 2 / 4, 1 / 3])
    assert survival_counts(ACCEPTED, HORIZONS, 3) == ([4, 2, 1], [6, 4, 3])


def test_censored_round_is_not_a_rejection():
    # counting censored positions as rejections would give P_3 = 1/6 instead of 1/3
    naive = sum(a >= 3 for a in ACCEPTED) / len(ACCEPTED)
    assert survival(ACCEPTED, HORIZONS, 3)[2] != pytest.approx(naive)


def test_survival_is_not_conditional_acceptance():
    # conditional P(A>=2 | A>=1, observed) = 2/3 here; the cumulative P_2 is 1/2
    assert survival(ACCEPTED, HORIZONS, 3)[1] == pytest.approx(0.5)


def test_unobserved_position_has_no_survival_value():
    assert survival([1, 2], [2, 2], 4) == [1.0, 0.5, None, None]


def test_inconsistent_round_is_refused():
    with pytest.raises(ValueError, match="A=3, h=2"):
        survival([3], [2], 3)
    with pytest.raises(ValueError, match="K=3"):
        survival([1], [4], 3)


def test_tps_speedup_and_gain_match_the_papers_table_1_average():
    assert tps(100, 4.0) == 25.0
    assert tps(0, 0.0) == 0.0
    assert speedup(302.78, 95.86) == pytest.approx(3.1586, abs=1e-4)
    assert gain_pct(302.78, 280.42) == pytest.approx(7.974, abs=1e-3)
    assert gain_pct(4.5285, 4.1739) == pytest.approx(8.496, abs=1e-3)
    assert gain_pct(None, 1.0) is None


def test_summarize_pools_rounds_of_all_sequences():
    logs = [
        SequenceLog(new_tokens=10, wall_s=1.0, accepted=ACCEPTED[:3], horizons=HORIZONS[:3], prefill_s=0.1),
        SequenceLog(new_tokens=6, wall_s=3.0, accepted=ACCEPTED[3:], horizons=HORIZONS[3:], prefill_s=0.2),
    ]
    m = summarize(logs, "gsm8k", "ready", 3)
    assert (m.prompts, m.rounds, m.new_tokens) == (2, 6, 16)
    assert m.tau == pytest.approx(2.5)
    assert m.tps == pytest.approx(16 / 4.0)
    assert m.prefill_s == pytest.approx(0.3)
    assert m.survival == pytest.approx([4 / 6, 2 / 4, 1 / 3])
    assert m.survival_n == [6, 4, 3]
    assert m.accept_hist == [2, 2, 1, 1]
    ar = summarize([SequenceLog(new_tokens=16, wall_s=8.0, accepted=[0] * 15, horizons=[0] * 15)], "gsm8k", "ar", 0)
    assert ar.tau == 1.0 and ar.survival == []
    assert with_ar(m, ar).speedup == pytest.approx(4.0 / 2.0)
    json.dumps(m.to_dict())  # JSON-serialisable


def test_overall_pools_every_benchmarks_rounds():
    """One pooling: the overall survival and tau come from the summed hits_j and N_j of every benchmark,
    TPS from the summed tokens and wall times (ratios of sums, not means of the benchmarks' values)."""
    a = summarize([SequenceLog(10, 1.0, [3, 3], [3, 3])], "a", "ready", 3)
    b = summarize([SequenceLog(30, 10.0, [0, 1, 2, 0], [3, 3, 2, 1])], "b", "ready", 3)
    a.lossless, b.lossless = 1, 0
    o = overall([a, b])
    assert o.benchmark == "overall"
    # b: P1 = 2/4, P2 = 1/3 (r4 censored), P3 = 0/2
    assert b.survival == pytest.approx([2 / 4, 1 / 3, 0 / 2]) and b.tau == pytest.approx(1 + 2 / 4 + 1 / 3)
    # pooled: hits (2+2, 2+1, 2+0) over observed (2+4, 2+3, 2+2)
    assert o.survival == pytest.approx([4 / 6, 3 / 5, 2 / 4]) and o.survival_n == [6, 5, 4]
    assert o.tau == pytest.approx(1 + 4 / 6 + 3 / 5 + 2 / 4)
    assert o.tau != pytest.approx((a.tau + b.tau) / 2)  # not the mean over benchmarks
    assert o.tps == pytest.approx(40 / 11.0)
    assert o.rounds == 6 and o.new_tokens == 40 and o.lossless == 0
    ar_a = summarize([SequenceLog(10, 2.0, [0] * 9, [0] * 9)], "a", "ar", 0)
    ar_b = summarize([SequenceLog(30, 30.0, [0] * 29, [0] * 29)], "b", "ar", 0)
    assert overall([a, b], ar=[ar_a, ar_b]).speedup == pytest.approx((40 / 11.0) / (40 / 32.0))


def test_overall_refuses_to_mix_methods():
    a = summarize([SequenceLog(10, 1.0, [3], [3])], "a", "ready", 3)
    b = summarize([SequenceLog(10, 1.0, [3], [3])], "b", "dspark", 3)
    with pytest.raises(ValueError, match="mixes methods"):
        overall([a, b])


def test_mlflow_metric_names_follow_the_contract():
    m = summarize([SequenceLog(10, 2.0, [1, 2], [2, 2])], "humaneval", "ready", 3)
    m.speedup, m.lossless = 2.5, 1
    flat = m.mlflow_metrics()
    assert flat["humaneval/tps"] == 5.0 and flat["humaneval/lossless"] == 1.0
    assert flat["humaneval/survival_1"] == 1.0 and flat["humaneval/survival_2"] == 0.5
    assert "humaneval/survival_3" not in flat  # nobody observed position 3 ...
    assert "humaneval/tau" not in flat  # ... so no tau either
    flat = summarize([SequenceLog(10, 2.0, [1, 2], [2, 2])], "humaneval", "ready", 2).mlflow_metrics()
    assert flat["humaneval/tau"] == pytest.approx(1 + 1.0 + 0.5)
    assert all(isinstance(v, float) and not math.isnan(v) for v in flat.values())
    assert isinstance(m, Metrics)
