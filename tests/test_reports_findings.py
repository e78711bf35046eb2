"""The findings' verdicts follow the intervals: effects must clear 0, saturation must stay under the band."""

import pytest

from ready.stats import Interval
from reports.findings import Comparison, control_verdict, judge, overall_verdict


def test_a_directional_claim_needs_its_interval_on_the_right_side_of_zero():
    above = Comparison("a", "b")
    assert judge(above, Interval(3.0, 1.0, 5.0)) == "reproduces"
    assert judge(above, Interval(0.5, -1.0, 2.0)) == "inconclusive"
    assert judge(above, Interval(-3.0, -5.0, -1.0)) == "does not"
    below = Comparison("a", "b", "below")
    assert judge(below, Interval(-3.0, -5.0, -1.0)) == "reproduces"
    assert judge(below, Interval(3.0, 1.0, 5.0)) == "does not"


def test_saturation_and_the_placebo_claim():
    sat = Comparison("r=128", "r=8", "saturated")
    assert judge(sat, Interval(0.2, -0.5, 0.9)) == "reproduces"
    assert judge(sat, Interval(1.5, 0.5, 2.5)) == "inconclusive"
    assert judge(sat, Interval(3.0, 2.0, 4.0)) == "does not"
    null = Comparison("placebo", "ft", "null")
    assert judge(null, Interval(0.5, -0.5, 1.5)) == "reproduces"
    assert judge(null, Interval(2.0, 0.5, 3.5)) == "does not"
    assert judge(Comparison("a", "b", "info"), Interval(1, 0, 2)) is None


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
