"""`torchrun ... -m sweeps.commands.train_launch`: one row's training (data, base drafter, stage 1, stage 2), data-parallel.

    torchrun --standalone --nproc-per-node 2 -m sweeps.commands.train_launch [a.b=v ...]  # this host's GPUs 0 and 1
    torchrun --standalone --nproc-per-node 2 -m sweeps.commands.train_launch --what base  # data + base drafter only
    torchrun ... -m sweeps.launch --sweep rank --row "r=8" --seed 0 [a.b=v]              # one sweep row's config
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint host0:29500 \\
        --rdzv-id r8 -m sweeps.commands.train_launch ...                                  # two hosts (docs/sweeps.md)
    python -m sweeps.commands.train_launch ... --json out.json                            # one process; a summary
    python -m sweeps.commands.train_launch --compare one.json two.json                    # speed-up, loss agreement

Config: `ready.config.load_config` (schema <- experiments/base.yaml <- --preset <- --config FILE <- a.b=v;
a sweep row's resolved config: `sweeps.launch --sweep/--row/--seed`, the same options).
Every rank loads the target, joins the group (NCCL on CUDA, gloo on CPU) and calls
ready.train.pipeline, which writes cached artifacts (rank 0): a sweep row with the same config
later finds them built. `--out-dir` defaults to `<artifacts_dir>/stages`, where sweep rows look.

`run_under_torchrun` (sweeps.torchrun) is how a process with `train.devices = N > 1` hands its
training to N processes on this host (a sweep row gives it to ready.train.pipeline): the config goes to
a file, torchrun runs this module on it, the caller waits and then reads the artifacts.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch
from omegaconf import DictConfig

from ready.config import entry_point, load_config
from ready.data.tokenizer import load_tokenizer
from ready.loading import pick_device, target_dir
from ready.target import load_target
from ready.train import distributed
from ready.train.pipeline import STAGES_SUBDIR, ensure_base_drafter, train_variant
from sweeps.torchrun import LaunchError, run_under_torchrun

__all__ = ["LaunchError", "compare", "load_for_training", "main", "parser", "run", "stage_logs", "train"]


def load_for_training(cfg: DictConfig, prompts_arg: Optional[str]) -> tuple[Any, Any, Optional[torch.Tensor]]:
    """(target, tokenizer or None, explicit prompts or None) on this rank's device."""
    with distributed.main_first():  # rank 0 builds the embedded default target (if asked) first
        path = target_dir(cfg, progress=distributed.world().main)
    torch.manual_seed(int(cfg.seed))  # an architecture-only preset gets the same random weights on every rank
    # "cuda" is this rank's GPU: init_from_env pinned it
    target = load_target(path, device=pick_device(cfg), dtype=getattr(torch, str(cfg.target.dtype)))
    for p in target.parameters():
        p.requires_grad_(False)
    tokenizer = None
    if Path(path).is_dir() and any((Path(path) / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        tokenizer = load_tokenizer(path)
    prompts = None
    if prompts_arg == "random":  # speed runs on an architecture-only target: token ids, no text
        g = torch.Generator().manual_seed(int(cfg.regen.seed))
        prompts = torch.randint(0, int(target.config.vocab_size), (int(cfg.regen.num_samples), int(cfg.regen.prompt_len)),
                                generator=g)
    elif prompts_arg:
        if not Path(prompts_arg).is_file():
            raise LaunchError(f"--prompts {prompts_arg!r} is not a file; expected 'random' or a .pt of token ids [N, prompt_len]")
        prompts = torch.load(prompts_arg, map_location="cpu", weights_only=True)
    elif tokenizer is None:
        raise LaunchError(f"target {path!r} has no tokenizer to encode training prompts; expected a checkpoint folder "
                          "with one, or --prompts random (token ids, for speed runs)")
    return target, tokenizer, prompts


def train(cfg: DictConfig, what: str, base_drafter_dir: Optional[str], out_dir: Optional[str],
          prompts_arg: Optional[str]) -> dict:
    """One rank's share of `what`; returns the summary (stage -> steps, seconds, losses) on rank 0."""
    w = distributed.init_from_env(pick_device(cfg))
    target, tokenizer, prompts = load_for_training(cfg, prompts_arg)
    out = Path(out_dir) if out_dir else Path(cfg.artifacts_dir) / STAGES_SUBDIR
    t0 = time.perf_counter()
    launch = run_under_torchrun  # `python -m` of this module with train.devices = N > 1: N processes train
    base = Path(base_drafter_dir) if base_drafter_dir else ensure_base_drafter(cfg, target, tokenizer, progress=w.main,
                                                                                prompts=prompts, launch=launch)
    final = base if what == "base" else train_variant(cfg, target, tokenizer, base, out, progress=w.main, prompts=prompts,
                                                      launch=launch)
    return {"world_size": w.size, "device": str(target.embed_tokens.weight.device.type), "what": what,
            "drafter": str(final), "seconds": round(time.perf_counter() - t0, 3),
            "stages": {**stage_logs(Path(base)), **stage_logs(Path(final))}}


def stage_logs(final: Path) -> dict[str, dict]:
    """The train.json of the stages behind a trained drafter folder: stage 2 and stage 1, or the
    base drafter ({} for a drafter not trained here, e.g. drafter.checkpoint)."""
    out: dict[str, dict] = {}
    folder = final.parent
    while (folder / "train.json").is_file():
        log = json.loads((folder / "train.json").read_text())
        out[log["stage"]] = {k: log.get(k) for k in ("steps", "seconds", "losses", "resumed_from", "world_size")}
        spec = json.loads((folder / "spec.json").read_text()) if (folder / "spec.json").is_file() else {}
        if "start" not in spec or log["stage"] != "stage2":
            break
        folder = folder.parent / f"stage1-{spec['start']}"
    return out


def compare(a: dict, b: dict) -> dict:
    """Per stage of two summaries (e.g. 1 and 2 processes): speed-up of b over a and loss agreement."""
    out = {}
    for stage in sorted(set(a["stages"]) & set(b["stages"])):
        sa, sb = a["stages"][stage], b["stages"][stage]
        la, lb = sa["losses"], sb["losses"]
        diffs = [abs(x - y) for x, y in zip(la, lb)]
        out[stage] = {"processes": [a["world_size"], b["world_size"]], "steps": [len(la), len(lb)],
                      "seconds": [sa["seconds"], sb["seconds"]],
                      "speedup": round(sa["seconds"] / sb["seconds"], 3) if sb["seconds"] else None,
                      "max_abs_loss_diff": max(diffs) if diffs else None,
                      "max_rel_loss_diff": max(d / max(abs(x), 1e-12) for d, x in zip(diffs, la)) if diffs else None}
    return out


def parser(prog: str = "python -m sweeps.commands.train_launch",
           description: Optional[str] = None) -> argparse.ArgumentParser:
    """The launcher's own options (`--what`, `--out-dir`, `--json`, `--compare`, ...) and `a.b=v` overrides;
    `main` adds where the config comes from (`--preset`, `--config`), `sweeps.launch` a sweep row."""
    p = argparse.ArgumentParser(prog=prog, description=description or __doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("overrides", nargs="*", help="config overrides a.b=v")
    p.add_argument("--what", choices=("variant", "base"), default="variant",
                   help="variant: base drafter (unless drafter.checkpoint) + stage 1 + stage 2; base: the base drafter")
    p.add_argument("--base-drafter", default=None, help="start the stages from this base drafter folder")
    p.add_argument("--out-dir", default=None, help="stage folders (default <artifacts_dir>/stages, as sweep rows)")
    p.add_argument("--prompts", default=None, help="'random' (token ids; architecture-only targets) or a .pt of ids")
    p.add_argument("--json", default=None, help="rank 0 writes the summary (steps, seconds, losses per stage) here")
    p.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"), help="compare two --json summaries and exit")
    return p


def run(args: argparse.Namespace, make_config: Callable[[], DictConfig]) -> int:
    """Train `make_config()` as `args` ask (or `--compare` two summaries); the exit status. A user's
    mistake (a ValueError) is one line on stderr and status 2."""
    try:
        if args.compare:
            a, b = (json.loads(Path(f).read_text()) for f in args.compare)
            print(json.dumps(compare(a, b), indent=1))
            return 0
        cfg = make_config()
        summary = train(cfg, args.what, args.base_drafter, args.out_dir, args.prompts)
        if distributed.world().main:
            text = json.dumps(summary, indent=1)
            if args.json:
                Path(args.json).write_text(text)
            print(json.dumps({k: v for k, v in summary.items() if k != "stages"}), flush=True)
        return 0
    except ValueError as e:  # the user's mistakes: one line
        print(f"error: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}", file=sys.stderr)
        return 2
    finally:
        distributed.shutdown()


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> int:
    """`python -m sweeps.commands.train_launch`: the config from `--preset`, `--config` and `a.b=v` (a sweep row: `sweeps.launch`)."""
    p = parser()
    p.add_argument("--preset", default=None, help="experiments/presets/<name>.yaml")
    p.add_argument("--config", default=None, help="a YAML config merged over base.yaml and the preset")
    args = p.parse_args(argv)
    return run(args, lambda: load_config(preset=args.preset, files=[args.config] if args.config else [],
                                         overrides=args.overrides))


if __name__ == "__main__":
    sys.exit(main())
