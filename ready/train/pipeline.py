"""A variant's whole training: regenerated data -> base DSpark drafter -> stage 1 -> stage 2.

Every product is an artifact named by the content hash of what it depends on, written
atomically, and reused when present:

- `<artifacts>/regen/<hash>/`: the target-regenerated data (ready.train.regen).
- `<artifacts>/teacher_store/<hash>/`: the target's features and final-norm outputs for that data
  (ready.train.teacher_store), from which the base drafter's (and the no-state control's) teacher
  passes are assembled on CPU; built when a base drafter first trains, unless built before
  (`ensure_teacher_store`, by the process that builds a sweep's shared artifacts).
- `<artifacts>/drafter_base/<hash>/drafter/`: the base DSpark drafter, trained from scratch
  when `drafter.checkpoint` is empty (with DSpark's confidence-head loss when it has a confidence
  head). Its hash covers the drafter architecture, the base budget, the loss, `train.base_seed`,
  the data and the target, never the reader or the adaptation stages, so every variant (and seed)
  of a sweep shares one base drafter.
- `<out_dir>/<stage>-<hash>/drafter/`: the drafter after stage 1 and after stage 2, with
  `train.json` (the loss curve and which parameters were trained).

While a stage runs, its checkpoints live in `<final folder>.work/`; a killed run resumes
from there on the next call and the folder is removed once the stage's result is in place.
LoRA adapters are merged into the backbone before saving, so every saved drafter is a plain
`DSparkDrafter` that `ready.drafter.load_drafter` reads.

Data-parallel (ready.train.distributed): under torchrun every rank runs these functions; rank 0
decides whether an artifact is already built, writes it, and the others wait at a barrier, so
`artifacts_dir` must be a filesystem every rank sees. A plain process with `train.devices = N > 1`
does not train itself: `ensure_base_drafter` and `train_variant` hand the same call to the `launch` their
caller gives (a sweep row's: `torchrun --standalone --nproc-per-node N` on N processes of this host) when
something is still to be built, then read the artifacts. The callback is then not called (the curves are
in train.json). How to start processes is the caller's business, so the library names no command.
"""

from __future__ import annotations

import gc
import json
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from omegaconf import OmegaConf

from ready.artifacts import artifact_dir, atomic_dir, intact, spec_threads
from ready.config import config_hash, restore_retired, to_container
from ready.drafter import DSparkDrafter, load_drafter, save_drafter
from ready.phases import PHASES
from ready.threads import cpu_threads
from ready.train import distributed
from ready.train.lora import has_lora, merge_lora_
from ready.train.regen import RegenData, build_regen_data, regen_artifact, target_fingerprint
from ready.train.stages import MetricsCallback, TrainResult, length_buckets, stage_seed, train_stage
from ready.train.teacher_store import TeacherStore, ensure_teacher_store

DRAFTER_SUBDIR = "drafter"
LOG_FILE = "train.json"
STAGES_SUBDIR = "stages"  # <artifacts_dir>/stages: where sweep rows keep their stage folders (sweeps.row)
Prompts = Optional[torch.Tensor]  # explicit training prompts [N, prompt_len]; None = the corpus's
# runs launch(cfg, what, base_drafter_dir, out_dir, prompts) on `train.devices` processes and returns once they end:
# `what` is "base" or "variant", as `built` reads it
Launch = Callable[[Any, str, Optional[str | Path], Optional[str | Path], Prompts], None]


class PipelineError(ValueError):
    """A pipeline input (checkpoint path, config) is unusable; the message says what was expected."""


def _plain(node: Any) -> Any:
    return to_container(node) if OmegaConf.is_config(node) else node


