"""reports.tables without MLflow: which file a sweep's table goes to, the interval cells of an
ablation table built from hand-built evaluation logs (marks, bold, left-out runs, captions), and
LaTeX escaping."""

import pytest

from evaluation_logs import bench_rounds, evaluation, metrics_of
from ready import stats
from reports import collect, latex, markdown
from reports.tables import CPU_TIMING, Cell, build_table, mark_best, spec_for

BENCHES = ("humaneval", "gsm8k")
PROMPTS, ROUNDS = 8, 30  # per benchmark: 480 rounds per seed


def _runs(table_tag: str):
    return collect.runs_frame([{"run_id": "x", "status": "FINISHED", "ready.table": table_tag}], "s")


def test_paper_sweeps_map_to_their_table_files():
    assert [spec_for(s, _runs("")).name for s in ("main", "ft_control", "rank", "layers", "inject_layer", "inject_pos")] \
        == [f"table{i}" for i in range(1, 7)]
    assert spec_for("main", _runs("")).layout == "main" and spec_for("rank", _runs("")).layout == "ablation"


def test_other_sweeps_are_named_after_themselves_never_overwriting_a_paper_table():
    assert spec_for("rank_big", _runs("table3")).name == "table3_rank_big"
    assert spec_for("search_loss", _runs("search")).name == "search_loss"
    assert spec_for("main_big", _runs("table1")).layout == "main"


def _iv(mean, lo, hi, kind="gain"):
    return Cell(kind, mean, decimals=1, lo=lo, hi=hi)


def test_bold_only_where_the_best_interval_clears_the_runner_up():
    clear = [_iv(12.0, 9.0, 15.0), _iv(5.0, 2.0, 8.5), _iv(1.0, -2.0, 4.0), Cell("gain")]
    mark_best(clear)
    assert [c.bold for c in clear] == [True, False, False, False]
    overlap = [_iv(12.0, 8.0, 15.0), _iv(9.0, 6.0, 12.0)]  # the best is higher, but not beyond noise
    mark_best(overlap)
    assert not any(c.bold for c in overlap)
    without = [_iv(12.0, 9.0, 15.0), Cell("gain", 5.0)]  # a value without an interval is never ranked
    mark_best(without)
    assert not any(c.bold for c in without)
    lone = [_iv(12.0, 9.0, 15.0), Cell("gain")]
    mark_best(lone)
    assert not lone[0].bold


def test_latex_escapes_labels_and_renders_missing_negative_and_interval_values():
    assert latex.escape("{30,62} & r_8 50%") == r"\{30,62\} \& r\_8 50\%"
    assert latex.render_cell(Cell()) == r"--$^{\dagger}$"
    assert latex.render_cell(Cell("gain", -2.857)) == "$-2.86$"
    assert latex.render_cell(Cell("speedup", 3.158, bold=True)) == r"$\mathbf{3.16\times}$"
    effect = _iv(5.12, 2.04, 8.33)
    assert latex.render_cell(effect) == r"$+5.1\;[+2.0, +8.3]^{*}$"
    assert markdown.render_cell(effect) == r"+5.1 [+2.0, +8.3]\*"
    effect.bold = True
    assert latex.render_cell(effect) == r"$\mathbf{+5.1\;[+2.0, +8.3]}^{*}$"
    noise = _iv(1.0, -2.4, 4.1)
    assert latex.render_cell(noise) == r"$+1.0\;[-2.4, +4.1]$" and markdown.render_cell(noise) == "+1.0 [-2.4, +4.1]"


# ---------------------------------------------------------------------------------------------
# An ablation sweep from hand-built evaluation logs: DSpark, FT, placebo and ReaDy rows, 2 seeds


def _rounds(base: int, seed: int, gain: float = 0.0, ref=None) -> dict:
    return {b: bench_rounds(base + 10 * seed + i, PROMPTS, ROUNDS, gain, ref[b] if ref else None)
            for i, b in enumerate(BENCHES)}


