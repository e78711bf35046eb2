"""What a training run at paper scale costs, measured on random weights; prints one JSON object.

    python -m benchmarks.train_scale --target qwen3_5_27b --json
    python -m benchmarks.train_scale --target tiny --quick --json target.device=cpu   # plumbing check, seconds

No checkpoint is needed: the target is the preset's architecture with random weights, in the config's
`target.dtype` on its `target.device` (qwen3_5_27b: bfloat16 on CUDA; tiny: float32, CUDA when visible),
and the drafter has the preset's DSpark shape (experiments/presets/<target>.yaml: for qwen3_5_27b the
public 27B DSpark layout), also random. Sections (`--sections`, default all):

- `regen`: the target regenerating responses through the batched greedy engine
  (ready.decode.engine.Engine with B slots, as ready.train.conversations regenerates assistant turns): B random
  prompts of P tokens (B: the config's regen.batch_size; 2 with `--quick`), R new tokens each, one
  timed call after a warm-up call (CUDA graphs captured).
  No row stops early (random weights have no learned end-of-turn, and no stop token is set), so every row
  decodes its full budget and `tokens_per_s` = B * R / wall time is a fair throughput figure.
  `--regen-admit-tokens 0,8192`: the same at each admission budget (one prefill per row against right-padded
  passes of up to 8,192 tokens, `Engine(admit_tokens=)`), paired ABBA in one process.
- `prefill`: batch-1 prefill (`target.prefill`, LM head included) over prompts of each `--prefill-lengths`,
  against the bf16 tensor-core bound 2 * matmul parameters * tokens / `--peak-flops` (default 989e12 on
  CUDA, H200 dense bf16; no bound on CPU). Matmul parameters leave out the embedding table (a gather, as
  benchmarks.target leaves it out of the streamed bytes); attention FLOPs are not counted.
- `train`: for `base` (DSpark from scratch, every drafter parameter), `stage1` (the reader only) and
  `stage2` (reader + LoRA on the drafter): `--warmup-steps` untimed then `--train-steps` timed optimizer
  steps of ready.train.stages.train_stage itself (teacher pass on the frozen target, drafter forward_train
  under its autocast, draft_loss, AdamW, clipping, schedule; `checkpoints=False`: no checkpoint writes)
  on random rows of `--train-seq-len` tokens, `--train-batch` rows per step, run in micro-batches of at
  most `train.micro_batch_size` rows (gradient accumulation; 4 in the paper_recipe profile, 0 = the whole
  batch in one pass). Reports samples/s, tokens/s, s/step, peak GPU memory per stage (reset before each;
  the target's weights are part of it), trainable parameters, the micro-batch size and the precision setup.

A section or stage that fails (e.g. out of GPU memory) is reported with an `error` (also listed in
`errors`, traceback on stderr), the others still run, and the command exits with status 1.
- `recipe`: the paper's recipe (the preset + experiments/profiles/paper_recipe.yaml: regenerate 70k
  conversations, stage 1 on 20k samples, stage 2 on 50k; the base drafter is the public DSpark
  checkpoint, so no base training) extrapolated from the measured rates to each of `--gpus` (data
  parallel), with its `assumptions`; and the base drafter from scratch per 10k samples.

The typed config is the command line: positional `a.b=v` overrides go to the config (schema <- base.yaml <-
preset <- profile <- `--quick`'s regen.batch_size=2 <- overrides; `ready.config.load_config`, parsed and checked
as `python -m sweeps.run` does), e.g. `train.stage1.anchors_per_sample=64` or `reader.rank=16`. The flags that
restated config keys are gone, each refused in one line naming its override: `--device D` is `target.device=D`,
`--dtype T` `target.dtype=T`, `--regen-batch B` `regen.batch_size=B`, `--micro-batch M`
`train.micro_batch_size=M`. The measured sizes (`--regen-prompt-len`, `--train-seq-len`, ...) are the
benchmark's own flags.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from ready.config import ConfigError, entry_point, load_config, preset_names, replaced_flags
from ready.decode.engine import Engine
from ready.drafter import DSparkDrafter
from ready.loading import PipelineConfigError, pick_device
from ready.target import PRESETS, load_target, preset_config
from ready.train.regen import RegenData
from ready.train.stages import stage_seed, train_stage

H200_BF16_DENSE_FLOPS = 989e12  # H200 SXM dense bf16 tensor-core peak (no sparsity)
SECTIONS = ("regen", "prefill", "train")
TRAIN_STAGES = ("base", "stage1", "stage2")
NO_STOP = -1  # no token has id -1: every regenerated row decodes its whole budget
DEFAULT_PROFILE = "paper_recipe"
# the flags that restated config keys, and the override that says each now (ready.config.replaced_flags)
REPLACED = {"--device": "target.device", "--dtype": "target.dtype", "--regen-batch": "regen.batch_size",
            "--micro-batch": "train.micro_batch_size"}

# sizes: the paper-scale defaults, and --quick (tiny target on CPU, seconds; with QUICK_CONFIG, a config layer
# under the command line's overrides)
FULL = dict(regen_prompt_len=512, regen_response_len=256, prefill_lengths="1024,8192",
            prefill_repeats=2, train_seq_len=2048, train_batch=4, train_prompt_len=1, warmup_steps=2,
            train_steps=3)
QUICK = dict(regen_prompt_len=16, regen_response_len=8, prefill_lengths="32,64",
             prefill_repeats=1, train_seq_len=48, train_batch=2, train_prompt_len=1, warmup_steps=1,
             train_steps=1)
QUICK_CONFIG = ("regen.batch_size=2",)


class TrainScaleError(ValueError):
    """A benchmark argument is unusable; the message names it and what was expected."""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _failure(e: BaseException, what: str) -> str:
    """One line for a section or stage that failed (its traceback goes to stderr): the run goes on, so one
    failure on the GPU host still leaves the other figures."""
    traceback.print_exc(file=sys.stderr)
    first = (str(e).strip().splitlines() or [""])[0][:300]
    if isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in first.lower():
        return f"out of GPU memory {what}: {first}"
    return f"{type(e).__name__} {what}: {first}"


# --- config and models ------------------------------------------------------------------------------

def bench_config(preset: str, profile: Optional[str] = DEFAULT_PROFILE, overrides: Sequence[str] = ()) -> DictConfig:
    """The preset's config with the profile's `config:` layer and `a.b=v` overrides, validated
    (`ready.config.load_config`); `--target` names the preset."""
    if preset not in preset_names():
        raise TrainScaleError(f"--target {preset!r}: no experiments/presets/{preset}.yaml; expected one of {preset_names()}")
    return load_config(preset=preset, profile=profile, overrides=overrides)


def random_target(preset: str, device: str, dtype: str) -> Any:
    """The preset's target architecture with random weights (seed 0), frozen."""
    if preset not in PRESETS:
        raise TrainScaleError(f"--target {preset!r}: not a target architecture preset; expected one of {sorted(PRESETS)}")
    torch.manual_seed(0)
    target = load_target(preset, device=device, dtype=dtype)
    for p in target.parameters():
        p.requires_grad_(False)
    return target.eval()


