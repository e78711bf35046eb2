"""One sweep row's run (`sweeps.row`): shared artifacts -> train -> evaluate -> metrics.

`run_variant(cfg, method)` is what a sweep worker calls for every row, baselines included:

- `ar`: greedy autoregressive decoding of the target (the speed and lossless reference);
- `dspark`: the base DSpark drafter (reader off), trained once per sweep setting and cached;
- `dflash`: the same without the Markov head (`drafter.head: none`): the DFlash baseline;
- `ft`: DSpark + the two adaptation stages with the reader off (Table 2's control);
- `placebo`: like `ready`, but the reader is trained and evaluated on another sequence's
  committed states (`reader.states: shuffled`): adapter capacity without state information;
- `ready`: DSpark + the reader, stage 1 (reader) then stage 2 (reader + LoRA).

Every drafting row also measures its teacher-forced acceptance on held-out regenerated
sequences (`heldout_tf`, `ready.train.teacher_forced`), and every `ready` row decodes its
prompts a second time reading another prompt's states (`state_swap`, for `state_reliance`).

Every product is a content-hashed artifact (ready/artifacts.py), so rows that share a target, a
base drafter, AR generations or a trained drafter build (and evaluate) them once. AR generations of each benchmark are cached per
(target, benchmark settings, eval settings): every drafting row checks losslessness against the
same AR tokens, and its speedup is its TPS over the AR TPS timed when that cache was built. The
AR row itself decodes afresh, so the TPS it reports was measured in its own run.
"""

from __future__ import annotations

import gc
import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from omegaconf import DictConfig, OmegaConf

from ready.artifacts import cached
from ready.config import compile_in_graphs, config_hash, exact_mode, restore_retired, to_container
from ready.data import load_suite
from ready.decode.rounds import Generation
from ready.calibration import verification_metrics
from ready.decode.evaluate import evaluate, next_prompt_donors, pooled_verification, run_ar
from ready.decode.schedule import schedule_from
from ready.decode.sampling import params_from
from ready.drafter import load_drafter
from ready.drafter.checkpoint import has_markov_head, is_drafter_folder
from ready.health import HealthError, check_target, generations_problem
from ready.fastops import fused_on
from ready.loading import (WEIGHT_FILES, LoadedTarget, PipelineConfigError, configure_target, load_configured_target,
                           target_dir, weights_id)
from ready.metrics import Metrics, overall
from ready.phases import PHASES, Phase, phase_metrics
from ready.threads import cpu_threads
from ready.train import ensure_base_drafter, train_variant
from ready.train.conversations import load_counts
from ready.train.regen import build_regen_data, build_validation_data, regen_artifact
from ready.train.stages import MetricsCallback
from ready.train.teacher_forced import teacher_forced_acceptance
from ready.train.teacher_store import ensure_teacher_store
from sweeps.torchrun import run_under_torchrun

METHODS = ("ar", "dspark", "dflash", "ft", "placebo", "ready")
AR_BUILD_VERSION = 2  # 2: generations name K "proposals" (was "block_size")


@dataclass
class VariantResult:
    """What one run measured: per-benchmark metrics, the overall row, training curves, resolved ids."""

    method: str
    benchmarks: list[Metrics]
    overall: Metrics
    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # stage -> [(step, loss)]
    resolved: dict[str, Any] = field(default_factory=dict)  # ids and sizes actually built
    evaluation: dict[str, Any] = field(default_factory=dict)  # the evaluation JSON artifact
    phases: dict[str, Phase] = field(default_factory=dict)  # where the row's time and GPU memory went (ready.phases)
    engine: dict[str, str] = field(default_factory=dict)  # what decoded the row's evaluation (`engine_tags`)

    def metrics(self) -> dict[str, float]:
        """Flat MLflow metrics, `<benchmark>/<name>` and `overall/<name>` (docs/interfaces.md);
        `<b>/lossless` is greedy validity (at eval.temperature > 0 the distribution check), `<b>/lossless_exact`
        token identity with AR (greedy only); `phase/<name>_s` and `phase/<name>_peak_gb` (ready.phases)."""
        out: dict[str, float] = phase_metrics(self.phases)
        for m in [*self.benchmarks, self.overall]:
            out.update(m.mlflow_metrics())
        exact = {b: rec["lossless_exact"] for b, rec in (self.evaluation.get("benchmarks") or {}).items()
                 if rec.get("lossless_exact") is not None}
        for b, value in exact.items():
            out[f"{b}/lossless_exact"] = float(value)
        if exact:
            out["overall/lossless_exact"] = float(all(exact.values()))
        out.update(verification_metrics(self.evaluation))  # tokens verified per round, the head's calibration
        return out

    def tags(self) -> dict[str, str]:
        """MLflow tags beside the metrics: the engine the evaluation ran on (`ready.engine*`) and whether the
        worker's loaded target served this row (`ready.target_reused`)."""
        return dict(self.engine)

    @property
    def lossless(self) -> bool:
        return bool(self.overall.lossless)

    def survival(self) -> dict[str, list]:
        return {m.benchmark: list(m.survival) for m in [*self.benchmarks, self.overall] if m.survival}


