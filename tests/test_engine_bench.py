"""The engine benchmark: accepted-length distributions parse as written, forced acceptance
replays them, and the script prints one consistent JSON object on CPU."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from benchmarks.engine import (
    ForcedRounds, abba, calibrated_confidence, consistency, forced_acceptance, main, paired_difference, paired_ratio,
    parse_accept_dist, verify_bound
)
from ready.decode import DecodeError
from ready.target import HybridConfig, HybridLM, save_target

torch.set_num_threads(1)  # tiny models: one thread beats two on a shared machine


def test_accept_dist_is_parsed_and_normalised():
    assert parse_accept_dist("0:1,3:1,7:2", 7) == {0: 0.25, 3: 0.25, 7: 0.5}
    assert parse_accept_dist("2:0.5,2:0.5", 3) == {2: 1.0}


@pytest.mark.parametrize("text", ["0:0.5,8:0.5", "a:1", "3", "0:-1,1:2", "0:0"])
def test_bad_accept_dist_is_refused(text):
    with pytest.raises(DecodeError, match="--accept-dist"):
        parse_accept_dist(text, 7)


def test_forced_acceptance_draws_from_the_distribution():
    draw = forced_acceptance({0: 0.2, 7: 0.8}, seed=1)
    counts = Counter(draw(None, None) for _ in range(2000))
    assert set(counts) == {0, 7}
    assert 0.75 < counts[7] / 2000 < 0.85


def test_forced_confidence_is_the_distributions_conditional_acceptance_or_the_rounds_own():
    dist = {0: 0.15, 1: 0.1, 2: 0.1, 3: 0.1, 4: 0.1, 5: 0.15, 6: 0.3}  # issue 74's forced distribution, K = 6
    assert calibrated_confidence(dist, 6) == pytest.approx([0.85, 0.75 / 0.85, 0.65 / 0.75, 0.55 / 0.65,
                                                           0.45 / 0.55, 0.3 / 0.45])
    cal = ForcedRounds(dist, 6, seed=3)
    assert cal.confidence(0) == pytest.approx(calibrated_confidence(dist, 6))
    plain = forced_acceptance(dist, seed=3)
    assert [cal.accept(None, None) for _ in range(50)] == [plain(None, None) for _ in range(50)]
    oracle = ForcedRounds(dist, 6, seed=3, kind="oracle")
    plain = forced_acceptance(dist, seed=3)
    for _ in range(50):  # two rows a round: each row's accept returns the A its confidences told, in row order
        c = [oracle.confidence(b) for b in (0, 1)]
        a = [oracle.accept(None, None) for _ in (0, 1)]
        assert a == [plain(None, None), plain(None, None)]
        assert c == [[1.0] * x + [0.0] * (6 - x) for x in a]
    with pytest.raises(DecodeError, match="--force-confidence"):
        ForcedRounds(dist, 6, kind="psychic")


def test_verify_bound_is_the_larger_of_bytes_over_bandwidth_and_flops_over_peak():
    from ready.target import load_target

    tiny = load_target("tiny", device="cpu", dtype="float32")
    streamed = 4_000_000
    b = verify_bound(tiny, 2, 14, 100, streamed, bandwidth=1e9, peak_flops=1e12)
    assert b["flops"] == pytest.approx(2 * (streamed / 4) * 14)
    assert b["memory_ms"] == pytest.approx(b["bytes"] / 1e9 * 1e3) and b["bytes"] > streamed
    assert b["bound_ms"] == max(b["memory_ms"], b["flops_ms"])
    assert verify_bound(tiny, 2, 14, 100, streamed, 0.0, 0.0)["bound_ms"] is None  # CPU: no bound


def test_batched_benchmark_under_both_verify_schedules(capsys):
    """`--verify-schedule full,confidence --force-confidence oracle`: each drafter also runs as
    `<kind>@confidence` with forced confidences that know each round's forced A, so τ is the full schedule's
    and every row verifies exactly the drafts it will accept (tokens verified per round = τ), fewer than the
    full schedule's; the calibrated confidence of a distribution whose every step is >= 0.5 verifies all."""
    args = ["--target", "tiny", "target.device=cpu", "--prompt-len", "6", "--new-tokens", "10", "drafter.proposals=3",
            "--accept-dist", "0:1,1:1,3:2", "--drafter", "dspark,ready", "--batch", "1,2", "--batch-only",
            "--repeats", "1", "--json", "--verify-schedule", "full,confidence"]
    assert main(args + ["--force-confidence", "oracle"]) == 0
    b = json.loads(capsys.readouterr().out)["batched"]
    assert b["schedules"] == {"full": {"confidence_threshold": 0.5, "verify_budget": 0.0},
                              "confidence": {"confidence_threshold": 0.5, "verify_budget": 0.0}}
    assert b["force_confidence"] == "oracle"
    for run in b["runs"]:
        for k in ("dspark", "ready"):
            full, conf = run[k], run[f"{k}@confidence"]
            assert conf["tau"] == full["tau"] and conf["rounds"] == full["rounds"]
            assert conf["verified_per_round"] == pytest.approx(conf["tau"])
            assert conf["verified_per_round"] < full["verified_per_round"] <= 4
            assert conf["verify_tokens_per_round"] <= full["verify_tokens_per_round"]
            assert conf["over_full"] > 0 and "verify_bound" in conf
    assert main(args + ["--force-confidence", "calibrated", "--accept-dist", "1:1,3:3"]) == 0
    b = json.loads(capsys.readouterr().out)["batched"]
    for run in b["runs"]:  # c = 1, 0.75, 1 (all >= 0.5): the schedule keeps every draft
        assert run["dspark@confidence"]["verified_per_round"] == run["dspark"]["verified_per_round"]
    assert main(args[:-1] + ["full,half"]) == 2
    assert "--verify-schedule" in capsys.readouterr().err


