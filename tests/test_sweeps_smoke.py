"""The real pieces under the sweep runner: `profile=smoke` trains and evaluates every row of a
sweep on CPU (tiny budgets), leaves lossless child runs with params, metrics and artifacts in
mlflow.db, and a second invocation runs nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sweeps import tracking
from sweeps.run import main
from sweeps.spec import load_sweep


@pytest.mark.slow
def test_smoke_sweep_on_the_real_pipeline_is_lossless_and_rerun_skips_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["inject_pos", "profile=smoke", "--no-report", "--quiet"]
    assert main(args) == 0
    c = tracking.client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = c.get_experiment_by_name("ready-inject_pos")
    runs = c.search_runs([exp.experiment_id], filter_string="tags.`ready.kind` = 'variant'")
    sweep = load_sweep("inject_pos", ["profile=smoke"])
    assert sorted(r.data.tags["ready.config_hash"] for r in runs) == sorted(j.config_hash for j in sweep.jobs())
    for run in runs:
        assert run.info.status == "FINISHED"
        m = run.data.metrics
        assert m["overall/lossless"] == 1.0 and m["humaneval/lossless"] == 1.0 and m["heldout/lossless"] == 1.0
        assert m["overall/tps"] > 0 and m["overall/new_tokens"] > 0
        assert run.data.params["reader.position"] in ("pre", "post")
        arts = {a.path for a in c.list_artifacts(run.info.run_id)}
        assert {"config.yaml", "evaluation.json"} <= arts
        if run.data.tags["ready.method"] != "ar":
            assert "survival.png" in arts and m["overall/tau"] >= 1.0
            assert run.data.tags["ready.resolved_layers"]
        if run.data.tags["ready.method"] == "ready":
            assert {"train/stage1/loss", "train/stage2/loss"} <= set(m)
            assert "overall/speedup" in m and "overall/tau_gain_pct" in m
        if run.data.tags["ready.method"] != "ar":  # every drafting row: the teacher-forced metric
            evaluation = json.loads(Path(c.download_artifacts(run.info.run_id, "evaluation.json", str(tmp_path))).read_text())
            assert evaluation["heldout_tf"]["split"] == "validation" and evaluation["heldout_tf"]["tau"] >= 1.0
            swapped = [b.get("state_swap") is not None for b in evaluation["benchmarks"].values()]
            assert all(swapped) if run.data.tags["ready.method"] == "ready" else not any(swapped)
    assert {r.data.tags["ready.method"] for r in runs} == {"ar", "dspark", "ft", "placebo", "ready"}
    capsys.readouterr()
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.count(" skipped ") == len(sweep.jobs()) and " ran " not in out
