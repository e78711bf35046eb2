"""The paper-scale training benchmark runs end to end on the tiny preset on CPU and prints one
consistent JSON object (keys, finite positive rates, the recipe arithmetic); bad flags end in one message.
The typed config is its command line: `a.b=v` overrides reach what it runs (device, dtype, regeneration batch,
micro-batches), and a flag that restated a config key names its override.
No timing is asserted (docs/design.md: speed is measured by benchmark scripts, not by tests)."""

from __future__ import annotations

import contextlib
import io
import json
import math

import pytest

from benchmarks.train_scale import TRAIN_STAGES, main

ARGS = ["--target", "tiny", "target.device=cpu", "--quick", "--threads", "1", "--no-progress", "--json", "--gpus", "1,4"]


@pytest.fixture(scope="module")
def run() -> tuple[dict, str]:
    """One benchmark run for every test of this module (a few seconds): (returned dict, printed text)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        res = main(ARGS)
    return res, out.getvalue()


def _numbers(obj, path=""):
    """(path, value) of every number in a JSON tree."""
    if isinstance(obj, bool):
        return []
    if isinstance(obj, (int, float)):
        return [(path, obj)]
    if isinstance(obj, dict):
        return [x for k, v in obj.items() for x in _numbers(v, f"{path}.{k}")]
    if isinstance(obj, list):
        return [x for i, v in enumerate(obj) for x in _numbers(v, f"{path}[{i}]")]
    return []


def test_prints_one_json_object_with_every_section(run):
    res, text = run
    assert json.loads(text) == json.loads(json.dumps(res))  # one object, the one main returns
    assert res["errors"] == []
    assert {"regen", "prefill", "train", "recipe", "target_params", "target_weight_bytes"} <= set(res)
    regen = res["regen"]
    assert regen["new_tokens"] == regen["batch"] * regen["response_len"]  # no row stops early
    assert regen["rows_full_budget"] == regen["batch"] == 2  # --quick's regen.batch_size
    assert res["device"] == "cpu" and res["dtype"] == "float32"  # the tiny preset's target.dtype
    assert set(res["prefill"]["lengths"]) == {"32", "64"}
    for stage in TRAIN_STAGES:
        st = res["train"][stage]
        assert {"samples_per_s", "tokens_per_s", "s_per_step", "trainable_params", "precision"} <= set(st)
        assert len(st["losses"]) == st["warmup_steps"] + st["steps"]
        assert st["checkpoint_writes_skipped"] is True
        assert st["micro_batch_size"] == 4  # experiments/profiles/paper_recipe.yaml
    assert res["train"]["precision"]["drafter_parameters"] == "float32"
    assert set(res["recipe"]["gpus"]) == {"1", "4"} and res["recipe"]["assumptions"]


def test_numbers_are_finite_and_rates_positive(run):
    res, _ = run
    for path, value in _numbers(res):
        assert math.isfinite(value), path
        assert value >= 0, path
    rates = [res["regen"]["tokens_per_s"], res["regen"]["wall_s"]]
    rates += [r["tokens_per_s"] for r in res["prefill"]["lengths"].values()]
    rates += [res["train"][s][k] for s in TRAIN_STAGES for k in ("samples_per_s", "tokens_per_s", "s_per_step",
                                                                  "trainable_params")]
    assert all(r > 0 for r in rates)


def test_stages_train_what_they_should(run):
    res, _ = run
    base, s1, s2 = (res["train"][s] for s in TRAIN_STAGES)
    assert base["reader_params"] == 0 and base["trainable_params"] == base["drafter_params"]  # all of it
    assert s1["trainable_params"] == s1["reader_params"] > 0  # the reader only
    assert s2["trainable_params"] > s2["reader_params"]  # reader + LoRA adapters


def test_recipe_is_the_measured_rates_extrapolated(run):
    res, _ = run
    rec, train = res["recipe"], res["train"]
    one, four = rec["gpus"]["1"], rec["gpus"]["4"]
    assert one["stage1_s"] == pytest.approx(rec["inputs"]["stage1_samples"] / train["stage1"]["samples_per_s"])
    assert one["stage2_s"] == pytest.approx(rec["inputs"]["stage2_samples"] / train["stage2"]["samples_per_s"])
    # each conversation: its prompt at the regeneration's prompt rate, its new tokens at the decode rate
    convs, regen = rec["inputs"]["conversations"], res["regen"]
    prompts_s = convs * rec["inputs"]["regen_prompt_tokens_per_conversation"] / regen["prompt_tokens_per_s"]
    decode_s = convs * rec["inputs"]["regen_tokens_per_conversation"] / regen["decode_tokens_per_s"]
    assert regen["prompt_tokens_per_s"] == pytest.approx(regen["batch"] * regen["prompt_len"] / regen["prefill_s"])
    assert one["regen_s"] == pytest.approx(prompts_s + decode_s)
    assert rec["regen_parts_on_1_gpu"] == pytest.approx({"prompts_s": prompts_s, "decode_s": decode_s})
    assert one["total_s"] == pytest.approx(one["regen_s"] + one["stage1_s"] + one["stage2_s"])
    assert four["total_s"] == pytest.approx(one["total_s"] / 4)
    assert rec["inputs"]["conversations"] == 70000  # experiments/profiles/paper_recipe.yaml
    assert rec["base_from_scratch_s_per_10k_samples"]["1"] == pytest.approx(1e4 / train["base"]["samples_per_s"])


def test_micro_batch_override_runs_the_step_in_micro_batches_and_is_recorded(monkeypatch):
    from ready.train import stages

    passes = []
    real = stages.teacher_pass
    monkeypatch.setattr(stages, "teacher_pass", lambda *a, **kw: passes.append(a[2].shape[0]) or real(*a, **kw))
    with contextlib.redirect_stdout(io.StringIO()):
        res = main([*ARGS, "--sections", "train", "--stages", "stage1", "train.micro_batch_size=1"])
    st = res["train"]["stage1"]
    assert res["errors"] == [] and st["micro_batch_size"] == res["train"]["micro_batch_size"] == 1
    assert passes == [1] * (st["batch"] * (st["warmup_steps"] + st["steps"]))  # one teacher pass per row


@pytest.mark.parametrize("flags, message", [
    (["--target", "nope"], "--target 'nope'"),
    (["--sections", "regen,nope"], "--sections"),
    (["--warmup-steps", "0"], "--warmup-steps 0"),
    (["--prefill-lengths", "1024,x"], "--prefill-lengths"),
    (["--train-seq-len", "4096"], "exceed the tiny target's context"),
    (["--regen-admit-tokens", "0,-1"], "--regen-admit-tokens '0,-1': expected a comma list of integers >= 0"),
])
def test_bad_input_ends_in_one_message(flags, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--target", "tiny", "target.device=cpu", "--quick", *flags])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


# --- the typed config is the command line -------------------------------------------------------------------

@pytest.mark.parametrize("override, message", [
    ("reader.rank=0", "bad value at key 'reader.rank': 0"),
    ("train.micro_batch_size=-1", "bad value at key 'train.micro_batch_size': -1"),
    ("regen.batch_size=0", "bad value at key 'regen.batch_size': 0"),
    ("target.dtype=float64", "bad value at key 'target.dtype': 'float64'"),
    ("regen.batch_sise=8", "bad value at key 'regen.batch_sise': Key 'batch_sise' not in 'RegenConfig'"),
])
def test_a_bad_override_is_one_line_naming_the_key(override, message, capsys):
    """Parsed and checked by ready.config.load_config, as `ready sweep` does: one `error:` line, status 2."""
    with pytest.raises(SystemExit) as e:
        main(["--target", "tiny", "target.device=cpu", "--quick", override])
    assert e.value.code == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith(f"error: command line: {message}") and out.err.count("\n") == 1


def test_overrides_reach_the_regeneration_batch_and_the_target_dtype():
    """`regen.batch_size` wins over `--quick`'s 2 (an override is the last layer); `target.dtype` is the dtype
    the random target is built in."""
    with contextlib.redirect_stdout(io.StringIO()):
        res = main([*ARGS, "--sections", "regen,prefill", "regen.batch_size=3", "target.dtype=bfloat16"])
    assert res["errors"] == [] and res["dtype"] == "bfloat16"
    assert res["regen"]["batch"] == res["regen"]["rows_full_budget"] == 3
    assert res["regen"]["new_tokens"] == 3 * res["regen"]["response_len"]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the refusal of a CUDA device where none is")
def test_admission_budgets_run_paired_abba_in_one_process():
    """`--regen-admit-tokens 0,64`: one prefill per row against 64-token padded passes, each run twice in
    ABBA order on the same target and prompts; the section's figures are the last budget's."""
    with contextlib.redirect_stdout(io.StringIO()):
        res = main([*ARGS, "--sections", "regen", "--regen-admit-tokens", "0,64", "regen.batch_size=3"])
    regen = res["regen"]
    assert regen["order"] == [0, 64, 64, 0]
    assert set(regen["by_admit_tokens"]) == {"0", "64"}
    assert regen["admit_tokens"] == 64
    assert regen["tokens_per_s"] == regen["by_admit_tokens"]["64"]["tokens_per_s"]
    assert all(v["prompt_tokens_per_s"] > 0 for v in regen["by_admit_tokens"].values())


def test_a_cuda_device_without_one_is_one_line(capsys):
    """The 27B preset says target.device=cuda: on a machine without CUDA that is one line (before, --device's
    default was cpu here, and the run built a 27B target on the CPU)."""
    with pytest.raises(SystemExit) as e:
        main(["--target", "qwen3_5_27b", "--quick"])
    assert e.value.code == 2
    assert capsys.readouterr().err == ("error: bad value at key 'target.device': 'cuda' but no CUDA device is visible; "
                                       "expected 'cpu' or 'auto' on this machine\n")


@pytest.mark.parametrize("flag, override", [
    (["--device", "cpu"], "target.device=cpu"), (["--dtype", "bfloat16"], "target.dtype=bfloat16"),
    (["--regen-batch", "8"], "regen.batch_size=8"), (["--micro-batch=4"], "train.micro_batch_size=4"),
])
def test_a_removed_flag_names_the_override_that_replaces_it(capsys, flag, override):
    with pytest.raises(SystemExit) as e:
        main(["--target", "tiny", "--quick", *flag, "--json"])
    assert e.value.code == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == (f"error: {' '.join(flag)}: this flag is gone; the config says it: {override} "
                                         "(a key=value override, as python -m sweeps.run takes them)\n")
