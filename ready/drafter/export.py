"""Export a drafter as a DSpark folder that SpecForge, DeepSpec and SGLang's DSpark worker load.

    python -m ready.drafter.export SRC OUT [--dtype bfloat16] [--tracking-uri sqlite:///mlflow.db]

SRC is a drafter folder (a sweep's stage folder `.../drafter`, a base drafter, a DSpark folder) or
the MLflow run id of a sweep row (its evaluation.json names the drafter it evaluated). The folders
this tool writes are DSpark folders already (ready/drafter/checkpoint.py), so the export checks the
source against its manifest, refuses what a DSpark consumer would run differently (a context window),
optionally casts the weights, and writes OUT atomically: config.json + model.safetensors, and for a
ReaDy drafter its reader (`ready_reader` block + ready_reader.safetensors), which DSpark-only
loaders ignore and `ready.generate --drafter OUT` reads back. A drafter without a Markov head
(`drafter.head: none`) is written as a DFlash folder, which SpecForge's DFlashDraftModel loads.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

import torch

from ready.artifacts import ArtifactError, atomic_dir, check_folder
from ready.drafter.checkpoint import CONFIG_FILE, READER_FILE, load_tensors, read_json, weight_files
from ready.drafter.model import DrafterError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def drafter_dir_of_run(run_id: str, tracking_uri: str) -> Path:
    """The drafter folder a sweep row's MLflow run evaluated (from its evaluation.json)."""
    if tracking_uri.startswith("sqlite:///") and not Path(tracking_uri[len("sqlite:///"):]).is_file():
        raise DrafterError(f"--tracking-uri {tracking_uri}: no such store; expected the sweep's MLflow database")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            evaluation = json.loads(Path(client.download_artifacts(run_id, "evaluation.json", tmp)).read_text())
    except Exception as e:  # no such run, no such artifact, unreadable store
        raise DrafterError(f"run {run_id!r} in {tracking_uri}: no evaluation.json ({type(e).__name__}); expected the "
                           "run id of a drafting sweep row (DSpark, FT, placebo or ReaDy)") from None
    folder = (evaluation.get("resolved") or {}).get("drafter_dir")
    if not folder:
        raise DrafterError(f"run {run_id!r}: method {evaluation.get('method')!r} has no drafter; expected a drafting row")
    return Path(folder)


def resolve_source(src: str, tracking_uri: str) -> Path:
    """A folder as given, else the drafter folder of the MLflow run `src` (`runs:/ID` or ID)."""
    path = Path(src)
    if path.is_dir():
        return path
    run_id = src.removeprefix("runs:/").strip("/")
    if path.exists() or not run_id.isalnum():
        raise DrafterError(f"{src}: neither a drafter folder nor an MLflow run id; expected one of them")
    return drafter_dir_of_run(run_id, tracking_uri)


def export(src: Path, out: Path, dtype: Optional[str] = None) -> Path:
    """Write the drafter in `src` as a DSpark folder at `out` (new or a drafter folder), cast to `dtype`."""
    if not (src / CONFIG_FILE).is_file():
        raise DrafterError(f"{src}: no {CONFIG_FILE}; expected a drafter folder")
    try:
        check_folder(src, "drafter checkpoint", patterns=("*.safetensors", "*.json"))
    except ArtifactError as e:
        raise DrafterError(str(e)) from None
    config = read_json(src / CONFIG_FILE)
    if not isinstance(config.get("dflash_config"), dict):
        raise DrafterError(f"{src / CONFIG_FILE}: no dflash_config; expected a DSpark drafter folder")
    window = ((config.get("ready_drafter") or {}).get("drafter") or {}).get("context_window", 0)
    if window:
        raise DrafterError(f"{src}: drafter.context_window = {window} (the positive control's limited context); a "
                           "DSpark consumer reads the whole context, so it would run another drafter: not exported")
    if dtype is not None and dtype not in DTYPES:
        raise DrafterError(f"--dtype {dtype!r}; expected one of {list(DTYPES)}")
    if out.exists() and any(p.name not in {CONFIG_FILE, "model.safetensors", READER_FILE, "DONE"} for p in out.iterdir()):
        raise DrafterError(f"{out}: exists and holds other files; expected a new folder or an exported drafter")
    from safetensors.torch import save_file

    weights: dict[str, torch.Tensor] = {}
    for file in weight_files(src):
        weights.update(load_tensors(file))
    reader = load_tensors(src / READER_FILE) if (src / READER_FILE).is_file() else {}
    if dtype is not None:
        cast = DTYPES[dtype]
        weights = {k: v.to(cast) if v.is_floating_point() else v for k, v in weights.items()}
        config["dtype"] = dtype
    with atomic_dir(out) as tmp:
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=1))
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if reader:
            save_file(reader, str(tmp / READER_FILE), metadata={"format": "pt"})
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ready.drafter.export", description=__doc__.splitlines()[0])
    ap.add_argument("src", help="a drafter folder, or the MLflow run id of a sweep row (runs:/ID or ID)")
    ap.add_argument("out", help="the DSpark folder to write")
    ap.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="cast the weights (default: as saved)")
    ap.add_argument("--tracking-uri", default="sqlite:///mlflow.db", help="MLflow store of the run (default %(default)s)")
    a = ap.parse_args(argv)
    try:
        out = export(resolve_source(a.src, a.tracking_uri), Path(a.out), a.dtype)
    except DrafterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"exported": str(out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
