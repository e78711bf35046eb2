"""The A/B runner alternates variants over fresh engine processes, pairs them by round, and
reports each difference with a t interval; bad requests get one clear message."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from benchmarks import ab
from ready.target import save_target
from tiny_models import small_target

ROOT = Path(__file__).resolve().parent.parent


def test_a_variant_is_a_name_and_assignments():
    assert ab.parse_variant(["serial", "CUDA_LAUNCH_BLOCKING=1", "X=a=b"]) == (
        "serial", {"CUDA_LAUNCH_BLOCKING": "1", "X": "a=b"})
    assert ab.parse_variant(["plain"]) == ("plain", {})
    with pytest.raises(ab.ABError, match="not a VAR=value"):
        ab.parse_variant(["serial", "CUDA_LAUNCH_BLOCKING"])
    with pytest.raises(ab.ABError, match="expected a name"):
        ab.parse_variant(["CUDA_LAUNCH_BLOCKING=1"])


def test_rounds_alternate_the_order():
    assert [ab.round_order(["a", "b", "c"], r) for r in range(3)] == [["a", "b", "c"], ["c", "b", "a"], ["a", "b", "c"]]


def test_the_paired_interval_is_students_t():
    got = ab.paired_interval([1.0, 2.0, 3.0])  # mean 2, sd 1, t(0.975, 2 df) = 4.3026527
    half = 4.3026527 / 3 ** 0.5
    assert got == pytest.approx({"mean": 2.0, "lo": 2.0 - half, "hi": 2.0 + half})
    assert ab.paired_interval([0.5]) is None  # one round: no interval


def test_dotted_paths_reach_into_lists_and_miss_cleanly():
    doc = {"ar": {"step_ms": 13.7}, "forced": [{"tps": 250}], "flag": True}
    assert ab.lookup(doc, "ar.step_ms") == 13.7 and ab.lookup(doc, "forced.0.tps") == 250.0
    assert ab.lookup(doc, "forced.1.tps") is None and ab.lookup(doc, "ar.nope") is None and ab.lookup(doc, "flag") is None


def test_summary_pairs_by_round_and_skips_rounds_without_a_partner():
    runs = {"a": [{"ar": {"decode_tokens_per_s": 70.0}}, {"ar": {"decode_tokens_per_s": 71.0}}, {"failed": "exit code 1"}],
            "b": [{"ar": {"decode_tokens_per_s": 72.0}}, {"ar": {"decode_tokens_per_s": 72.5}}, {"ar": {"decode_tokens_per_s": 99.0}}]}
    res = ab.summarize(["a", "b"], runs, {"ar_tok_s": "ar.decode_tokens_per_s"})
    d = res["differences"]["ar_tok_s"]["b - a"]
    assert d["rounds"] == [0, 1] and d["per_round"] == [2.0, 1.5]  # round 2's 99 has no partner
    assert d["interval"]["mean"] == pytest.approx(1.75) and res["failed"] == {"a": {2: "exit code 1"}}


def test_a_round_is_started_only_when_it_fits_the_budget():
    assert ab.round_fits(0.0, [], 2, 10.0)  # nothing measured yet: the first round always starts
    assert ab.round_fits(100.0, [40.0, 50.0], 2, 200.0)  # 100 + 2 x 50 = 200
    assert not ab.round_fits(100.5, [40.0, 50.0], 2, 200.0)
    assert ab.round_fits(1e9, [50.0], 2, None)


def test_the_first_process_cold_caches_do_not_cost_a_round():
    """The 7 Dec H100 call: a cold first process of 134 s, then 99 s; 233 + 2 x 99 = 431 fits a 442 s budget
    (the next processes took 85 s), which counting the cold process (233 + 2 x 134 = 501) refused."""
    assert ab.process_estimate([134.0]) == 134.0  # nothing else measured yet
    assert ab.process_estimate([134.0, 99.0]) == 99.0
    assert ab.process_estimate([134.0, 99.0, 120.0]) == 120.0  # a slow later process still counts
    assert ab.round_fits(233.0, [134.0, 99.0], 2, 442.0)
    assert not ab.round_fits(233.0, [134.0, 120.0], 2, 442.0)


def test_a_budget_stops_before_a_round_that_cannot_finish_and_still_summarizes(tmp_path, monkeypatch):
    """Processes of 120 s under a 385 s budget (the 3 Dec H200 run): round 0 runs, round 1 would end
    at ~480 s and is not started, so no unpaired process is paid for; the summary is written."""
    now = [0.0]
    monkeypatch.setattr(ab, "run_process", lambda args, env, timeout, bench: (now.__setitem__(0, now[0] + 120.0),
                                                                       {"ar": {"decode_tokens_per_s": float(env["R"])}})[1])
    res = ab.run_ab({"a": {"R": "70"}, "b": {"R": "72"}}, [], 3, tmp_path, dict(ab.METRICS), budget=385.0,
                    clock=lambda: now[0])
    assert res["rounds_run"] == 1 and res["order"] == [["a", "b"]] and now[0] == 240.0
    assert "after 1 of 3 rounds" in res["stopped"] and "--budget 385" in res["stopped"]
    assert res["differences"]["ar_tok_s"]["b - a"]["per_round"] == [2.0]
    assert json.loads((tmp_path / "ab.json").read_text())["rounds_run"] == 1
    assert sorted(f.name for f in tmp_path.glob("*_*.json")) == ["a_0.json", "b_0.json"]


def test_the_step_trace_is_ab_d_on_the_metrics_given(tmp_path, monkeypatch, capsys):
    """`--bench step_trace` runs `python -m benchmarks.step_trace` in each process and compares only the
    dotted paths given with --metric (the engine's figures do not exist there)."""
    ran = []

    def fake(args, env, timeout, bench):
        ran.append((bench, list(args)))
        return {"steps": [{"batch": 1, "replay_ms": 3.0 if env.get("V") == "a" else 2.9}]}

    monkeypatch.setattr(ab, "run_process", fake)
    assert ab.main(["--bench", "step_trace", "--variant", "a", "V=a", "--variant", "b", "V=b", "--rounds", "2",
                    "--metric", "b1_ms=steps.0.replay_ms", "--out", str(tmp_path / "ab"), "--", "--draft", "dspark"]) == 0
    assert ran == [("step_trace", ["--draft", "dspark"])] * 4
    res = json.loads((tmp_path / "ab" / "ab.json").read_text())
    assert res["bench"] == "step_trace" and list(res["differences"]) == ["b1_ms"]
    assert res["differences"]["b1_ms"]["b - a"]["per_round"] == pytest.approx([-0.1, -0.1])
    capsys.readouterr()
    assert ab.main(["--bench", "step_trace", "--variant", "a", "--variant", "b", "--out", str(tmp_path / "x")]) == 2
    assert "--bench step_trace: give at least one --metric" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_a_process_output_is_read_as_one_line_or_one_indented_document():
    """The engine prints its JSON on the last line after progress lines; step_trace prints one indented
    document (on the H100 on 6 Dec every step_trace process was refused until this read it)."""
    doc = {"steps": [{"batch": 1, "replay_ms": 2.88}], "bound_ms": 2.04}
    assert ab.output_json("warming up\n" + json.dumps(doc) + "\n") == doc
    assert ab.output_json(json.dumps(doc, indent=1) + "\n") == doc
    assert ab.lookup(ab.output_json(json.dumps(doc, indent=1)), "steps.0.replay_ms") == 2.88
    assert ab.output_json("done\n") is None
    assert ab.output_json("[1, 2]\n") is None  # JSON, but not a benchmark's object


def test_bad_requests_are_refused_with_one_message(tmp_path, capsys):
    assert ab.main(["--variant", "a", "--out", str(tmp_path)]) == 2
    assert "at least two variants" in capsys.readouterr().err
    assert ab.main(["--variant", "a", "--variant", "a", "X=1", "--out", str(tmp_path)]) == 2
    assert "given twice" in capsys.readouterr().err
    assert ab.main(["--variant", "a", "--variant", "b", "--out", str(tmp_path), "--", "--out", "x.json"]) == 2
    assert "leave out --out" in capsys.readouterr().err
    assert ab.main(["--variant", "a", "--variant", "b", "--budget", "0", "--out", str(tmp_path)]) == 2
    assert "--budget 0: expected a positive number of seconds" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing written for a refused request


def test_pooled_calls_pair_within_each_round_and_refuse_foreign_folders(tmp_path, monkeypatch, capsys):
    """Two device calls of two rounds each (ABBA, then ABBA again) summarize as one A/B of four rounds,
    with the same differences as one call of those four rounds would give."""
    tps = iter([70.0, 72.0, 72.5, 71.0, 69.0, 70.0, 71.5, 70.5])  # a, b | b, a | a, b | b, a
    monkeypatch.setattr(ab, "run_process", lambda args, env, timeout, bench: {"ar": {"decode_tokens_per_s": next(tps)}})
    for call in ("call1", "call2"):
        ab.run_ab({"a": {}, "b": {}}, ["--prompt-len", "256"], 2, tmp_path / call, dict(ab.METRICS))
    assert ab.main(["--pool", str(tmp_path / "call1"), str(tmp_path / "call2"), "--out", str(tmp_path / "all")]) == 0
    res = json.loads((tmp_path / "all" / "ab.json").read_text())
    d = res["differences"]["ar_tok_s"]["b - a"]
    assert d["rounds"] == [0, 1, 2, 3] and d["per_round"] == [2.0, 1.5, 1.0, 1.0]
    assert d["interval"] == ab.paired_interval([2.0, 1.5, 1.0, 1.0])
    assert [c["rounds"] for c in res["pooled"]] == [2, 2] and res["engine_args"] == ["--prompt-len", "256"]
    capsys.readouterr()

    tps = iter([73.0, 70.0])  # a third call that opened with b: b, a
    ab.run_ab({"b": {}, "a": {}}, ["--prompt-len", "256"], 1, tmp_path / "call3", dict(ab.METRICS))
    assert ab.main(["--pool", *(str(tmp_path / c) for c in ("call1", "call2", "call3")),
                    "--out", str(tmp_path / "all3")]) == 0
    d3 = json.loads((tmp_path / "all3" / "ab.json").read_text())["differences"]["ar_tok_s"]["b - a"]
    assert d3["per_round"] == [2.0, 1.5, 1.0, 1.0, 3.0]  # still b - a: the first folder names the reference

    (tmp_path / "other").mkdir()  # an A/B of another prompt length
    (tmp_path / "other" / "ab.json").write_text(json.dumps({**res, "engine_args": ["--prompt-len", "8192"],
                                                            "rounds_run": 0, "order": []}))
    assert ab.main(["--pool", str(tmp_path / "call1"), str(tmp_path / "other"), "--out", str(tmp_path / "x")]) == 2
    assert "engine arguments differ" in capsys.readouterr().err
    assert ab.main(["--pool", str(tmp_path / "call1"), str(tmp_path / "nothing"), "--out", str(tmp_path / "x")]) == 2
    assert "no ab.json there" in capsys.readouterr().err
    assert ab.main(["--pool", str(tmp_path / "call1"), "--out", str(tmp_path / "call1")]) == 2
    assert "would be overwritten" in capsys.readouterr().err
    assert ab.main(["--pool", str(tmp_path / "call1"), "--variant", "a", "--out", str(tmp_path / "x")]) == 2
    capsys.readouterr()
    assert ab.main(["--pool", str(tmp_path / "call1"), "--bench", "step_trace", "--out", str(tmp_path / "x")]) == 2
    assert "give no --variant, --tree, --bench" in capsys.readouterr().err  # the folders name their benchmark
    assert not (tmp_path / "x").exists()  # nothing written for a refused request


@pytest.mark.slow
def test_two_trees_run_in_fresh_processes_on_cpu(tmp_path, capsys):
    torch.manual_seed(0)
    target = save_target(small_target(num_layers=4), tmp_path / "t")
    copy, broken = tmp_path / "copy", tmp_path / "broken"
    for name in ("ready", "benchmarks", "kernels", "experiments"):  # another source tree: this one's code, elsewhere
        shutil.copytree(ROOT / name, copy / name, ignore=shutil.ignore_patterns("__pycache__", "results"))
    for name in ("ready", "benchmarks", "kernels"):
        (broken / name).mkdir(parents=True)
    for f in ("ready/__init__.py", "benchmarks/__init__.py"):
        (broken / f).write_text("")
    (broken / "benchmarks/engine.py").write_text("raise SystemExit('error: this tree is broken')\n")
    out = tmp_path / "ab"
    code = ab.main(["--variant", "here", "--variant", "copy", "--variant", "broken",
                    "--tree", f"copy={copy}", "--tree", f"broken={broken}", "--rounds", "2", "--out", str(out),
                    "--metric", "tau=ar.tau", "--",
                    "--target", str(target), "target.device=cpu", "--prompt-len", "8", "--new-tokens", "12", "drafter.proposals=3",
                    "--accept-dist", "3:1", "--repeats", "1", "--verify-iters", "2", "--threads", "1"])
    res = json.loads(capsys.readouterr().out)
    assert json.loads((out / "ab.json").read_text()) == res
    assert res["order"] == [["here", "copy", "broken"], ["broken", "copy", "here"]]
    # each process ran its own tree: the engine JSON names the source tree it imported
    sources = {n: {json.loads((out / f"{n}_{r}.json").read_text())["source"]["ready"] for r in (0, 1)}
               for n in ("here", "copy")}
    assert sources == {"here": {str(ROOT)}, "copy": {str(copy.resolve())}}
    assert all(p["tau"] == 1.0 and p["ar_tok_s"] > 0 for p in res["per_process"]["here"])
    assert sorted(f.name for f in out.glob("*.json")) == sorted(
        ["ab.json"] + [f"{n}_{r}.json" for n in ("here", "copy", "broken") for r in (0, 1)])
    # a broken tree fails its process, not the run; its rounds count as incomplete
    assert set(res["failed"]["broken"]) == {"0", "1"} and code == 1
    assert "this tree is broken" in json.loads((out / "broken_0.json").read_text())["stderr"]
    copy_minus_here = res["differences"]["ar_tok_s"]["copy - here"]
    assert copy_minus_here["rounds"] == [0, 1] and copy_minus_here["interval"] is not None


def fake_tree(root, tok_s: float, bench: str = "benchmarks"):
    """A source tree whose engine benchmark prints one JSON line with an AR rate, and a kernels folder;
    its benchmarks in `bench` (benchmarks/, or ready/bench/ as before issue 76)."""
    for folder in ("ready", bench, "kernels"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    (root / "kernels" / "marker.py").write_text(f"TOK_S = {tok_s}\n")
    for pkg in {root / "ready", root / bench}:
        (pkg / "__init__.py").write_text("")
    (root / bench / "engine.py").write_text(
        "import json\nfrom ready_kernels.marker import TOK_S\n"
        "print(json.dumps({'ar': {'decode_tokens_per_s': TOK_S}}))\n")
    return root


@pytest.mark.parametrize("before_bench", ["benchmarks", "ready/bench"])
def test_a_variant_can_run_another_source_tree(tmp_path, capsys, before_bench):
    """--tree: each variant's processes import `ready` and `ready_kernels` from its own tree, not this one;
    a tree from before issue 76 runs its ready/bench/ as `benchmarks`."""
    before, after = fake_tree(tmp_path / "before", 70.0, before_bench), fake_tree(tmp_path / "after", 72.5)
    out = tmp_path / "ab"
    code = ab.main(["--variant", "before", "--variant", "after", "--tree", f"before={before}",
                    "--tree", f"after={after}", "--rounds", "2", "--out", str(out)])
    res = json.loads(capsys.readouterr().out)
    assert code == 0 and [p["ar_tok_s"] for p in res["per_process"]["before"]] == [70.0, 70.0]
    assert res["differences"]["ar_tok_s"]["after - before"]["per_round"] == [2.5, 2.5]
    assert res["env"]["after"]["PYTHONSAFEPATH"] == "1"


def test_a_tree_that_is_not_this_project_is_refused(tmp_path, capsys):
    out = tmp_path / "ab"
    assert ab.main(["--variant", "a", "--variant", "b", "--tree", f"a={tmp_path}", "--out", str(out)]) == 2
    assert "expected a source tree of this project" in capsys.readouterr().err
    assert ab.main(["--variant", "a", "--variant", "b", "--tree", f"c={tmp_path}", "--out", str(out)]) == 2
    assert "NAME one of the variants (a, b)" in capsys.readouterr().err
    assert not out.exists()  # nothing written for a refused request
