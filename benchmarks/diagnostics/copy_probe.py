"""Does the tiny target learn in-context copying, and after how much pretraining?

    python -m benchmarks.diagnostics.copy_probe --batch 16 --checks 640,1280,2560,5120 target.attention_window=16
    python -m benchmarks.diagnostics.copy_probe --data random --symbols 64 --batch 32 --checks 250,500,1000 target.device=cuda
    python -m benchmarks.diagnostics.copy_probe --built target.attention_window=16  # the config's target, as built

ReaDy reads what the target's GDN states hold about older text; a positive control needs a target
that retrieves specific older text (copies it), not only its gist. This trains a fresh target of the
config's preset and corpus (as `ensure_default_target` builds it) with the pretraining's optimizer at
a constant learning rate after a 100-step warmup, on:

- `text`: the train split, as the default build;
- `repeats`: the same, with `--fraction` of the windows carrying a span of their own text (`--span`
  tokens) repeated 0..`--max-gap` tokens later (`insert_repeats`, the `pretrain.repeat_fraction` knob);
- `random`: random ids (`--symbols` distinct ones) with one random span repeated per window, where
  only copying lowers the loss below ln(symbols).

At each `--checks` step (and at `--seconds`) it prints one JSON line: training loss, held-out loss,
and copy fidelity (`copy_fidelity`): how much of the greedy continuation of
a segment repeated after `source` tokens continues the copy, for held-out corpus segments (`text`)
and for random ids (`random`), at sources 24 and 48 with 8 tokens repeated (beyond a 16-token
attention window, so a windowed target must copy through its states) and 96 with 32. Nothing is
cached: it is a measurement, not a build. `--built` measures the config's own target instead
(built and cached as every run builds it) and trains nothing. `--save DIR` keeps the trained target
as a local checkpoint with its tokenizer (and `probe.json`, these rows), which a run loads with
`target.source=DIR target.pretrain=false`; its attention window comes with it (config.json).
`--init DIR` continues training such a folder (same tokenizer required) instead of a fresh target.
Every run, trained or `--built`, runs on the config's `target.device` (auto: CUDA when visible; the flag
`--device` that restated it is gone: `target.device=cpu`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from ready.artifacts import atomic_dir
from ready.config import entry_point, load_config, replaced_flags
from ready.data import training_prompts
from ready.data.corpus import load_corpus
from ready.data.default import TOKENIZER_FILES, _arch_overrides, _preset, ensure_tokenizer
from ready.data.pretrain import _lm_loss, _optimizer, heldout_loss, insert_repeats, token_stream
from ready.data.tokenizer import load_tokenizer, special_token_ids
from ready.loading import PipelineConfigError, load_configured_target, pick_device, target_dir
from ready.target import load_target, save_target
from ready.target.config import PRESETS
from ready.train import greedy_responses
from ready.train.regen import as_prompt_tensor

COPIES = ((24, 8), (48, 8), (96, 32))
HELDOUT_WINDOWS = 16  # held-out loss over this many seq_len windows (a trend, cheap at every check)


def copy_prompts(prompts: torch.Tensor, source: int, lead: int) -> torch.Tensor:
    """Each row's first `source` tokens followed by its first `lead` again: [N, source + lead]."""
    if not 1 <= lead < source <= prompts.shape[1]:
        raise ValueError(f"copy task: lead {lead} and source {source} tokens with prompts of "
                         f"{prompts.shape[1]} tokens; expected 1 <= lead < source <= prompt length")
    return torch.cat([prompts[:, :source], prompts[:, :lead]], dim=1)


def copy_fidelity(data: Any, source: int, lead: int) -> float:
    """Share of response tokens that continue the copy (token i of the response = source token lead + i)."""
    n = min(data.response_len, source - lead)
    resp = data.tokens[:, data.prompt_len:data.prompt_len + n]
    want = data.tokens[:, lead:lead + n]
    valid = (torch.arange(n) < (data.lengths - data.prompt_len).clamp(min=0).unsqueeze(1))
    return float(((resp == want) & valid).sum() / valid.sum().clamp(min=1))


def fidelity(model: Any, segments: torch.Tensor, source: int, lead: int, new_tokens: int = 16) -> float:
    """Copy fidelity of `model`'s greedy continuation of each segment's first `source` tokens + first `lead`."""
    data = greedy_responses(model, copy_prompts(segments, source, lead), new_tokens, eos_id=None,
                            batch_size=segments.shape[0], progress=False)
    return round(copy_fidelity(data, source, lead), 4)