def _sweep(rows, device="cpu", seeds=(0, 1)):
    """rows: (method, label, order, gain vs DSpark, options) -> (runs frame, evaluations by run id).

    options: wall_s (TPS), swap (τ gain of the state-swapped decode), not_lossless (seeds),
    seeds (this row's seeds), base_seed (param train.base_seed; default: the seed).
    """
    ds = {s: _rounds(100, s) for s in seeds}
    records, evaluations = [], {}
    for method, label, order, gain, opt in rows:
        for s in opt.get("seeds", seeds):
            rounds = ds[s] if method == "dspark" else _rounds(200 + 7 * order, s, gain, ds[s])
            swapped = {b: bench_rounds(900 + s, PROMPTS, ROUNDS, opt["swap"], r) for b, r in rounds.items()} \
                if "swap" in opt else None
            bad = s in opt.get("not_lossless", ())
            ev = evaluation(method, rounds, device=device, wall_s=opt.get("wall_s", 0.1), swapped=swapped,
                            lossless=0 if bad else 1)
            run_id = f"{label}-{s}"
            evaluations[run_id] = ev
            records.append({"run_id": run_id, "status": "FINISHED", "start_time": s, "ready.method": method,
                            "ready.label": label, "ready.order": str(order), "ready.variant_id": label,
                            "ready.seed": str(s), "ready.model": "tiny", "ready.lossless": "0" if bad else "1",
                            "param.train.base_seed": str(opt.get("base_seed", s)),
                            **metrics_of(ev)})
    return collect.runs_frame(records, "rank"), evaluations


ROWS = [
    ("dspark", "DSpark", 0, 0.0, {}),
    ("ready", "r=8", 3, 0.10, {"swap": -0.10}),
    ("ready", "r=16", 4, 0.01, {"swap": -0.01}),
    ("ready", "r=128", 10, 0.25, {"swap": -0.20, "wall_s": 0.05}),
    ("ft", "DSpark + FT", 1, 0.01, {}),
    ("placebo", "Placebo (shuffled states)", 2, 0.005, {}),
]


@pytest.fixture(scope="module")
def rank():
    runs, evaluations = _sweep(ROWS)
    return build_table("rank", runs, evaluations), runs, evaluations


def _cells(table):
    return {row[0].text: row[1:] for row in table.rows}


def _pairs(evaluations, a: str, b: str, seeds=(0, 1)):
    return ([stats.tallies(evaluations[f"{a}-{s}"]) for s in seeds], [stats.tallies(evaluations[f"{b}-{s}"]) for s in seeds])


def test_controls_come_right_after_dspark_then_ready_rows_in_order(rank):
    table, _, _ = rank
    assert [r[0].text for r in table.rows] == ["DSpark", "DSpark + FT", "Placebo (shuffled states)", "r=8", "r=16", "r=128"]
    assert table.rule_before == {1, 3}  # reference | controls | ReaDy rows
    assert [c.markdown for c in table.columns] == ["Rank", "τ", "Δτ vs DSpark (%)", "Δτ vs FT (%)", "State reliance (Δτ)",
                                                    "TPS", "ΔTPS vs DSpark (%)"]


def test_gain_cells_are_the_hierarchical_paired_interval_over_both_seeds(rank):
    table, _, evaluations = rank
    cells = _cells(table)
    want = stats.gain_pct(*_pairs(evaluations, "r=8", "DSpark"), "overall")
    got = cells["r=8"][1]
    assert (got.mean, got.lo, got.hi) == (want.value, want.lo, want.hi)
    assert got.mean == pytest.approx(10.0, abs=0.05)  # each benchmark and seed is exactly +10 %
    vs_ft = stats.gain_pct(*_pairs(evaluations, "r=8", "DSpark + FT"), "overall")
    assert (cells["r=8"][2].mean, cells["r=8"][2].lo) == (vs_ft.value, vs_ft.lo)
    assert [c.text for c in cells["DSpark"][1:3]] == ["ref.", ""] and cells["DSpark + FT"][2].text == "ref."
    reliance = cells["r=8"][3]
    assert reliance.kind == "diff" and reliance.lo > 0  # own states beat another prompt's by 10 % of τ
    assert cells["DSpark + FT"][3].text == ""  # no reader, nothing to swap