def test_benchmark_prints_consistent_json_on_cpu(tmp_path, capsys):
    torch.manual_seed(0)
    cfg = HybridConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, linear_num_key_heads=1, linear_num_value_heads=2,
        linear_key_head_dim=8, linear_value_head_dim=8, max_position_embeddings=128,
    )
    path = save_target(HybridLM(cfg), tmp_path / "t")
    code = main(["--target", str(path), "target.device=cpu", "--prompt-len", "8", "--new-tokens", "40", "drafter.proposals=3",
                 "--accept-dist", "3:1", "--accept-dist", "0:1", "--repeats", "1", "--verify-iters", "3",
                 "--bandwidth", "1e10", "--json"])
    assert code == 0
    printed = capsys.readouterr()
    res = json.loads(printed.out)
    # each finished section is announced on stderr, so a run cut by a time limit still shows its figures
    assert f"prompt 8: AR {res['ar']['decode_tokens_per_s']:.1f} decode tok/s" in printed.err
    assert f"verify(4) / AR step {res['verify']['ratio']:.3f}" in printed.err
    # the JSON keeps the same marks, so where a process's minutes went survives without its stderr
    marks = res["timeline_s"]
    assert [m for _, m in marks][:3] == [f"target {path} loaded on cpu (float32)",
                                         f"prompt 8: AR {res['ar']['decode_tokens_per_s']:.1f} decode tok/s",
                                         f"prompt 8: verify(4) / AR step {res['verify']['ratio']:.3f}"]
    assert [t for t, _ in marks] == sorted(t for t, _ in marks)
    assert res["ar"]["new_tokens"] == 40 and res["ar"]["tau"] == 1.0 and res["ar"]["tokens_per_s"] > 0
    assert res["verify"]["tokens"] == [1, 2, 4] and res["verify"]["ratio"] > 0
    always, never = res["forced"]
    # all 3 drafts accepted every round: 1 + 9 x 4 tokens, then 3 left -> a 10th round with
    # A = h = 3 whose bonus token falls outside the budget; tau = mean(A + 1) = 4
    assert always["tau"] == 4.0 and always["rounds"] == 10
    assert never["tau"] == 1.0 and never["rounds"] == 39
    assert res["bound"]["tokens_per_s"] > 0
    # which source tree produced the figures travels with them (benchmarks.ab A/Bs trees)
    assert Path(res["source"]["ready"]) == Path(__file__).resolve().parent.parent


def test_benchmark_refuses_a_bad_distribution(capsys):
    assert main(["--target", "tiny", "target.device=cpu", "drafter.proposals=3", "--accept-dist", "5:1"]) == 2
    assert "accepted lengths must lie in 0..K=3" in capsys.readouterr().err


