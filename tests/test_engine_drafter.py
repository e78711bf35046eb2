"""The team's DSpark / ReaDy drafters run through the engine over the Drafter protocol: output
stays lossless, and `python -m sweeps.commands.generate --method dspark|ready --drafter DIR` loads them."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from ready import fastops
from ready.config import DrafterConfig, ReaderConfig
from ready.decode import Engine, evaluate
from ready.drafter import save_drafter
from ready.target import HybridLM, save_target
from sweeps.commands.generate import main

from tiny_models import VOCAB, small_target

torch.set_num_threads(1)  # tiny models: one thread beats two on a shared machine
drafter_mod = pytest.importorskip("ready.drafter")


@pytest.fixture(scope="module")
def target() -> HybridLM:
    return small_target()


def make_drafter(target: HybridLM, reader: bool, k: int = 3):
    torch.manual_seed(6)
    d = DrafterConfig(proposals=k, num_layers=1, head_rank=8)
    r = ReaderConfig(enabled=reader, rank=4, mlp_hidden=16)
    return drafter_mod.DSparkDrafter(d, r, target).eval()


@pytest.mark.parametrize("reader", [False, True], ids=["dspark", "ready"])
def test_block_drafters_are_lossless_through_the_engine(target, reader):
    drafter = make_drafter(target, reader)
    assert drafter.capture_layers and bool(drafter.state_layers) == reader
    prompts = [torch.randint(0, VOCAB, (n,)).tolist() for n in (1, 6, 15)]
    res = evaluate(target, drafter, prompts, 20, benchmark="toy", method="ready" if reader else "dspark",
                   warmup=0, progress=False)
    assert res.lossless == 1
    assert res.metrics.rounds >= 1 and len(res.metrics.survival) == 3


def test_generate_cli_loads_a_saved_drafter(target, tmp_path, capsys):
    tpath = save_target(target, tmp_path / "target")
    save_drafter(make_drafter(target, reader=True), tmp_path / "ready")
    save_drafter(make_drafter(target, reader=False), tmp_path / "dspark")
    code = main(["--target", str(tpath), "--drafter", str(tmp_path / "ready"), "--method", "ready", "--prompt-ids",
                 "1,2,3,4", "--max-new-tokens", "12", "target.device=cpu", "--json", "--check-lossless"])
    out = capsys.readouterr()
    assert code == 0, out.err
    report = json.loads(out.out)
    assert report["lossless"] == 1 and report["proposals"] == 3
    assert report["results"][0]["token_ids"] == Engine(target).generate([1, 2, 3, 4], 12).tokens
    # a DSpark checkpoint under --method ready is refused with one line
    code = main(["--target", str(tpath), "--drafter", str(tmp_path / "dspark"), "--method", "ready", "--prompt-ids",
                 "1,2", "--max-new-tokens", "4", "target.device=cpu"])
    err = capsys.readouterr().err
    assert code == 2 and "has no state reader" in err and err.count("\n") == 1


@pytest.mark.cuda
def test_fused_kernels_leave_the_greedy_tokens_unchanged_on_cuda(target, monkeypatch):
    """ReaDy on CUDA through the Triton kernels (verify, commit, state reader, drafting ops) gives exactly
    the tokens of the same engine with the library's kernel choice switched to torch (`fastops.fused_on`
    says no), and of plain autoregressive decoding."""
    tgt = copy.deepcopy(target).cuda()
    drafter = make_drafter(tgt, reader=True).cuda()
    assert fastops.fused(tgt.lm_head.weight)  # the Triton kernels run here ...
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (1, 6, 15, 40)]
    fused = [Engine(tgt, drafter).generate(p, 40).tokens for p in prompts]
    autoregressive = [Engine(tgt).generate(p, 40).tokens for p in prompts]

    monkeypatch.setattr(fastops, "fused_on", lambda device: False)  # ... and here the torch paths everywhere
    references = [Engine(tgt, drafter).generate(p, 40).tokens for p in prompts]
    assert fused == references == autoregressive
