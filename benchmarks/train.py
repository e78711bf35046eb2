"""Benchmark of the training pipeline on the embedded default; prints JSON.

    python -m benchmarks.train [--variants N] [--limit N] [key=value ...]

Builds (or reuses) the pretrained tiny target, the regenerated data and the base DSpark
drafter, evaluates AR, the n-gram drafter and the base drafter on the configured suites
(HumanEval prompts and held-out corpus slices), then trains N ReaDy variants (reader ranks
8, 16, ... up to d_k; stage 1 + stage 2) and evaluates each. Reports tau per suite, whether every
speculative output was token-identical to AR greedy, the training losses, and the wall time
of every phase (cold when the artifacts folder is empty, warm otherwise).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from ready.config import entry_point, load_config, merge
from ready.data import ensure_default_target, load_suite
from ready.data.tokenizer import load_tokenizer
from ready.decode import NgramDrafter, evaluate, run_ar
from ready.drafter import load_drafter
from ready.target import load_target
from ready.train.pipeline import ensure_base_drafter, read_train_log, train_variant
from ready.train.regen import build_regen_data


def _timed(times: dict, key: str, fn, *args, **kw):
    t0 = time.perf_counter()
    out = fn(*args, **kw)
    times[key] = round(time.perf_counter() - t0, 2)
    return out


def _evaluate(target: Any, drafter: Any, suites: dict, cfg: Any, ar: dict, name: str) -> dict:
    out = {}
    for suite, prompts in suites.items():
        res = evaluate(target, drafter, [p.ids for p in prompts], int(cfg.eval.max_new_tokens), benchmark=suite,
                       method=name, eos_token_id=ar["eos"], warmup=0, progress=False, ar=ar[suite])
        out[suite] = {"tau": res.metrics.tau, "lossless": res.lossless,
                      "survival": [None if s is None else round(s, 3) for s in res.metrics.survival]}
    return out


@entry_point
def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", type=int, default=1, help="ReaDy variants to train after the base drafter")
    p.add_argument("--control", action="store_true", help="also train the no-state control (LoRA only)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("overrides", nargs="*", help="config overrides a.b=value")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = load_config(overrides=args.overrides)

    times: dict[str, float] = {}
    t_all = time.perf_counter()
    tdir = _timed(times, "target_s", ensure_default_target, cfg)
    target = load_target(str(tdir), device="cpu", dtype=torch.float32).eval()
    tokenizer = load_tokenizer(tdir)
    _timed(times, "regen_s", build_regen_data, cfg, target, tokenizer)
    base_dir = _timed(times, "base_s", ensure_base_drafter, cfg, target, tokenizer)
    base_log = read_train_log(base_dir) if (Path(base_dir).parent / "train.json").is_file() else {}

    suites = {s: load_suite(s, cfg.bench, tokenizer, cfg.corpus) for s in cfg.bench.suites}
    eos = tokenizer.eos_token_id
    t0 = time.perf_counter()
    ar = {s: run_ar(target, [torch.tensor(x.ids) for x in ps], int(cfg.eval.max_new_tokens), eos_token_id=eos,
                    warmup=0, progress=False) for s, ps in suites.items()}
    ar["eos"] = eos
    times["eval_ar_s"] = round(time.perf_counter() - t0, 2)
    result: dict[str, Any] = {"config": {"train": OmegaConf.to_container(cfg.train), "regen": OmegaConf.to_container(cfg.regen),
                                         "drafter": OmegaConf.to_container(cfg.drafter)}}
    result["ngram"] = _timed(times, "eval_ngram_s", _evaluate, target, NgramDrafter(target.config.vocab_size,
                             int(cfg.drafter.proposals)), suites, cfg, ar, "ngram")
    base = load_drafter(base_dir, target)
    result["dspark"] = _timed(times, "eval_dspark_s", _evaluate, target, base, suites, cfg, ar, "dspark")
    result["dspark"]["train_first_loss"] = base_log.get("first_loss")
    result["dspark"]["train_last_loss"] = base_log.get("last_loss")

    d_k = int(target.config.linear_key_head_dim)  # ranks above d_k do not exist: take the next ones that do
    ranks = [r for r in (8, 16, 32, 64, 128, 4, 2, 1) if r <= d_k][: args.variants]
    runs = [(f"ready_r{r}", {"reader": {"rank": r}}) for r in ranks]
    if args.control:
        runs.append(("control", {"reader": {"enabled": False}}))
    for name, layer in runs:
        vcfg = merge(cfg, layer)
        out = Path(cfg.artifacts_dir) / "bench_variants" / name
        final = _timed(times, f"train_{name}_s", train_variant, vcfg, target, tokenizer, base_dir, out)
        log1 = read_train_log(next(out.glob("stage1-*")) / "drafter")
        log2 = read_train_log(final)
        result[name] = _timed(times, f"eval_{name}_s", _evaluate, target, load_drafter(final, target), suites, vcfg, ar, name)
        result[name]["stage1_loss"] = [log1.get("first_loss"), log1.get("last_loss")]
        result[name]["stage2_loss"] = [log2.get("first_loss"), log2.get("last_loss")]
    times["total_s"] = round(time.perf_counter() - t_all, 2)
    result["times"] = times
    result["threads"] = torch.get_num_threads()
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