def test_dspark_and_ready_rounds_under_identical_acceptance_on_cpu(tmp_path, capsys):
    torch.manual_seed(0)
    cfg = HybridConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, linear_num_key_heads=1, linear_num_value_heads=2,
        linear_key_head_dim=8, linear_value_head_dim=8, max_position_embeddings=128,
    )
    path = save_target(HybridLM(cfg), tmp_path / "t")
    out = tmp_path / "res.json"
    code = main(["--target", str(path), "target.device=cpu", "--prompt-len", "12", "--new-tokens", "30", "drafter.proposals=3",
                 "--accept-dist", "0:1,2:1,3:2", "--repeats", "2", "--pairs", "4", "--verify-iters", "2",
                 "--verify-tokens", "", "--tolerance-pct", "1000", "--drafter", "dspark,ready", "--breakdown", "--profile", "--first-later", "--json", "--out", str(out)])
    assert code == 0
    res = json.loads(capsys.readouterr().out)
    assert json.loads(out.read_text()) == res
    assert res["verify"]["tokens"] == [1, 4] and res["forced"] == []  # no random-drafter runs asked for
    d = res["drafters"]
    assert d["preset"] == "tiny" and d["resolved"]["ready"]["state_layers"] and not d["resolved"]["dspark"]["state_layers"]
    assert d["drafter_params"]["ready"] > d["drafter_params"]["dspark"]
    run = d["runs"][0]
    # the same forced accepted lengths for both drafters, every repeat: identical rounds and tau
    assert run["same_rounds"] and run["dspark"]["tau"] == run["ready"]["tau"]
    assert run["dspark"]["rounds"] == run["ready"]["rounds"] > 1
    assert run["ready_over_dspark"] > 0 and len(run["ready_over_dspark_pairs"]) == 4
    iv = run["ready_over_dspark_interval"]
    assert iv["lo"] <= run["ready_over_dspark"] <= iv["hi"] and iv["pairs"] == 4
    for k in ("dspark", "ready"):
        b = run[k]["breakdown"]
        assert b["draft_us"] > 0 and b["verify_us"] > 0 and b["commit_us"] > 0 and b["round_us"] > 0
        assert b["rounds_us"] >= b["round_us"] and b["pairs"] == 4 and run[k]["events_over_plain"] > 0
    assert len(run["breakdown_ratio"]["per_pair"]) == 4 and run["consistency"]["consistent"]
    med = run["ready_over_dspark_median_round"]
    assert med["lo"] <= med["ratio"] <= med["hi"] and len(med["per_pair"]) == 4
    assert run["ready"]["breakdown"]["tail_us"] >= 0 and run["ready"]["breakdown"]["last_round_us"] > 0
    extra = run["ready_minus_dspark_us"]
    assert set(extra) == {"round_us", "draft_us", "verify_us", "commit_us", "other_us"}
    assert all(e["lo"] <= e["mean"] <= e["hi"] and e["pairs"] == 4 for e in extra.values())
    assert "reader_extra_draft_us" in run
    assert d["profile"]["ready"]["top"] and d["profile"]["ready_minus_dspark"]
    fl = res["first_vs_later"]
    assert fl["first"]["decode_tokens_per_s"] > 0 and fl["later"]["decode_tokens_per_s"] > 0 and fl["later_over_first"] > 0


def test_unknown_drafter_is_refused(capsys):
    assert main(["--target", "tiny", "target.device=cpu", "--drafter", "eagle"]) == 2
    assert "expected a comma list of none, random, dspark, ready" in capsys.readouterr().err


