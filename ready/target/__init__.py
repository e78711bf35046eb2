"""The hybrid linear-attention target (Qwen3.5-style) and its committed-state interface."""

from ready.target.cache import HybridCache
from ready.target.checkpoint import load_target, save_target
from ready.target.config import PRESETS, HybridConfig, TargetError, preset_config
from ready.target.graphs import GraphedVerify
from ready.target.model import HybridLM, TargetOutput

__all__ = [
    "GraphedVerify", "HybridCache", "HybridConfig", "HybridLM", "PRESETS", "TargetError", "TargetOutput",
    "load_target", "preset_config", "save_target",
]
