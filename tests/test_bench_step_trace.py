"""step_trace's arithmetic: busy time, gaps inside a replay, breaks between replays, per kernel; its command
line: the typed config's `a.b=v` overrides reach the traced target and drafter, a flag that restated a config
key names its override (checked on CPU, the trace itself needs CUDA)."""

import pytest

from benchmarks.step_trace import kernel_difference, kernel_events, kernel_part, main, summarize


def test_kernel_events_keeps_device_kernels_in_start_order():
    trace = {"traceEvents": [
        {"cat": "kernel", "ph": "X", "ts": 20, "dur": 5, "name": "b"},
        {"cat": "cuda_runtime", "ph": "X", "ts": 1, "dur": 1, "name": "cudaGraphLaunch"},
        {"cat": "kernel", "ph": "X", "ts": 10, "dur": 4, "name": "a"},
    ]}
    assert kernel_events(trace) == [(10.0, 4.0, "a"), (20.0, 5.0, "b")]


def test_by_grid_tells_one_kernels_launch_shapes_apart():
    trace = {"traceEvents": [
        {"cat": "kernel", "ph": "X", "ts": 0, "dur": 5, "name": "gemv", "args": {"grid": [4120, 1, 1]}},
        {"cat": "kernel", "ph": "X", "ts": 9, "dur": 2, "name": "gemv", "args": {"grid": [1280, 1, 1]}},
    ]}
    assert [n for _, _, n in kernel_events(trace)] == ["gemv", "gemv"]
    assert [n for _, _, n in kernel_events(trace, by_grid=True)] == ["gemv grid=[4120, 1, 1]", "gemv grid=[1280, 1, 1]"]


def test_summary_splits_busy_time_gaps_and_breaks_between_replays():
    # two replays of [a 10 µs, gap 2, b 6 µs]; 500 µs of host time between them
    one = [(0.0, 10.0, "a"), (12.0, 6.0, "b")]
    events = one + [(t + 518.0, d, n) for t, d, n in one]
    s = summarize(events, replays=2)
    assert s["busy_ms"] == pytest.approx(16e-3)
    assert s["gap_ms"] == pytest.approx(2e-3)
    assert s["span_ms"] == pytest.approx(18e-3)  # the 500 µs break is not part of a replay
    assert s["kernels"] == 2
    rows = {r["kernel"]: r for r in s["by_kernel"]}
    assert rows["b"]["gap_before_us"] == pytest.approx(2.0) and rows["a"]["gap_before_us"] == 0.0
    assert rows["a"]["us"] == pytest.approx(10.0) and rows["a"]["calls"] == 1


def test_overlapping_kernels_are_charged_only_what_they_add_to_the_timeline():
    # a PDL launch: b starts 6 µs into a's 10 and ends at 14; c waits 1 µs idle, then runs 3
    events = [(0.0, 10.0, "a"), (6.0, 8.0, "b"), (15.0, 3.0, "c")]
    s = summarize(events, replays=1)
    rows = {r["kernel"]: r for r in s["by_kernel"]}
    assert (rows["a"]["advance_us"], rows["b"]["advance_us"], rows["c"]["advance_us"]) == (10.0, 4.0, 3.0)
    assert rows["b"]["us"] == 8.0 and rows["c"]["gap_before_us"] == 1.0
    assert sum(r["advance_us"] for r in s["by_kernel"]) + s["gap_ms"] * 1e3 == pytest.approx(s["span_ms"] * 1e3)
    assert [r["kernel"] for r in s["by_kernel"]] == ["a", "b", "c"]  # by advance + gap
    inside = summarize([(0.0, 10.0, "a"), (2.0, 3.0, "b")], replays=1)  # b ends before a: adds nothing
    assert {r["kernel"]: r["advance_us"] for r in inside["by_kernel"]} == {"a": 10.0, "b": 0.0}


def test_kernels_are_summed_per_part_of_the_step():
    names = {  # names as the H100 trace of the draft step recorded them (docs/data/draft_trace_h100_2026-12-06_*),
        # and the Triton names of kernels built since (rope, add_argmax)
        "_small_m_kernel": "projections", "nvjet_sm90_tst_512x8_64x3_2x1_v_bz_TNT": "projections",
        "_rope_kernel": "norms and rotary", "_add_argmax_partial": "argmax", "_attend_kernel": "attention",
        "_gdn_fused_kernel": "GDN",
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>, uns": "argmax",
        "void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)::Opaqu":
            "copies and indexing",
        "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::neg_kerne":
            "elementwise",
    }
    assert {n: kernel_part(n) for n in names} == names
    events = [(0.0, 10.0, "_small_m_kernel"), (10.0, 2.0, "_rope_kernel"), (13.0, 4.0, "nvjet_x"),
              (18.0, 1.0, "_rms_norm_kernel")]
    parts = {r["part"]: r for r in summarize(events, replays=1)["by_part"]}
    assert parts["projections"]["advance_us"] == 14.0 and parts["projections"]["calls"] == 2
    assert parts["norms and rotary"]["us"] == 3.0 and parts["norms and rotary"]["gap_before_us"] == 1.0
    assert list(parts) == ["projections", "norms and rotary"]