def matmul_params(target: Any) -> int:
    """Parameters a token's forward multiplies by: all of them but the embedding table (a gather)."""
    total = sum(p.numel() for p in target.parameters())
    emb = target.embed_tokens.weight
    tied = target.lm_head.weight is emb
    return total if tied else total - emb.numel()


def make_drafter(stage: str, cfg: DictConfig, target: Any) -> torch.nn.Module:
    """A random drafter of the config's DSpark shape as ready.train.pipeline builds it for `stage`:
    reader off for `base`, on (cfg.reader) for stage 1 and 2; fp32 parameters on the target's device."""
    reader = OmegaConf.merge(cfg.reader, {"enabled": False}) if stage == "base" else cfg.reader
    seed = stage_seed(int(cfg.train.base_seed), "base") if stage == "base" else stage_seed(int(cfg.seed), "stage1")
    torch.manual_seed(seed)
    return DSparkDrafter(cfg.drafter, reader, target).to(target.embed_tokens.weight.device)


def random_rows(vocab: int, rows: int, seq_len: int, prompt_len: int, seed: int = 0) -> Any:
    """`rows` random training sequences of `seq_len` tokens whose tokens from `prompt_len` on are trainable
    (prompt_len 1 = conversation rows whose every token may be an anchor's label)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (rows, seq_len), generator=g)
    return RegenData(tokens=tokens, prompt_len=prompt_len, lengths=torch.full((rows,), seq_len, dtype=torch.long))


# --- regeneration and prefill -----------------------------------------------------------------------

def bench_regen(target: Any, batch: int, prompt_len: int, response_len: int, seed: int = 0,
                progress: bool = True, admit_tokens: Optional[int] = None) -> dict:
    """Greedy regeneration throughput of `batch` random prompts through the engine (one timed call).
    `admit_tokens`: the engine's admission passes (`Engine(admit_tokens=)`; None: its default)."""
    g = torch.Generator().manual_seed(seed)
    prompts = list(torch.randint(0, int(target.config.vocab_size), (batch, prompt_len), generator=g))
    engine = Engine(target, None, batch_size=batch, eos_token_id=NO_STOP, admit_tokens=admit_tokens)
    engine.reserve(prompt_len + response_len)  # the timed call reuses these buffers and graphs
    t0 = time.perf_counter()
    engine.decode(prompts, min(4, response_len))  # warm-up: allocation, graph capture
    warmup_s = time.perf_counter() - t0
    res = engine.decode(prompts, response_len, progress=progress, desc="regen (timed)")
    prefill_s = sum(gen.prefill_s for gen in res.generations)
    decode_s = res.wall_s - prefill_s
    full = sum(len(gen.tokens) == response_len for gen in res.generations)
    out = {
        "batch": batch, "prompt_len": prompt_len, "response_len": response_len,
        "new_tokens": res.new_tokens, "wall_s": res.wall_s, "warmup_s": warmup_s,
        "tokens_per_s": res.tokens_per_s, "sequences_per_s": batch / res.wall_s,
        "admit_tokens": getattr(engine.slots, "admit_tokens", 0),  # one slot: no admission passes
        "prefill_s": prefill_s, "prompt_tokens_per_s": batch * prompt_len / prefill_s if prefill_s > 0 else None,
        "decode_tokens_per_s": res.new_tokens / decode_s if decode_s > 0 else None,
        "rounds": res.rounds, "rows_full_budget": full,
        "note": ("random weights have no learned end-of-turn and no stop token is set, so every row decodes its "
                 "full budget: throughput per token at concurrency B; real turns stop at end-of-turn and their "
                 "slot takes the next conversation"),
    }
    del engine, res
    return out