# ---------------------------------------------------------------------------------------------
# Shared artifacts


# ---------------------------------------------------------------------------------------------
# The worker's target: loaded once, kept across rows


_HELD: dict[str, LoadedTarget] = {}  # at most one: the target of the last row, by `target_key`
LOADS = {"count": 0}  # targets this process loaded (tests/test_gpu_shape.py counts them)


def target_key(cfg: DictConfig) -> str:
    """What decides which target (and tokenizer) a config loads: its `target` section but `compile` (a setting
    of the loaded target, `configure_target`), the corpus and pretraining of the embedded default or of the
    random preset's tokenizer, and the shared builds' threads."""
    target = {k: v for k, v in to_container(cfg.target).items() if k != "compile"}
    return config_hash({"target": target, "corpus": to_container(cfg.corpus), "pretrain": to_container(cfg.pretrain),
                        "threads": int(cfg.threads.shared)})


def held_target(cfg: DictConfig, progress: bool = True) -> LoadedTarget:
    """The config's target, loaded (or, for a preset with `target.pretrain=false`, built on the device) once
    per process and kept for every later row that asks for the same one (`target_key`), with the row's own
    settings applied (`configure_target`: exact mode, compile). A worker thus loads a 54 GB target once, and
    its compiled layers and tuned kernels (kept on the target and in the process) serve every later row. A
    different target replaces the kept one, which is freed first."""
    path = target_dir(cfg, progress)  # the embedded default's artifact is verified (and rebuilt) here, as before
    key = f"{target_key(cfg)}:{path}:{folder_stamp(path)}"
    loaded = _HELD.get(key)
    if loaded is None:
        release_target()
        with PHASES.phase("target_load"):
            loaded = load_configured_target(cfg, progress)
        LOADS["count"] += 1
        _HELD[key] = loaded
    else:
        configure_target(loaded.target, cfg)
    return loaded


def folder_stamp(path: str) -> str:
    """The weight files of a target folder by name, size, inode and time stamp ('' for a preset): a folder
    rewritten between rows (a rebuilt artifact, a replaced checkpoint) is loaded again."""
    folder = Path(path)
    if not folder.is_dir():
        return ""
    files = sorted(f for pattern in WEIGHT_FILES for f in folder.glob(pattern) if f.is_file())
    return config_hash([[f.name, st.st_size, st.st_ino, st.st_mtime_ns] for f in files for st in [f.stat()]])


def release_target() -> None:
    """Forget the kept target and give its memory back (before another one is loaded)."""
    _HELD.clear()
    free_device_memory()