def test_no_kernels_is_a_clear_error():
    with pytest.raises(SystemExit, match="no kernels"):
        summarize([], replays=1)


def test_the_replayer_repeats_one_verify_on_the_same_context():
    import torch

    from benchmarks.step_trace import step_replayer
    from ready.target import load_target

    torch.manual_seed(0)
    target = load_target("tiny", device="cpu", dtype="float32")
    replay = step_replayer(target, tokens=1, prompt_len=8)
    for _ in range(3):  # would refuse the second call if a verify were left uncommitted
        replay()


def test_the_batched_replayer_verifies_every_row_of_one_ragged_cache_on_the_same_context():
    import torch

    from benchmarks.step_trace import step_replayer
    from ready.target import load_target

    torch.manual_seed(0)
    target = load_target("tiny", device="cpu", dtype="float32")
    replay = step_replayer(target, tokens=3, prompt_len=8, batch=4)
    for _ in range(3):
        replay()


def test_the_difference_of_two_sizes_lists_the_largest_changes_first():
    one = {"by_kernel": [{"kernel": "gemv", "us": 40.0, "calls": 4}, {"kernel": "norm", "us": 3.0, "calls": 2}]}
    eight = {"by_kernel": [{"kernel": "small_m", "us": 50.0, "calls": 4}, {"kernel": "norm", "us": 3.5, "calls": 2}]}
    diff = kernel_difference(one, eight)
    assert [(r["kernel"], r["us"], r["calls"]) for r in diff] == [("small_m", 50.0, 4), ("gemv", -40.0, -4), ("norm", 0.5, 0)]
    assert kernel_difference(one, eight, top=1)[0]["us_last"] == 50.0