def bench_regen_admission(target: Any, batch: int, prompt_len: int, response_len: int, budgets: Sequence[int],
                          progress: bool = True) -> dict:
    """`bench_regen` at each admission budget, paired in one process on the same target and prompts, in ABBA
    order (the list, then reversed); each budget's figures are the mean of its two runs. The section's top-level
    figures are the last budget's (what the recipe estimate reads)."""
    order = list(budgets) + list(reversed(budgets))
    runs = [bench_regen(target, batch, prompt_len, response_len, progress=progress, admit_tokens=b) for b in order]
    keys = ("wall_s", "tokens_per_s", "prefill_s", "prompt_tokens_per_s", "decode_tokens_per_s")
    by: dict[str, dict] = {}
    for b in budgets:
        mine = [r for r, asked in zip(runs, order) if asked == b]
        by[str(b)] = {k: statistics.fmean(r[k] for r in mine) for k in keys if all(r[k] is not None for r in mine)}
    last = [r for r, asked in zip(runs, order) if asked == budgets[-1]][-1]
    return {**last, **by[str(budgets[-1])], "order": order, "by_admit_tokens": by}


def bench_prefill(target: Any, lengths: Sequence[int], peak_flops: Optional[float], repeats: int = 2,
                  progress: bool = True) -> dict:
    """Batch-1 prefill tokens/s at each length (median of `repeats` after a warm-up), against the
    tensor-core bound when `peak_flops` is given."""
    dev = target.embed_tokens.weight.device
    n = matmul_params(target)
    out: dict[str, Any] = {"matmul_params": n, "peak_flops": peak_flops, "lengths": {}}
    bound = peak_flops / (2.0 * n) if peak_flops else None
    if bound is not None:
        out["bound_tokens_per_s"] = bound
        out["bound_note"] = "2 x matmul parameters FLOP per token at peak_flops; attention FLOPs not counted"
    g = torch.Generator().manual_seed(1)
    for L in tqdm(list(lengths), desc="prefill", unit="length", disable=not progress):
        ids = torch.randint(0, int(target.config.vocab_size), (1, L), generator=g).to(dev)
        cache = target.new_cache(1, L + 1)
        target.prefill(ids, cache)  # warm-up
        times = []
        for _ in range(repeats):
            cache.reset()
            _sync(dev)
            t0 = time.perf_counter()
            target.prefill(ids, cache)
            _sync(dev)
            times.append(time.perf_counter() - t0)
        s = statistics.median(times)
        row = {"tokens": L, "seconds": s, "tokens_per_s": L / s}
        if bound is not None:
            row["fraction_of_bound"] = (L / s) / bound
        out["lengths"][str(L)] = row
        del cache
        _free(dev)
    return out


