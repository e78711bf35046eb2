"""The set-up the held-out diagnostics share (`ready.diagnostics.plateau`, `ready.diagnostics.context_ceiling`,
`ready.diagnostics.reader_pilot`): a config from command-line overrides, the loaded target, and the
held-out regenerated sequences (`eval.heldout_tf_samples`) they measure on."""

from __future__ import annotations

from typing import Any, Sequence

import torch
from omegaconf import DictConfig

from ready.config import load_config
from ready.loading import load_configured_target
from ready.train.regen import build_validation_data


def heldout_setup(overrides: Sequence[str], threads: int, min_sequences: int,
                  measured: str) -> tuple[DictConfig, Any, Any]:
    """(config, loaded target and tokenizer, validation data); bad input exits with one line
    (`measured` says what the sequences are for, in that line)."""
    if threads < 1:
        raise SystemExit(f"error: --threads {threads}: expected an integer >= 1")
    torch.set_num_threads(threads)
    cfg = load_config(overrides=overrides)
    if int(cfg.eval.heldout_tf_samples) < min_sequences:
        raise SystemExit(f"error: eval.heldout_tf_samples must be >= {min_sequences}: {measured} on those sequences")
    loaded = load_configured_target(cfg, progress=True)
    return cfg, loaded, build_validation_data(cfg, loaded.target, loaded.tokenizer, progress=True)
