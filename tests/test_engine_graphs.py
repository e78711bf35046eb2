"""The engine's CUDA-graph path (static cache, fixed-shape verify/step) is lossless: eagerly on
CPU (same static-cache forwards, no capture), captured and replayed on CUDA."""

from __future__ import annotations

import pytest
import torch

from ready.decode import Engine, NgramDrafter
from ready.target import HybridConfig, HybridLM

torch.set_num_threads(1)  # tiny models: one thread beats two on a shared machine
VOCAB = 128


def tiny(device: str = "cpu") -> HybridLM:
    torch.manual_seed(11)
    cfg = HybridConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, linear_num_key_heads=1, linear_num_value_heads=2,
        linear_key_head_dim=16, linear_value_head_dim=16, max_position_embeddings=256,
    )
    return HybridLM(cfg).to(device).eval()


def _check_lossless(device: str, k: int, capture_layers: list[int] = ()) -> None:
    model = tiny(device)
    plain = Engine(model, cuda_graphs=False)
    drafter = NgramDrafter(VOCAB, k)
    drafter.capture_layers = list(capture_layers)
    ar, spec = Engine(model, cuda_graphs=True), Engine(model, drafter, cuda_graphs=True)
    gen = torch.Generator().manual_seed(k)
    for length in (1, 7, 20, 3):  # the last prompt is shorter: the same cache and graphs are reused
        prompt = torch.randint(0, VOCAB, (length,), generator=gen).tolist()
        want = plain.generate(prompt, 30).tokens
        assert ar.generate(prompt, 30).tokens == want
        assert spec.generate(prompt, 30).tokens == want
    assert ar.slots.cache.static and spec.slots.cache.static and not plain.slots.cache.static
    assert set(spec.slots.graphs.graphs) == {k + 1}  # the shortened last round runs eagerly
    assert set(ar.slots.graphs.graphs) == {1}


@pytest.mark.parametrize("k", [1, 3, 7])
def test_static_cache_path_is_lossless_on_cpu(k):
    _check_lossless("cpu", k, capture_layers=[1, 3])


@pytest.mark.cuda
@pytest.mark.parametrize("k", [3, 7])
def test_cuda_graphs_are_lossless(k):
    _check_lossless("cuda", k, capture_layers=[1, 3])