def _state_fingerprint(module: torch.nn.Module) -> str:
    """Content hash of a module's weights (a strided sample of each tensor)."""
    import hashlib

    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        flat = t.detach().reshape(-1)
        h.update(name.encode() + str(tuple(t.shape)).encode())
        h.update(flat[:: max(1, flat.numel() // 2048)].float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def _run_cached_stage(
    final: Path,
    spec: dict,
    make_drafter: Callable[[], torch.nn.Module],
    stage: str,
    target: Any,
    data: RegenData,
    cfg: Any,
    callback: Optional[MetricsCallback],
    progress: bool,
    launched: bool = False,
    store: Optional[Callable[[], Optional[TeacherStore]]] = None,
) -> Path:
    """Train `stage` into `final/drafter` unless it is already there and intact (resuming a killed
    run; a finished folder whose files no longer match its manifest is trained again). Every rank
    trains; rank 0 writes. `launched`: torchrun was to have built it, so training here is an error.
    `store`: gives the teacher store for the stage (ready.train.teacher_store), asked only when it trains."""
    label = f"{final.parent.name}/{final.name}"
    if distributed.main_decides(lambda: intact(final, spec, label=label)):
        return final / DRAFTER_SUBDIR
    if launched:
        raise PipelineError(f"{final}: the data-parallel training (train.devices={cfg.train.devices}) did not build "
                            "this stage; expected the target and prompts of this process to be the ones the torchrun "
                            f"processes load from the config (target.source={cfg.target.source!r})")
    work = final.parent / f"{final.name}.work"
    with PHASES.phase(stage):  # the stage's wall time and peak GPU memory, its drafter's build and save included
        drafter = make_drafter()
        with cpu_threads(spec_threads(spec)):
            result = train_stage(stage, drafter, target, data, cfg, work, callback=callback, progress=progress,
                                 store=store() if store is not None else None)
        if has_lora(drafter):
            merge_lora_(drafter)
        for p in drafter.parameters():
            p.requires_grad_(False)
        if distributed.world().main:
            with atomic_dir(final, spec=spec) as tmp:
                (tmp / "spec.json").write_text(json.dumps(spec, indent=2, sort_keys=True, default=str))
                log = {**asdict(result), "first_loss": result.first_loss, "last_loss": result.last_loss,
                       "world_size": distributed.world().size}
                (tmp / LOG_FILE).write_text(json.dumps(log, indent=1))

                save_drafter(drafter, tmp / DRAFTER_SUBDIR)
            shutil.rmtree(work, ignore_errors=True)
        del drafter
        gc.collect()  # the stage's drafter and optimizer (with any reference cycle) go before the next one loads
    distributed.barrier()  # the next stage starts from this folder on every rank
    return final / DRAFTER_SUBDIR


def _data_and_spec(cfg: Any, target: Any, tokenizer: Any, progress: bool, prompts: Prompts = None) -> tuple[RegenData, str]:
    data, folder = build_regen_data(cfg, target, tokenizer, prompts=prompts, progress=progress)
    return data, folder.name


def base_spec(cfg: Any, data_id: str) -> dict:
    """What the base DSpark drafter depends on (no reader, no adaptation stages, no variant seed)."""
    drafter = _drafter_spec(cfg)
    drafter.pop("checkpoint", None)
    spec = {
        "kind": "drafter_base",
        "drafter": drafter,
        "train": _plain(cfg.train.base),
        "loss": _loss_spec(cfg, base=True),
        "seed": int(cfg.train.base_seed),
        "data": data_id,
        "threads": int(cfg.threads.drafters),
    }
    return _with_buckets(spec, cfg)


def _drafter_spec(cfg: Any) -> dict:
    """`drafter` as a trained drafter's hash reads it: renamed keys under their old names (`drafter.proposals`
    as block_size = proposals + 1), so the drafters trained before the rename are still found."""
    return restore_retired(dict(_plain(cfg.drafter)), "drafter")


def _loss_spec(cfg: Any, base: bool) -> dict:
    """The loss settings a stage depends on: `train.loss.confidence_weight` and `confidence_temperature` (its
    label's decoding) only in the base drafter's training of a drafter with a confidence head (the one
    stage that trains it; absent elsewhere, so the artifacts built before the knobs keep their hashes);
    the temperature not at 1, the label every head trained before the knob had (those drafters stay found)."""
    loss = dict(_plain(cfg.train.loss))
    if not (base and cfg.drafter.confidence_head):
        loss.pop("confidence_weight", None)
        loss.pop("confidence_temperature", None)
    elif float(loss["confidence_temperature"]) == 1.0:
        loss.pop("confidence_temperature", None)
    return loss


def _with_buckets(spec: dict, cfg: Any) -> dict:
    """`spec` with `train.length_buckets` when it is on (absent at 0: earlier artifacts keep their hashes)."""
    if length_buckets(cfg):
        spec["length_buckets"] = length_buckets(cfg)
    return spec


def ensure_base_drafter(
    cfg: Any,
    target: Any,
    tokenizer: Any,
    callback: Optional[MetricsCallback] = None,
    progress: bool = True,
    prompts: Prompts = None,
    launch: Optional[Launch] = None,
) -> Path:
    """The base DSpark drafter's folder: `drafter.checkpoint` when given, else trained from scratch (cached);
    with `train.devices` > 1 outside torchrun, trained by `launch`."""
    if cfg.drafter.checkpoint:
        path = Path(cfg.drafter.checkpoint)
        if not path.is_dir():
            raise PipelineError(f"drafter.checkpoint = {str(path)!r} is not a folder; expected a DSpark drafter folder "
                                "(config.json with dflash_config + model.safetensors)")
        return path
    launched = _launch_if_asked(cfg, target, tokenizer, "base", None, None, prompts, launch)
    return _ensure_base(cfg, target, tokenizer, callback, progress, prompts, launched)


def _ensure_base(cfg: Any, target: Any, tokenizer: Any, callback: Optional[MetricsCallback], progress: bool,
                 prompts: Prompts, launched: bool) -> Path:
    data, data_id = _data_and_spec(cfg, target, tokenizer, progress, prompts)
    spec = base_spec(cfg, data_id)
    final = artifact_dir(cfg.artifacts_dir, "drafter_base", spec)
    reader_off = OmegaConf.merge(cfg.reader, {"enabled": False})

    def make() -> torch.nn.Module:
        torch.manual_seed(stage_seed(int(cfg.train.base_seed), "base"))
        return DSparkDrafter(cfg.drafter, reader_off, target).to(target.embed_tokens.weight.device)

    def store() -> Optional[TeacherStore]:
        return ensure_teacher_store(cfg, target, tokenizer, progress, prompts)

    return _run_cached_stage(final, spec, make, "base", target, data, cfg, callback, progress, launched, store)


def stage_spec(cfg: Any, stage: str, start_id: str, data_id: str) -> dict:
    """What a stage's output depends on: its starting drafter, the variant's reader and budgets."""
    return _with_buckets({
        "kind": stage,
        "start": start_id,
        "drafter": _drafter_spec(cfg),
        "reader": _plain(cfg.reader),
        "train": _plain(getattr(cfg.train, stage)),
        "lora": _plain(cfg.train.lora),
        "loss": _loss_spec(cfg, base=False),
        "seed": int(cfg.seed),
        "data": data_id,
        "threads": int(cfg.threads.drafters),
    }, cfg)


def train_variant(
    cfg: Any,
    target: Any,
    tokenizer: Any,
    base_drafter_dir: Optional[str | Path],
    out_dir: str | Path,
    callback: Optional[MetricsCallback] = None,
    progress: bool = True,
    prompts: Prompts = None,
    launch: Optional[Launch] = None,
) -> Path:
    """Train one variant (reader config of `cfg`) and return the folder of its final drafter.

    base_drafter_dir: a base DSpark drafter folder; None = `ensure_base_drafter(cfg, ...)`.
    With the reader on: stage 1 trains the reader, stage 2 the reader + LoRA. With the reader
    off (the no-state control): both stages train LoRA only, with the same budgets. With
    `train.devices` > 1 outside torchrun, `launch` trains it (the module docstring).
    """
    launched = _launch_if_asked(cfg, target, tokenizer, "variant", base_drafter_dir, out_dir, prompts, launch)
    data, data_id = _data_and_spec(cfg, target, tokenizer, progress, prompts)
    if base_drafter_dir is None:
        base_drafter_dir = (Path(cfg.drafter.checkpoint) if cfg.drafter.checkpoint
                            else _ensure_base(cfg, target, tokenizer, callback, progress, prompts, launched))
    current = Path(base_drafter_dir)

    def store() -> Optional[TeacherStore]:  # the no-state control reads no state: a built store serves it
        return None if cfg.reader.enabled else ensure_teacher_store(cfg, target, tokenizer, progress, prompts, build=False)

    for stage, final, spec in stage_chain(cfg, target, current, data_id, Path(out_dir)):
        fresh_reader = stage == "stage1"

        def make(prev: Path = current, fresh_reader: bool = fresh_reader) -> torch.nn.Module:
            torch.manual_seed(stage_seed(int(cfg.seed), "stage1"))
            return load_drafter(prev, target, reader_cfg=cfg.reader if fresh_reader else None)

        current = _run_cached_stage(final, spec, make, stage, target, data, cfg, callback, progress, launched, store)
    return current


def stage_chain(cfg: Any, target: Any, base_drafter_dir: Path, data_id: str, out_dir: Path) -> list[tuple[str, Path, dict]]:
    """(stage, final folder, spec) of stage 1 and stage 2 from this base drafter (validated against
    the target); builds nothing."""
    start_id = _start_fingerprint(Path(base_drafter_dir), target)
    chain = []
    for stage in ("stage1", "stage2"):
        spec = stage_spec(cfg, stage, start_id, data_id)
        chain.append((stage, out_dir / f"{stage}-{config_hash(spec)}", spec))
        start_id = config_hash(spec)
    return chain


_START_IDS: dict[tuple, str] = {}  # this process's fingerprints of drafter folders, by their files and the target


def _start_fingerprint(folder: Path, target: Any) -> str:
    """`_state_fingerprint` of the drafter in `folder`, loaded (which validates the folder against the target)
    once per process for the same files (name, inode, size, mtime) and target: every trained row of a sweep
    starts from the same base drafter (a 1.9 B-parameter checkpoint at the 27B shape), and stage 1 loads it
    anyway."""
    try:
        files = tuple(sorted((p.name, st.st_ino, st.st_size, st.st_mtime_ns)
                             for p in folder.iterdir() if p.is_file() for st in [p.stat()]))
    except OSError:
        files = None
    key = (str(folder.resolve()), files, target_fingerprint(target))
    if files is None or key not in _START_IDS:
        base = load_drafter(folder, target)  # validates the folder and the target
        fingerprint = _state_fingerprint(base)
        del base
        if files is None:
            return fingerprint
        _START_IDS[key] = fingerprint
    return _START_IDS[key]


def built(cfg: Any, target: Any, tokenizer: Any, what: str, base_drafter_dir: Optional[str | Path] = None,
          out_dir: Optional[str | Path] = None, prompts: Prompts = None) -> bool:
    """Whether everything `what` ("base" or "variant") needs is already built and intact: the
    regenerated data, the base drafter (unless given) and, for a variant, both stages."""
    folder, regen_spec = regen_artifact(cfg, target, tokenizer, prompts)
    if not intact(folder, regen_spec):
        return False
    if base_drafter_dir is None and cfg.drafter.checkpoint:
        base_drafter_dir = cfg.drafter.checkpoint
    if base_drafter_dir is None:
        final = artifact_dir(cfg.artifacts_dir, "drafter_base", base_spec(cfg, folder.name))
        if not intact(final, base_spec(cfg, folder.name)):
            return False
        base_drafter_dir = final / DRAFTER_SUBDIR
    if what == "base":
        return True
    chain = stage_chain(cfg, target, Path(base_drafter_dir), folder.name, Path(out_dir))
    return all(intact(final, spec) for _, final, spec in chain)


def _launch_if_asked(cfg: Any, target: Any, tokenizer: Any, what: str, base_drafter_dir: Optional[str | Path],
                     out_dir: Optional[str | Path], prompts: Prompts, launch: Optional[Launch]) -> bool:
    """With `train.devices = N > 1` in a process outside torchrun, run this call on N processes with
    `launch` (unless all is built already); True when it did. Inside torchrun: join its group."""
    distributed.init_from_env(target.embed_tokens.weight.device.type)  # no-op outside torchrun
    n = int(cfg.train.devices)
    if n <= 1 or distributed.under_torchrun():
        return False
    if built(cfg, target, tokenizer, what, base_drafter_dir, out_dir, prompts):
        return False
    if launch is None:
        raise PipelineError(f"bad value at key 'train.devices': {n} data-parallel processes asked of a caller that "
                            "trains in one; expected 1 here, or a sweep row (`ready sweep`, which starts torchrun) "
                            "or a process torchrun started (`ready launch`)")
    launch(cfg, what, base_drafter_dir, out_dir, prompts)
    return True


def read_train_log(drafter_dir: str | Path) -> dict:
    """The `train.json` written beside a trained drafter (loss curve, trained parameter names)."""
    path = Path(drafter_dir).parent / LOG_FILE
    if not path.is_file():
        raise PipelineError(f"{path} does not exist; expected a drafter folder produced by ready.train.pipeline")
    return json.loads(path.read_text())


__all__ = ["ensure_base_drafter", "train_variant", "read_train_log", "TrainResult", "PipelineError"]
