"""The findings' verdicts follow the intervals: effects must clear 0; "no effect" and "saturated" hold by an
equivalence test within a margin at least the MDE, fail when the interval lies outside the margin, and are
inconclusive otherwise; thin comparisons are read by their exact sign test before anything else."""

import numpy as np
import pytest

from reports.findings import Comparison, _fmt, _mde, control_verdict, judge, overall_verdict, reason
from reports.stats import Interval


def test_a_directional_claim_needs_its_interval_on_the_right_side_of_zero():
    above = Comparison("a", "b")
    assert judge(above, Interval(3.0, 1.0, 5.0)) == "reproduces"
    assert judge(above, Interval(0.5, -1.0, 2.0)) == "inconclusive"
    assert judge(above, Interval(-3.0, -5.0, -1.0)) == "does not"
    below = Comparison("a", "b", "below")
    assert judge(below, Interval(-3.0, -5.0, -1.0)) == "reproduces"
    assert judge(below, Interval(3.0, 1.0, 5.0)) == "does not"


def test_no_effect_is_claimed_only_by_an_equivalence_test_within_a_margin_at_least_the_mde():
    sat = Comparison("r=128", "r=8", "saturated")
    assert sat.bound == 1.0
    tight = Interval(0.2, -0.3, 0.7, se=0.25, df=50)  # MDE 0.71 %: a ±1 % margin can be shown
    assert tight.mde() < 1.0 and tight.tost_p(1.0) < 0.05 and judge(sat, tight) == "reproduces"
    # Table 3's old r=128 vs r=8 (+0.09 [-0.71, +0.96]): MDE ≈ 1.2 % > 1 %, so "near saturation" cannot be shown
    old = Interval(0.09, -0.71, 0.96, se=0.43)
    assert old.mde() > 1.0 and judge(sat, old) == "inconclusive"
    assert "MDE 1.20 % > margin ±1 %" in reason(sat, old)
    wide_ok = Interval(0.3, -0.2, 0.8, se=0.25, df=2)  # the same SE on 2 df: MDE (4.30 + 1.06) × 0.25 > 1
    assert judge(sat, wide_ok) == "inconclusive"
    assert judge(sat, Interval(1.5, 0.5, 2.5)) == "inconclusive"
    assert judge(sat, Interval(3.0, 2.0, 4.0)) == "does not"  # wholly above the margin
    assert judge(sat, Interval(-3.0, -4.0, -2.0)) == "does not"  # wholly below it: "saturated" fails there too
    assert reason(sat, Interval(-3.0, -4.0, -2.0)) == "interval outside ±1 %"
    null = Comparison("placebo", "ft", "null")
    assert judge(null, Interval(0.1, -0.3, 0.5, se=0.2, df=30)) == "reproduces"
    assert judge(null, Interval(2.0, 0.5, 3.5)) == "does not"  # the placebo clearly beats FT
    assert judge(null, Interval(-2.0, -2.5, -1.5)) == "does not"  # far below FT: not "no effect" either
    control = Interval(-0.10, -0.95, 0.75, se=0.43)  # the positive control's placebo vs FT: absence of evidence
    assert judge(null, control) == "inconclusive"
    assert judge(Comparison("placebo", "ft", "null", margin=2.0), control) == "reproduces"  # a wider declared margin
    assert reason(null, control).startswith("MDE 1.20 % > margin ±1 %")
    assert judge(Comparison("a", "b", "info"), Interval(1, 0, 2)) is None


