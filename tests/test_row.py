"""sweeps.row: rank clamping, method / config agreement, metric names, and where the AR row's timing comes from."""

from __future__ import annotations

import pytest

from ready.metrics import SequenceLog, overall, summarize
from sweeps.row import PipelineConfigError, VariantResult, resolve_rank, run_variant
from sweeps.spec import load_sweep


def test_a_rank_above_d_k_is_clamped_and_the_request_kept():
    rows = {v.label: v.cfg for v in load_sweep("rank").variants}
    assert resolve_rank(rows["r=128"], d_k=64).reader.rank == 64
    assert rows["r=128"].reader.rank == 128  # the row's own config is untouched
    assert resolve_rank(rows["r=32"], d_k=64).reader.rank == 32
    assert resolve_rank(rows["r=128"], d_k=128).reader.rank == 128


@pytest.mark.parametrize("method, enabled, expected", [
    ("ft", True, "reader.enabled=false"), ("ready", False, "reader.enabled=true"), ("medusa", True, "unknown"),
])
def test_method_and_reader_switch_must_agree(method, enabled, expected):
    cfg = load_sweep("main").common.copy()
    cfg.reader.enabled = enabled
    with pytest.raises(PipelineConfigError, match=expected):
        run_variant(cfg, method)


@pytest.mark.parametrize("method, head, expected", [
    ("dflash", "vanilla", "expected drafter.head=none"), ("dspark", "none", "drafter.head=none is the 'dflash' row"),
])
def test_method_and_markov_head_must_agree(method, head, expected):
    cfg = load_sweep("main").common.copy()
    cfg.drafter.head = head
    with pytest.raises(PipelineConfigError, match=expected):
        run_variant(cfg, method)


def test_variant_result_flattens_to_the_mlflow_metric_names():
    logs = [SequenceLog(new_tokens=9, wall_s=1.0, accepted=[3, 7, 0], horizons=[7, 7, 2])]
    per = [summarize(logs, b, "ready", 7) for b in ("humaneval", "heldout")]
    for m in per:
        m.lossless = 1
    result = VariantResult(method="ready", benchmarks=per, overall=overall(per))
    m = result.metrics()
    # 1 + P_1 + ... + P_7; the third round, cut after 2 positions, counts for positions 1 and 2 only
    assert m["humaneval/tau"] == pytest.approx(1 + 2 / 3 + 2 / 3 + 2 / 2 + 4 * 1 / 2) and m["overall/lossless"] == 1.0
    assert m["heldout/survival_1"] == pytest.approx(2 / 3) and "heldout/survival_3" in m
    assert result.lossless and set(result.survival()) == {"humaneval", "heldout", "overall"}


@pytest.mark.slow
def test_the_ar_row_times_its_own_decoding_even_with_cached_generations(tmp_path, monkeypatch):
    """Cached AR generations serve the drafting rows' lossless checks and speedups; the AR row's
    own TPS must come from decoding in that run, not from the cache's old timing."""
    import importlib

    ev = importlib.import_module("ready.decode.evaluate")  # the module (the package re-exports a function of that name)
    cfg = load_sweep("rank", ["profile=smoke"]).common.copy()
    cfg.artifacts_dir = str(tmp_path / "artifacts")
    calls = []
    real_run_ar = ev.run_ar
    monkeypatch.setattr(ev, "run_ar", lambda *a, **k: calls.append(k.get("desc")) or real_run_ar(*a, **k))
    first = run_variant(cfg, "ar", progress=False)
    calls.clear()
    second = run_variant(cfg, "ar", progress=False)  # the generations are cached by now
    assert len(calls) == len(cfg.bench.suites)  # one fresh timed decode per suite, none to rebuild the cache
    assert first.lossless and second.lossless


@pytest.mark.slow
def test_rows_that_end_with_the_same_drafter_are_evaluated_once(tmp_path):
    """r=64 and r=128 build the same reader on a d_k=64 target: the second row reuses the first's
    trained drafter and its evaluation record (and says so); another seed is evaluated afresh."""
    rows = {v.label: v for v in load_sweep("rank", ["profile=smoke"]).variants}
    jobs = {label: rows[label].job(0) for label in ("r=64", "r=128")}
    for job in jobs.values():
        job.cfg.artifacts_dir = str(tmp_path / "artifacts")
    first = run_variant(jobs["r=64"].cfg, "ready", progress=False)
    second = run_variant(jobs["r=128"].cfg, "ready", progress=False)
    assert not first.resolved["evaluation_reused"] and second.resolved["evaluation_reused"]
    assert second.resolved["drafter_dir"] == first.resolved["drafter_dir"]
    assert second.evaluation["benchmarks"] == first.evaluation["benchmarks"]
    assert second.evaluation["config"]["reader"]["rank"] == 64 and second.resolved["rank_requested"] == 128
    other = rows["r=64"].job(1)
    other.cfg.artifacts_dir = str(tmp_path / "artifacts")
    third = run_variant(other.cfg, "ready", progress=False)
    assert not third.resolved["evaluation_reused"] and third.resolved["drafter_dir"] != first.resolved["drafter_dir"]


def test_sampling_settings_reach_the_decode_and_its_cache_keys_only_when_sampling():
    from sweeps.row import SAMPLING_VERSION, sampling_params, sampling_spec

    greedy = load_sweep("ft_control", ["profile=smoke"]).common
    sampled = load_sweep("ft_control", ["profile=smoke", "eval.temperature=1.0", "eval.top_p=0.9"]).common
    assert sampling_params(greedy) is None and sampling_spec(greedy) == {}  # greedy caches keep their keys
    params = sampling_params(sampled)
    assert (params.temperature, params.top_p, params.seed) == (1.0, 0.9, 0)
    assert sampling_spec(sampled) == {"temperature": 1.0, "top_p": 0.9, "sample_seed": 0, "samples_per_prompt": 4,
                                      "version": SAMPLING_VERSION}
