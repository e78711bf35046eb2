"""reports.tables without MLflow: which file a sweep's table goes to, the interval cells of an
ablation table built from hand-built evaluation logs (Holm marks, paired bold, thin comparisons,
clone rows, left-out runs, captions), and LaTeX escaping."""

import polars as pl
import pytest

from evaluation_logs import bench_rounds, evaluation, metrics_of
from reports import stats
from reports import collect, latex, markdown
from reports.stats import Interval
from reports.tables import CPU_TIMING, Cell, apply_holm, best_row, build_table, spec_for

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


def test_bold_needs_a_paired_win_against_every_other_row():
    from types import SimpleNamespace

    from reports.stats import Interval

    a, b, c = (SimpleNamespace(name=n) for n in "abc")
    score = {"a": 5.0, "b": 4.0, "c": 3.0}
    wins = {("a", "b"): Interval(1.0, 0.2, 1.8), ("a", "c"): Interval(2.0, 1.0, 3.0)}
    assert best_row([a, b, c], lambda v: score[v.name], lambda x, y: wins[x.name, y.name]) is a
    # the best beats the runner-up clearly but not c, paired: nothing bold (marginal intervals do not decide)
    wins[("a", "c")] = Interval(2.0, -0.1, 4.1)
    assert best_row([a, b, c], lambda v: score[v.name], lambda x, y: wins[x.name, y.name]) is None
    # a win on too few differing units is no win
    wins[("a", "c")] = Interval(2.0, 1.0, 3.0, discordant=3, ahead=3)
    assert best_row([a, b, c], lambda v: score[v.name], lambda x, y: wins[x.name, y.name]) is None
    wins[("a", "c")] = Interval(2.0, 1.0, 3.0)
    assert best_row([a, b, c], lambda v: None if v is c else score[v.name], lambda x, y: wins[x.name, y.name]) is None
    assert best_row([a], lambda v: 1.0, lambda x, y: None) is None  # one row is never "best"