def test_a_thin_comparison_is_read_by_its_sign_test_before_any_mde_or_tost():
    """Fewer than MIN_DISCORDANT differing units: no interval, so no MDE and no TOST; the exact sign test on
    the differing units decides a direction, and an absence claim stays inconclusive (r=8 vs the placebo
    once rested on 11 of 384 units and read "equivalent, p 6e-6" by a t on 18 df)."""
    above = Comparison("r=8", "placebo", "precondition")
    two = Interval(-0.06, -np.inf, np.inf, se=0.05, df=18, discordant=2, ahead=0, units=384)
    assert two.thin and judge(above, two) == "inconclusive"
    eight = Interval(0.4, -np.inf, np.inf, se=0.1, df=18, discordant=8, ahead=8, units=384)  # sign test p 0.008
    assert judge(above, eight) == "reproduces" and judge(Comparison("a", "b", "below"), eight) == "does not"
    assert "2 of 384 units differ, 0 ahead; sign test p 0.5" in _fmt(two)
    eleven = Interval(0.05, -np.inf, np.inf, se=0.02, df=18, discordant=11, ahead=6, units=384)
    sat = Comparison("r=128", "r=8", "saturated")
    assert judge(sat, eleven) == "inconclusive" and reason(sat, eleven).startswith("thin: 11 of 384 units differ")
    assert _mde(eleven) == "— (thin)"  # judge never asked for an MDE or a TOST (both raise on a thin interval)
    null = Comparison("placebo", "ft", "null")
    assert judge(null, eleven) == "inconclusive" and judge(null, eight) == "does not"  # 8 of 8 ahead: it beats FT


def test_one_failed_comparison_decides_and_a_missing_row_says_not_run():
    assert overall_verdict(["reproduces", None, "reproduces"]) == "reproduces"
    assert overall_verdict(["reproduces", "inconclusive"]) == "inconclusive"
    assert overall_verdict(["reproduces", "does not", "inconclusive"]) == "does not reproduce"
    assert overall_verdict(["reproduces", "not run"]) == "not run"


def test_a_null_claim_without_a_state_effect_is_vacuous_not_reproduced():
    pre = Comparison("r=8", "Placebo (shuffled states)", "precondition")
    assert judge(pre, Interval(2.0, 0.5, 3.5)) == "reproduces"
    assert judge(pre, Interval(0.1, -0.3, 0.4)) == "inconclusive"
    assert overall_verdict(["reproduces"], ["reproduces"]) == "reproduces"
    assert overall_verdict(["reproduces"], ["inconclusive"]) == "vacuous (no state effect shown)"
    assert overall_verdict(["does not"], ["inconclusive"]) == "does not reproduce"
    assert overall_verdict(["reproduces"], ["not run"]) == "not run"


def test_regenerating_keeps_the_hand_written_preface(tmp_path):
    from reports.findings import MARKER, with_preface

    out = tmp_path / "findings.md"
    assert with_preface(out, "tables v1") == "tables v1"  # no file yet
    out.write_text("# Reading\n\nwhat the numbers mean\n\n" + MARKER + "\n\ntables v1")
    assert with_preface(out, "tables v2") == "# Reading\n\nwhat the numbers mean\n\n" + MARKER + "\n\ntables v2"


def test_opposed_certain_metrics_make_a_comparison_inconclusive():
    from reports.findings import reconcile

    up, down, either = Interval(0.8, 0.2, 1.8), Interval(-0.2, -0.3, -0.04), Interval(0.1, -0.2, 0.3)
    assert reconcile("reproduces", up, down) == "inconclusive"
    assert reconcile("reproduces", up, either) == "reproduces"  # teacher-forced undecided: the engine decides
    assert reconcile("reproduces", up, Interval(0.3, 0.1, 0.5)) == "reproduces"
    assert reconcile("inconclusive", up, down) == "inconclusive"
    assert reconcile(None, up, down) is None


def test_the_positive_control_passes_or_not():
    assert control_verdict("reproduces") == "passed"
    assert control_verdict("inconclusive") == "not passed (inconclusive)"
    assert control_verdict("not run") == "not passed (not run)"


def test_a_profile_selects_the_runs_made_with_it_and_no_profile_those_made_without():
    import polars as pl

    from reports.errors import ReportError
    from reports.findings import profile_runs

    runs = pl.DataFrame({"run_id": ["a", "b", "c", "d"], "start_time": [1, 2, 3, 4],
                         "ready.setting": ["s0", "s0", "s1", "s2"],
                         "ready.profile": [None, "", "state_context", "smoke"]})
    assert profile_runs(runs, "rank", None)["run_id"].to_list() == ["a", "b"]  # untagged runs predate profiles
    assert profile_runs(runs, "rank", "state_context")["run_id"].to_list() == ["c"]
    with pytest.raises(ReportError, match="sweep 'rank' has no runs made with profile=big"):
        profile_runs(runs, "rank", "big")
