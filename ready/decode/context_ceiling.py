"""How much could reading states add at all? The target's dependence on text beyond a window.

    python -m ready.decode.context_ceiling --windows 4,8,16,32,64 [a.b=value ...]

On held-out target-regenerated sequences (the validation split of the teacher-forced metric), each
response token is the target's greedy choice given the whole prefix. For a window W, the same
target is given only the last W tokens before each position; the share of positions where its
greedy choice then changes is what a drafter that sees only W tokens cannot know without the
states (the positive control cuts the drafter's context to W: experiments/positive_control.yaml).
A small share bounds the effect any reader can show; a large one says the information exists, so
a null result points at the reader or its training instead. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Optional, Sequence

import torch

from ready.train.regen import RegenData


@torch.no_grad()
def greedy_change_rate(target: Any, data: RegenData, window: int) -> tuple[float, int]:
    """(share of response positions whose greedy token changes when the target sees only the last
    `window` tokens, positions counted). Positions with fewer than `window` tokens before them see
    their whole prefix either way and count as unchanged."""
    if window < 1:
        raise ValueError(f"window {window}: expected an integer >= 1")
    changed = counted = 0
    device = next(target.parameters()).device
    for i in range(len(data)):
        seq = data.tokens[i, : int(data.lengths[i])].to(device)
        full = target(seq[None]).logits[0].argmax(-1)
        positions = list(range(int(data.prompt_len) - 1, seq.numel() - 1))  # each predicts a response token
        cut = [t for t in positions if t + 1 > window]
        if cut:
            windows = torch.stack([seq[t + 1 - window: t + 1] for t in cut])
            changed += int((target(windows).logits[:, -1].argmax(-1) != full[cut]).sum())
        counted += len(positions)
    return (changed / counted if counted else 0.0), counted


def main(argv: Optional[Sequence[str]] = None) -> dict:
    from omegaconf import OmegaConf

    from ready.config import merge, schema, validate

    p = argparse.ArgumentParser(prog="python -m ready.decode.context_ceiling", description=__doc__.split("\n")[0])
    p.add_argument("--windows", default="4,8,16,32,64", help="comma list of context windows W (tokens)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("overrides", nargs="*", help="config overrides a.b=value (which target, which sequences)")
    args = p.parse_args(argv)
    try:
        windows = [int(w) for w in args.windows.split(",") if w.strip()]
    except ValueError:
        raise SystemExit(f"error: --windows {args.windows!r}: expected a comma list of integers >= 1") from None
    if not windows or min(windows) < 1 or args.threads < 1:
        raise SystemExit(f"error: --windows {args.windows!r} / --threads {args.threads}: expected integers >= 1")
    torch.set_num_threads(args.threads)
    cfg = merge(schema(), OmegaConf.from_dotlist(args.overrides), source="command line")
    validate(cfg)
    if int(cfg.eval.heldout_tf_samples) < 1:
        raise SystemExit("error: eval.heldout_tf_samples must be >= 1: the rates are measured on those sequences")

    from ready.row import _load
    from ready.train.regen import build_validation_data

    loaded = _load(cfg, progress=True)
    val = build_validation_data(cfg, loaded.target, loaded.tokenizer, progress=True)
    out: dict[str, Any] = {"sequences": len(val), "prompt_len": int(val.prompt_len), "rates": {}}
    for w in windows:
        rate, n = greedy_change_rate(loaded.target, val, w)
        out["rates"][str(w)] = round(rate, 4)
        out["positions"] = n
        print(f"[context_ceiling] W={w}: greedy token changes at {rate:.1%} of {n} positions", file=sys.stderr, flush=True)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
