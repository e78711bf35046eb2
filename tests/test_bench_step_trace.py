"""step_trace's arithmetic: busy time, gaps inside a replay, breaks between replays, per kernel."""

import pytest

from ready.bench.step_trace import kernel_events, summarize


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


def test_no_kernels_is_a_clear_error():
    with pytest.raises(SystemExit, match="no kernels"):
        summarize([], replays=1)


def test_the_replayer_repeats_one_verify_on_the_same_context():
    import torch

    from ready.bench.step_trace import step_replayer
    from ready.target import load_target

    torch.manual_seed(0)
    target = load_target("tiny", device="cpu", dtype="float32")
    replay = step_replayer(target, tokens=1, prompt_len=8)
    for _ in range(3):  # would refuse the second call if a verify were left uncommitted
        replay()
