"""Which token mixers of the hybrid target learn content-based copying, on a dense toy task?

    python -m benchmarks.diagnostics.induction_toy --layers LALA --steps 4000 --batch 64 --device cuda
    python -m benchmarks.diagnostics.induction_toy --layers LLLL ...  # GDN only
    python -m benchmarks.diagnostics.induction_toy --layers AA ...  # attention only

`copy_probe` showed the tiny target copying older text poorly, and not at all for random ids. This
asks the architecture question apart from the corpus: small models of the target's own classes
(`HybridLM`, one letter per layer: L = Gated DeltaNet, A = full attention) are trained from scratch
on random ids in which each sequence repeats one span (12-32 tokens) 0-16 tokens after it ends, at a
random place, so only content-based copying (find the earlier occurrence of the current token,
emit what followed it) predicts the repeat. At each check it prints one JSON line: training loss and
`copy_loss`, the mean loss on the repeated tokens after the first of a fixed held-out batch
(ln symbols = no copying, 0 = perfect).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from ready.config import entry_point
from ready.target.config import HybridConfig
from ready.target.layers import init_weights
from ready.target.model import HybridLM

MIXERS = {"L": "linear_attention", "A": "full_attention"}


def copy_batch(batch: int, length: int, symbols: int, gen: torch.Generator,
               span: tuple[int, int] = (12, 32), max_gap: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids [batch, length] in 0..symbols-1, each row with one span repeated after a gap, and a
    mask [batch, length] of the repeated positions a copier can predict (all but the first)."""
    if length < 2 * span[1] + max_gap + 1:
        raise ValueError(f"length {length} is too short for spans up to {span[1]} and gaps up to {max_gap}")
    ids = torch.randint(0, symbols, (batch, length), generator=gen)
    mask = torch.zeros(batch, length, dtype=torch.bool)
    for b in range(batch):
        n = int(torch.randint(span[0], span[1] + 1, (), generator=gen))
        gap = int(torch.randint(0, max_gap + 1, (), generator=gen))
        s = int(torch.randint(0, length - 2 * n - gap, (), generator=gen))
        d = s + n + gap
        ids[b, d:d + n] = ids[b, s:s + n]
        mask[b, d + 1:d + n] = True
    return ids, mask


def toy_model(layers: str, symbols: int, hidden: int = 128):
    """A small `HybridLM` with the target's mixers in the order `layers` (e.g. 'LALA')."""
    bad = sorted(set(layers) - set(MIXERS))
    if not layers or bad:
        raise ValueError(f"--layers {layers!r}: expected letters L (Gated DeltaNet) and A (full attention), e.g. LALA")
    cfg = HybridConfig(vocab_size=symbols, hidden_size=hidden, intermediate_size=2 * hidden,
                       num_hidden_layers=len(layers), layer_types=[MIXERS[c] for c in layers],
                       num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                       linear_num_key_heads=2, linear_num_value_heads=4,
                       linear_key_head_dim=hidden // 4, linear_value_head_dim=hidden // 4)
    model = HybridLM(cfg)
    init_weights(model)
    return model


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> list[dict]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.diagnostics.induction_toy", description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", default="LALA", help="one letter per layer: L = Gated DeltaNet, A = full attention")
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--checks", type=int, default=8, help="measurements, evenly spaced (default 8)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--length", type=int, default=96, help="tokens per sequence (default 96)")
    p.add_argument("--symbols", type=int, default=64, help="distinct ids (default 64)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = p.parse_args(argv)
    if args.steps < 1 or args.checks < 1 or args.batch < 1 or args.symbols < 2:
        raise SystemExit("error: --steps, --checks and --batch expect integers >= 1 and --symbols >= 2")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    try:
        model = toy_model(args.layers, args.symbols).to(args.device)
        held, held_mask = copy_batch(128, args.length, args.symbols, torch.Generator().manual_seed(10_000 + args.seed))
    except ValueError as e:
        raise SystemExit(f"error: {e}")
    held, held_mask = held.to(args.device), held_mask[:, 1:].to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(args.seed + 1)
    every = max(1, args.steps // args.checks)
    rows, t0 = [], time.time()
    for step in range(1, args.steps + 1):
        ids, _ = copy_batch(args.batch, args.length, args.symbols, gen)
        ids = ids.to(args.device)
        logits = model(ids[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, args.symbols).float(), ids[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % every == 0 or step == args.steps:
            with torch.no_grad():
                lg = model(held[:, :-1]).logits.float()
                per_token = F.cross_entropy(lg.reshape(-1, args.symbols), held[:, 1:].reshape(-1), reduction="none")
                copy_loss = per_token.view_as(held_mask)[held_mask].mean().item()
            row = {"layers": args.layers, "step": step, "s": round(time.time() - t0), "loss": round(loss.item(), 3),
                   "copy_loss": round(copy_loss, 3), "chance": round(math.log(args.symbols), 3)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def exit_status(rows: list[dict]) -> int:
    """The command's exit status: 1 when no measurement was made."""
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(exit_status(main()))
