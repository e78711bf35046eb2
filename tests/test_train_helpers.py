"""Tiny random target + config shared by the training tests (no tests here; imported by test_train_*.py)."""

from __future__ import annotations

import torch
from omegaconf import OmegaConf

from ready.config import schema
from ready.target import HybridLM, preset_config

MICRO_TARGET = dict(
    vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=8, num_attention_heads=2,
    num_key_value_heads=1, head_dim=16, linear_num_key_heads=1, linear_num_value_heads=2,
    linear_key_head_dim=8, linear_value_head_dim=8, max_position_embeddings=256,
)


def micro_target(seed: int = 0) -> HybridLM:
    torch.manual_seed(seed)
    return HybridLM(preset_config("tiny", MICRO_TARGET)).eval()


def micro_cfg(tmp_path, **train):
    """A resolved config sized for the micro target: K=4, one draft layer, budgets of a few steps."""
    stage = {"samples": 24, "batch_size": 4, "lr": 3e-3, "anchors_per_sample": 3, "warmup": 0.1}
    layer = {
        "artifacts_dir": str(tmp_path / "artifacts"),
        "regen": {"num_samples": 16, "prompt_len": 12, "response_len": 12, "batch_size": 8},
        "drafter": {"proposals": 4, "num_layers": 1, "head_rank": 8},
        "reader": {"rank": 4, "mlp_hidden": 16},
        "train": {
            "base": dict(stage, samples=48),
            "stage1": dict(stage),
            "stage2": dict(stage),
            "lora": {"rank": 2, "alpha": 4},
            "checkpoint_every": 2,
            **train,
        },
    }
    return OmegaConf.merge(schema(), layer)


def micro_prompts(n: int = 16, length: int = 12, vocab: int = 128, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, length), generator=g)
