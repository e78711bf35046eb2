"""benchmarks.exact's command line (the measurements need CUDA; their CPU counterparts are tests/test_exact_mode.py):
the n-gram drafter's K is the typed config's `drafter.proposals` (the target's preset, then `a.b=v` overrides),
and the flag `-k` that restated it names its override."""

from __future__ import annotations

import pytest

from benchmarks import exact
from benchmarks.exact import main


@pytest.fixture
def measured(monkeypatch) -> dict:
    """main's calls of cost / flips, captured instead of run (they need CUDA and a loaded target)."""
    import torch

    calls: dict = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "no GPU (test)")
    monkeypatch.setattr(exact, "load_target", lambda spec, **kw: calls.setdefault("load", (spec, kw)) and "model")
    monkeypatch.setattr(exact, "cost", lambda model, k, *a: calls.setdefault("cost_k", k) and {})
    monkeypatch.setattr(exact, "flips", lambda model, prompts, new_tokens, k, modes: calls.setdefault("flips_k", k) and {})
    return calls


@pytest.mark.parametrize("target, k", [("qwen3_5_27b", 6), ("tiny", 7)])
def test_k_is_the_preset_s_proposals(measured, capsys, tmp_path, target, k):
    """Without an override, the preset's drafter.proposals (qwen3_5_27b: 6; the old -k default was 7)."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt_ids": [1, 2, 3]}\n')
    assert main(["--target", target, "--cost", "--flips", str(prompts)]) == 0
    assert measured["cost_k"] == measured["flips_k"] == k
    assert measured["load"] == (target, {"device": "cuda", "dtype": __import__("torch").bfloat16})


def test_an_override_is_the_k_that_runs(measured, capsys, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt_ids": [1, 2, 3]}\n')
    assert main(["--target", "qwen3_5_27b", "drafter.proposals=7", "--cost", "--flips", str(prompts), "--json"]) == 0
    assert measured["cost_k"] == measured["flips_k"] == 7


def test_a_bad_override_is_one_line_naming_the_key(measured, capsys):
    assert main(["--target", "tiny", "--cost", "drafter.proposals=0"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith("error: command line: bad value at key 'drafter.proposals': 0")
    assert out.err.count("\n") == 1 and "cost_k" not in measured


@pytest.mark.parametrize("flag, override", [(["-k", "7"], "drafter.proposals=7"), (["-k7"], "drafter.proposals=7")])
def test_a_removed_flag_names_the_override_that_replaces_it(capsys, flag, override):
    """Refused on any machine (the CUDA check comes after the arguments)."""
    assert main(["--target", "qwen3_5_27b", "--cost", *flag]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == (f"error: {' '.join(flag)}: this flag is gone; the config says it: {override} "
                                         "(a key=value override, as python -m sweeps.run takes them)\n")
