"""Whether DSpark's confidence head predicts greedy acceptance: the head and its label, teacher-forced.

    python -m benchmarks.diagnostics.confidence_label --target DIR --train DIR --heldout DIR [--train-sequences N]
        DRAFTER [DRAFTER ...]

DRAFTER: a base drafter with a confidence head (a `drafter_base/<id>` artifact folder, or its `drafter`
folder); --target the target's folder; --train, --heldout: regenerated-data folders (`regen/<id>`, their
data.pt), the drafter's training sequences and held-out ones. On the held-out sequences, teacher-forced (every
anchor with a full block of target tokens after it, `ready.train.teacher_forced`; along an accepted prefix
the drafts are the true tokens, so acceptance is the decoding's), per draft position j = 1..K: the head's
mean step confidence c_j, its label at temperature 1 (DeepSpec's, 1 - TV of the two distributions) and at 0
(greedy: the drafter's argmax is the target's; `ready.train.loss.confidence_label`), the observed greedy
acceptance and the target's top-token probability, among the anchors whose drafts 1..j-1 were accepted, and the calibration (`ready.calibration`: 20 bins) of the
head's predicted prefix acceptance S_j = c_1 ... c_j against 1{A >= j}. Then the head's linear layer is
refit on the drafter's frozen features (its input: the proposal's hidden state and the Markov embedding of the
token before it) of the first N --train sequences, once against each label with DSpark's position weights,
and scored the same way on the held-out sequences: if the label at 1 reproduces the head's miscalibration
and the label at 0 removes it, the label, not the training budget or the drift from teacher forcing to the
drafter's own drafts, is the cause (docs/figures.md, "On the embedded default (CPU): the schedule's effect
and the head's calibration"). JSON to stdout; CPU, one thread (--threads).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ready.calibration import calibration
from ready.config import LossConfig, entry_point
from ready.drafter import load_drafter
from ready.drafter.checkpoint import is_drafter_folder
from ready.target import load_target
from ready.train.anchors import gather_blocks
from ready.train.loss import confidence_label, position_weights
from ready.train.regen_data import DATA_FILE, RegenData
from ready.train.teacher_forced import compact_anchors, full_block_anchors
from ready.train.teacher_pass import teacher_pass

GAMMA = LossConfig().decay_gamma  # the position-weight decay the base drafter trained with (the schema's default)


@torch.no_grad()
def collect(drafter: Any, target: Any, data: RegenData, rows: Optional[int] = None, batch_size: int = 8) -> dict:
    """Per full-block anchor of the first `rows` sequences [n, K]: the head's step confidences `conf`, its
    input features `x` [n, K, F], the labels at temperature 1 and 0 (`label_1`, `label_0`), the target's top
    probability `target_top`, and `hit`: the drafter's argmax equals the sequence's token (greedy acceptance
    given the true prefix)."""
    if drafter.confidence_head is None:
        raise SystemExit("error: the drafter has no confidence head; expected a DSpark drafter with one "
                         "(drafter.confidence_head true)")
    K = int(drafter.proposals)
    n = len(data) if rows is None else min(int(rows), len(data))
    anchors, valid = full_block_anchors(data, K)
    seen: dict[str, torch.Tensor] = {}

    def keep_input(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        hidden, emb = args[0], args[1] if len(args) > 1 else None
        seen["x"] = torch.cat([hidden, emb.to(hidden.dtype)], -1) if module.with_markov else hidden

    hook = drafter.confidence_head.register_forward_hook(keep_input)
    parts: dict[str, list] = {k: [] for k in ("conf", "x", "label_1", "label_0", "target_top", "hit")}
    was_training = drafter.training
    drafter.eval()
    try:
        for lo in range(0, n, batch_size):
            sl = slice(lo, min(lo + batch_size, n))
            a, ok = compact_anchors(anchors[sl], valid[sl])
            if not bool(ok.any()):
                continue
            tokens = data.tokens[sl]
            tp = teacher_pass(target, drafter, tokens, a, keep=False)
            logits, conf = drafter.forward_train(tokens, tp.hidden, a, tp.states, confidence=True)
            teacher = tp.teacher(a, K)
            parts["conf"].append(conf.sigmoid()[ok])
            parts["x"].append(seen["x"].float()[ok])
            parts["label_1"].append(confidence_label(logits, teacher, 1.0)[ok])
            parts["label_0"].append(confidence_label(logits, teacher, 0.0)[ok])
            parts["target_top"].append(teacher.float().softmax(-1).amax(-1)[ok])
            parts["hit"].append((logits.argmax(-1) == gather_blocks(tokens, a, K, offset=1)).float()[ok])
    finally:
        hook.remove()
        drafter.train(was_training)
    return {k: torch.cat(v) if v else torch.zeros(0, K) for k, v in parts.items()}


def head_calibration(conf: torch.Tensor, hit: torch.Tensor) -> dict:
    """`ready.calibration` of step confidences [n, K] against the accepted prefixes of `hit` [n, K]: ECE over
    positions, and per position the ECE, mean predicted S_j and observed 1{A >= j}."""
    K = conf.shape[1]
    accepted = hit.int().cumprod(-1).sum(-1)
    cal = calibration([(conf[i].tolist(), int(accepted[i]), K) for i in range(len(conf))], K)
    if cal is None:
        return {"ece": None, "positions": []}
    return {"ece": _r(cal["ece"]),
            "positions": [{"j": p["position"], "ece": _r(p["ece"]), "predicted": _r(p["pred_mean"]),
                           "observed": _r(p["obs_mean"])} for p in cal["positions"]]}


def refit(x: torch.Tensor, label: torch.Tensor, init: dict, gamma: float = GAMMA) -> nn.Linear:
    """The head's linear layer (started from `init`) fit to `label` [n, K] on features `x` [n, K, F] by DSpark's
    position-weighted BCE, to convergence (L-BFGS)."""
    lin = nn.Linear(x.shape[-1], 1)
    lin.load_state_dict(init)
    w = position_weights(label.shape[-1], gamma).expand_as(label).reshape(-1)
    xs, ys = x.reshape(-1, x.shape[-1]), label.reshape(-1)
    opt = torch.optim.LBFGS(lin.parameters(), max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = (F.binary_cross_entropy_with_logits(lin(xs).squeeze(-1), ys, reduction="none") * w).sum() / w.sum()
        loss.backward()
        return loss

    opt.step(closure)
    return lin


def diagnose(drafter: Any, target: Any, train: RegenData, heldout: RegenData, train_sequences: int) -> dict:
    """The module docstring's measurement for one drafter (JSON-able)."""
    held = collect(drafter, target, heldout)
    hit = held["hit"]
    reached = torch.cat([torch.ones(len(hit), 1), hit.cumprod(-1)[:, :-1]], 1).bool()  # drafts < j accepted
    positions = []
    for j in range(hit.shape[1]):
        r = reached[:, j]
        positions.append({"j": j + 1, "blocks": int(r.sum()), "confidence": _r(held["conf"][r, j].mean()),
                          "label_1": _r(held["label_1"][r, j].mean()), "label_0": _r(held["label_0"][r, j].mean()),
                          "accepted": _r(hit[r, j].mean()), "target_top": _r(held["target_top"][r, j].mean())})
    out = {"heldout_blocks": int(len(hit)), "given_prefix": positions, "head": head_calibration(held["conf"], hit)}
    fit = collect(drafter, target, train, train_sequences)
    out["train_blocks"] = int(len(fit["x"]))
    init = {k: v.detach().float() for k, v in drafter.confidence_head.proj.state_dict().items()}
    for t in (1, 0):
        lin = refit(fit["x"], fit[f"label_{t}"], init)
        with torch.no_grad():
            out[f"refit_label_{t}"] = head_calibration(lin(held["x"]).squeeze(-1).sigmoid(), hit)
    return out


