"""Does the reader learn anything from the states? A one-seed pilot, in minutes instead of a sweep.

    python -m benchmarks.diagnostics.reader_pilot [--drafter DIR] [a.b=value ...]
    # in the positive control's setting (experiments/profiles/state_context.yaml):
    python -m benchmarks.diagnostics.reader_pilot 'drafter.context_layers=[-1]' drafter.context_window=1 \
        train.base.samples=3200 train.stage1.samples=384 train.stage1.lr=0.003

From the base DSpark drafter of the config (built if missing, cached like a sweep's), it trains
stage 1 (the reader alone, drafter frozen) twice, with the row's own states (ReaDy) and with another
sequence's (the state placebo), and measures teacher-forced τ on the held-out regenerated sequences
(`heldout_tf/tau`, thousands of blocks). With `--drafter DIR` it skips training and probes that
trained ReaDy drafter instead. For a ReaDy reader it also reports:

- `dh_over_h`: |Δh| / |h|, how far the reader moves the hidden state;
- `tau_no_reader`: τ with Δh = 0 (what the reader adds at all);
- `tau_other_states`: τ with the states of another block of the batch (what the states add).

A reader that moves h but whose τ does not change with Δh = 0 or with other states has learned a
state-independent shift (positive control v3: `git show b5af749:docs/findings.md`). Prints JSON; one seed, so compare
differences with the standard error of τ (≈ 0.02 on 128 sequences), not as a finding.

`--task copy` asks the capacity question on text where the states are all that matters: every
prompt is a corpus segment followed by its own first `--copy-lead` tokens (`benchmarks.diagnostics.copy_probe.copy_prompts`), so a
target that copies continues the segment from `--copy-source` tokens back, beyond a windowed
target's attention and the drafter's context window; only the GDN states carry it. Training and
held-out sequences are both built that way (train and validation splits), and `copy_fidelity` says
how much of the target's response is the copy. A reader that can read states must beat the placebo
by far there; one that cannot is broken, not starved of signal.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import torch

from benchmarks.diagnostics.copy_probe import copy_fidelity, copy_prompts
from benchmarks.diagnostics.heldout_setup import heldout_setup
from ready.config import entry_point, merge
from ready.data import training_prompts
from ready.drafter import load_drafter
from ready.reader import StateSource
from ready.train.pipeline import ensure_base_drafter
from ready.train.regen import as_prompt_tensor, build_regen_data
from ready.train.stages import stage_seed, train_stage
from ready.train.teacher_forced import teacher_forced_acceptance


@contextlib.contextmanager
def reader_ablation(drafter: Any, mode: str, record: Optional[list] = None) -> Iterator[None]:
    """Inside: every reader of `drafter` runs as `mode` says. "own": as trained (with `record`, each
    call appends (|Δh|, |h|) means); "none": Δh = 0; "other": it reads the states of another block
    (the slots rolled by half the batch, so another sequence's)."""
    if mode not in ("own", "none", "other"):
        raise ValueError(f"reader ablation {mode!r}: expected own, none or other")
    readers = list(drafter.readers.values())
    saved = [(r, r.delta) for r in readers]

    def patched(real: Any):
        def delta(h: torch.Tensor, source: StateSource) -> torch.Tensor:
            if mode == "none":
                return torch.zeros_like(h)
            if mode == "other":
                n = source.slots.numel()
                source = StateSource(source.ssm, source.layer_idx, source.slots.roll(max(1, n // 2)))
            out = real(h, source)
            if record is not None:
                record.append((out.float().norm(dim=-1).mean().item(), h.float().norm(dim=-1).mean().item()))
            return out
        return delta

    for r, real in saved:
        r.delta = patched(real)
    try:
        yield
    finally:
        for r, _ in saved:
            del r.delta  # the instance attribute goes; the class method is back


def probe(drafter: Any, target: Any, val: Any) -> dict[str, float]:
    """Teacher-forced τ of a ReaDy drafter as trained, with Δh = 0 and with another block's states."""
    def tau() -> float:
        return float(teacher_forced_acceptance(drafter, target, val, progress=False)["tau"])

    norms: list = []
    with reader_ablation(drafter, "own", norms):
        out = {"tau": tau()}
    out["dh_over_h"] = sum(a for a, _ in norms) / max(1e-12, sum(b for _, b in norms))
    with reader_ablation(drafter, "none"):
        out["tau_no_reader"] = tau()
    with reader_ablation(drafter, "other"):
        out["tau_other_states"] = tau()
    return out


def _copy_data(cfg: Any, loaded: Any, split: str, n: int, source: int, lead: int) -> Any:
    """Target-regenerated copy sequences from `n` prompts of `split` (cached like any regen data)."""
    from omegaconf import OmegaConf

    rcfg = OmegaConf.merge(cfg, {"regen": {"num_samples": n, "prompt_len": source + lead}})
    base = as_prompt_tensor(training_prompts(loaded.tokenizer, OmegaConf.merge(rcfg.regen, {"prompt_len": source}),
                                             split=split, corpus_cfg=cfg.corpus))
    return build_regen_data(rcfg, loaded.target, loaded.tokenizer, prompts=copy_prompts(base, source, lead),
                            progress=True)[0]


def _loss_ends(losses: Sequence[float]) -> list[float]:
    """Mean loss of the first and the last tenth of the steps (single steps are too noisy)."""
    k = max(1, len(losses) // 10)
    return [sum(losses[:k]) / k, sum(losses[-k:]) / k] if losses else []


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.diagnostics.reader_pilot", description=__doc__.split("\n")[0])
    p.add_argument("--drafter", default=None, help="probe this trained ReaDy drafter instead of training stage 1")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--task", choices=("text", "copy"), default="text",
                   help="text: the config's regenerated data (default); copy: segments repeated (see above)")
    p.add_argument("--copy-source", type=int, default=96, help="copy task: tokens of the segment (default 96)")
    p.add_argument("--copy-lead", type=int, default=32, help="copy task: tokens repeated in the prompt (default 32)")
    p.add_argument("overrides", nargs="*", help="config overrides a.b=value")
    args = p.parse_args(argv)

    cfg, loaded, val = heldout_setup(args.overrides, args.threads, 2, "τ is measured")
    if args.drafter:
        drafter = load_drafter(args.drafter, loaded.target).eval()
        if not len(drafter.readers):
            raise SystemExit(f"error: --drafter {args.drafter}: has no state reader; expected a ReaDy drafter")
        out: dict[str, Any] = {"drafter": args.drafter, "ready": probe(drafter, loaded.target, val)}
        print(json.dumps(out))
        return out
    base = Path(ensure_base_drafter(cfg, loaded.target, loaded.tokenizer, progress=True))
    out = {"task": args.task}
    if args.task == "copy":
        src, lead = args.copy_source, args.copy_lead
        data = _copy_data(cfg, loaded, "train", int(cfg.regen.num_samples), src, lead)
        val = _copy_data(cfg, loaded, "validation", int(cfg.eval.heldout_tf_samples), src, lead)
        out["copy_fidelity"] = {"train": copy_fidelity(data, src, lead), "heldout": copy_fidelity(val, src, lead)}
        print(f"[reader_pilot] copy fidelity {json.dumps(out['copy_fidelity'])}", file=sys.stderr, flush=True)
    else:
        data, _ = build_regen_data(cfg, loaded.target, loaded.tokenizer, progress=True)
    out["base"] = float(teacher_forced_acceptance(load_drafter(base, loaded.target), loaded.target, val,
                                                   progress=False)["tau"])
    for name, states in (("ready", "own"), ("placebo", "shuffled")):
        c = merge(cfg, {"reader": {"enabled": True, "states": states}})
        torch.manual_seed(stage_seed(int(cfg.seed), "stage1"))
        drafter = load_drafter(base, loaded.target, reader_cfg=c.reader)
        with tempfile.TemporaryDirectory() as work:
            r = train_stage("stage1", drafter, loaded.target, data, c, work, progress=True)
        drafter.eval()
        out[name] = probe(drafter, loaded.target, val) if states == "own" else {
            "tau": float(teacher_forced_acceptance(drafter, loaded.target, val, progress=False)["tau"])}
        out[name]["loss_first_last_tenth"] = _loss_ends(r.losses)
        print(f"[reader_pilot] {name}: {json.dumps(out[name])}", file=sys.stderr, flush=True)
    out["ready_minus_placebo"] = out["ready"]["tau"] - out["placebo"]["tau"]
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
