"""LoRA on the drafter backbone through peft: inject, list, and merge back.

Adapters go only on backbone Linear layers whose leaf name is in `train.lora.target_modules`
(never on the reader, which trains in full, nor on the target's shared embeddings/LM head).
After a stage the adapters are merged into the base weights, so a saved drafter is a plain
DSparkDrafter that `load_drafter` reads without peft.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class LoraSetupError(ValueError):
    """The LoRA config matches nothing in the drafter; the message lists what it could match."""


def lora_target_names(drafter: nn.Module, target_modules: list[str]) -> list[str]:
    """Full names of the backbone nn.Linear modules whose leaf name is in `target_modules`."""
    backbone = {id(p) for p in drafter.backbone_parameters()}
    wanted = set(target_modules)
    names, available = [], set()
    for name, mod in drafter.named_modules():
        if isinstance(mod, nn.Linear) and id(mod.weight) in backbone:
            leaf = name.rsplit(".", 1)[-1]
            available.add(leaf)
            if leaf in wanted:
                names.append(name)
    if not names:
        raise LoraSetupError(
            f"train.lora.target_modules {sorted(wanted)} matches no Linear layer of the drafter backbone; "
            f"expected some of {sorted(available)}"
        )
    return names


def inject_lora(drafter: nn.Module, lora_cfg: Any) -> list[str]:
    """Add LoRA adapters (in place) to the drafter backbone; returns the adapted module names."""
    from peft import LoraConfig, inject_adapter_in_model

    names = lora_target_names(drafter, list(lora_cfg.target_modules))
    config = LoraConfig(
        r=int(lora_cfg.rank),
        lora_alpha=int(lora_cfg.alpha),
        lora_dropout=float(lora_cfg.dropout),
        target_modules=names,
        bias="none",
    )
    inject_adapter_in_model(config, drafter)
    return names


def lora_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """(name, parameter) of every LoRA adapter weight in `model`."""
    return [(n, p) for n, p in model.named_parameters() if ".lora_" in n]


def has_lora(model: nn.Module) -> bool:
    from peft.tuners.lora import LoraLayer

    return any(isinstance(m, LoraLayer) for m in model.modules())


@torch.no_grad()
def merge_lora_(model: nn.Module) -> int:
    """Fold every LoRA adapter into its base Linear and remove the wrapper (in place).

    Returns how many layers were merged. Afterwards the module tree and state-dict keys are
    those of the model before `inject_lora`.
    """
    from peft.tuners.lora import LoraLayer

    targets = [(name, mod) for name, mod in model.named_modules() if isinstance(mod, LoraLayer)]
    for name, mod in targets:
        mod.merge()
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, leaf, mod.get_base_layer())
    return len(targets)


def base_name(name: str) -> str:
    """The parameter name it had before LoRA wrapped its layer ('x.q_proj.base_layer.weight' -> 'x.q_proj.weight')."""
    return name.replace(".base_layer.", ".")
