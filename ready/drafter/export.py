"""Export a drafter as a DSpark folder that SpecForge, DeepSpec and SGLang's DSpark worker load.

Its command line is `ready export SRC OUT` (sweeps/commands/export.py). SRC is a drafter folder (a
sweep's stage folder `.../drafter`, a base drafter, a DSpark folder) or the MLflow run id of a sweep row
(its evaluation.json names the drafter it evaluated). The folders this tool writes are DSpark folders
already (ready/drafter/checkpoint.py), so the export checks the source against its manifest, refuses
what a DSpark consumer would run differently (a context window), optionally casts the weights, and
writes OUT atomically: config.json + model.safetensors, and for a ReaDy drafter its reader
(`ready_reader` block + ready_reader.safetensors), which DSpark-only loaders ignore and `ready generate
--drafter OUT` reads back. A drafter without a Markov head (`drafter.head: none`) is written as a DFlash
folder, which SpecForge's DFlashDraftModel loads.

The weights are checked as every loader checks them (floating dtypes, each tensor once, finite), and
a `--dtype` that cannot hold a value (1e6 in float16) is refused naming the tensor. OUT is new, an
empty folder, or a folder this export wrote and nobody changed since (its DONE manifest says so):
another tool's checkpoint folder, a sweep's drafter, a file or a symbolic link is never replaced. The
run of an MLflow run id must have FINISHED; `--allow-unfinished` exports a FAILED, KILLED or RUNNING
run's drafter with a warning.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Optional

import torch

from ready.artifacts import ArtifactError, atomic_dir, check_folder, written_from
from ready.checkpoint_files import inside
from ready.drafter.checkpoint import (CONFIG_FILE, READER_FILE, WEIGHTS_FILE, own_blocks, read_json, read_weights,
                                     saved_drafter_config, weight_files)
from ready.drafter.model import DrafterError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
EXPORT_SPEC = {"written_by": "ready.drafter.export"}  # the marker (DONE manifest) of a folder this tool wrote
FINISHED = "FINISHED"


def drafter_dir_of_run(run_id: str, tracking_uri: str, unfinished: str = "read") -> Path:
    """The drafter folder a sweep row's MLflow run evaluated (from its evaluation.json). A run that did not
    finish (FAILED, KILLED, still RUNNING) is read as any other (`unfinished` "read": a diagnostic's
    choice), refused ("refuse": the export's default) or read with a warning on stderr ("warn")."""
    if tracking_uri.startswith("sqlite:///") and not Path(tracking_uri[len("sqlite:///"):]).is_file():
        raise DrafterError(f"--tracking-uri {tracking_uri}: no such store; expected the sweep's MLflow database")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        status = client.get_run(run_id).info.status
        with tempfile.TemporaryDirectory() as tmp:
            evaluation = json.loads(Path(client.download_artifacts(run_id, "evaluation.json", tmp)).read_text())
    except Exception as e:  # no such run, no such artifact, unreadable store
        raise DrafterError(f"run {run_id!r} in {tracking_uri}: no evaluation.json ({type(e).__name__}); expected the "
                           "run id of a drafting sweep row (DSpark, FT, placebo or ReaDy)") from None
    if status != FINISHED and unfinished != "read":
        if unfinished == "refuse":
            raise DrafterError(f"run {run_id!r} is {status}, not {FINISHED}; expected a finished sweep row (or "
                               "--allow-unfinished to export its drafter anyway)")
        print(f"warning: run {run_id!r} is {status}, not {FINISHED}: exporting the drafter it left, which may not be "
              "the one a finished row would have evaluated", file=sys.stderr, flush=True)
    resolved = evaluation.get("resolved") if isinstance(evaluation, dict) else None
    folder = resolved.get("drafter_dir") if isinstance(resolved, dict) else None
    if not isinstance(folder, str) or not folder:
        method = evaluation.get("method") if isinstance(evaluation, dict) else None
        raise DrafterError(f"run {run_id!r}: method {method!r} has no drafter; expected a drafting row")
    return Path(folder)


def resolve_source(src: str, tracking_uri: str, unfinished: str = "read") -> Path:
    """A folder as given, else the drafter folder of the MLflow run `src` (`runs:/ID` or ID); `unfinished`
    says what a run that did not finish gets (`drafter_dir_of_run`)."""
    path = Path(src)
    if path.is_dir():
        return path
    run_id = src.removeprefix("runs:/").strip("/")
    if path.exists() or not run_id.isalnum():
        raise DrafterError(f"{src}: neither a drafter folder nor an MLflow run id; expected one of them")
    return drafter_dir_of_run(run_id, tracking_uri, unfinished)


def check_out(out: Path) -> None:
    """OUT must be new (or an empty folder) or a folder this export wrote, unchanged since: another tool's
    checkpoint folder, a sweep's drafter, a file or a symbolic link is never replaced."""
    if out.is_symlink():
        raise DrafterError(f"{out}: a symbolic link; expected a new folder or one this export wrote (a link is "
                           "not followed: its target would be replaced)")
    if out.exists() and not out.is_dir():
        raise DrafterError(f"{out}: a file; expected a new folder or one this export wrote")
    if out.is_dir() and any(out.iterdir()) and not written_from(out, EXPORT_SPEC):
        held = sorted(p.name for p in out.iterdir())
        raise DrafterError(f"{out}: exists and was not written by this export (holds {held[:5]}); expected a new "
                           "folder or an earlier export left as it was (nothing else is replaced)")


def cast_weights(weights: dict[str, torch.Tensor], dtype: str) -> dict[str, torch.Tensor]:
    """The floating tensors cast to `dtype`; one DrafterError naming the first tensor with a value `dtype`
    cannot hold (it would become Inf: weights of 1e6 in float16)."""
    cast = DTYPES[dtype]
    out = {}
    for name, v in weights.items():
        if not v.is_floating_point():
            out[name] = v
            continue
        out[name] = c = v.to(cast)
        if not bool(torch.isfinite(c).all()):
            biggest = float(v.abs().max())
            raise DrafterError(f"--dtype {dtype}: tensor {name} holds values up to |{biggest:.4g}|, beyond {dtype}'s "
                               f"largest {torch.finfo(cast).max:.4g}; expected a dtype that represents every value "
                               "(e.g. float32, or bfloat16)")
    return out


def export(src: Path, out: Path, dtype: Optional[str] = None) -> Path:
    """Write the drafter in `src` as a DSpark folder at `out` (new, or an earlier export), cast to `dtype`."""
    if not (src / CONFIG_FILE).is_file():
        raise DrafterError(f"{src}: no {CONFIG_FILE}; expected a drafter folder")
    try:
        check_folder(src, "drafter checkpoint", patterns=("*.safetensors", "*.json"))
    except ArtifactError as e:
        raise DrafterError(str(e)) from None
    config = read_json(src / CONFIG_FILE)
    if not isinstance(config.get("dflash_config"), dict):
        raise DrafterError(f"{src / CONFIG_FILE}: no dflash_config; expected a DSpark drafter folder")
    own, _ = own_blocks(config, src)
    window = saved_drafter_config(own, src).context_window if own is not None else 0  # a DSpark folder: no window
    if window:
        raise DrafterError(f"{src}: drafter.context_window = {window} (the positive control's limited context); a "
                           "DSpark consumer reads the whole context, so it would run another drafter: not exported")
    if dtype is not None and dtype not in DTYPES:
        raise DrafterError(f"--dtype {dtype!r}; expected one of {list(DTYPES)}")
    check_out(out)
    from safetensors.torch import save_file

    as_saved = lambda key: key  # noqa: E731 - an export keeps the names it was given
    weights = read_weights(weight_files(src), rename=as_saved)
    reader = {}
    if (src / READER_FILE).exists():
        reader = read_weights([inside(src, READER_FILE, f"{src}: {READER_FILE}", DrafterError)], rename=as_saved)
    if dtype is not None:
        weights = cast_weights(weights, dtype)
        config["dtype"] = dtype
    with atomic_dir(out, spec=EXPORT_SPEC) as tmp:
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=1))
        save_file(weights, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        if reader:
            save_file(reader, str(tmp / READER_FILE), metadata={"format": "pt"})
    return out
