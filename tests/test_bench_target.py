"""benchmarks.target's command line on CPU (its figures are CUDA's: docs/figures.md): the target's device and dtype
are the typed config's `target.device` / `target.dtype` (the preset's, then `a.b=v` overrides), and the flags
`--device` / `--dtype` that restated them name their overrides. No timing is asserted."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.target import main

SMALL = ["--prompt-len", "8", "--decode-steps", "2", "--json"]


@pytest.fixture(autouse=True)
def _grad_mode():
    """main switches autograd off for the process (a command's whole run); the tests after these keep theirs."""
    was = torch.is_grad_enabled()
    yield
    torch.set_grad_enabled(was)


def _run(capsys, *args: str) -> dict:
    main([*args, *SMALL])
    return json.loads(capsys.readouterr().out)


def test_the_preset_gives_the_dtype_and_device_auto(capsys):
    res = _run(capsys, "--preset", "tiny")
    assert res["preset"] == "tiny" and res["dtype"] == "float32"  # the tiny preset's target.dtype
    assert res["device"] == ("cuda" if torch.cuda.is_available() else "cpu")  # target.device auto
    assert res["decode_step_ms"] > 0 and res["params"] > 0


def test_overrides_are_the_device_and_dtype_it_runs_in(capsys):
    res = _run(capsys, "--preset", "tiny", "target.device=cpu", "target.dtype=bfloat16")
    assert res["device"] == "cpu" and res["dtype"] == "bfloat16"
    assert res["weight_bytes"] == 2 * res["params"]  # built in bf16


def test_a_checkpoint_directory_takes_the_default_config(capsys, tmp_path):
    from ready.target import load_target, save_target

    path = save_target(load_target("tiny", device="cpu", dtype="float32"), tmp_path / "t")
    res = _run(capsys, "--preset", str(path), "target.device=cpu")
    assert res["preset"] == str(path) and res["device"] == "cpu" and res["dtype"] == "float32"


@pytest.mark.parametrize("override, message", [
    ("target.dtype=float64", "error: command line: bad value at key 'target.dtype': 'float64'"),
    ("target.devise=cpu", "error: command line: bad value at key 'target.devise': Key 'devise' not in 'TargetConfig'"),
])
def test_a_bad_override_is_one_line_naming_the_key(capsys, override, message):
    with pytest.raises(SystemExit) as e:
        main(["--preset", "tiny", override, *SMALL])
    assert e.value.code == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith(message) and out.err.count("\n") == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a CUDA device where none is")
def test_the_27b_preset_on_a_machine_without_cuda_is_one_line(capsys):
    """qwen3_5_27b says target.device=cuda; before, --device defaulted to cpu here and built 27 B parameters."""
    with pytest.raises(SystemExit) as e:
        main(["--preset", "qwen3_5_27b", *SMALL])
    assert e.value.code == 2
    assert capsys.readouterr().err == ("error: bad value at key 'target.device': 'cuda' but no CUDA device is visible; "
                                       "expected 'cpu' or 'auto' on this machine\n")


@pytest.mark.parametrize("flag, override", [
    (["--device", "cpu"], "target.device=cpu"), (["--dtype", "bfloat16"], "target.dtype=bfloat16"),
    (["--dtype=float32"], "target.dtype=float32"),
])
def test_a_removed_flag_names_the_override_that_replaces_it(capsys, flag, override):
    with pytest.raises(SystemExit) as e:
        main(["--preset", "tiny", *flag, *SMALL])
    assert e.value.code == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == (f"error: {' '.join(flag)}: this flag is gone; the config says it: {override} "
                                         "(a key=value override, as python -m sweeps.run takes them)\n")
