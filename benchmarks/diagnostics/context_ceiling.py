"""How much could reading states add at all? The target's dependence on text beyond a window.

    python -m benchmarks.diagnostics.context_ceiling --windows 4,8,16,32,64 [a.b=value ...]

On held-out target-regenerated sequences (the validation split of the teacher-forced metric), each
response token is the target's greedy choice given the whole prefix. For a window W, the same
target is given only the last W tokens before each position; the share of positions where its
greedy choice then changes is what a drafter that sees only W tokens cannot know without the
states (the positive control cuts the drafter's context to W: experiments/positive_control.yaml).
A small share bounds the effect any reader can show; a large one says the information exists, so
a null result points at the reader or its training instead. With `--drafter DIR` (a trained
drafter, e.g. the base drafter of a positive-control seed) it also says where that drafter's
rejections fall: among positions that need older text, or elsewhere. `attention_only_rates` cuts
only the target's attention layers to W (its GDN states keep the whole prefix): what changes then
is older text the target reads through attention, which no state reader can recover. Prints JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any, Iterator, Optional, Sequence

import torch

from benchmarks.diagnostics.heldout_setup import heldout_setup
from ready.config import entry_point
from ready.drafter import load_drafter
from ready.target.layers import Attention
from ready.train.regen import RegenData
from ready.train.teacher_forced import _batches, block_acceptance, compact_anchors, full_block_anchors


@torch.no_grad()
def changed_positions(target: Any, seq: torch.Tensor, window: int) -> torch.Tensor:
    """Bool [T]: entry t says whether the target's greedy token after seq[: t + 1] changes when it
    sees only the last `window` of those tokens (False where the prefix fits in the window)."""
    if window < 1:
        raise ValueError(f"window {window}: expected an integer >= 1")
    full = target(seq[None]).logits[0].argmax(-1)
    out = torch.zeros(seq.numel(), dtype=torch.bool, device=seq.device)
    cut = list(range(window, seq.numel()))  # t + 1 > window: the window drops something
    if cut:
        windows = torch.stack([seq[t + 1 - window: t + 1] for t in cut])
        out[cut] = target(windows).logits[:, -1].argmax(-1) != full[cut]
    return out


@contextlib.contextmanager
def attention_window(target: Any, window: int) -> Iterator[None]:
    """Inside: the target's full-attention layers see only the last `window` keys of each query (the
    target's own sliding window, `HybridConfig.sliding_window`, narrowed), while its GDN layers still
    run over the whole prefix. Comparing the target so cut with the target whole says how much of
    what it knows of older text travels through attention rather than through the GDN states (all a
    reader sees)."""
    mods = [m for m in target.modules() if isinstance(m, Attention)]
    before = [m.window for m in mods]
    for m in mods:
        m.window = min(m.window or window, window)
    try:
        yield
    finally:
        for m, w in zip(mods, before):
            m.window = w


@torch.no_grad()
def attention_only_change_rate(target: Any, data: RegenData, window: int) -> tuple[float, int]:
    """Like `greedy_change_rate`, but only the attention layers lose what lies beyond `window`
    (`attention_window`); the GDN states keep the whole prefix."""
    changed = counted = 0
    device = next(target.parameters()).device
    for i in range(len(data)):
        seq = data.tokens[i, : int(data.lengths[i])].to(device)
        full = target(seq[None]).logits[0].argmax(-1)
        with attention_window(target, window):
            cut = target(seq[None]).logits[0].argmax(-1)
        span = slice(int(data.prompt_len) - 1, seq.numel() - 1)
        changed, counted = changed + int((cut[span] != full[span]).sum()), counted + full[span].numel()
    return (changed / counted if counted else 0.0), counted


def greedy_change_rate(target: Any, data: RegenData, window: int) -> tuple[float, int]:
    """(share of response positions whose greedy token changes when the target sees only the last
    `window` tokens, positions counted). Positions with fewer than `window` tokens before them see
    their whole prefix either way and count as unchanged."""
    changed = counted = 0
    device = next(target.parameters()).device
    for i in range(len(data)):
        seq = data.tokens[i, : int(data.lengths[i])].to(device)
        flags = changed_positions(target, seq, window)[int(data.prompt_len) - 1: seq.numel() - 1]
        changed, counted = changed + int(flags.sum()), counted + flags.numel()
    return (changed / counted if counted else 0.0), counted


@torch.no_grad()
def rejection_share(drafter: Any, target: Any, data: RegenData, window: int, batch_size: int = 8) -> dict[str, Any]:
    """Where a drafter fails: over every full-block anchor (teacher-forced, as `heldout_tf/tau`), the
    share of anchor positions whose target token needs text beyond `window`, and the same share
    among the positions of the drafter's first rejected draft. A rejection share well above the
    anchor share says the drafter fails where older text matters: what reading states could fix."""
    K = int(drafter.proposals)
    device = next(drafter.parameters()).device
    anchors, valid = full_block_anchors(data, K)
    n_anchor = n_anchor_changed = n_rej = n_rej_changed = 0
    for rows in _batches(len(data), max(2, batch_size)):
        a, ok = compact_anchors(anchors[rows], valid[rows])  # each row's own anchors only
        tokens, a, ok = data.tokens[rows].to(device), a.to(device), ok.to(device)
        if not bool(ok.any()):
            continue
        acc = block_acceptance(drafter, target, tokens, a)
        for b in range(tokens.shape[0]):
            flags = changed_positions(target, tokens[b, : int(data.lengths[rows][b])], window)
            an, A = a[b][ok[b]], acc[b][ok[b]]
            n_anchor, n_anchor_changed = n_anchor + an.numel(), n_anchor_changed + int(flags[an].sum())
            rejected = A < K  # draft A + 1 (token an + A + 1, predicted after an + A) was rejected
            n_rej, n_rej_changed = n_rej + int(rejected.sum()), n_rej_changed + int(flags[(an + A)[rejected]].sum())
    return {"window": window, "anchors": n_anchor, "rejections": n_rej,
            "anchor_share": n_anchor_changed / n_anchor if n_anchor else 0.0,
            "rejection_share": n_rej_changed / n_rej if n_rej else 0.0}


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.diagnostics.context_ceiling", description=__doc__.split("\n")[0])
    p.add_argument("--windows", default="4,8,16,32,64", help="comma list of context windows W (tokens)")
    p.add_argument("--drafter", default=None, help="a trained drafter's folder: where its rejections fall")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("overrides", nargs="*", help="config overrides a.b=value (which target, which sequences)")
    args = p.parse_args(argv)
    try:
        windows = [int(w) for w in args.windows.split(",") if w.strip()]
    except ValueError:
        raise SystemExit(f"error: --windows {args.windows!r}: expected a comma list of integers >= 1") from None
    if not windows or min(windows) < 1:
        raise SystemExit(f"error: --windows {args.windows!r}: expected a comma list of integers >= 1")

    _, loaded, val = heldout_setup(args.overrides, args.threads, 1, "the rates are measured")
    out: dict[str, Any] = {"sequences": len(val), "prompt_len": int(val.prompt_len), "rates": {}}
    out["attention_only_rates"] = {}
    for w in windows:
        rate, n = greedy_change_rate(loaded.target, val, w)
        out["rates"][str(w)] = round(rate, 4)
        out["positions"] = n
        print(f"[context_ceiling] W={w}: greedy token changes at {rate:.1%} of {n} positions", file=sys.stderr, flush=True)
        att, _ = attention_only_change_rate(loaded.target, val, w)
        out["attention_only_rates"][str(w)] = round(att, 4)
        print(f"[context_ceiling] W={w}: {att:.1%} when only the attention layers are cut (GDN states whole)",
              file=sys.stderr, flush=True)
    if args.drafter:
        drafter = load_drafter(args.drafter, loaded.target).eval()
        out["drafter"] = {"path": args.drafter, "by_window": {}}
        for w in windows:
            r = rejection_share(drafter, loaded.target, val, w)
            out["drafter"]["by_window"][str(w)] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}
            print(f"[context_ceiling] W={w}: {r['rejection_share']:.1%} of {r['rejections']} rejections vs "
                  f"{r['anchor_share']:.1%} of anchor positions need older text", file=sys.stderr, flush=True)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