def _fidelities(model: Any, segments: torch.Tensor, rand_segments: torch.Tensor) -> dict[str, float]:
    out = {}
    for src, lead in COPIES:
        out[f"text_{src}_{lead}"] = fidelity(model, segments, src, lead)
        out[f"random_{src}_{lead}"] = fidelity(model, rand_segments, src, lead)
    return out


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> list[dict]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.diagnostics.copy_probe", description=__doc__.split("\n")[0])
    p.add_argument("--built", action="store_true", help="measure the config's built target; train nothing")
    p.add_argument("--data", choices=("text", "repeats", "random"), default="text")
    p.add_argument("--fraction", type=float, default=0.5, help="repeats: share of windows with a repeat")
    p.add_argument("--symbols", type=int, default=None, help="random: distinct ids (3, 4, ...; default: the whole vocabulary)")
    p.add_argument("--span", default="8,48", help="repeats/random: repeated span length LO,HI tokens (default 8,48)")
    p.add_argument("--max-gap", type=int, default=64, help="repeats/random: most tokens between a span and its repeat")
    p.add_argument("--prompts", type=int, default=64, help="segments per fidelity measurement (default 64)")
    p.add_argument("--batch", type=int, default=4, help="windows per step (default: the pretraining's 4)")
    p.add_argument("--lr", type=float, default=None, help="default: pretrain.lr")
    p.add_argument("--checks", default="640,1280,2560,5120", help="steps at which to measure (comma list)")
    p.add_argument("--seconds", type=float, default=None, help="also measure and stop after this many seconds")
    p.add_argument("--init", default=None, help="continue from this saved target (a --save folder) instead of a fresh one")
    p.add_argument("--save", default=None, help="write the trained target here as a checkpoint (a new folder)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("overrides", nargs="*", help="config overrides a.b=value (target.attention_window=16, ...)")
    replaced_flags(list(sys.argv[1:] if argv is None else argv), {"--device": "target.device"})
    args = p.parse_intermixed_args(argv)
    from omegaconf import OmegaConf

    try:
        span = tuple(int(x) for x in args.span.split(","))
    except ValueError:
        span = ()
    if len(span) != 2 or not 1 <= span[0] <= span[1] or args.max_gap < 0:
        raise SystemExit(f"error: --span {args.span!r} --max-gap {args.max_gap}: expected LO,HI with 1 <= LO <= HI "
                         "and a gap >= 0")
    if args.save and Path(args.save).exists():
        raise SystemExit(f"error: --save {args.save}: already exists; expected a new folder")
    if args.prompts < 1:
        raise SystemExit(f"error: --prompts {args.prompts}: expected an integer >= 1")
    checks = sorted({int(c) for c in args.checks.split(",") if c})
    if not checks or checks[0] < 1:
        raise SystemExit(f"error: --checks {args.checks!r}: expected a comma list of steps >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = load_config(overrides=args.overrides)
    try:
        device = pick_device(cfg)
    except PipelineConfigError as e:
        raise SystemExit(f"error: {e}") from None
    tok_dir = _built_tokenizer(cfg) if args.built else ensure_tokenizer(cfg, progress=True)
    tokenizer = load_tokenizer(tok_dir)
    corpus = load_corpus(cfg.corpus)
    eos = special_token_ids(tokenizer)["eos_token_id"]
    held = token_stream(corpus.heldout, tokenizer, eos)
    seq = int(cfg.pretrain.seq_len)
    segments = as_prompt_tensor(training_prompts(tokenizer, OmegaConf.merge(cfg.regen, {"num_samples": args.prompts, "prompt_len": 128}),
                                                 split="validation", corpus_cfg=cfg.corpus))
    vocab = len(tokenizer)
    symbols = vocab - 3 if args.symbols is None else args.symbols
    if args.data == "random" and not 4 <= symbols <= vocab - 3:
        raise SystemExit(f"error: --symbols {args.symbols}: expected 4..{vocab - 3} (ids 3.. of the {vocab}-token vocabulary)")
    hi = min(symbols + 3, vocab)
    rand_segments = torch.randint(3, hi, (args.prompts, 128), generator=torch.Generator().manual_seed(5))
    if args.built:
        model = load_configured_target(cfg, progress=True).target.eval()
        pretrained = bool(cfg.target.pretrain) and str(cfg.target.source) in PRESETS
        row: dict[str, Any] = {"data": "built", "source": str(cfg.target.source),
                               "step": int(cfg.pretrain.steps) if pretrained else None,
                               "heldout_loss": round(heldout_loss(model, held, seq, HELDOUT_WINDOWS), 3)}
        row.update(_fidelities(model, segments, rand_segments))
        print(json.dumps(row), flush=True)
        return [row]
    train = token_stream(corpus.train, tokenizer, eos)
    torch.manual_seed(int(cfg.pretrain.seed))
    if args.init:
        _check_same_tokenizer(Path(args.init), tok_dir)
        model = load_target(args.init, device=device, dtype=torch.float32)
    else:
        model = load_target(_preset(cfg), overrides=_arch_overrides(cfg, tok_dir), device=device, dtype=torch.float32)
    lr = float(args.lr if args.lr is not None else cfg.pretrain.lr)
    opt = _optimizer(model, OmegaConf.merge(cfg.pretrain, {"lr": lr}))
    gen, copy_gen = torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)
    rows: list[dict] = []
    t0, step = time.time(), 0
    model.train()
    while step < checks[-1]:
        step += 1
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, step / 100)
        if args.data == "random":
            w = insert_repeats(torch.randint(3, hi, (args.batch, seq + 1), generator=gen), 1.0, copy_gen,
                               span, args.max_gap, fill=(3, hi))
        else:
            starts = torch.randint(0, train.numel() - seq - 1, (args.batch,), generator=gen)
            w = torch.stack([train[s:s + seq + 1] for s in starts.tolist()])
            if args.data == "repeats":
                w = insert_repeats(w, args.fraction, copy_gen, span, args.max_gap)
        w = w.to(device)
        loss = _lm_loss(model, w)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), float(cfg.pretrain.grad_clip))
        opt.step()
        late = args.seconds is not None and time.time() - t0 > args.seconds
        if step in checks or late:
            model.eval()
            row = {"data": args.data, "batch": args.batch, "step": step, "s": round(time.time() - t0),
                   "loss": round(loss.item(), 3), "heldout_loss": round(heldout_loss(model, held, seq, HELDOUT_WINDOWS), 3)}
            row.update(_fidelities(model, segments, rand_segments))
            model.train()
            rows.append(row)
            print(json.dumps(row), flush=True)
            if late:
                break
    if args.save:
        _save(model, tok_dir, Path(args.save), {"argv": list(argv) if argv is not None else sys.argv[1:], "rows": rows})
    return rows