# --- training ---------------------------------------------------------------------------------------

@dataclass
class StageRun:
    """One timed `train_stage` call: per-step losses and wall seconds, what it trained, in which dtypes."""

    losses: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)  # step k: from the end of step k-1 (the call for k=1)
    trainable: int = 0  # trainable parameters (LoRA adapters included)
    trainable_tensors: int = 0
    checkpoint_writes_skipped: bool = True  # train_stage(checkpoints=False)
    precision: dict = field(default_factory=dict)


def _dtype(t: Any) -> Optional[str]:
    return None if t is None else str(t).replace("torch.", "")


def run_stage(stage: str, drafter: torch.nn.Module, target: Any, data: Any, cfg: DictConfig,
              progress: bool = True) -> StageRun:
    """ready.train.stages.train_stage itself (the project's training step, unchanged) for the stage's
    budget in `cfg`, each optimizer step timed to a device synchronisation through its metrics callback
    (which runs after the step's update), without checkpoint writes (`checkpoints=False`: at paper scale a
    base stage's weights and AdamW states are about 23 GB that a benchmark keeps nowhere); a hook on the
    drafter's first projection records the dtype its forward computes in."""
    dev = target.embed_tokens.weight.device
    times: list[float] = []
    steps_seen: list[int] = []

    def on_metric(key: str, value: float, step: int) -> None:
        if not steps_seen or steps_seen[-1] != step:  # the first metric of each step, after its update
            _sync(dev)
            times.append(time.perf_counter())
            steps_seen.append(step)

    seen: dict[str, Any] = {}

    def on_fc(module: torch.nn.Module, inputs: Any, output: torch.Tensor) -> None:
        seen.setdefault("compute", output.dtype)

    hook = drafter.fc.register_forward_hook(on_fc)
    try:
        with tempfile.TemporaryDirectory(prefix="ready-train-scale-") as tmp:
            _sync(dev)
            t0 = time.perf_counter()
            result = train_stage(stage, drafter, target, data, cfg, Path(tmp) / stage, callback=on_metric,
                                 progress=progress, checkpoints=False)
    finally:
        hook.remove()
    if len(times) != result.steps:
        raise RuntimeError(f"train_stage reported {len(times)} of its {result.steps} steps to the metrics callback; "
                           "expected one report per step (has its callback changed?)")
    names = set(result.trainable)
    params = [p for n, p in drafter.named_parameters() if n in names]
    master = params[0].dtype if params else None
    run = StageRun(losses=list(result.losses), step_s=[b - a for a, b in zip([t0] + times, times)],
                   trainable=sum(p.numel() for p in params), trainable_tensors=len(params))
    run.precision = {
        "target": _dtype(next(target.parameters()).dtype),
        "drafter_parameters": _dtype(drafter.fc.weight.dtype),
        "trainable_parameters": _dtype(master),
        "optimizer_states": _dtype(master),  # torch's AdamW keeps its moments in the parameters' dtype
        "drafter_forward_compute": _dtype(seen.get("compute")),
        "fp32_master_weights_bf16_compute": master == torch.float32 and seen.get("compute") == torch.bfloat16,
    }
    return run