def test_holm_marks_only_what_survives_the_tables_family():
    strong = Cell("gain", 9.0, decimals=1, lo=5.0, hi=13.0, iv=Interval(9.0, 5.0, 13.0, se=2.0, df=30))
    weak = Cell("gain", 4.0, decimals=1, lo=0.2, hi=7.8, iv=Interval(4.0, 0.2, 7.8, se=1.9, df=30))
    null = Cell("gain", 0.5, decimals=1, lo=-3.0, hi=4.0, iv=Interval(0.5, -3.0, 4.0, se=1.7, df=30))
    timing = Cell("gain", 9.0, decimals=1, lo=5.0, hi=13.0, iv=strong.iv, ranked=False)
    # unranked and interval-less cells stay out of the family
    assert apply_holm([strong, weak, null, timing, Cell("gain", 1.0)]) == 3
    # step-down: the second smallest p is multiplied by 2 (the largest, by 1)
    assert weak.iv.p_value < 0.05 and weak.p_adj == pytest.approx(2 * weak.iv.p_value) and weak.p_adj > 0.05
    assert strong.marked and not weak.marked and weak.lo > 0  # excludes 0, but not after Holm
    assert timing.p_adj is None and not timing.marked

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
    seeds (this row's seeds), base_seed (param train.base_seed; default: the seed), like (an earlier
    row whose rounds this row repeats) with differ (that many of seed 0's prompts accept nothing
    instead), drafter (the row whose trained drafter this row reports) with rank (requested, built).
    """
    ds = {s: _rounds(100, s) for s in seeds}
    records, evaluations, drawn = [], {}, {}
    for method, label, order, gain, opt in rows:
        for s in opt.get("seeds", seeds):
            rounds = ds[s] if method == "dspark" else _rounds(200 + 7 * order, s, gain, ds[s])
            if "like" in opt:
                rounds = {b: [list(r) for r in rs] for b, rs in drawn[opt["like"], s].items()}
                for i in range(opt.get("differ", 0) if s == 0 else 0):
                    rounds[BENCHES[0]][i] = [0] * len(rounds[BENCHES[0]][i])
            drawn[label, s] = rounds
            swapped = {b: bench_rounds(900 + s, PROMPTS, ROUNDS, opt["swap"], r) for b, r in rounds.items()} \
                if "swap" in opt else None
            bad = s in opt.get("not_lossless", ())
            ev = evaluation(method, rounds, device=device, wall_s=opt.get("wall_s", 0.1), swapped=swapped,
                            lossless=0 if bad else 1)
            requested, built = opt.get("rank", (0, 0))
            ev["resolved"].update(drafter_dir=f"/drafters/{opt.get('drafter', label)}-{s}", rank_requested=requested,
                                  rank=built)
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
    ("ready", "r=16", 4, 0.05, {"swap": -0.01}),
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


def test_marks_follow_holm_over_the_tables_comparisons(rank):
    """+25 % and +10 % survive Holm over the table's comparisons; +5 % excludes 0 on its own but not after
    Holm at this size (16 prompts × 2 seeds); +1 % (FT) is noise."""
    table, _, _ = rank
    cells = _cells(table)
    r8, r128, r16, ft = cells["r=8"][1], cells["r=128"][1], cells["r=16"][1], cells["DSpark + FT"][1]
    assert r128.marked and r128.p_adj < 0.05 and r8.marked
    assert r16.lo > 0 and r16.iv.p_value < 0.05 and r16.p_adj >= 0.05 and not r16.marked
    assert not ft.marked and ft.lo < 0 < ft.hi
    family = [c for row in table.rows for c in row if c.comparison]
    assert len(family) == 12  # 5 vs DSpark, 4 vs FT, 3 state reliances; CPU timings stay out
    assert all(c.p_adj == pytest.approx(p) for c, p in zip(family, stats.holm([c.iv.p_value for c in family])))
    md = markdown.render(table)
    assert f"| r=16 | {markdown.render_cell(cells['r=16'][0])} | {markdown.render_cell(r16)} |" in md
    assert markdown.render_cell(r128).endswith(r"\*") and not markdown.render_cell(r16).endswith(r"\*")
    assert "after Holm's correction over the table's 12 comparisons" in " ".join(table.about)


def test_bold_goes_to_the_row_that_wins_every_paired_comparison_and_never_to_cpu_timing(rank):
    table, _, evaluations = rank
    cells = _cells(table)
    # r=128 (+25 %) beats every other row paired, prompt by prompt and seed by seed: its τ cells are bold
    assert [i for i, c in enumerate(cells["r=128"]) if c.bold] == [0, 1, 2]
    for other in ("DSpark", "DSpark + FT", "Placebo (shuffled states)", "r=8", "r=16"):
        assert stats.gain_pct(*_pairs(evaluations, "r=128", other), "overall").lo > 0, other
    assert not any(c.bold for name, row in cells.items() if name != "r=128" for c in row)
    # bold though its own τ interval overlaps r=8's: that interval carries the prompts' spread, which pairing cancels
    assert cells["r=128"][0].lo < cells["r=8"][0].hi
    tps_gain = cells["r=128"][5]  # r=128 is twice as fast, but on CPU: never bold, never marked an effect
    assert tps_gain.lo > 0 and not tps_gain.bold and not tps_gain.marked
    assert not markdown.render_cell(tps_gain).endswith(r"\*")
    assert CPU_TIMING in " ".join(table.about)
    assert "CPU timing, indicative" in latex.caption(table) and "CPU timing, indicative" in markdown.render(table)


def test_on_cuda_a_clear_speed_gain_is_bold():
    runs, evaluations = _sweep(ROWS, device="cuda")
    table = build_table("rank", runs, evaluations)
    assert _cells(table)["r=128"][5].bold and _cells(table)["r=128"][5].marked
    assert "CPU" not in " ".join(table.about)


def test_a_batched_evaluation_says_its_tps_is_throughput_at_that_concurrency(rank):
    _, runs, evaluations = rank
    assert "decoded together" not in " ".join(rank[0].about)  # one prompt at a time: nothing to say
    batched = runs.with_columns(pl.lit("8").alias("param.eval.concurrency"))
    about = " ".join(build_table("rank", batched, evaluations).about)
    assert "TPS is throughput: committed tokens per second with 8 sequences decoded together" in about
    assert CPU_TIMING in about


def test_caption_counts_seeds_prompts_and_rounds_and_states_the_rules(rank):
    table, _, _ = rank
    cap = " ".join(table.about)
    n = len(BENCHES) * PROMPTS
    assert f"Per cell: 2 seeds × {n} prompts × {2 * n * ROUNDS:,} rounds." in cap
    for rule in ("τ = 1 + Σ_j P_j, censored at the token budget", "closed-form 95 % interval",
                 "the seed level on seeds − 1 degrees of freedom plus the prompt level on prompts − suites "
                 "(effective df here ",
                 "* marks a comparison that stays significant (p < 0.05) after Holm's correction",
                 "bold: a row whose paired interval against every other row excludes 0 in its favour",
                 "Smallest Δτ vs DSpark detectable at 80 % power: ", "pool every suite's prompts"):
        assert rule in cap, rule
    mdes = [c.iv.mde() for c in (row[2] for row in table.rows) if c.iv is not None]
    assert f"{min(mdes):.1f}–{max(mdes):.1f} %." in cap
    tex = latex.caption(table)
    assert rf"2 seeds $\times$ {n} prompts $\times$ {2 * n * ROUNDS:,} rounds" in tex
    assert " ".join(table.about) in markdown.render(table).splitlines()[0]


def test_a_comparison_on_two_differing_units_shows_the_count_not_an_interval():
    """r=8 decodes exactly like the placebo but on 2 of 2 × 16 prompt × seed units."""
    rows = ROWS[:1] + ROWS[4:] + [("ready", "r=8", 3, 0.0, {"like": "Placebo (shuffled states)", "differ": 2})]
    runs, evaluations = _sweep(rows)
    table = build_table("rank", runs, evaluations)
    pair = stats.gain_pct(*_pairs(evaluations, "r=8", "Placebo (shuffled states)"), "overall")
    assert pair.discordant == 2 and pair.thin
    vs_ds = _cells(table)["r=8"][1]  # against DSpark the rows differ on most units: an interval as usual
    assert not vs_ds.thin and vs_ds.has_interval
    direct = build_table("rank", *_sweep([ROWS[0], ("ready", "r=8", 3, 0.0, {"like": "DSpark", "differ": 2})]))
    cell = _cells(direct)["r=8"][1]
    assert cell.thin and not cell.has_interval and not cell.marked and not cell.comparison
    assert markdown.render_cell(cell) == f"{cell.mean:+.1f} (2 of 32 differ)"
    assert latex.render_cell(cell) == f"${cell.mean:+.1f}$ (2 of 32 differ)"
    assert "(k of N differ): the two rows decode differently on fewer than 30" in " ".join(direct.about)


def test_a_row_that_resolves_to_another_rows_drafter_is_labelled_and_never_ranked():
    """r=128 is clamped to rank 64 = d_k: the same drafter folder as r=64 in every seed, the same numbers."""
    rows = ROWS[:1] + ROWS[4:] + [("ready", "r=8", 3, 0.10, {"swap": -0.10, "rank": (8, 8)}),
                                  ("ready", "r=64", 6, 0.25, {"swap": -0.20, "rank": (64, 64)}),
                                  ("ready", "r=128", 7, 0.0, {"like": "r=64", "drafter": "r=64", "rank": (128, 64),
                                                              "swap": -0.20})]
    runs, evaluations = _sweep(rows)
    table = build_table("rank", runs, evaluations)
    labels = [r[0].text for r in table.rows]
    clone = "r=128 (= r=64: rank 128 clamped to d_k = 64)"
    assert labels[-2:] == ["r=64", clone]
    cells = _cells(table)
    assert [c.bold for c in cells["r=64"][:3]] == [True, True, True]  # its clone takes no part in the bold
    assert cells[clone][1].mean == cells["r=64"][1].mean and not any(c.bold or c.marked for c in cells[clone])
    assert not any(c.comparison for c in cells[clone])  # nor in the Holm family
    assert f"| {clone} |" in markdown.render(table)
    assert "r=128 (= r=64: rank 128 clamped to d\\_k = 64) &" in latex.render(table)
    assert "A row labelled (= X: …) resolves to row X's drafter" in " ".join(table.about)


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
        ev["heldout_tf"] = {"split": "validation", "num_sequences": 3, "proposals": 7,
                            "sequences": {"committed": [4, 5, 6], "blocks": [2, 2, 2]}, "tau": 2.5}
    about = " ".join(build_table("search_loss", runs, evaluations).about)
    assert ("Search objective heldout_tf/tau: teacher-forced τ on the validation split of held-out regenerated "
            "sequences (3 sequences), not on the evaluation suites.") in about
    (tmp_path / "search_loss.yaml").write_text("search:\n  objective: overall/tau\n")
    about = " ".join(build_table("search_loss", runs, evaluations).about)
    assert "Search objective overall/tau: computed on the evaluation suites themselves" in about


def test_the_main_table_shows_a_dflash_row_beside_dspark_with_its_gain():
    """The `dflash` baseline (DSpark without the Markov head) is a column group labelled DFlash, compared with DSpark."""
    runs, evaluations = _sweep([("dspark", "DSpark", 1, 0.0, {}), ("dflash", "DFlash", 2, -0.05, {}),
                                ("ready", "ReaDy", 3, 0.10, {"swap": -0.10})])
    table = build_table("main", runs, evaluations)
    names = [c.markdown for c in table.columns]
    assert "DFlash τ" in names and "DFlash vs DSpark τ (%)" in names and "ReaDy vs DSpark τ (%)" in names
    assert names.index("DSpark τ") < names.index("DFlash τ") < names.index("ReaDy τ")
    assert collect.METHOD_NAMES["dflash"] == "DFlash"