def _built_tokenizer(cfg: Any) -> Path:
    """The tokenizer the built target was trained with: the checkpoint's own for a local source."""
    if str(cfg.target.source) in PRESETS and not cfg.target.pretrain:
        raise SystemExit(f"error: --built with target.source={cfg.target.source} target.pretrain=false: a randomly "
                         "initialised preset copies nothing; expected a pretrained preset or a checkpoint folder")
    return Path(target_dir(cfg, progress=True))


def _check_same_tokenizer(init: Path, tok_dir: Path) -> None:
    """--init must have been trained with the tokenizer this run uses (same ids, same meaning)."""
    theirs = init / "tokenizer.json"
    if not theirs.is_file():
        raise SystemExit(f"error: --init {init}: no tokenizer.json; expected a folder written by copy_probe --save")
    if theirs.read_bytes() != (tok_dir / "tokenizer.json").read_bytes():
        raise SystemExit(f"error: --init {init}: its tokenizer differs from this run's ({tok_dir}); expected a target "
                         "saved on a machine with the same corpus")


def _save(model: Any, tok_dir: Path, out: Path, meta: dict) -> None:
    """`model` + the tokenizer files as a checkpoint folder, atomically (nothing half-written stays)."""
    import os
    import shutil

    with atomic_dir(out) as tmp:
        saved = save_target(model.eval(), tmp / "model", tokenizer=None)
        for f in saved.iterdir():
            os.replace(f, tmp / f.name)
        saved.rmdir()
        for name in TOKENIZER_FILES:
            shutil.copy2(tok_dir / name, tmp / name)
        (tmp / "probe.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"[copy_probe] saved the trained target to {out}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
