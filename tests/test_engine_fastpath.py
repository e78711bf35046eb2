"""The fast paths (fused projections, the small-M Triton linear, torch.compile'd layers inside the
CUDA graphs, the drafter's captured draft step) leave decoding lossless and give the greedy tokens
of the plain eager path.

CUDA only. In fp32 the Triton linear multiplies in IEEE fp32, so fast and plain paths compute the
same function up to fp32 rounding and must give identical greedy tokens; in bf16 (different GEMM
kernels round differently) the logits are compared instead.
"""

from __future__ import annotations

import pytest
import torch

import ready.fastops  # noqa: F401
from ready.config import DrafterConfig, ReaderConfig
from ready.decode import Engine
from ready.decode.graphs import GraphRunner
from ready.drafter import DSparkDrafter
from ready.target import HybridLM
from ready_kernels import small_m_gemm as sm
from tiny_models import VOCAB, small_target

pytestmark = pytest.mark.cuda


def _target(dtype: torch.dtype) -> HybridLM:
    return small_target().to("cuda", dtype).requires_grad_(False)


def _drafter(target: HybridLM, k: int = 3) -> DSparkDrafter:
    torch.manual_seed(6)
    d = DSparkDrafter(DrafterConfig(proposals=k, num_layers=1, head_rank=8), ReaderConfig(rank=4, mlp_hidden=16), target)
    with torch.no_grad():
        for r in d.readers.values():
            r.fuse_out.weight.normal_(std=0.3)
    return d.to("cuda", target.dtype).eval()


@pytest.fixture
def mode():
    prev = sm.get_mode()
    yield sm.set_mode
    sm.set_mode(prev)


def test_fp32_fast_paths_give_the_plain_greedy_tokens(mode):
    target = _target(torch.float32)
    drafter = _drafter(target)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (1, 6, 15, 40)]

    mode("torch")  # plain: F.linear, eager layers, no graphs anywhere
    target.compile_layers(False)
    drafter.cuda_graphs = False
    plain_ar = [Engine(target, cuda_graphs=False).generate(p, 40).tokens for p in prompts]
    plain_spec = [Engine(target, drafter, cuda_graphs=False).generate(p, 40).tokens for p in prompts]

    mode("triton")  # fast: the Triton small-M linear (IEEE fp32), compiled layers in graphs, graphed drafts
    target.compile_layers(True)
    drafter.cuda_graphs = None
    ar, spec = Engine(target), Engine(target, drafter)
    fast_ar = [ar.generate(p, 40).tokens for p in prompts]
    fast_spec = [spec.generate(p, 40).tokens for p in prompts]
    assert fast_ar == plain_ar == plain_spec == fast_spec
    assert drafter._graphs and all(g.graph is not None for g in drafter._graphs)
    assert target._compiled_fn is not None and set(spec.slots.graphs.graphs) == {4}


def test_bf16_fast_verify_logits_match_the_plain_ones(mode):
    target = _target(torch.bfloat16)
    ids = torch.randint(0, VOCAB, (1, 20), device="cuda")
    block = torch.randint(0, VOCAB, (1, 8), device="cuda")

    def verify_logits(fast: bool) -> torch.Tensor:
        mode("auto" if fast else "torch")
        target.compile_layers(fast)
        cache = target.new_cache(1, 40, max_verify=8)
        runner = GraphRunner(target, []) if fast else None
        if runner is not None:
            runner.prepare(cache)
        target.prefill(ids, cache)
        out = runner.verify(block, cache) if fast else target.verify(block, cache)
        return out.logits.float().clone()

    plain, fast = verify_logits(False), verify_logits(True)
    rel = ((fast - plain).norm() / plain.norm()).item()
    assert rel < 2e-2, rel
    assert sm.TUNER.choice  # the tuner met the verify shapes


def test_a_donor_cache_never_replays_the_graph_of_the_own_cache():
    """The state placebo hands the drafter another cache: the captured step of the own cache is not
    replayed for it (each cache gets its own), so the reader reads the donor's states."""
    target = _target(torch.float32)
    drafter = _drafter(target)
    eager = _drafter(target)
    eager.cuda_graphs = False
    from ready.decode.protocol import DraftStep

    ids = torch.randint(0, VOCAB, (1, 30), device="cuda")
    caches = []
    for seq in (ids, torch.randint(0, VOCAB, (1, 30), device="cuda")):
        c = target.new_cache(1, 64)
        target.prefill(seq[:, :-1], c)
        caches.append(c)
    feats = target(ids[:, :-1], capture_layers=drafter.capture_layers).hidden
    own = DraftStep(tokens=ids, features=feats, target=target, cache=caches[0])
    donor = DraftStep(tokens=ids, features=feats, target=target, cache=caches[1])
    for d in (drafter, eager):
        d.begin(ids)
    a, b = drafter.draft(own)[1], drafter.draft(donor)[1]
    torch.testing.assert_close(a, eager.draft(own)[1], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(b, eager.draft(donor)[1], rtol=1e-4, atol=1e-4)
    assert not torch.allclose(a, b)
    assert len(drafter._graphs) == 2 and all(g.graph is not None for g in drafter._graphs)
