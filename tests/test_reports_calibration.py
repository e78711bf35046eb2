"""`reports.calibration`: the verify-schedule table and reliability figure from hand-built runs (one sweep
setting per schedule, as the `axes` of experiments/verify_schedule.yaml make them) and evaluation.json logs."""

from __future__ import annotations

import random

import polars as pl
import pytest

from ready import metrics
from ready.calibration import calibration, rounds_of, sts_holdout
from reports.calibration import build, plot_reliability, render

K = 3
BENCHES = ("humaneval", "heldout")


def prompt(index: int, rng: random.Random, scheduled: bool) -> dict:
    """One prompt's record: rounds with the head's confidences; the confidence schedule verifies the
    prefix of confidences >= 0.5 (fewer drafts), the full one all K; every round's horizon is K (no budget
    cut: a draft the schedule did not verify is a stop, `ready.decode.rounds.settle_round`)."""
    rec = {"index": index, "accepted": [], "horizons": [], "verified": [], "confidence": [], "committed": [],
           "wall_s": 0.1, "ar_wall_s": 0.2, "lossless": 1}
    for _ in range(6):
        conf = [rng.choice([0.2, 0.6, 0.9]) for _ in range(K)]
        n = K
        if scheduled:
            n = next((j for j, c in enumerate(conf) if c < 0.5), K)
        a = min(n, rng.randrange(K + 1))
        rec["accepted"].append(a)
        rec["horizons"].append(K)
        rec["verified"].append(n)
        rec["confidence"].append(conf)
        rec["committed"].append(a + 1)
    rec["n_tokens"] = 1 + sum(rec["committed"])
    rec["wall_s"] = 0.01 * (len(rec["accepted"]) + sum(rec["verified"]))
    return rec


def evaluation(seed: int, method: str, scheduled: bool) -> dict:
    rng = random.Random(f"{seed}{method}{scheduled}")
    return {"method": method, "resolved": {"device": "cpu"},
            "benchmarks": {b: {"metrics": {"proposals": K}, "prompts": [prompt(i, rng, scheduled) for i in range(5)]}
                           for b in BENCHES}}


SETTINGS = (("old", None, 8), ("full", "full", 8), ("conf", "confidence", 8))  # oldest first


def frame(settings=SETTINGS) -> tuple[pl.DataFrame, dict[str, dict]]:
    """One sweep setting per (name, eval.verify_schedule param (None: predates the key), bench.limit), two
    seeds of AR, DSpark and ReaDy each."""
    rows, evals, clock = [], {}, 0
    for setting, schedule, limit in settings:
        for method in ("ar", "dspark", "ready"):
            for seed in (0, 1):
                clock += 1
                rid = f"{setting}-{method}-{seed}"
                rows.append({"run_id": rid, "status": "FINISHED", "start_time": clock, "ready.setting": setting,
                             "ready.method": method, "ready.seed": str(seed), "ready.variant_id": f"{setting}-{method}",
                             "ready.lossless": "1", "overall/lossless": 1.0, "param.eval.verify_schedule": schedule,
                             "param.bench.limit": str(limit), "param.seed": str(seed)})
                if method != "ar":
                    evals[rid] = evaluation(seed, method, schedule == "confidence")
    return pl.DataFrame(rows), evals


def test_rows_pair_each_schedule_with_the_full_one_and_score_the_heads_calibration():
    runs, evals = frame()
    report = build(runs, evals, "verify_schedule")
    assert [(r.method, r.schedule, r.seeds) for r in report.rows] == [
        ("dspark", "full", (0, 1)), ("dspark", "confidence", (0, 1)), ("ready", "full", (0, 1)),
        ("ready", "confidence", (0, 1))]
    assert report.settings == {"confidence": "conf", "full": "full"}  # the newest setting of each schedule
    assert report.notes == []
    for r in report.rows:
        setting = "conf" if r.schedule == "confidence" else "full"
        recs = [p for s in (0, 1) for b in evals[f"{setting}-{r.method}-{s}"]["benchmarks"].values() for p in b["prompts"]]
        ver = sum(n + 1 for p in recs for n in p["verified"]) / sum(len(p["verified"]) for p in recs)
        tau = metrics.tau([a for p in recs for a in p["accepted"]], [h for p in recs for h in p["horizons"]], K)
        assert r.verified.value == pytest.approx(ver) and r.verified.lo <= ver <= r.verified.hi
        assert r.tau.value == pytest.approx(tau)
        assert r.calibration == calibration(rounds_of(recs), K)
        assert r.sts == sts_holdout(recs, K)  # fitted on the even-numbered records, scored on the odd ones
    full, conf = report.rows[0], report.rows[1]
    assert conf.vs_full["verified"].value == pytest.approx(100 * (conf.verified.value / full.verified.value - 1))
    assert conf.vs_full["verified"].value < 0  # the schedule verified fewer tokens per round
    assert conf.vs_full["tau"].value == pytest.approx(100 * (conf.tau.value / full.tau.value - 1))
    assert not full.vs_full
    text = render(report)
    assert text.count("\n| ") == 5 and "DSpark, confidence" in text and "ECE_3" in text and "CPU, indicative" in text
    sts = full.sts
    assert f"{sts['holdout_ece_before']:.3f} → {sts['holdout_ece_after']:.3f}" in text


def test_a_setting_that_differs_in_more_than_the_schedule_is_left_out_and_said_so():
    runs, evals = frame((("smoke", "full", 2), ("conf", "confidence", 8)))
    report = build(runs, evals, "verify_schedule")
    assert [r.schedule for r in report.rows] == ["confidence", "confidence"]
    assert len(report.notes) == 3 and report.notes[0].startswith("setting smoke (full) left out")
    assert "bench.limit" in report.notes[0] and "no seed of the full schedule" in report.notes[1]


def test_the_reliability_figure_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    runs, evals = frame()
    paths = plot_reliability(build(runs, evals, "verify_schedule"), tmp_path / "fig")
    assert [p.suffix for p in paths] == [".pdf", ".png"] and all(p.stat().st_size > 1000 for p in paths)
