"""`sweeps.run NAME --cost` (sweeps/cost.py): the campaign's GPU-hours from rates measured on GPUs, each rate
the very value of the committed JSON it cites, and the arithmetic that turns counted work into hours."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sweeps.cost import (CostError, Rate, RowWork, Work, estimate, load_rates, rates_path, seconds, source_value,
                         wall_on, work)
from sweeps.run import main as sweeps_main
from sweeps.spec import load_sweep

ROOT = Path(__file__).resolve().parent.parent


def rate(name: str, value: float, card: str = "X") -> Rate:
    return Rate(name, value, card, "2026-12-07", "docs/data/x.json", "k")


def test_every_stored_rate_is_the_value_its_committed_json_holds():
    files = sorted((ROOT / "experiments" / "presets").glob("*.rates.json"))
    assert files, "no rates stored with any preset"
    for f in files:
        for card, rates in load_rates(f.name.split(".")[0]).items():
            for r in rates.values():
                assert (ROOT / r.source).is_file() and r.source.startswith("docs/data/"), r.source
                assert source_value(r, ROOT) == pytest.approx(r.value, rel=1e-9), (card, r.name)
                assert r.date.startswith("2026-") and r.at, (card, r.name)


def test_counted_work_over_rates_gives_seconds_and_names_a_missing_rate():
    rates = {"ar_decode_tokens_per_s": rate("ar_decode_tokens_per_s", 50.0),
             "stage1_samples_per_s": rate("stage1_samples_per_s", 4.0)}
    s, missing = seconds({"ar_tokens": 1000.0, "stage1_samples": 20.0, "stage2_samples": 8.0}, rates)
    assert s == pytest.approx(1000 / 50 + 20 / 4) and missing == ["stage2_samples_per_s"]


def test_n_gpus_run_the_shared_work_first_then_one_row_per_gpu_longest_first():
    assert wall_on(10.0, [5.0, 4.0, 3.0, 3.0], 1) == pytest.approx(25.0)
    assert wall_on(10.0, [5.0, 4.0, 3.0, 3.0], 2) == pytest.approx(10.0 + 8.0)  # {5, 3} and {4, 3}: the longer one
    assert wall_on(10.0, [5.0, 4.0], 8) == pytest.approx(15.0)  # idle GPUs: the longest row sets the wall
    w = Work(shared={"regen_tokens": 3600.0 * 100}, rows=[RowWork("a", "ready", 0, {"ar_tokens": 3600.0 * 10})] * 4,
             prompts={})
    card = estimate(w, {"X": {"regen_decode_tokens_per_s": rate("regen_decode_tokens_per_s", 100.0),
                              "ar_decode_tokens_per_s": rate("ar_decode_tokens_per_s", 10.0)}})[0]
    assert card.gpu_hours(1) == pytest.approx(1.0 + 4 * 1.0)
    assert card.wall_hours(4) == pytest.approx(2.0) and card.gpu_hours(4) == pytest.approx(8.0)


def test_the_paper_recipe_main_sweep_counts_what_its_rows_ask_for():
    sweep = load_sweep("main", ["preset=qwen3_5_27b", "profile=paper_recipe", "drafter.checkpoint=null"])
    w = work(sweep)
    cfg = sweep.common
    assert w.shared["regen_tokens"] == (70000 + int(cfg.eval.heldout_tf_samples)) * 1024
    # each regenerated turn's prompt is prefilled too, at its cap (regen.prompt_len), at the prefill rate
    assert w.shared["regen_prompt_tokens"] == (70000 + int(cfg.eval.heldout_tf_samples)) * int(cfg.regen.prompt_len)
    assert w.shared["base_samples"] == 2 * int(cfg.train.base.samples)  # DSpark's and DFlash's base drafters
    assert w.prompts["humaneval"] == 164 and w.prompts["gsm8k"] is None  # no file here: not counted
    by = {r.method: r.counts for r in w.rows}
    assert by["ready"]["stage1_samples"] == 20000 and by["ready"]["stage2_samples"] == 50000
    assert by["ready"]["draft_tokens"] == 2 * by["dspark"]["draft_tokens"]  # the state swap decodes again
    assert by["dspark"]["ar_tokens"] == by["ar"]["ar_tokens"] == 164 * 1024  # AR timed beside it on CUDA
    assert "stage1_samples" not in by["dspark"]


def test_cost_prints_both_cards_and_refuses_a_preset_without_rates(capsys):
    assert sweeps_main(["main", "preset=qwen3_5_27b", "profile=paper_recipe", "--cost", "--gpus", "8"]) == 0
    out = capsys.readouterr().out
    assert "GPU-hours on 1 GPU" in out and "GPU-hours on 8 GPUs" in out and "H200" in out and "H100" in out
    assert "docs/data/train_scale_27b_h200_2026-12-04.json" in out
    assert sweeps_main(["rank", "preset=tiny", "--cost"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no measured rates for preset 'tiny'" in err


def test_a_malformed_rates_file_is_one_line(tmp_path):
    (tmp_path / "presets").mkdir()
    rates_path("p", tmp_path).write_text(json.dumps({"cards": {"H100": {"ar_decode_tokens_per_s": {"value": 1}}}}))
    with pytest.raises(CostError, match="malformed"):
        load_rates("p", tmp_path)
