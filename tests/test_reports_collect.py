"""reports.collect without MLflow: string tags/params are cast, seeds aggregate to mean ± std,
missing runs, seeds and metrics are reported rather than averaged away."""

import math

import polars as pl
import pytest

from reports import collect


def rec(variant, seed, status="FINISHED", order="1", start=0, **metrics):
    r = {
        "run_id": f"{variant}-{seed}-{status}-{start}",
        "status": status,
        "start_time": start,
        "ready.method": "ready",
        "ready.label": variant,
        "ready.order": order,
        "ready.variant_id": variant,
        "ready.seed": str(seed),
        "ready.model": "tiny",
        "param.reader.rank": "8",
        "param.train.stage1.lr": "0.0001",
        "param.reader.enabled": "True",
        "param.reader.layers": "[30, 62]",
    }
    r.update(metrics)
    return r


def test_tags_and_params_come_back_typed():
    df = collect.runs_frame([rec("a", 0, order="10", **{"overall/tau": 4.0})], "rank")
    assert df.schema["ready.order"] == pl.Int64 and df["ready.order"][0] == 10
    assert df.schema["ready.seed"] == pl.Int64
    assert df.schema["param.reader.rank"] == pl.Int64
    assert df.schema["param.train.stage1.lr"] == pl.Float64 and df["param.train.stage1.lr"][0] == 1e-4
    assert df.schema["param.reader.enabled"] == pl.Boolean and df["param.reader.enabled"][0] is True
    assert df.schema["param.reader.layers"] == pl.String  # a list stays text
    assert df.schema["overall/tau"] == pl.Float64
    assert df["ready.sweep"][0] == "rank"  # filled from the experiment when the tag is absent


def test_mean_and_sample_std_over_seeds_in_numeric_order():
    runs = collect.runs_frame(
        [
            rec("r=128", 0, order="10", **{"overall/tau": 4.6}),
            rec("r=128", 1, order="10", **{"overall/tau": 4.7}),
            rec("r=8", 0, order="2", **{"overall/tau": 4.0}),
            rec("r=8", 1, order="2", **{"overall/tau": 4.4}),
        ],
        "rank",
    )
    v8, v128 = collect.aggregate(runs)  # order 2 before order 10 (not string order)
    assert (v8.name, v128.name) == ("r=8", "r=128")
    s, why = v8.stat("overall/tau")
    assert why is None and s.n == 2
    assert s.mean == pytest.approx(4.2)
    assert s.std == pytest.approx(math.sqrt(((4.0 - 4.2) ** 2 + (4.4 - 4.2) ** 2) / 1))  # ddof = 1


def test_a_rerun_of_the_same_seed_counts_once_latest_wins():
    runs = collect.runs_frame(
        [rec("a", 0, start=1, **{"overall/tps": 10.0}), rec("a", 0, start=2, **{"overall/tps": 30.0})], "s"
    )
    (v,) = collect.aggregate(runs)
    assert v.seeds == (0,)
    assert v.stat("overall/tps")[0].mean == 30.0


def test_missing_run_metric_and_seed_are_named_never_zero():
    runs = collect.runs_frame(
        [
            rec("failed", 0, status="FAILED", order="1", **{"overall/tps": 1.0}),
            rec("no-tps", 0, order="2", **{"overall/tau": 4.0}),
            rec("no-tps", 1, order="2", **{"overall/tau": 4.2, "overall/tps": 9.0}),
            rec("one-seed", 0, order="3", **{"overall/tps": 5.0}),
            rec("one-seed", 1, status="RUNNING", order="3"),
        ],
        "layers",
    )
    failed, no_tps, one_seed = collect.aggregate(runs)
    assert failed.stat("overall/tps") == (None, "failed: no finished run (status FAILED)")
    assert no_tps.stat("overall/tps") == (None, "no-tps: metric overall/tps not logged in 1 of 2 runs")
    assert no_tps.stat("overall/tau")[0].mean == pytest.approx(4.1)
    assert one_seed.seeds == (0,) and one_seed.missing_seeds == (1,)
    assert one_seed.unfinished == ("RUNNING",)
    assert collect.seed_counts([failed, no_tps, one_seed]) == (1, 2)


