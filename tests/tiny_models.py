"""Tiny hybrid targets shared by the engine tests (random weights, CPU-sized)."""

from __future__ import annotations

import torch

from ready.target import HybridConfig, HybridLM

VOCAB = 128


def small_target(num_layers: int = 8, seed: int = 5) -> HybridLM:
    """A 64-wide GDN + attention target (attention every 4th layer) with a 128-token vocabulary."""
    torch.manual_seed(seed)
    cfg = HybridConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=num_layers, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, linear_num_key_heads=1, linear_num_value_heads=2,
        linear_key_head_dim=16, linear_value_head_dim=16, max_position_embeddings=256,
    )
    return HybridLM(cfg).eval()