def test_batched_benchmark_prints_json_for_each_batch_size(capsys):
    """`--batch 1,2` on the tiny preset: AR, DSpark and ReaDy through the batched engine at each size, the
    drafters under the same forced accepted lengths (identical rounds), the reader's share of a round."""
    code = main(["--target", "tiny", "target.device=cpu", "--prompt-len", "6", "--new-tokens", "8", "drafter.proposals=3",
                 "--accept-dist", "0:1,3:1", "--drafter", "dspark,ready", "--batch", "1,2", "--batch-only",
                 "--repeats", "1", "--json"])
    assert code == 0
    printed = capsys.readouterr()
    res = json.loads(printed.out)
    b = res["batched"]
    assert b["batches"] == [1, 2] and [r["batch"] for r in b["runs"]] == [1, 2]
    assert "batch 2: decode tok/s ar " in printed.err
    # where a batch size's minutes go: building the engines, then warming up (capture, compile, tuning) each
    marks = [m for _, m in res["timeline_s"]]
    assert marks.index("batch 2: ar, dspark, ready built") < marks.index(
        "batch 2: ready warmed up (graphs captured, layers compiled, kernels tuned)") < marks.index(
        next(m for m in marks if m.startswith("batch 2: decode tok/s")))
    for run in b["runs"]:
        n = run["batch"] * b["waves"]
        for k in ("ar", "dspark", "ready"):
            assert run[k]["prompts"] == n and run[k]["new_tokens"] == 8 * n and run[k]["tokens_per_s"] > 0
        assert run["ar"]["tau"] == 1.0 and run["same_rounds"] and run["dspark"]["tau"] == run["ready"]["tau"] > 1
        assert run["ready"]["breakdown"]["draft_us"] > 0 and "reader_share" in run and run["ready_over_dspark"] > 0
    assert main(["--target", "tiny", "target.device=cpu", "--batch", "0,2"]) == 2
    assert "--batch" in capsys.readouterr().err


def test_batched_benchmark_one_engine_at_a_time_holds_one_and_runs_the_same_rounds(capsys, monkeypatch):
    """`--one-at-a-time` (caches too big to hold three): each method's engine is built, timed and dropped
    before the next is built, and the drafters still run identical rounds."""
    import weakref

    import benchmarks.engine as bench_engine

    alive, most = [], [0]

    class Counted(bench_engine.Engine):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            alive.append(weakref.ref(self))
            most[0] = max(most[0], sum(r() is not None for r in alive))

    monkeypatch.setattr(bench_engine, "Engine", Counted)
    args = ["--target", "tiny", "target.device=cpu", "--prompt-len", "6", "--new-tokens", "8", "drafter.proposals=3",
            "--accept-dist", "0:1,3:1", "--drafter", "dspark,ready", "--batch", "2", "--batch-only",
            "--repeats", "1", "--json"]
    assert main(args + ["--one-at-a-time"]) == 0
    out = json.loads(capsys.readouterr().out)
    one = out["batched"]
    assert [m for _, m in out["timeline_s"] if "built and warmed up" in m] == [
        f"batch 2: {k} built and warmed up (graphs captured, layers compiled, kernels tuned)" for k in ("ar", "dspark", "ready")]
    assert one["one_at_a_time"] and most[0] == 1
    most[0] = 0
    assert main(args) == 0
    held = json.loads(capsys.readouterr().out)["batched"]
    assert most[0] == 3  # AR, DSpark and ReaDy held together, interleaved
    a, b = one["runs"][0], held["runs"][0]
    assert a["same_rounds"] and a["dspark"]["tau"] == a["ready"]["tau"] == b["dspark"]["tau"]
    assert a["ready"]["breakdown"]["draft_us"] > 0 and a["ready_over_dspark"] > 0


def test_batched_benchmark_samples_at_a_temperature(capsys):
    """`eval.temperature=1`: AR, DSpark and ReaDy sample through the batched engine (real acceptance rule)."""
    code = main(["--target", "tiny", "target.device=cpu", "--prompt-len", "6", "--new-tokens", "8", "drafter.proposals=3",
                 "--drafter", "dspark,ready", "--batch", "2", "--batch-only", "--repeats", "1", "eval.temperature=1",
                 "--json"])
    assert code == 0
    b = json.loads(capsys.readouterr().out)["batched"]
    assert b["temperature"] == 1.0 and b["accept_dist"] is None
    run = b["runs"][0]
    for k in ("ar", "dspark", "ready"):
        assert run[k]["prompts"] == 4 and run[k]["new_tokens"] == 32 and run[k]["tokens_per_s"] > 0
    assert main(["--target", "tiny", "target.device=cpu", "--batch", "2", "eval.temperature=-1"]) == 2
    assert capsys.readouterr().err == ("error: command line: bad value at key 'eval.temperature': -1.0; expected a "
                                       "number >= 0 (0 = greedy)\n")


def test_drafters_alternate_abba_so_each_runs_first_in_half_the_pairs():
    assert abba(6) == [(0, 1), (1, 0), (1, 0), (0, 1), (0, 1), (1, 0)]
    assert sum(o == (0, 1) for o in abba(8)) == 4