def test_a_ten_percent_gain_is_marked_and_a_one_percent_gain_is_not(rank):
    table, _, _ = rank
    cells = _cells(table)
    assert cells["r=8"][1].marked and cells["r=128"][1].marked
    assert not cells["r=16"][1].marked and not cells["DSpark + FT"][1].marked
    assert cells["r=16"][1].lo < 0 < cells["r=16"][1].hi
    md = markdown.render(table)
    assert f"| r=8 | {markdown.render_cell(cells['r=8'][0])} | {markdown.render_cell(cells['r=8'][1])} |" in md
    assert markdown.render_cell(cells["r=8"][1]).endswith(r"]\*")


def test_bold_goes_to_a_best_row_that_clears_the_runner_up_and_never_to_cpu_timing(rank):
    table, _, _ = rank
    cells = _cells(table)
    # r=128's paired gain (+25 %) clears r=8's (+10 %); r=128 is also twice as fast, but on CPU
    assert cells["r=128"][1].bold
    assert not any(c.bold for name, row in cells.items() if name != "r=128" for c in row)
    # a row's own τ interval carries the spread of prompt difficulty, which pairing cancels: not bold
    assert not cells["r=128"][0].bold and cells["r=128"][0].lo < cells["r=8"][0].hi
    assert cells["r=128"][5].lo > max(cells[n][5].hi for n in ("r=8", "r=16"))
    assert not cells["r=128"][5].bold and not cells["r=128"][4].bold
    tps_gain = cells["r=128"][5]  # its interval excludes 0, but a CPU timing is never marked an effect
    assert tps_gain.lo > 0 and not tps_gain.marked and not markdown.render_cell(tps_gain).endswith(r"\*")
    assert CPU_TIMING in " ".join(table.about)
    assert "CPU timing, indicative" in latex.caption(table) and "CPU timing, indicative" in markdown.render(table)


def test_on_cuda_a_clear_speed_gain_is_bold():
    runs, evaluations = _sweep(ROWS, device="cuda")
    table = build_table("rank", runs, evaluations)
    assert _cells(table)["r=128"][5].bold and _cells(table)["r=128"][5].marked
    assert "CPU" not in " ".join(table.about)


def test_caption_counts_seeds_prompts_and_rounds_per_cell(rank):
    table, _, _ = rank
    cap = " ".join(table.about)
    n = len(BENCHES) * PROMPTS
    assert f"Per cell: 2 seeds × {n} prompts × {2 * n * ROUNDS:,} rounds." in cap
    assert "95 % interval" in cap and "* marks an interval that excludes 0" in cap
    tex = latex.caption(table)
    assert rf"2 seeds $\times$ {n} prompts $\times$ {2 * n * ROUNDS:,} rounds" in tex
    assert " ".join(table.about) in markdown.render(table).splitlines()[0]


def test_a_not_lossless_run_is_left_out_of_every_gain_and_footnoted():
    rows = ROWS + [("ready", "r=32", 5, 0.50, {"not_lossless": (1,)}), ("ready", "r=64", 6, 0.50, {"not_lossless": (0, 1)})]
    runs, evaluations = _sweep(rows)
    table = build_table("rank", runs, evaluations)
    cells = {row[0].text: row for row in table.rows}
    assert cells["r=32"][0].flag == "‡" and cells["r=64"][0].flag == "‡" and cells["r=8"][0].flag == ""
    # r=32: only seed 0 remains, paired with DSpark's seed 0
    seed0 = stats.gain_pct(*_pairs(evaluations, "r=32", "DSpark", seeds=(0,)), "overall")
    assert cells["r=32"][2].mean == seed0.value
    assert all(c.missing for c in cells["r=64"][1:3] + cells["r=64"][4:])  # nothing left to average
    assert not cells["r=64"][2].bold and "r=64" not in [r[0].text for r in table.rows if r[2].bold]
    assert table.lossless_notes == [
        "r=32: seed(s) 1 not lossless (speculative output differed from AR greedy); left out of every number and gain of this row",
        "r=64: seed(s) 0, 1 not lossless (speculative output differed from AR greedy); left out of every number and gain of this row",
    ]
    md = markdown.render(table)
    assert "| r=32‡ |" in md and "‡ Not lossless: r=32: seed(s) 1 not lossless" in md
    tex = latex.render(table)
    assert r"r=32$^{\ddagger}$ &" in tex and r"$^{\ddagger}$\,Not lossless: r=32" in tex


