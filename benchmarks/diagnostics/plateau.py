"""Where training stops paying: held-out loss and teacher-forced tau against each stage's budget.

    python -m benchmarks.diagnostics.plateau [--base 25,50,100,200,400] [--stage1 4,8,16,32,64] [key=value ...]

Every budget is its own training run with its own warmup + cosine schedule (a point on the curve
is what a run of that many steps ends at, not the middle of a longer run). Stage 2 always gets
2.5 x stage 1's steps (the paper's 20k : 50k samples). The adaptation curves start from the base
drafter that `train.base` builds (cached), for ReaDy (the configured reader) and for the FT
control (reader off). Each point is measured on held-out regenerated sequences of the validation
split (`eval.heldout_tf_samples` of them): the training loss and the teacher-forced tau. Curves go
to MLflow (experiment `ready-plateau`, one run per curve, the budget as the step) and the JSON
summary to stdout; docs/figures.md "Training budgets" records the curves the defaults were chosen from.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from omegaconf import OmegaConf

from benchmarks.diagnostics.heldout_setup import heldout_setup
from ready.config import entry_point, merge
from ready.drafter import DSparkDrafter, load_drafter
from ready.train.lora import has_lora, merge_lora_
from ready.train.pipeline import ensure_base_drafter
from ready.train.regen import build_regen_data
from ready.train.stages import evaluate_loss, stage_seed, train_stage
from ready.train.teacher_forced import teacher_forced_acceptance
from reports import mlflow_store

STAGE2_RATIO = 2.5  # stage 2 : stage 1 steps (paper: 50k : 20k samples)


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"error: {text!r}: expected comma-separated step counts, e.g. 25,50,100") from None
    if not values or min(values) < 1:
        raise SystemExit(f"error: {text!r}: expected step counts >= 1")
    return values


def _measure(drafter: Any, target: Any, val: Any, cfg: Any) -> dict[str, float]:
    loss = evaluate_loss(drafter, target, val, cfg, num=len(val), anchors_per_sample=8)
    tf = teacher_forced_acceptance(drafter, target, val, progress=False)
    return {"heldout_loss": float(loss), "heldout_tf_tau": float(tf["tau"])}


def _with_steps(cfg: Any, stage: str, steps: int) -> Any:
    sc = getattr(cfg.train, stage)
    return merge(cfg, {"train": {stage: {"samples": int(steps) * int(sc.batch_size)}}})


def base_curve(cfg: Any, target: Any, data: Any, val: Any, budgets: list[int], log: Callable) -> list[dict]:
    """Final held-out metrics of a base DSpark drafter trained from scratch for each budget."""
    points = []
    for steps in budgets:
        c = _with_steps(cfg, "base", steps)
        torch.manual_seed(stage_seed(int(c.train.base_seed), "base"))
        drafter = DSparkDrafter(c.drafter, OmegaConf.merge(c.reader, {"enabled": False}), target)
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as work:
            res = train_stage("base", drafter, target, data, c, work, progress=False)
        point = {"steps": steps, "train_s": round(time.perf_counter() - t0, 1), "last_train_loss": res.last_loss,
                 **_measure(drafter, target, val, c)}
        log("base", point)
        points.append(point)
    return points


def adaptation_curve(cfg: Any, target: Any, data: Any, val: Any, base_dir: Path, budgets: list[int],
                     method: str, log: Callable) -> list[dict]:
    """Final held-out metrics after stage 1 (s steps) + stage 2 (2.5 s steps) from one base drafter."""
    reader = OmegaConf.merge(cfg.reader, {"enabled": method == "ready"})
    points = []
    for s1 in budgets:
        s2 = max(1, round(STAGE2_RATIO * s1))
        c = _with_steps(_with_steps(merge(cfg, {"reader": OmegaConf.to_container(reader)}), "stage1", s1), "stage2", s2)
        torch.manual_seed(stage_seed(int(c.seed), "stage1"))
        drafter = load_drafter(base_dir, target, reader_cfg=c.reader)
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as work:
            train_stage("stage1", drafter, target, data, c, Path(work) / "s1", progress=False)
            after1 = _measure(drafter, target, val, c)
            if has_lora(drafter):  # as the pipeline saves it: the control's stage-1 adapters land in the backbone
                merge_lora_(drafter)
            res = train_stage("stage2", drafter, target, data, c, Path(work) / "s2", progress=False)
        point = {"stage1_steps": s1, "stage2_steps": s2, "train_s": round(time.perf_counter() - t0, 1),
                 "after_stage1": after1, "last_train_loss": res.last_loss, **_measure(drafter, target, val, c)}
        log(f"adapt_{method}", point)
        points.append(point)
    return points


def _mlflow_logger(uri: Optional[str], cfg: Any) -> tuple[Callable, Callable]:
    """(log(curve, point), close()) writing one MLflow run per curve, the budget as the step."""
    if not uri:
        return (lambda curve, point: None), (lambda: None)
    c = mlflow_store.client(mlflow_store.resolve_tracking_uri(uri))
    exp = mlflow_store.ensure_experiment(c, "plateau")
    runs: dict[str, str] = {}

    def log(curve: str, point: dict) -> None:
        if curve not in runs:
            run = c.create_run(exp, run_name=curve, tags={"ready.kind": "plateau", "ready.curve": curve})
            runs[curve] = run.info.run_id
            for k, v in mlflow_store.flatten(cfg).items():
                c.log_param(run.info.run_id, k, v[:6000])
        step = int(point.get("steps", point.get("stage1_steps")))
        for k in ("heldout_loss", "heldout_tf_tau", "train_s"):
            c.log_metric(runs[curve], f"plateau/{k}", float(point[k]), step=step)

    def close() -> None:
        for rid in runs.values():
            c.set_terminated(rid, "FINISHED")

    return log, close


@entry_point
def main(argv: Optional[list[str]] = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.diagnostics.plateau", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", default="25,50,100,200,400", help="base drafter budgets in optimizer steps")
    p.add_argument("--stage1", default="4,8,16,32,64", help="stage 1 budgets in steps (stage 2 gets 2.5x)")
    p.add_argument("--only", choices=("base", "adapt"), default=None, help="measure one kind of curve only")
    p.add_argument("--methods", default="ready,ft", help="adaptation curves to measure (ready, ft)")
    p.add_argument("--tracking-uri", default="sqlite:///mlflow.db", help="MLflow store ('' = none)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("overrides", nargs="*", help="config overrides a.b=value")
    args = p.parse_args(argv)

    cfg, loaded, val = heldout_setup(args.overrides, args.threads, 2, "the curves are measured")
    data, _ = build_regen_data(cfg, loaded.target, loaded.tokenizer, progress=True)
    log_run, close = _mlflow_logger(args.tracking_uri, cfg)

    def log(curve: str, point: dict) -> None:
        print(f"[plateau] {curve}: {json.dumps(point)}", file=sys.stderr, flush=True)
        log_run(curve, point)

    out: dict[str, Any] = {"config": {"train": OmegaConf.to_container(cfg.train), "regen": OmegaConf.to_container(cfg.regen)},
                           "validation_sequences": len(val), "threads": args.threads}
    try:
        if args.only in (None, "base"):
            out["base"] = base_curve(cfg, loaded.target, data, val, _ints(args.base), log)
        if args.only in (None, "adapt"):
            base_dir = Path(ensure_base_drafter(cfg, loaded.target, loaded.tokenizer, progress=True))
            for method in [m for m in args.methods.split(",") if m in ("ready", "ft")]:
                out[f"adapt_{method}"] = adaptation_curve(cfg, loaded.target, data, val, base_dir, _ints(args.stage1),
                                                          method, log)
    finally:
        close()
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