def test_paired_ratio_sees_an_order_effect_and_its_interval_covers_the_truth():
    orders = abba(8)
    den = [1.0] * 8
    # the true ratio is 1.02; whoever runs second is 1 % slower: a fixed order would read 1.01 or 1.03
    num = [1.02 * (1.0 if o == (0, 1) else 1.01) for o in orders]
    r = paired_ratio(num, [d * (1.01 if o == (0, 1) else 1.0) for d, o in zip(den, orders)], orders)
    assert r["lo"] <= 1.02 <= r["hi"] and abs(r["ratio"] - 1.02) < 1e-9
    assert r["order_effect_pct"] == pytest.approx(100 * (1 / 1.01 ** 2 - 1))


def test_paired_difference_is_the_mean_difference_with_a_t_interval():
    d = paired_difference([10.0, 12.0, 11.0, 13.0], [9.0, 10.0, 10.0, 11.0])  # differences 1, 2, 1, 2
    assert d["mean"] == 1.5 and d["pairs"] == 4
    assert d["hi"] - 1.5 == pytest.approx(1.5 - d["lo"], abs=0.11) and d["lo"] > 0.5 and d["hi"] < 2.5


def test_consistency_fails_a_ratio_the_breakdown_contradicts():
    orders = abba(10)
    noise = [1 + 0.001 * ((i * 7) % 5 - 2) for i in range(10)]
    tps = paired_ratio([1.04 * n for n in noise], [1.0] * 10, orders)  # "ReaDy 4 % faster"
    rounds = paired_ratio([0.966 * n for n in noise], [1.0] * 10, orders)  # ... while its rounds are 3.4 % slower
    c = consistency(tps, rounds)
    assert not c["consistent"] and c["lo_pct"] > 0
    assert consistency(tps, paired_ratio([1.0401 * n for n in noise], [1.0] * 10, orders))["consistent"]
    # a difference inside the tolerance passes even when the pairs are precise enough to see it
    exact_a, exact_b = (paired_ratio([x] * 10, [1.0] * 10, orders) for x in (1.04, 1.039))  # no noise at all
    assert consistency(exact_a, exact_b, tolerance_pct=0.25)["consistent"]
    assert not consistency(exact_a, exact_b, tolerance_pct=0.05)["consistent"]