def _r(v: Any) -> Optional[float]:
    return None if v is None else round(float(v), 3)


def _drafter_folder(path: str) -> Path:
    p = Path(path)
    if is_drafter_folder(p / "drafter"):
        return p / "drafter"
    if is_drafter_folder(p):
        return p
    raise SystemExit(f"error: {path}: not a drafter folder nor a drafter_base artifact folder (with drafter/ inside)")


def _data(path: str) -> RegenData:
    p = Path(path)
    file = p / DATA_FILE if p.is_dir() else p
    if not file.is_file():
        raise SystemExit(f"error: {path}: no {DATA_FILE}; expected a regen artifact folder")
    return RegenData.load(file)


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.diagnostics.confidence_label",
                                 description=__doc__.split("\n", 1)[0])
    ap.add_argument("drafters", nargs="+", help="drafter_base artifact folders (or drafter folders) with a confidence head")
    ap.add_argument("--target", required=True, help="the target's folder")
    ap.add_argument("--train", required=True, help="regen folder of the drafter's training sequences")
    ap.add_argument("--heldout", required=True, help="regen folder of held-out sequences")
    ap.add_argument("--train-sequences", type=int, default=160, help="training sequences the head is refit on")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    if args.train_sequences < 1 or args.threads < 1:
        raise SystemExit("error: --train-sequences and --threads must be integers >= 1")
    torch.set_num_threads(args.threads)
    if not Path(args.target).is_dir():
        raise SystemExit(f"error: --target {args.target}: not a folder")
    target = load_target(args.target, device="cpu", dtype=torch.float32).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    train, heldout = _data(args.train), _data(args.heldout)
    out = {}
    for path in args.drafters:
        drafter = load_drafter(_drafter_folder(path), target)
        out[path] = diagnose(drafter, target, train, heldout, args.train_sequences)
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