def test_benchmarks_follow_the_configured_suite_order():
    r = rec("a", 0, **{"humaneval/tps": 1.0, "heldout/tps": 1.0, "overall/tps": 1.0, "zeta/tps": 1.0})
    r["param.bench.suites"] = "['humaneval', 'heldout']"
    runs = collect.runs_frame([r], "main")
    assert collect.benchmarks(runs, "tps") == ["humaneval", "heldout", "zeta"]


def test_mean_over_benchmarks_is_missing_when_one_is():
    runs = collect.runs_frame([rec("a", 0, **{"x/tps": 2.0, "y/tps": 4.0}), rec("b", 0, **{"x/tps": 2.0})], "s")
    out = collect.with_mean_over(runs, "avg", ["x/tps", "y/tps"])
    assert out["avg"].to_list() == [3.0, None]


def test_only_the_latest_sweep_setting_is_reported():
    old = rec("a", 0, start=1, **{"overall/tps": 1.0})
    new = rec("a", 0, start=5, **{"overall/tps": 2.0})
    old["ready.setting"], new["ready.setting"] = "smoke", "full"
    kept, msg = collect.latest_setting(collect.runs_frame([new, old], "rank"))
    assert kept["overall/tps"].to_list() == [2.0]
    assert msg == "2 settings in the store; reporting the latest, full (1 runs); left out: smoke"
    same, none = collect.latest_setting(collect.runs_frame([new], "rank"))
    assert same.height == 1 and none is None


def test_a_checkpoint_path_is_named_by_its_folder():
    assert collect.short_model("/data/ckpt/Qwen3.5-27B/") == "Qwen3.5-27B"
    assert collect.short_model("tiny") == "tiny"


def test_a_nan_metric_counts_as_missing():
    runs = collect.runs_frame([rec("a", 0, **{"overall/tps": float("nan"), "overall/tau": 4.0})], "s")
    (v,) = collect.aggregate(runs)
    assert v.stat("overall/tps") == (None, "a: metric overall/tps not logged in any run")


def test_a_not_lossless_run_is_set_aside_by_metric_or_by_tag():
    runs = collect.runs_frame(
        [
            rec("a", 0, **{"overall/lossless": 1.0, "overall/tau": 4.0}),
            rec("a", 1, **{"overall/lossless": 0.0, "overall/tau": 9.0}),  # the metric says so
            {**rec("b", 0, **{"overall/tau": 4.2}), "ready.lossless": "0"},  # the tag says so
            {**rec("b", 1, status="FAILED", **{"overall/lossless": 0.0}), "ready.lossless": "0"},  # never finished
        ],
        "rank",
    )
    marked, aside = collect.set_aside_not_lossless(runs)
    assert aside == {"a": (1,), "b": (0,)}
    a, b = collect.aggregate(marked)
    assert a.seeds == (0,) and a.stat("overall/tau")[0].mean == 4.0  # seed 1's 9.0 is not averaged in
    assert b.stat("overall/tau") == (None, "b: no finished run (status FAILED/NOT_LOSSLESS)")


def test_slimmed_evaluations_keep_every_number_the_statistics_need():
    import copy

    import numpy as np

    from evaluation_logs import bench_rounds, evaluation
    from reports import stats

    rounds = {"humaneval": bench_rounds(1, 4, 10)}
    full = evaluation("ready", rounds, swapped=rounds)
    for b in full["benchmarks"].values():  # an older log: no per-round `committed`
        for rec in b["prompts"] + b["state_swap"]["prompts"]:
            del rec["committed"]
    slim = collect.slim(copy.deepcopy(full))
    assert "tokens" not in slim["benchmarks"]["humaneval"]["prompts"][0]
    a, b = stats.tallies(full).benchmarks["humaneval"], stats.tallies(slim).benchmarks["humaneval"]
    for field in ("committed", "rounds", "hits", "observed", "new_tokens", "wall_s"):
        assert np.array_equal(getattr(a, field), getattr(b, field)), field
    assert stats.run_metrics(full) == stats.run_metrics(slim)