def test_several_prompt_lengths_in_one_process_each_with_its_kv_bound(capsys):
    code = main(["--target", "tiny", "target.device=cpu", "--prompt-len", "8,24", "--new-tokens", "6", "drafter.proposals=3",
                 "--accept-dist", "0:1,3:1", "--repeats", "1", "--verify-iters", "1", "--verify-tokens", "",
                 "--bandwidth", "1e11", "--json"])
    assert code == 0
    res = json.loads(capsys.readouterr().out)
    assert res["prompt_lens"] == [8, 24] and [r["prompt_len"] for r in res["by_prompt_len"]] == [8, 24]
    short, long = (r["bound"] for r in res["by_prompt_len"])
    assert short["streamed_bytes"] == long["streamed_bytes"]
    # the K/V read grows with the context: 2 x full-attention layers x kv heads x head_dim x (P + new/2) x 4 bytes
    assert long["kv_bytes"] - short["kv_bytes"] == 16 * (short["kv_bytes"] // (8 + 3))
    assert long["step_ms_with_kv"] > short["step_ms_with_kv"] > short["step_ms"]
    assert main(["--target", "tiny", "target.device=cpu", "--prompt-len", "8,x"]) == 2
    assert "--prompt-len '8,x': expected a number or a comma list" in capsys.readouterr().err


def test_prefill_chunk_prefills_long_prompts_in_pieces_and_is_recorded(capsys, monkeypatch):
    from ready.target.model import HybridLM

    pieces = []
    run = HybridLM._run

    def counting(self, ids, mode, *args, **kw):
        if mode == "prefill":
            pieces.append(ids.shape[1])
        return run(self, ids, mode, *args, **kw)

    monkeypatch.setattr(HybridLM, "_run", counting)
    code = main(["--target", "tiny", "target.device=cpu", "--prompt-len", "24", "--new-tokens", "6", "drafter.proposals=3",
                 "--accept-dist", "0:1,3:1", "--repeats", "1", "--verify-iters", "1", "--verify-tokens", "",
                 "--prefill-chunk", "10", "--json"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["prefill_chunk"] == 10
    assert pieces and max(pieces) <= 10 and 4 in pieces  # 24 tokens: 10 + 10 + 4
    assert main(["--target", "tiny", "target.device=cpu", "--prefill-chunk", "-8"]) == 2
    assert "--prefill-chunk -8: expected 0 (one pass) or a number of tokens >= 1" in capsys.readouterr().err


# --- the typed config is the command line: `a.b=v` overrides, parsed and checked as `sweeps.run` does them ---

def test_overrides_reach_the_real_drafters_and_the_target(capsys):
    """`drafter.*` and `reader.*` overrides size the timed drafters; `target.dtype` is the target's dtype."""
    code = main(["--target", "tiny", "--prompt-len", "6", "--new-tokens", "6", "--accept-dist", "3:1", "--repeats", "1",
                 "--verify-iters", "2", "--pairs", "2", "--drafter", "dspark,ready", "--json", "target.device=cpu",
                 "drafter.proposals=3", "drafter.context_layers=[1,62]", "reader.layers=[62]", "reader.rank=4"])
    assert code == 0
    res = json.loads(capsys.readouterr().out)
    assert res["proposals"] == 3 and res["dtype"] == "float32" and res["verify"]["tokens"][-1] == 4
    resolved = res["drafters"]["resolved"]
    assert len(resolved["ready"]["state_layers"]) == 1 and resolved["dspark"]["state_layers"] == []
    assert len(resolved["dspark"]["context_layers"]) == len(resolved["ready"]["context_layers"]) == 2


def test_the_config_s_verify_schedule_and_its_threshold_reach_the_batched_engine(capsys):
    code = main(["--target", "tiny", "--prompt-len", "6", "--new-tokens", "8", "--accept-dist", "0:1,3:1",
                 "--drafter", "dspark", "--batch", "1", "--batch-only", "--repeats", "1", "--json", "target.device=cpu",
                 "drafter.proposals=3", "drafter.confidence_head=true", "eval.verify_schedule=confidence",
                 "eval.confidence_threshold=0.25", "eval.verify_budget=2"])
    assert code == 0
    b = json.loads(capsys.readouterr().out)["batched"]
    assert b["schedules"] == {"confidence": {"confidence_threshold": 0.25, "verify_budget": 2.0}}
    assert "dspark@confidence" in b["runs"][0] and "dspark" not in b["runs"][0]


@pytest.mark.parametrize("args, message", [
    (["drafter.proposal=3"], "error: command line: bad value at key 'drafter.proposal': Key 'proposal' not in "
                             "'DrafterConfig'. Did you mean one of: 'proposals', 'rope_scaling'?"),
    (["target.compile=maybe"], "error: command line: bad value at key 'target.compile': 'maybe'; expected auto, on "
                               "or off"),
    (["eval.verify_schedule=confidence"], "error: command line: bad value at key 'eval.verify_schedule': 'confidence'; "
                                          "expected full with drafter.confidence_head false (the confidence schedule "
                                          "reads the drafter's confidence head)"),
])
def test_a_bad_override_is_one_line_naming_the_key(capsys, args, message):
    assert main(["--target", "tiny", "target.device=cpu", *args]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == message + "\n"


@pytest.mark.parametrize("flag, override", [
    (["-k", "6"], "drafter.proposals=6"), (["--proposals", "6"], "drafter.proposals=6"),
    (["--device", "cpu"], "target.device=cpu"), (["--dtype", "bfloat16"], "target.dtype=bfloat16"),
    (["--compile"], "target.compile=on"), (["--no-compile"], "target.compile=off"),
    (["--temperature", "0.7"], "eval.temperature=0.7"), (["--confidence-threshold", "0.3"], "eval.confidence_threshold=0.3"),
    (["--verify-budget", "4"], "eval.verify_budget=4"),
])
def test_a_removed_flag_names_the_override_that_replaces_it(capsys, flag, override):
    assert main(["--target", "tiny", *flag, "--json"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == (f"error: {' '.join(flag)}: this flag is gone; the config says it: {override} "
                                         "(a key=value override, as python -m sweeps.run takes them)\n")
