"""The set-up the held-out diagnostics share (`benchmarks.diagnostics.plateau`, `benchmarks.diagnostics.context_ceiling`,
`benchmarks.diagnostics.reader_pilot`, `benchmarks.diagnostics.query_span`): a config from command-line overrides
(over a sweep row's resolved config, when given), the loaded target, and the held-out regenerated
sequences (`eval.heldout_tf_samples`) they measure on."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from omegaconf import DictConfig

from ready.config import Layer, load_config
from ready.loading import load_configured_target
from ready.train.regen import build_validation_data


def heldout_config(overrides: Sequence[str], min_sequences: int, measured: str,
                   base: Optional[Layer] = None) -> DictConfig:
    """The validated config (`load_config`): the defaults, then `base` ((source, mapping): a sweep row's
    resolved config), then the overrides a.b=v; too few held-out sequences exits with one line
    (`measured` says what the sequences are for)."""
    cfg = load_config(files=[base] if base is not None else (), overrides=overrides)
    if int(cfg.eval.heldout_tf_samples) < min_sequences:
        raise SystemExit(f"error: eval.heldout_tf_samples must be >= {min_sequences}: {measured} on those sequences")
    return cfg


def heldout_setup(overrides: Sequence[str], threads: int, min_sequences: int,
                  measured: str) -> tuple[DictConfig, Any, Any]:
    """(config, loaded target and tokenizer, validation data); bad input exits with one line
    (`measured` says what the sequences are for, in that line)."""
    if threads < 1:
        raise SystemExit(f"error: --threads {threads}: expected an integer >= 1")
    torch.set_num_threads(threads)
    cfg = heldout_config(overrides, min_sequences, measured)
    loaded = load_configured_target(cfg, progress=True)
    return cfg, loaded, build_validation_data(cfg, loaded.target, loaded.tokenizer, progress=True)
