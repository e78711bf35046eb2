"""Write a preset's random target as a Hugging Face folder and a DSpark folder of its drafter shape, once.

    python -m benchmarks.shape_folders --target qwen3_5_27b --target-out /data/q27 --drafter-out /data/dspark27
    python -m benchmarks.shape_folders --target tiny --target-out /tmp/t --drafter-out /tmp/d      # seconds, CPU

What `target.source=DIR drafter.checkpoint=DIR` load at a model's size when no real checkpoint is at hand:
- the target folder: the very target `target.pretrain=false` builds for the preset (ready.loading.random_target:
  random weights, seed 0, the embedded tokenizer) as `config.json` + sharded safetensors
  (`model-0000i-of-0000n.safetensors` + `model.safetensors.index.json`, `--shard-gb` each, as Hugging Face
  shards a large checkpoint) + the tokenizer files; at the 27B preset 53.8 GB in bf16;
- the drafter folder: a random DSpark drafter of the preset's shape (benchmarks.engine.build_drafter: its
  sequence head non-zero) in the target's dtype, written as a public DSpark checkpoint is
  (`config.json` with `dflash_config` and `model.safetensors`, no block of this tool's own), so the sweep
  reads it through the path a SpecForge or DeepSpec folder takes; 1.86 B parameters, 3.7 GB in bf16.

Prints one JSON object: the folders, their bytes and the seconds each build and write took.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from benchmarks.engine import build_drafter
from ready.artifacts import atomic_dir
from ready.config import ConfigError, entry_point, load_config
from ready.drafter.checkpoint import CONFIG_FILE, WEIGHTS_FILE, dspark_config
from ready.loading import pick_device, random_target
from ready.target.checkpoint import save_target
from ready.target.config import PRESETS

PROFILE = "gpu_shape"  # target.pretrain=false: the random target a sweep with this profile builds


class ShapeFoldersError(ValueError):
    """An argument is unusable; the message names it and what was expected."""


def _bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def write_folders(preset: str, target_out: Optional[Path], drafter_out: Optional[Path], overrides: Sequence[str] = (),
                  shard_gb: float = 5.0) -> dict[str, Any]:
    """Build the preset's random target (and drafter) on the config's device and write the folders asked for."""
    if preset not in PRESETS:
        raise ShapeFoldersError(f"--target {preset!r}: not a target architecture preset; expected one of {sorted(PRESETS)}")
    try:
        cfg = load_config(preset=preset, profile=PROFILE, overrides=[f"target.source={preset}", *overrides])
    except ConfigError as e:
        raise ShapeFoldersError(str(e)) from None
    device = pick_device(cfg)
    out: dict[str, Any] = {"preset": preset, "device": device, "dtype": str(cfg.target.dtype)}
    if device == "cuda":
        out["gpu"] = torch.cuda.get_device_name()
    t0 = time.perf_counter()
    target, tokenizer = random_target(cfg, preset, device, getattr(torch, str(cfg.target.dtype)))
    if device == "cuda":
        torch.cuda.synchronize()
    out["target_build_s"] = round(time.perf_counter() - t0, 2)
    out["target_params"] = sum(p.numel() for p in target.parameters())
    if target_out is not None:
        t0 = time.perf_counter()
        save_target(target, target_out, tokenizer=tokenizer, shard_bytes=int(shard_gb * 1e9))
        out["target"] = {"folder": str(target_out), "bytes": _bytes(target_out),
                         "shards": len(list(target_out.glob("model-*.safetensors"))),
                         "write_s": round(time.perf_counter() - t0, 2)}
    if drafter_out is not None:
        t0 = time.perf_counter()
        drafter = build_drafter(target, "dspark", preset, int(cfg.drafter.proposals), seed=0)
        out["drafter_build_s"] = round(time.perf_counter() - t0, 2)
        t0 = time.perf_counter()
        write_dspark_folder(drafter, drafter_out)
        out["drafter"] = {"folder": str(drafter_out), "bytes": _bytes(drafter_out),
                          "params": sum(p.numel() for p in drafter.parameters()),
                          "write_s": round(time.perf_counter() - t0, 2)}
    return out


def write_dspark_folder(drafter: Any, folder: Path) -> Path:
    """The drafter as a public DSpark checkpoint folder (config.json + model.safetensors), atomically."""
    from safetensors.torch import save_file

    weights = {k: v.detach().contiguous().cpu() for k, v in drafter.state_dict().items() if not k.startswith("readers.")}
    with atomic_dir(folder) as tmp:
        (tmp / CONFIG_FILE).write_text(json.dumps(dspark_config(drafter), indent=1))
        save_file(weights, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
    return folder


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.shape_folders", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("overrides", nargs="*", help="config overrides a.b=v (after the preset and the gpu_shape profile)")
    ap.add_argument("--target", default="tiny", help="the preset whose architecture and drafter shape to write")
    ap.add_argument("--target-out", default=None, help="the Hugging Face target folder to write (none: not written)")
    ap.add_argument("--drafter-out", default=None, help="the DSpark drafter folder to write (none: not written)")
    ap.add_argument("--shard-gb", type=float, default=5.0, help="largest shard of the target, in GB (default 5)")
    ap.add_argument("--json", action="store_true", help="print the JSON on one line")
    a = ap.parse_args(argv)
    if a.shard_gb <= 0:
        print(f"error: --shard-gb {a.shard_gb}: expected a positive number of GB", file=sys.stderr)
        return 2
    try:
        res = write_folders(a.target, Path(a.target_out) if a.target_out else None,
                            Path(a.drafter_out) if a.drafter_out else None, a.overrides, a.shard_gb)
    except ValueError as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    print(json.dumps(res, indent=None if a.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
