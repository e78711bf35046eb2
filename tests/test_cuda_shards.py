"""The CUDA shard runner packs tests into shards under the budget and reads pytest's JUnit results."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cuda_shards as cs  # noqa: E402


def test_files_are_packed_whole_under_the_budget_longest_first():
    ids = ["tests/a.py::t1", "tests/a.py::t2", "tests/b.py::t", "tests/c.py::t"]
    durations = {"tests/a.py::t1": 100, "tests/a.py::t2": 100, "tests/b.py::t": 150, "tests/c.py::t": 90}
    shards = cs.plan(ids, durations, budget=250)
    assert [s.items for s in shards] == [["tests/a.py"], ["tests/b.py", "tests/c.py"]]
    assert all(s.seconds <= 250 for s in shards)


def test_the_shards_greedy_packing_needs_are_filled_evenly():
    lengths = {"a": 200, "b": 100, "c": 90, "d": 60, "e": 50}  # greedy under 300: 300 + 200
    ids = [f"tests/{f}.py::t" for f in lengths]
    shards = cs.plan(ids, {f"tests/{f}.py::t": v for f, v in lengths.items()}, budget=300)
    assert sorted(s.seconds for s in shards) == [250, 250]
    assert sorted(i for s in shards for i in s.items) == [f"tests/{f}.py" for f in sorted(lengths)]
    assert cs.plan([], {}, budget=300) == []


def test_a_file_longer_than_the_budget_is_split_by_test_and_unknown_tests_count_the_default():
    ids = ["tests/long.py::x", "tests/long.py::y", "tests/new.py::z"]
    shards = cs.plan(ids, {"tests/long.py::x": 200, "tests/long.py::y": 200}, budget=250)
    assert sorted(i for s in shards for i in s.items) == ["tests/long.py::x", "tests/long.py::y", "tests/new.py"]
    assert len(shards) == 2 and max(s.seconds for s in shards) == 200 + cs.DEFAULT_S


def test_junit_results_become_node_ids_with_outcomes(tmp_path):
    xml = tmp_path / "j.xml"
    xml.write_text(
        '<testsuites><testsuite>'
        '<testcase classname="tests.test_k" file="tests/test_k.py" name="test_ok[1-2]" time="1.5"/>'
        '<testcase classname="tests.test_k.TestBox" file="tests/test_k.py" name="test_bad" time="2">'
        '<failure message="x"/></testcase>'
        '<testcase classname="tests.test_k" file="tests/test_k.py" name="test_skip" time="0"><skipped/></testcase>'
        '</testsuite></testsuites>')
    assert cs._junit(xml) == [
        {"id": "tests/test_k.py::test_ok[1-2]", "outcome": "passed", "seconds": 1.5},
        {"id": "tests/test_k.py::TestBox::test_bad", "outcome": "failed", "seconds": 2.0},
        {"id": "tests/test_k.py::test_skip", "outcome": "skipped", "seconds": 0.0},
    ]


def test_a_malformed_durations_file_is_one_clear_error(tmp_path):
    bad = tmp_path / "d.json"
    bad.write_text('{"tests": [1, 2]}')
    try:
        cs.load_durations(bad)
    except SystemExit as e:
        assert str(bad) in str(e) and "node id: seconds" in str(e)
    else:
        raise AssertionError("a malformed durations file was accepted")


def test_only_files_that_mark_cuda_tests_are_collected():
    files = cs.marked_files(["tests"])
    assert "tests/test_kernels_decode_attention.py" in files and "tests/test_target.py" in files
    assert "tests/test_sweeps_study.py" not in files  # imports optuna, which a GPU image may lack
    assert cs.marked_files(["tests/test_sweeps_study.py"]) == []


def test_a_shard_past_its_timeout_says_timeout_with_the_tests_it_finished(tmp_path, capsys, monkeypatch):
    slow = tmp_path / "test_slow.py"
    slow.write_text("import time, pytest\n\n"
                    "@pytest.mark.cuda\ndef test_quick():\n    time.sleep(0.3)\n\n"
                    "@pytest.mark.cuda\ndef test_slow():\n    time.sleep(60)\n")
    (tmp_path / "pyproject.toml").write_text('[tool.pytest.ini_options]\naddopts = "-q"\n')  # as this project's
    monkeypatch.setattr(cs, "ROOT", tmp_path)
    record = cs.run_shard(1, 1, cs.Shard([str(slow)], 1.0), ["-p", "no:cacheprovider", "--override-ini", "markers=cuda"],
                          timeout=8)
    line = capsys.readouterr().out.splitlines()[0]
    assert record["verdict"] == "TIMEOUT" and line.startswith("shard 1/1: TIMEOUT 1 passed, 0 failed")
    assert [c["id"].split("::")[1] for c in record["cases"]] == ["test_quick"]
    assert record["cases"][0]["seconds"] >= 0.3  # interrupted, pytest still wrote its report: durations to record
    assert record["wall_s"] < 30  # stopped at Ctrl-C, not after the sleep


def test_a_shard_whose_tests_all_ended_before_the_limit_is_judged_on_its_report(tmp_path, capsys, monkeypatch):
    """On an H100 (6 Dec) pytest printed "23 passed ... in 271.82s" and the process was still exiting
    (CUDA teardown) when a 280 s limit came: the shard passed, and says the limit came at exit."""
    slow_exit = tmp_path / "test_slow_exit.py"
    slow_exit.write_text("import atexit, time, pytest\n\natexit.register(time.sleep, 60)\n\n"
                         "@pytest.mark.cuda\ndef test_quick():\n    pass\n")
    (tmp_path / "pyproject.toml").write_text('[tool.pytest.ini_options]\naddopts = "-q"\n')
    monkeypatch.setattr(cs, "ROOT", tmp_path)
    record = cs.run_shard(1, 1, cs.Shard([str(slow_exit)], 1.0),
                          ["-p", "no:cacheprovider", "--override-ini", "markers=cuda"], timeout=8)
    line = capsys.readouterr().out.splitlines()[0]
    assert record["verdict"] == "PASS" and record["ended_at_exit"] and record["passed"] == 1
    assert line.startswith("shard 1/1: PASS 1 passed, 0 failed") and "came while pytest exited" in line
    assert record["wall_s"] < 40


def test_verbose_lines_become_outcomes():
    text = ("tests/a.py::test_x PASSED      [ 50%]\ntests/a.py::test_y[1] FAILED   [100%]\n"
            "tests/a.py::test_z SKIPPED (no GPU)  [100%]\nnoise PASSED\n")
    assert [(c["id"], c["outcome"]) for c in cs._verbose_outcomes(text)] == [
        ("tests/a.py::test_x", "passed"), ("tests/a.py::test_y[1]", "failed"), ("tests/a.py::test_z", "skipped")]