@pytest.mark.parametrize("tokens", ["0", "1,x", ""])
def test_bad_token_sizes_are_refused(tokens, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # reach the argument check on CPU
    assert main(["--tokens", tokens]) == 2
    assert "--tokens must be sizes >= 1" in capsys.readouterr().err


def test_two_sizes_are_traced_on_one_target_with_their_difference(monkeypatch):
    from benchmarks import step_trace

    from ready.target import load_target

    tiny = load_target("tiny", device="cpu", dtype="float32")
    loads = []
    monkeypatch.setattr(step_trace, "load_target", lambda *a, **k: loads.append(a) or tiny)
    monkeypatch.setattr(step_trace, "step_replayer", lambda target, tokens, prompt_len, batch: tokens)
    rows = lambda n: [{"kernel": f"k{i}", "us": float(n * i), "calls": 1.0} for i in range(30)]  # noqa: E731
    monkeypatch.setattr(step_trace, "trace_replay", lambda replay, replays, by_grid: {"replay_ms": replay, "by_kernel": rows(replay)})
    out = step_trace.trace_step("x", "bfloat16", [1, 8], 16, 2, 0)
    assert len(loads) == 1 and [s["tokens"] for s in out["steps"]] == [1, 8]
    assert all(len(s["by_kernel"]) == 25 for s in out["steps"])  # rows cut for the report, not for the difference
    assert out["difference"][0] == {"kernel": "k29", "us": 7 * 29.0, "advance_us": 7 * 29.0, "calls": 0.0,
                                 "us_first": 29.0, "us_last": 8 * 29.0}
    single = step_trace.trace_step("x", "bfloat16", [8], 16, 2, 0)
    assert single["tokens"] == 8 and "difference" not in single and len(single["by_kernel"]) == 25
    assert "over_bound" not in single  # no copy rate, no FLOP rate: no bound


def test_the_prefill_replayer_prefills_the_same_prompt_into_a_cleared_cache_each_time():
    import torch

    from benchmarks.step_trace import prefill_replayer
    from ready.target import load_target

    torch.manual_seed(0)
    target = load_target("tiny", device="cpu", dtype="float32")
    replay = prefill_replayer(target, prompt_len=12)
    for _ in range(3):  # a cache left at 12 tokens would take the next prompt as a continuation past its room
        replay()


def test_each_prefill_length_is_traced_against_its_flop_bound(monkeypatch):
    from benchmarks import step_trace
    from ready.target import load_target

    tiny = load_target("tiny", device="cpu", dtype="float32")
    monkeypatch.setattr(step_trace, "load_target", lambda *a, **k: tiny)
    monkeypatch.setattr(step_trace, "prefill_replayer", lambda target, n: n)
    monkeypatch.setattr(step_trace, "trace_replay", lambda replay, replays, by_grid: {"replay_ms": replay / 100, "by_kernel": []})
    out = step_trace.trace_prefill("x", "float32", [100, 800], 2, 0, peak_flops=1e12)
    head = tiny.lm_head.weight.numel()  # logits of the last position only
    params = sum(p.numel() for p in tiny.parameters()) - tiny.embed_tokens.weight.numel() - head
    bound = 2.0 * (params * 800 + head) / 1e12 * 1e3
    last = out["prefill"][-1]
    assert [s["prompt_len"] for s in out["prefill"]] == [100, 800] and out["matmul_params"] == params
    assert last["bound_ms"] == round(bound, 4) and last["over_bound"] == round(8.0 / bound, 3)


def test_each_batch_and_size_is_traced_against_the_verify_bound(monkeypatch):
    from benchmarks import step_trace
    from benchmarks.engine import verify_bound
    from ready.target import load_target

    tiny = load_target("tiny", device="cpu", dtype="float32")
    monkeypatch.setattr(step_trace, "load_target", lambda *a, **k: tiny)
    monkeypatch.setattr(step_trace, "step_replayer", lambda target, tokens, prompt_len, batch: (batch, tokens))
    monkeypatch.setattr(step_trace, "trace_replay", lambda replay, replays, by_grid: {"replay_ms": 2.0, "by_kernel": []})
    out = step_trace.trace_step("x", "float32", [1, 8], 16, 2, 0, batches=[1, 4], bandwidth=1e9, peak_flops=1e12)
    assert [(s["batch"], s["tokens"]) for s in out["steps"]] == [(1, 1), (1, 8), (4, 1), (4, 8)]
    streamed = sum(p.nbytes for p in tiny.parameters()) - tiny.embed_tokens.weight.nbytes
    want = verify_bound(tiny, 4, 32, 24, streamed, 1e9, 1e12)["bound_ms"]  # 4 rows x 8 tokens after 16 + 8
    assert out["steps"][-1]["bound_ms"] == round(want, 4) and out["steps"][-1]["over_bound"] == round(2.0 / want, 3)


def test_the_draft_replayer_repeats_the_batched_draft_step_and_its_bound_counts_weights_and_lm_head():
    import torch

    from benchmarks.step_trace import draft_replayer, draft_stream_bytes
    from ready.target import load_target

    torch.manual_seed(0)
    target = load_target("tiny", device="cpu", dtype="float32")
    replay, drafter, body = draft_replayer(target, "ready", "tiny", batch=2, prompt_len=8, proposals=3, seed=0)
    for _ in range(3):  # the batched step's body (eager off CUDA) over the same rows each time
        replay()
    body()  # the body alone, as `--ops` runs it under the profiler
    tables = sum(m.weight.numel() for m in drafter.modules() if isinstance(m, torch.nn.Embedding))  # rows looked up
    params = sum(p.numel() for p in drafter.parameters())  # the shared embedding and LM head are not the drafter's
    assert tables > 0 and drafter.readers
    assert draft_stream_bytes(drafter) == 4 * (params - tables + target.lm_head.weight.numel())


def test_bad_draft_batches_are_refused(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert main(["--draft", "dspark", "--batch", "0"]) == 2
    assert "--batch must be sizes >= 1" in capsys.readouterr().err


def test_the_bounds_default_to_the_copy_rate_of_the_gpu_by_name(monkeypatch):
    import torch

    from benchmarks import COPY_BYTES_PER_S, copy_rate

    assert copy_rate("cpu") == 0.0
    for name, rate in (("NVIDIA H100 80GB HBM3", COPY_BYTES_PER_S["H100"]), ("NVIDIA H200", COPY_BYTES_PER_S["H200"]),
                       ("NVIDIA A100-SXM4-80GB", 0.0)):  # a GPU with no measured rate gets no bound
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None, name=name: name)
        assert copy_rate("cuda:0") == rate


@pytest.mark.cuda
def test_op_times_charge_each_kernel_to_the_op_and_shapes_that_launched_it():
    import torch

    from benchmarks.step_trace import op_times

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    x = torch.randn(2048, 4096, device="cuda")
    rows = op_times(lambda: (x.t().contiguous(), x * 2.0))
    by_op = {r["op"]: r for r in rows}
    assert {"aten::copy_", "aten::mul"} <= set(by_op), [r["op"] for r in rows]
    assert "[2048, 4096]" in by_op["aten::mul"]["shapes"] and by_op["aten::mul"]["calls"] == 1
    assert all(r["device_us"] > 0 for r in rows)


# --- the typed config is the command line ------------------------------------------------------------------

def _traced(monkeypatch) -> dict:
    """main's call of trace_step / trace_draft, captured instead of run (the trace needs CUDA)."""
    import torch

    from benchmarks import step_trace

    calls: dict = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(step_trace, "copy_rate", lambda device: 1e12)
    monkeypatch.setattr(step_trace, "measured_bf16_flops", lambda device: 7e14)
    monkeypatch.setattr(step_trace, "trace_step", lambda *a, **k: calls.__setitem__("step", a) or {})
    monkeypatch.setattr(step_trace, "trace_draft", lambda *a, **k: calls.__setitem__("draft", a) or {})
    monkeypatch.setattr(step_trace, "trace_prefill", lambda *a, **k: calls.__setitem__("prefill", a) or {})
    return calls


@pytest.mark.parametrize("target, dtype, proposals", [("qwen3_5_27b", "bfloat16", 6), ("tiny", "float32", 7)])
def test_the_preset_gives_the_dtype_and_k(monkeypatch, capsys, target, dtype, proposals):
    """Without overrides: the target preset's target.dtype and drafter.proposals (qwen3_5_27b: K 6, the old
    -k default was 7; its dtype bfloat16 was the old --dtype default)."""
    calls = _traced(monkeypatch)
    assert main(["--target", target, "--draft", "dspark"]) == 0
    _, dt, kind, batches, *_rest = calls["draft"]
    assert (dt, kind, batches) == (dtype, "dspark", [1]) and calls["draft"][7] == proposals
    assert calls["draft"][-1].drafter.proposals == proposals  # the config that sizes the drafter
    assert main(["--target", target, "--tokens", "1,8"]) == 0 and calls["step"][1:3] == (dtype, [1, 8])


def test_overrides_reach_the_traced_target_and_drafter(monkeypatch, capsys):
    calls = _traced(monkeypatch)
    assert main(["--draft", "ready", "drafter.proposals=7", "--batch", "1,32", "target.dtype=float16",
                 "reader.rank=64"]) == 0
    args = calls["draft"]
    assert args[0] == "qwen3_5_27b" and args[1] == "float16" and args[3] == [1, 32] and args[7] == 7
    cfg = args[-1]
    assert cfg.drafter.proposals == 7 and cfg.reader.rank == 64 and cfg.target.dtype == "float16"
    assert main(["--tokens", "1", "target.dtype=float32"]) == 0 and calls["step"][1] == "float32"
    assert calls["step"][7:] == ([1], 1e12, 7e14)  # one row; the copy rate, the measured FLOP rate
    assert main(["--tokens", "1,8", "--batch", "1,32", "--peak-flops", "5e14"]) == 0
    assert calls["step"][7:] == ([1, 32], 1e12, 5e14)  # batches, the copy rate, the FLOP rate
    assert main(["--prefill", "1024,8192", "--replays", "3"]) == 0 and calls["prefill"][2:4] == ([1024, 8192], 3)
    assert calls["prefill"][5] == 7e14  # the measured FLOP rate


def test_an_override_sizes_the_replayed_drafter():
    """The config handed to draft_replayer is the one its drafter is built from (tiny, on CPU: the batched
    step, B = 2, runs eagerly off CUDA)."""
    import torch

    from benchmarks.step_trace import draft_replayer
    from ready.config import load_config
    from ready.target import load_target

    torch.manual_seed(0)
    target = load_target("tiny", device="cpu", dtype="float32")
    cfg = load_config(preset="tiny", overrides=["drafter.proposals=2", "reader.rank=4"])
    replay, drafter, _ = draft_replayer(target, "ready", "tiny", batch=2, prompt_len=8, proposals=2, seed=0, config=cfg)
    replay()
    assert drafter.proposals == 2 and [r.rank for r in drafter.readers.values()] == [4]


def test_a_bad_override_is_one_line_naming_the_key(monkeypatch, capsys):
    _traced(monkeypatch)
    assert main(["--draft", "dspark", "drafter.proposals=0"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith("error: command line: bad value at key 'drafter.proposals': 0")
    assert out.err.count("\n") == 1


@pytest.mark.parametrize("flag, override", [
    (["-k", "7"], "drafter.proposals=7"), (["--proposals", "7"], "drafter.proposals=7"), (["-k7"], "drafter.proposals=7"),
    (["--dtype", "bfloat16"], "target.dtype=bfloat16"),
])
def test_a_removed_flag_names_the_override_that_replaces_it(capsys, flag, override):
    """Refused before anything else, on any machine (the CUDA check comes after the arguments)."""
    assert main(["--draft", "dspark", *flag]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == (f"error: {' '.join(flag)}: this flag is gone; the config says it: {override} "
                                         "(a key=value override, as python -m sweeps.run takes them)\n")


@pytest.mark.parametrize("lengths", ["0", "8,x", ""])
def test_bad_prefill_lengths_are_refused(lengths, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # reach the argument check on CPU
    assert main(["--prefill", lengths]) == 2
    assert "--prefill must be prompt lengths >= 1" in capsys.readouterr().err
