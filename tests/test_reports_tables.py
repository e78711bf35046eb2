"""reports.tables without MLflow: which file a sweep's table goes to, bold ties, and LaTeX escaping."""

from reports import collect, latex
from reports.tables import Cell, mark_best, spec_for


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


def test_bold_marks_every_tie_at_display_precision_and_needs_two_values():
    cells = [Cell(mean=1.234, decimals=2), Cell(mean=1.2349, decimals=2), Cell(mean=1.1, decimals=2), Cell()]
    mark_best(cells)
    assert [c.bold for c in cells] == [True, True, False, False]
    lone = [Cell(mean=3.0), Cell()]
    mark_best(lone)
    assert not lone[0].bold


def test_latex_escapes_labels_and_renders_missing_and_negative_values():
    assert latex.escape("{30,62} & r_8 50%") == r"\{30,62\} \& r\_8 50\%"
    assert latex.render_cell(Cell()) == r"--$^{\dagger}$"
    assert latex.render_cell(Cell("gain", -2.857)) == "$-2.86$"
    assert latex.render_cell(Cell("speedup", 3.158, bold=True)) == r"$\mathbf{3.16\times}$"