def free_device_memory() -> None:
    """Drop what the last row left (engines, caches, CUDA graph pools, drafters) and hand the cached blocks
    back to CUDA, so the next row starts from the target alone."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def serving_dtype(drafter: Any, target: Any) -> Any:
    """The drafter as evaluation decodes with it: in the target's dtype when that is 16-bit (a trained drafter is
    saved with its fp32 master weights; the paper serves it in BF16 beside the BF16 target, and
    benchmarks.engine times it so), unchanged beside a float32 target."""
    dtype = getattr(target, "dtype", torch.float32)
    return drafter.to(dtype=dtype) if dtype in (torch.bfloat16, torch.float16) else drafter


def engine_tags(cfg: DictConfig, loaded: LoadedTarget) -> dict[str, str]:
    """What evaluation decoded on, as the engine benchmarks (benchmarks.engine) time it: CUDA graphs for the
    target's verify and the draft step (on CUDA), torch.compile'd layers inside them (`target.compile`), the
    fused Triton kernels (where `ready.fastops.fused_on` says Triton runs), the exact mode and the batch (`eval.concurrency`)."""
    cuda = loaded.device == "cuda"
    compiled = compile_in_graphs(cfg)
    kernels = cuda and fused_on(torch.device("cuda"))
    parts = (["cuda_graphs"] if cuda else ["eager"]) + (["compiled_layers"] if cuda and compiled is not False else []) \
        + (["triton_kernels"] if kernels else ["torch_ops"])
    drafter = str(loaded.target.dtype).removeprefix("torch.") if loaded.target.dtype in (torch.bfloat16, torch.float16) \
        else "float32"
    return {"ready.engine": "+".join(parts), "ready.engine_exact": str(int(exact_mode(cfg))),
            "ready.engine_drafter_dtype": drafter,
            "ready.engine_concurrency": str(concurrency(cfg)),
            "ready.engine_as_benchmarked": str(int(cuda and compiled is not False and kernels))}


def prepare_common(cfg: DictConfig, methods: Sequence[str] = METHODS, progress: bool = True) -> LoadedTarget:
    """Build what every base seed of a sweep setting shares: the target, the AR generations of every
    benchmark and, when a row drafts, the regenerated training and validation data and the teacher
    store of the base drafters (`ready.train.teacher_store`)."""
    loaded = held_target(cfg, progress)
    suites = _suites(cfg, loaded.tokenizer)
    check_donor_prompts(cfg, methods, suites)
    ar_generations(cfg, loaded, suites, progress)
    if any(m != "ar" for m in methods):

        build_regen_data(cfg, loaded.target, loaded.tokenizer, progress=progress)
        ensure_teacher_store(cfg, loaded.target, loaded.tokenizer, progress)  # the base drafters' teacher passes
        build_validation_data(cfg, loaded.target, loaded.tokenizer, progress=progress)
    return loaded


def prepare_shared(cfg: DictConfig, methods: Sequence[str] = METHODS, progress: bool = True,
                   callback: Optional[MetricsCallback] = None) -> None:
    """Build what every row of a sweep setting shares, once, before workers start (so parallel
    workers never build the same thing twice): `prepare_common`'s artifacts and, when a row drafts,
    the base DSpark drafter of `cfg.train.base_seed` (its training metrics go to `callback`: the
    sweep's progress bar over side-by-side builds). Their phases stay in `PHASES` for the caller to log."""
    try:
        loaded = prepare_common(cfg, methods, progress)
        if any(m != "ar" for m in methods):
            ensure_base_drafter(cfg, loaded.target, loaded.tokenizer, callback=callback, progress=progress,
                                launch=run_under_torchrun)
    except (torch.cuda.OutOfMemoryError, RuntimeError) as e:
        if not is_out_of_memory(e):
            raise
        failed_in = PHASES.failed_in
        free_device_memory()
        raise PipelineConfigError(out_of_memory(cfg, "shared artifacts", failed_in, e)) from None


def _suites(cfg: DictConfig, tokenizer: Any) -> dict[str, list[list[int]]]:

    return {name: [p.ids for p in load_suite(name, cfg.bench, tokenizer, cfg.corpus)] for name in cfg.bench.suites}


def check_donor_prompts(cfg: DictConfig, methods: Sequence[str], suites: dict[str, list[list[int]]]) -> None:
    """The state placebo and the state swap read another prompt's states, so each suite needs two
    prompts. Checked when the suites are loaded, before anything trains; the message says whether
    bench.limit or the benchmark's file is short."""
    uses = [what for method, what in (("placebo", "the state placebo"), ("ready", "the state swap (eval.state_reliance)"))
            if method in methods and (method == "placebo" or cfg.eval.state_reliance)]
    for name, prompts in suites.items():
        if uses and len(prompts) < 2:
            limit, path = int(cfg.bench.limit), (cfg.bench.paths or {}).get(name)
            if limit < 2:
                short = f"bench.limit={limit}; expected bench.limit >= 2"
            else:
                source = f"its file {str(path)!r}" if path else ("the held-out corpus" if name == "heldout" else
                                                                  "its embedded source")
                short = f"{source} holds only {len(prompts)} (bench.limit={limit}); expected at least 2 records there"
            raise PipelineConfigError(f"benchmark '{name}': {len(prompts)} prompt(s), but {uses[0]} reads another "
                                      f"prompt's states, so it needs at least 2: {short}")


def sampling_params(cfg: DictConfig) -> Any:
    """`ready.decode.sampling.SamplingParams` of `eval.temperature` > 0, None for greedy decoding."""

    return params_from(float(cfg.eval.temperature), float(cfg.eval.top_p), int(cfg.eval.sample_seed))


def concurrency(cfg: DictConfig) -> int:
    """`eval.concurrency`: sequences decoded together (1 when the config predates the key)."""
    return int(OmegaConf.select(cfg, "eval.concurrency", default=1) or 1)


STATE_SWAP_SLOTS = 16


def swap_concurrency(cfg: DictConfig, n_prompts: int) -> int:
    """Slots of the state swap's decodes: it reports acceptance only (no TPS), so greedy decoding runs
    its prompts through up to STATE_SWAP_SLOTS slots of the batched engine, which settles every row as
    one prompt at a time would, greedy or sampled (`ready.decode.engine`)."""
    return max(1, min(max(STATE_SWAP_SLOTS, concurrency(cfg)), n_prompts))


SAMPLING_VERSION = 2  # how seeds and draws are made (ready.decode.sampling); a change re-decodes sampled caches


def sampling_spec(cfg: DictConfig) -> dict:
    """The sampling settings that decide a decode (none when greedy, so greedy caches keep their hashes)."""
    if sampling_params(cfg) is None:
        return {}
    return {"temperature": float(cfg.eval.temperature), "top_p": float(cfg.eval.top_p),
            "sample_seed": int(cfg.eval.sample_seed), "samples_per_prompt": int(cfg.eval.samples_per_prompt),
            "version": SAMPLING_VERSION}


def ar_generations(cfg: DictConfig, loaded: LoadedTarget, suites: dict[str, list[list[int]]], progress: bool) -> dict[str, list]:
    """AR generations per benchmark (greedy, or `eval.samples_per_prompt` samples per prompt at
    eval.temperature > 0), decoded once per (target contents, prompts, budget, sampling) and cached.

    The target is checked first (finite weights, finite logits on a probe prompt): a broken target
    fails the run here rather than leaving generations, or a run, that later rows would trust.
    Cached generations that do not look like a clean, finished decode are decoded again.
    """


    probe = next((p for prompts in suites.values() for p in prompts), [])
    check_target(loaded.target, probe, what=f"target {loaded.target_path}")
    budget = int(cfg.eval.max_new_tokens)
    target_id = weights_id(loaded.target_path)
    spec = {"kind": "ar_generations", "version": AR_BUILD_VERSION,  # the target by content: a moved or
            "target_content": target_id, "checked": "health/1",        # copied artifacts_dir keeps its cache
            "dtype": str(cfg.target.dtype), "device": loaded.device, "prompts": suites,
            "max_new_tokens": budget, "warmup": int(cfg.eval.warmup_rounds),
            "eos": loaded.eos, **({"sampling": sampling_spec(cfg)} if sampling_spec(cfg) else {}),
            **({"concurrency": concurrency(cfg)} if concurrency(cfg) > 1 else {}),
            **({"exact": True} if exact_mode(cfg) else {}),  # 16-bit AR tokens differ by mode; earlier caches were fast
            "threads": int(cfg.threads.shared)}

    def build(tmp: Path) -> None:
        with PHASES.phase("ar_generations"):
            _build(tmp)

    def _build(tmp: Path) -> None:
        out = {}
        for name, prompts in suites.items():
            out[name] = run_ar(loaded.target, prompts, budget, eos_token_id=loaded.eos,
                               warmup=int(cfg.eval.warmup_rounds), progress=progress, desc=f"{name} AR",
                               sampling=sampling_params(cfg), samples=int(cfg.eval.samples_per_prompt), stream=name,
                               concurrency=concurrency(cfg))
        problem = generations_problem(out, budget)
        if problem:
            raise HealthError(f"AR decoding of target {loaded.target_path}: {problem}")
        (tmp / "generations.json").write_text(json.dumps({n: [g.to_dict() for g in gens] for n, gens in out.items()}))

    for attempt in (1, 2):
        folder = cached(cfg.artifacts_dir, "ar", spec, build)
        try:
            raw = json.loads((folder / "generations.json").read_text())
            gens = {name: [Generation(**g) for g in gens] for name, gens in raw.items()}
            problem = generations_problem(gens, budget) if set(gens) == set(suites) else "benchmarks differ"
        except (OSError, ValueError, TypeError, AttributeError) as e:
            problem = f"generations.json unreadable ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        if problem is None:
            return gens
        if attempt == 1:
            print(f"[ready] cached AR generations ar/{folder.name} are unusable ({problem}); decoding again",
                  file=sys.stderr, flush=True)
            shutil.rmtree(folder, ignore_errors=True)
    raise HealthError(f"{folder / 'generations.json'}: {problem}; expected the AR generations of every benchmark")


# ---------------------------------------------------------------------------------------------
# Drafters


def resolve_rank(cfg: DictConfig, d_k: int) -> DictConfig:
    """Clamp reader.rank to the target's d_k (the paper's "full rank" row asks for 128 on a
    d_k = 128 target; on a smaller target it means d_k). The requested value stays logged."""
    if int(cfg.reader.rank) <= d_k:
        return cfg
    out = cfg.copy()
    out.reader.rank = d_k
    return out


def _curve(path: Path) -> list[tuple[int, float]]:
    log = json.loads((path / "train.json").read_text()) if (path / "train.json").is_file() else {}
    return [(i + 1, float(v)) for i, v in enumerate(log.get("losses", []))]


def _drafter(cfg: DictConfig, method: str, loaded: LoadedTarget, progress: bool):
    """(drafter dir, training curves) for a method that drafts."""

    base = Path(ensure_base_drafter(cfg, loaded.target, loaded.tokenizer, progress=progress, launch=run_under_torchrun))
    curves: dict[str, list[tuple[int, float]]] = {}
    if not cfg.drafter.checkpoint:
        curves["base"] = _curve(base.parent)
    if method in ("dspark", "dflash"):
        return base, curves
    final = Path(train_variant(cfg, loaded.target, loaded.tokenizer, base, Path(cfg.artifacts_dir) / "stages",
                               progress=progress, launch=run_under_torchrun))
    stage2 = final.parent
    curves["stage2"] = _curve(stage2)
    spec = json.loads((stage2 / "spec.json").read_text()) if (stage2 / "spec.json").is_file() else {}
    if "start" in spec:  # stage 2 starts from stage 1's folder, named by the hash it records
        curves["stage1"] = _curve(stage2.parent / f"stage1-{spec['start']}")
    return final, curves


# ---------------------------------------------------------------------------------------------
# The run


def data_counts(cfg: DictConfig, loaded: LoadedTarget) -> dict[str, float]:
    """Training conversations used and truncated, and for `data.path` its rows read and skipped (by reason)."""

    return {k: float(v) for k, v in load_counts(regen_artifact(cfg, loaded.target, loaded.tokenizer)[0]).items()}


def check_method(cfg: DictConfig, method: str) -> None:
    """The method a row stands for must match its reader settings (one line naming the key)."""
    if method not in METHODS:
        raise PipelineConfigError(f"method {method!r} is unknown; expected one of {', '.join(METHODS)}")
    states = str(cfg.reader.states)
    if method == "dflash" and cfg.drafter.head != "none":
        raise PipelineConfigError("method 'dflash' is DSpark without the Markov head: expected drafter.head=none")
    if method == "dspark" and cfg.drafter.head == "none":
        raise PipelineConfigError("method 'dspark' drafts with a Markov head: expected drafter.head other than none "
                                  "(drafter.head=none is the 'dflash' row)")
    if method in ("dspark", "dflash") and cfg.drafter.checkpoint and is_drafter_folder(cfg.drafter.checkpoint) \
            and has_markov_head(cfg.drafter.checkpoint) != (method == "dspark"):
        raise PipelineConfigError(f"method {method!r}: drafter.checkpoint = {cfg.drafter.checkpoint} has "
                                  f"{'a' if method == 'dflash' else 'no'} Markov head; expected "
                                  f"{'a DFlash' if method == 'dflash' else 'a DSpark'} drafter folder")
    if method == "ft" and cfg.reader.enabled:
        raise PipelineConfigError("method 'ft' is DSpark + fine-tuning without state: expected reader.enabled=false")
    if method in ("ready", "placebo") and not cfg.reader.enabled:
        raise PipelineConfigError(f"method {method!r} needs the reader: expected reader.enabled=true")
    if method == "ready" and states != "own":
        raise PipelineConfigError("method 'ready' reads its own states: expected reader.states=own "
                                  "(reader.states=shuffled is the 'placebo' row)")
    if method == "placebo" and states != "shuffled":
        raise PipelineConfigError("method 'placebo' reads another sequence's states: expected reader.states=shuffled")


def _prompt_records(result: Any) -> list[dict]:
    return [dict(p.__dict__) for p in result.prompts]


def run_variant(cfg: DictConfig, method: str = "ready", progress: bool = True) -> VariantResult:
    """Train (if the method drafts) and evaluate one row on every suite of `cfg.bench.suites`."""


    check_method(cfg, method)
    free_device_memory()  # what the last row left behind, before this one measures its peaks
    PHASES.take()  # this row's phases start here
    torch.manual_seed(int(cfg.seed))
    loads = LOADS["count"]
    loaded = held_target(cfg, progress)
    kept = LOADS["count"] == loads
    try:
        result = _run_variant(cfg, method, loaded, progress)
    except (torch.cuda.OutOfMemoryError, RuntimeError) as e:
        if not is_out_of_memory(e):
            raise
        failed_in = PHASES.failed_in
        free_device_memory()
        raise PipelineConfigError(out_of_memory(cfg, method, failed_in, e)) from None
    result.phases = PHASES.take()
    result.engine = {**engine_tags(cfg, loaded), "ready.target_reused": str(int(kept))}
    return result


def is_out_of_memory(err: BaseException) -> bool:
    """Whether `err` is the GPU running out of memory (torch raises OutOfMemoryError, some paths a RuntimeError)."""
    return isinstance(err, torch.cuda.OutOfMemoryError) or "out of memory" in str(err).lower()


def out_of_memory(cfg: DictConfig, method: str, phase: Optional[str], err: BaseException) -> str:
    """One line for a row that ran out of GPU memory: where, and the settings that shrink that phase."""
    knobs = {
        "stage": f"train.micro_batch_size (now {int(cfg.train.micro_batch_size)}; 1-2 rows a micro-batch) or "
                 f"regen.prompt_len + regen.response_len (rows of {int(cfg.regen.prompt_len) + int(cfg.regen.response_len)} "
                 "tokens)",
        "base": "drafter.checkpoint (a DSpark folder: no base drafter trained beside the target; AdamW on 1.9 B "
                "fp32 parameters does not fit an 80 GB card with a 54 GB target) or train.base.samples=0",
        "regen": f"regen.batch_size (now {int(cfg.regen.batch_size)})",
        "eval": f"eval.concurrency (now {concurrency(cfg)}) or bench.max_prompt_tokens + eval.max_new_tokens",
        "heldout_tf": f"eval.heldout_tf_samples (now {int(cfg.eval.heldout_tf_samples)}, 0 = off)",
    }
    where = phase or "?"
    knob = next((v for k, v in (("stage1", knobs["stage"]), ("stage2", knobs["stage"]), ("base", knobs["base"]),
                                ("regen", knobs["regen"]), ("heldout_tf", knobs["heldout_tf"]), ("eval", knobs["eval"]),
                                ("state_swap", knobs["eval"]), ("ar_generations", knobs["eval"])) if where.startswith(k)),
                "a smaller target.dtype or a larger card")
    first = (str(err).strip().splitlines() or [""])[0][:160]
    return f"{method!r} ran out of GPU memory in phase {where!r} ({first}); expected it to fit: lower {knob}"


def _run_variant(cfg: DictConfig, method: str, loaded: LoadedTarget, progress: bool) -> VariantResult:
    """`run_variant` once the target is loaded."""
    d_k = int(loaded.target.config.linear_key_head_dim)
    requested_rank = int(cfg.reader.rank)
    cfg = resolve_rank(cfg, d_k)
    suites = _suites(cfg, loaded.tokenizer)
    check_donor_prompts(cfg, [method], suites)
    ar = ar_generations(cfg, loaded, suites, progress)

    drafter, folder, curves, resolved = None, None, {}, {}
    if method != "ar":
        folder, curves = _drafter(cfg, method, loaded, progress)
        with PHASES.phase("drafter_load"):
            drafter = serving_dtype(load_drafter(folder, loaded.target), loaded.target)
        drafter.eval()
        if method in ("dspark", "dflash") and drafter.is_dflash != (method == "dflash"):  # drafter.checkpoint decides
            raise PipelineConfigError(f"method {method!r}: the drafter in {folder} has "
                                      f"{'no' if drafter.is_dflash else 'a'} Markov head; expected "
                                      f"{'a DFlash' if method == 'dflash' else 'a DSpark'} drafter (drafter.checkpoint)")
        resolved = dict(drafter.resolved())
        resolved["drafter_dir"] = str(folder)
        resolved["data_rows"] = data_counts(cfg, loaded)
    resolved.update({"target": loaded.target_path, "device": loaded.device, "d_k": d_k,
                     "rank_requested": requested_rank, "rank": int(cfg.reader.rank)})

    if method == "ar":  # the AR row times its own decoding, every time
        with cpu_threads(int(cfg.threads.drafters)):
            record, reused = _evaluate(cfg, method, loaded, None, suites, ar, progress), False
    else:
        record, reused = _cached_evaluation(cfg, method, loaded, drafter, Path(folder), suites, ar, progress)
    resolved["evaluation_reused"] = reused
    per_bench = [Metrics(**b["metrics"]) for b in record["benchmarks"].values()]
    total = Metrics(**record["overall"])
    evaluation = {
        "method": method,
        "config": to_container(cfg) if isinstance(cfg, DictConfig) else OmegaConf.to_container(cfg),
        "resolved": resolved,
        **record,
    }
    return VariantResult(method=method, benchmarks=per_bench, overall=total, curves=curves, resolved=resolved,
                         evaluation=evaluation)


def _evaluate(cfg: DictConfig, method: str, loaded: LoadedTarget, drafter: Any, suites: dict, ar: dict,
              progress: bool) -> dict:
    """Decode every suite (and, for ready rows, again on another prompt's states) and score the
    drafter teacher-forced: the evaluation record without the run's config (docs/interfaces.md)."""


    mode = str(cfg.eval.interleave_ar)
    interleave = method != "ar" and (mode == "on" or (mode == "auto" and loaded.device == "cuda"))

    def run(name: str, prompts: list, donors: Any = None, slots: Optional[int] = None) -> Any:
        """One benchmark's decode; `slots`: the state swap's batched decode, untimed (no warm-up)."""
        return evaluate(loaded.target, drafter, prompts, int(cfg.eval.max_new_tokens), benchmark=name,
                        method=method, eos_token_id=loaded.eos, warmup=0 if slots else int(cfg.eval.warmup_rounds),
                        progress=progress, cuda_graphs=None, donors=donors, interleave_ar=interleave and slots is None,
                        # the AR row times its own decoding; drafting rows compare with the cache
                        ar=None if method == "ar" else ar[name], sampling=sampling_params(cfg),
                        samples=int(cfg.eval.samples_per_prompt), check_rounds=int(cfg.eval.check_rounds),
                        concurrency=slots or concurrency(cfg), verify_schedule=schedule_from(cfg.eval))

    results, swaps = [], {}
    with torch.no_grad():
        for name, prompts in suites.items():
            with PHASES.phase(f"eval_{name}"):
                results.append(run(name, prompts, next_prompt_donors(len(prompts)) if method == "placebo" else None))
            if method == "ready" and cfg.eval.state_reliance:
                with PHASES.phase(f"state_swap_{name}"):
                    swaps[name] = run(name, prompts, next_prompt_donors(len(prompts)),
                                      swap_concurrency(cfg, len(prompts)))
        heldout_tf = _heldout_tf(cfg, loaded, drafter, progress) if drafter is not None else None
    total = overall([r.metrics for r in results], ar=[r.ar for r in results])
    benchmarks = {}
    for r in results:
        benchmarks[r.benchmark] = {"metrics": r.metrics.to_dict(), "ar": r.ar.to_dict(), **r.validity(),
                                   "verification": r.verification,
                                   "mismatch": None if r.mismatch is None else r.mismatch.__dict__,
                                   "prompts": _prompt_records(r)}
        if r.benchmark in swaps:
            swap = swaps[r.benchmark]
            benchmarks[r.benchmark]["state_swap"] = {"donor": "the next prompt of the suite (the last reads the first)",
                                                     "tau": swap.metrics.tau, "lossless": swap.lossless,
                                                     "prompts": _prompt_records(swap)}
    record = {"overall": total.to_dict(), "benchmarks": benchmarks, "verification": pooled_verification(results)}
    if heldout_tf is not None:
        record["heldout_tf"] = heldout_tf
    return record


# how a scheduled evaluation's rounds are recorded; a change re-evaluates the confidence schedule's caches only.
# 2: the horizon is the budget's (and EOS's), a draft the schedule did not verify a stop (ready.decode.rounds.settle_round)
SCHEDULE_VERSION = 2
EVALUATION_BUILD_VERSION = 4  # 2: the state swap decodes through the batched engine; 3: records name K "proposals";
# 4: the record's tau is 1 + Σ P_j, censored at the budget (ready.metrics), not committed tokens / rounds


def _cached_evaluation(cfg: DictConfig, method: str, loaded: LoadedTarget, drafter: Any, folder: Path, suites: dict,
                       ar: dict, progress: bool) -> tuple[dict, bool]:
    """A drafting row's evaluation record, cached by what decides it: the trained drafter (its folder
    is named by the hash of everything it was trained from), the target, the prompts, the budget,
    the evaluation settings and the method (the placebo reads other prompts' states). Rows that end
    with the same drafter (r=64 and r=128 on a d_k=64 target; one configuration in several sweeps)
    are evaluated once. Returns (record, reused)."""

    drafter_id = weights_id(folder)  # its weights: a rebuild that differs is evaluated anew
    target_id = weights_id(loaded.target_path)
    evals = to_container(cfg.eval)
    if sampling_params(cfg) is None:  # knobs of sampling cannot change a greedy evaluation: greedy caches stay valid
        for key in ("temperature", "top_p", "sample_seed", "samples_per_prompt", "check_rounds"):
            evals.pop(key, None)
    else:
        evals["sampling_version"] = SAMPLING_VERSION
    if int(evals.get("concurrency", 1)) == 1:  # one prompt at a time: the evaluations cached before the key stay valid
        evals.pop("concurrency", None)
    if evals.get("verify_schedule", "full") == "full":  # the full schedule: as every evaluation cached before the keys
        for key in ("verify_schedule", "confidence_threshold", "verify_budget"):
            evals.pop(key, None)
    else:  # a scheduled evaluation cached before the horizon fix recorded schedule cuts as censoring: decode again
        evals["schedule_version"] = SCHEDULE_VERSION
    evals["exact"] = exact_mode(cfg)  # auto resolved: float32 auto hashes as the earlier `false`
    restore_retired(evals, "eval")  # keys removed from the schema: the evaluations cached before stay found
    spec = {"kind": "evaluation", "version": EVALUATION_BUILD_VERSION, "method": method, "drafter": drafter_id,
            "target": target_id, "dtype": str(cfg.target.dtype), "device": loaded.device, "prompts": suites,
            "eval": evals, "regen": to_container(cfg.regen), "corpus": to_container(cfg.corpus),
            "eos": loaded.eos, "threads": int(cfg.threads.drafters),
            **({"drafter_dtype": str(drafter.fc.weight.dtype)} if drafter.fc.weight.dtype != torch.float32 else {})}
    built = []

    def build(tmp: Path) -> None:
        (tmp / "evaluation.json").write_text(json.dumps(_evaluate(cfg, method, loaded, drafter, suites, ar, progress)))
        built.append(True)

    out = cached(cfg.artifacts_dir, "evaluation", spec, build)
    try:
        return json.loads((out / "evaluation.json").read_text()), not built
    except (OSError, ValueError) as e:
        raise PipelineConfigError(f"{out / 'evaluation.json'}: unreadable ({type(e).__name__}); delete the folder "
                                  "to evaluate again") from None


def _heldout_tf(cfg: DictConfig, loaded: LoadedTarget, drafter: Any, progress: bool) -> Optional[dict]:
    """Teacher-forced acceptance on the validation split's regenerated sequences (None when off)."""

    data = build_validation_data(cfg, loaded.target, loaded.tokenizer, progress=progress)
    if data is None:
        return None
    with PHASES.phase("heldout_tf"):
        return teacher_forced_acceptance(drafter, loaded.target, data, progress=progress)