def bench_stage(stage: str, cfg: DictConfig, target: Any, data: Any, warmup: int, steps: int,
                progress: bool = True) -> dict:
    """Build the stage's drafter, run warmup + steps optimizer steps, report the timed steps' rates and
    the stage's peak GPU memory (reset before the drafter is built). `cfg`'s stage budget must be
    (warmup + steps) batches."""
    dev = target.embed_tokens.weight.device
    _free(dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    sc = getattr(cfg.train, stage)
    B, T = int(sc.batch_size), int(data.tokens.shape[1])
    out: dict[str, Any] = {"batch": B, "micro_batch_size": int(cfg.train.micro_batch_size), "seq_len": T,
                           "anchors_per_sample": int(sc.anchors_per_sample), "warmup_steps": warmup, "steps": steps}
    drafter = None
    try:
        drafter = make_drafter(stage, cfg, target)
        out["drafter_params"] = sum(p.numel() for p in drafter.parameters())
        out["reader_params"] = sum(p.numel() for p in drafter.reader_parameters())
        run = run_stage(stage, drafter, target, data, cfg, progress)
    except Exception as e:  # e.g. out of memory: reported, the other stages still run
        out["error"] = _failure(e, f"in stage {stage} at batch {B} x {T} tokens")
    else:
        timed = run.step_s[warmup:]
        s = sum(timed) / len(timed)
        out.update(trainable_params=run.trainable, trainable_tensors=run.trainable_tensors,
                   s_per_step=s, s_per_step_min=min(timed), s_per_step_max=max(timed),
                   warmup_s=sum(run.step_s[:warmup]), samples_per_s=B / s, tokens_per_s=B * T / s,
                   losses=run.losses, checkpoint_writes_skipped=run.checkpoint_writes_skipped,
                   precision=run.precision)
    finally:
        if dev.type == "cuda":
            out["peak_memory_bytes"] = torch.cuda.max_memory_allocated(dev)
            out["peak_memory_gb"] = round(out["peak_memory_bytes"] / 1e9, 2)
        del drafter
        _free(dev)
    return out


def bench_train(cfg: DictConfig, target: Any, seq_len: int, batch: int, prompt_len: int, warmup: int, steps: int,
                stages: Sequence[str] = TRAIN_STAGES, progress: bool = True) -> dict:
    """Every stage in `stages` on the same random rows, with the stage's batch and budget set to what runs:
    `batch` rows a step, (warmup + steps) * batch samples (on a copy of `cfg`), in micro-batches of the config's
    train.micro_batch_size rows (0 = one pass)."""
    rows = batch * (warmup + steps)
    data = random_rows(int(target.config.vocab_size), rows, seq_len, prompt_len)
    layer: dict[str, Any] = {s: {"batch_size": batch, "samples": rows} for s in stages}
    cfg = OmegaConf.merge(cfg, {"train": layer})
    out: dict[str, Any] = {
        "seq_len": seq_len, "batch": batch, "micro_batch_size": int(cfg.train.micro_batch_size),
        "trainable_from": prompt_len,
        "data": "random token rows; tokens from trainable_from on may be labels (1 = every token after the "
                "first, as conversation rows: the teacher's LM head runs over nearly the whole row)",
        "step": "ready.train.stages.train_stage, one process: teacher pass on the frozen target (no_grad), drafter "
                "forward_train, draft_loss, backward (per micro-batch of at most micro_batch_size rows, gradients "
                "accumulated; 0 = the whole batch at once), clipping, AdamW, schedule; checkpoint writes off",
    }
    for stage in stages:
        out[stage] = bench_stage(stage, cfg, target, data, warmup, steps, progress)
    prec = next((out[s]["precision"] for s in stages if "precision" in out[s]), None)
    if prec is not None:
        out["precision"] = {**prec, "note": (
            "the drafter's parameters are fp32 and are the master weights (AdamW states fp32); its forward runs "
            "under torch.autocast(bfloat16) on CUDA (train_stage), so drafter_forward_compute is bfloat16 there "
            "and float32 on CPU; the loss is computed in fp32; the frozen target runs in its own dtype; the "
            "frozen backbone of stage 1 / 2 stays fp32 (memory)")}
    return out


# --- the recipe -------------------------------------------------------------------------------------

def recipe_estimate(cfg: DictConfig, regen: Optional[dict], train: Optional[dict], gpus: Sequence[int]) -> dict:
    """The paper recipe's wall time on each GPU count from the measured rates (None where a rate is missing)."""
    conversations = int(cfg.regen.num_samples)
    turn_tokens, prompt_tokens = int(cfg.regen.response_len), int(cfg.regen.prompt_len)
    s1, s2 = int(cfg.train.stage1.samples), int(cfg.train.stage2.samples)
    prompt_tps, decode_tps = (regen or {}).get("prompt_tokens_per_s"), (regen or {}).get("decode_tokens_per_s")

    def rate(stage: str) -> Optional[float]:
        return ((train or {}).get(stage) or {}).get("samples_per_s")

    def div(a: float, b: Optional[float]) -> Optional[float]:
        return a / b if b else None

    prompts_s, decode_s = div(conversations * prompt_tokens, prompt_tps), div(conversations * turn_tokens, decode_tps)
    one = {"regen_s": prompts_s + decode_s if prompts_s is not None and decode_s is not None else None,
           "stage1_s": div(s1, rate("stage1")), "stage2_s": div(s2, rate("stage2"))}
    per_gpus: dict[str, Any] = {}
    for n in gpus:
        row = {k: (v / n if v is not None else None) for k, v in one.items()}
        parts = list(row.values())
        row["total_s"] = sum(parts) if all(p is not None for p in parts) else None
        row["total_h"] = row["total_s"] / 3600 if row["total_s"] is not None else None
        per_gpus[str(n)] = row
    base = div(1e4, rate("base"))
    r = regen or {}
    measured = (f"{r['batch']} conversations at once, prompt {r['prompt_len']} / response {r['response_len']} tokens"
                if "tokens_per_s" in r else "not measured")
    split = {"prompts_s": prompts_s, "decode_s": decode_s}
    seq = (train or {}).get("seq_len")
    return {
        "regen_parts_on_1_gpu": split,
        "inputs": {"conversations": conversations, "regen_tokens_per_conversation": turn_tokens,
                   "regen_prompt_tokens_per_conversation": prompt_tokens,
                   "stage1_samples": s1, "stage2_samples": s2, "train_seq_len": seq,
                   "stage_batch_size_in_config": [int(cfg.train.stage1.batch_size), int(cfg.train.stage2.batch_size)]},
        "gpus": per_gpus,
        "base_from_scratch_s_per_10k_samples": {str(n): (base / n if base is not None else None) for n in gpus},
        "assumptions": [
            "base drafter = the public DSpark checkpoint: the recipe trains no base drafter "
            "(base_from_scratch_s_per_10k_samples is what one from scratch would cost)",
            f"regeneration: every conversation is one assistant turn at its caps, a prompt of regen.prompt_len = "
            f"{prompt_tokens} tokens at the measured regeneration's prompt rate (its prefill time over its prompt "
            f"tokens) and regen.response_len = {turn_tokens} new tokens at its decode rate, prefill excluded "
            f"({measured}; shorter prompts, turns that stop earlier or several turns scale the parts linearly; "
            "longer contexts decode somewhat slower)",
            f"training: samples/s measured at {(train or {}).get('batch')} rows x {seq} tokens a step holds at the "
            "config's stage batch size (train.<stage>.batch_size; a larger batch is usually no slower per sample; "
            "what must fit in one GPU is a micro-batch, train.micro_batch_size rows, gradients accumulated)",
            "N GPUs: linear data-parallel scaling of regeneration and training (every GPU holds the whole target "
            "and drafter; gradient all-reduce and the per-step sync not counted); regeneration split evenly "
            "over the N GPUs (ready.train.regen shards prompts over torchrun ranks; conversation data, data.path, "
            "need ready.train.conversations to do the same)",
            "no evaluation, artifact writes, checkpoint saves or model loading counted",
        ],
    }


# --- the command ------------------------------------------------------------------------------------

def _sizes(a: argparse.Namespace) -> dict:
    base = QUICK if a.quick else FULL
    return {k: (getattr(a, k) if getattr(a, k) is not None else v) for k, v in base.items()}


def _ints(text: str, flag: str, low: int = 1) -> list[int]:
    kind = "positive integers" if low == 1 else f"integers >= {low}"
    try:
        vals = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise TrainScaleError(f"{flag} {text!r}: expected a comma list of {kind}, e.g. 1024,8192") from None
    if not vals or min(vals) < low:
        raise TrainScaleError(f"{flag} {text!r}: expected a comma list of {kind}, e.g. 1024,8192")
    return vals


def _check(a: argparse.Namespace, z: dict) -> tuple[list[str], list[str], list[int], list[int]]:
    """The sections, stages, prefill lengths and GPU counts asked for; TrainScaleError on any unusable flag."""
    if a.target not in PRESETS:
        raise TrainScaleError(f"--target {a.target!r}: expected a preset with a target architecture, one of "
                              f"{sorted(PRESETS)} (random weights; no checkpoint is loaded)")
    sections = [s.strip() for s in a.sections.split(",") if s.strip()]
    bad = [s for s in sections if s not in SECTIONS]
    if bad or not sections:
        raise TrainScaleError(f"--sections {a.sections!r}: expected a comma list of {', '.join(SECTIONS)}")
    stages = [s.strip() for s in a.stages.split(",") if s.strip()]
    if not stages or any(s not in TRAIN_STAGES for s in stages):
        raise TrainScaleError(f"--stages {a.stages!r}: expected a comma list of {', '.join(TRAIN_STAGES)}")
    for k in ("regen_prompt_len", "regen_response_len", "prefill_repeats", "train_seq_len",
              "train_batch", "train_prompt_len", "train_steps"):
        if int(z[k]) < 1:
            raise TrainScaleError(f"--{k.replace('_', '-')} {z[k]}: expected an integer >= 1")
    if int(z["warmup_steps"]) < 1:
        raise TrainScaleError(f"--warmup-steps {z['warmup_steps']}: expected an integer >= 1 (the first step "
                              "carries the stage's setup and is never timed)")
    if z["train_prompt_len"] > z["train_seq_len"] - 2:
        raise TrainScaleError(f"--train-prompt-len {z['train_prompt_len']}: expected at most --train-seq-len - 2 = "
                              f"{z['train_seq_len'] - 2} (anchors need trainable tokens after it)")
    lengths = _ints(z["prefill_lengths"], "--prefill-lengths")
    ctx = int(preset_config(a.target).max_position_embeddings)
    for flag, n in (("--prefill-lengths", max(lengths)), ("--train-seq-len", z["train_seq_len"]),
                    ("--regen-prompt-len + --regen-response-len", z["regen_prompt_len"] + z["regen_response_len"])):
        if n > ctx:
            raise TrainScaleError(f"{flag}: {n} tokens exceed the {a.target} target's context of {ctx} tokens")
    return sections, stages, lengths, _ints(a.gpus, "--gpus")


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> dict:
    """Parse arguments, run the sections, print (and return) one JSON object."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.train_scale", description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                    help="overrides of the typed config (ready/config.py; after the preset and profile), e.g. "
                         "target.device=cpu train.micro_batch_size=4 regen.batch_size=64")
    ap.add_argument("--target", default="tiny", help="preset: target architecture + drafter shape (default tiny)")
    ap.add_argument("--profile", default=DEFAULT_PROFILE, help="experiments/profiles/<name>.yaml for the recipe "
                    "budgets ('' = none; default paper_recipe)")
    ap.add_argument("--sections", default=",".join(SECTIONS), help="comma list of regen, prefill, train")
    ap.add_argument("--stages", default=",".join(TRAIN_STAGES), help="training stages to time (base,stage1,stage2)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes for a CPU plumbing check, regen.batch_size=2 "
                    "(flags and overrides still win)")
    ap.add_argument("--regen-prompt-len", type=int, default=None, help=f"default {FULL['regen_prompt_len']}")
    ap.add_argument("--regen-response-len", type=int, default=None, help=f"default {FULL['regen_response_len']}")
    ap.add_argument("--regen-admit-tokens", default=None,
                    help="comma list of admission budgets (padded tokens per prefill pass; 0 = one prefill per row), "
                         "e.g. 0,8192: the regen section runs each, paired ABBA in this process (default: the "
                         "engine's own, one run)")
    ap.add_argument("--prefill-lengths", default=None, help=f"comma list (default {FULL['prefill_lengths']})")
    ap.add_argument("--prefill-repeats", type=int, default=None, help="timed prefills per length (median)")
    ap.add_argument("--peak-flops", type=float, default=None,
                    help=f"FLOP/s of the prefill bound (default {H200_BF16_DENSE_FLOPS:.0e} on CUDA, none on CPU)")
    ap.add_argument("--train-seq-len", type=int, default=None,
                    help=f"tokens per training row (default {FULL['train_seq_len']} = the preset's regen "
                         "prompt_len + response_len)")
    ap.add_argument("--train-batch", type=int, default=None,
                    help=f"rows per optimizer step (default {FULL['train_batch']}; the preset's stages use 32, "
                         "which fit one GPU in micro-batches: train.micro_batch_size)")
    ap.add_argument("--train-prompt-len", type=int, default=None,
                    help="tokens before the first trainable one (default 1: conversation rows, LM head over the row)")
    ap.add_argument("--warmup-steps", type=int, default=None, help="untimed optimizer steps per stage (default 2)")
    ap.add_argument("--train-steps", type=int, default=None, help="timed optimizer steps per stage (default 3)")
    ap.add_argument("--gpus", default="1,4", help="GPU counts of the recipe estimate (default 1,4)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    ap.add_argument("--out", default=None, help="also write the JSON to this file")
    ap.add_argument("--json", action="store_true", help="compact JSON (default: indented)")
    argv = list(sys.argv[1:] if argv is None else argv)
    replaced_flags(argv, REPLACED)  # a ConfigError: one line, status 2 (entry_point)
    a = ap.parse_intermixed_args(argv)
    z = _sizes(a)
    try:
        sections, stages, lengths, gpus = _check(a, z)
        admit = None if a.regen_admit_tokens is None else _ints(a.regen_admit_tokens, "--regen-admit-tokens", low=0)
    except TrainScaleError as e:
        ap.error(str(e).strip().splitlines()[0])
    # a bad key or value is one line, as `ready sweep` gives it (a ConfigError: entry_point)
    cfg = bench_config(a.target, a.profile or None, [*(QUICK_CONFIG if a.quick else ()), *a.overrides])
    try:
        device = pick_device(cfg)
    except PipelineConfigError as e:
        raise ConfigError(str(e)) from None
    if a.threads:
        torch.set_num_threads(a.threads)
    dev = torch.device(device)
    dtype = str(cfg.target.dtype)
    progress = not a.no_progress
    peak = a.peak_flops if a.peak_flops is not None else (H200_BF16_DENSE_FLOPS if dev.type == "cuda" else None)

    t_all = time.perf_counter()
    target = random_target(a.target, device, dtype)
    res: dict[str, Any] = {
        "target": a.target, "profile": a.profile or None, "device": str(dev),
        "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None, "dtype": dtype,
        "weights": "random (no checkpoint): the preset's architecture and drafter shape",
        "target_params": sum(p.numel() for p in target.parameters()),
        "target_weight_bytes": sum(p.numel() * p.element_size() for p in target.parameters()),
        "torch": torch.__version__, "threads": torch.get_num_threads(),
    }
    runs = {
        "regen": lambda: (bench_regen(target, int(cfg.regen.batch_size), z["regen_prompt_len"], z["regen_response_len"],
                                      progress=progress) if admit is None else
                          bench_regen_admission(target, int(cfg.regen.batch_size), z["regen_prompt_len"],
                                                z["regen_response_len"], admit, progress)),
        "prefill": lambda: bench_prefill(target, lengths, peak, z["prefill_repeats"], progress),
        "train": lambda: bench_train(cfg, target, z["train_seq_len"], z["train_batch"], z["train_prompt_len"],
                                     z["warmup_steps"], z["train_steps"], stages, progress),
    }
    for name in SECTIONS:
        if name in sections:
            try:
                res[name] = runs[name]()
            except Exception as e:  # reported; the other sections still run
                res[name] = {"error": _failure(e, f"in section {name}")}
            _free(dev)
    res["recipe"] = recipe_estimate(cfg, res.get("regen"), res.get("train"), gpus)
    res["errors"] = errors(res)
    res["total_s"] = time.perf_counter() - t_all
    text = json.dumps(res, indent=None if a.json else 2)
    if a.out:
        Path(a.out).write_text(text)
    print(text)
    return res


def errors(res: Any, where: str = "") -> list[str]:
    """Every `error` in the result, with the path of the section or stage it belongs to."""
    if not isinstance(res, dict):
        return []
    out = [f"{where or '.'}: {res['error']}"] if "error" in res else []
    for k, v in res.items():
        out += errors(v, f"{where}.{k}" if where else k)
    return out


def exit_status(result: dict) -> int:
    """The command's exit status: 1 when a section reported an error."""
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(exit_status(main()))