def test_a_seed_the_reference_lacks_is_named_not_paired_silently():
    rows = [("dspark", "DSpark", 0, 0.0, {"seeds": (0,)}), ("ready", "r=8", 3, 0.10, {})]
    runs, evaluations = _sweep(rows)
    table = build_table("rank", runs, evaluations)
    cell = _cells(table)["r=8"][1]
    want = stats.gain_pct(*_pairs(evaluations, "r=8", "DSpark", seeds=(0,)), "overall")
    assert cell.mean == want.value
    assert "r=8 vs DSpark: paired over seed(s) 0; DSpark has no run with per-prompt logs for seed(s) 1" in table.notes


def test_a_reference_run_shared_by_every_seed_pairs_with_each_of_them():
    """replicate: adaptation: one DSpark run (base drafter seed 0) is the reference of seeds 0 and 1."""
    rows = [("dspark", "DSpark", 0, 0.0, {"seeds": (0,), "base_seed": 0}), ("ready", "r=8", 3, 0.10, {"base_seed": 0})]
    runs, evaluations = _sweep(rows)
    table = build_table("rank", runs, evaluations)
    ds = stats.tallies(evaluations["DSpark-0"])
    want = stats.gain_pct([stats.tallies(evaluations[f"r=8-{s}"]) for s in (0, 1)], [ds, ds], "overall")
    assert _cells(table)["r=8"][1].mean == want.value
    assert "r=8 vs DSpark: one DSpark run (same base drafter) serves every seed; its training variance is not sampled" \
        in table.notes


def test_without_per_prompt_logs_gains_are_plain_ratios_without_marks_or_bold():
    runs, _ = _sweep(ROWS)
    table = build_table("rank", runs)  # no evaluation.json
    cells = _cells(table)
    r8 = cells["r=8"][1]
    assert r8.mean == pytest.approx(10.0, abs=0.05) and r8.lo is None and not r8.marked
    assert not any(c.bold for row in table.rows for c in row)
    assert "No per-prompt logs (evaluation.json)" in " ".join(table.about)


def test_search_sweep_says_which_objective_and_split_ranked_its_trials(tmp_path, monkeypatch):
    (tmp_path / "search_loss.yaml").write_text("search:\n  objective: heldout_tf/tau\n  n_trials: 2\n")
    monkeypatch.setattr(collect, "EXPERIMENTS_DIR", tmp_path)
    runs, evaluations = _sweep(ROWS[:2])
    for ev in evaluations.values():
        ev["heldout_tf"] = {"split": "validation", "num_sequences": 3, "block_size": 7,
                            "sequences": {"committed": [4, 5, 6], "blocks": [2, 2, 2]}, "tau": 2.5}
    about = " ".join(build_table("search_loss", runs, evaluations).about)
    assert ("Search objective heldout_tf/tau: teacher-forced τ on the validation split of held-out regenerated "
            "sequences (3 sequences), not on the evaluation suites.") in about
    (tmp_path / "search_loss.yaml").write_text("search:\n  objective: overall/tau\n")
    about = " ".join(build_table("search_loss", runs, evaluations).about)
    assert "Search objective overall/tau: computed on the evaluation suites themselves" in about
