"""Speculative decoding equals transformers' greedy `generate` on the same checkpoint."""

from __future__ import annotations

import pytest
import torch

from ready.decode import Engine, NgramDrafter
from ready.target import HybridConfig, HybridLM, save_target

torch.set_num_threads(1)  # tiny models: one thread beats two on a shared machine

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(7)
    cfg = HybridConfig(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, linear_num_key_heads=1, linear_num_value_heads=2,
        linear_key_head_dim=16, linear_value_head_dim=16, max_position_embeddings=256,
    )
    model = HybridLM(cfg).eval()
    path = save_target(model, tmp_path_factory.mktemp("ckpt") / "tiny")
    hf = transformers.Qwen3_5ForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    return model, hf


def hf_greedy(hf, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                      do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("k", [1, 3, 7])
def test_speculative_equals_transformers_generate(checkpoint, k):
    model, hf = checkpoint
    g = torch.Generator().manual_seed(k)
    engine_ar, engine_spec = Engine(model), Engine(model, NgramDrafter(96, k))
    for length in (1, 6, 19):
        prompt = torch.randint(0, 96, (length,), generator=g).tolist()
        want = hf_greedy(hf, prompt, 20)
        assert engine_ar.generate(prompt, 20).tokens == want
        assert engine_spec.generate(prompt, 20).tokens == want
