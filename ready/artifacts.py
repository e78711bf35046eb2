"""Content-addressed artifact cache with atomic writes.

An artifact (tokenizer, pretrained target, regenerated data, trained drafter, evaluation) lives
in `<root>/<kind>/<hash>/`, where the hash is that of the config that produced it. A build
writes into a temporary sibling folder and renames it into place only when complete, and
marks completion with a `DONE` file, so a killed build never leaves something a later run
trusts.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from ready.config import config_hash

DONE = "DONE"


def artifact_dir(root: str | os.PathLike, kind: str, spec: Any) -> Path:
    """Where the artifact of `kind` built from `spec` (a JSON-able config) lives."""
    return Path(root) / kind / config_hash(spec)


def is_complete(path: str | os.PathLike) -> bool:
    return (Path(path) / DONE).is_file()


@contextmanager
def atomic_dir(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary folder; on success it becomes `final` (replacing an incomplete one)."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
        (tmp / DONE).write_text("ok\n")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def cached(root: str | os.PathLike, kind: str, spec: Any, build: Callable[[Path], None]) -> Path:
    """Return the finished artifact for `spec`, building it with `build(tmp_dir)` if needed."""
    final = artifact_dir(root, kind, spec)
    if is_complete(final):
        return final
    with atomic_dir(final) as tmp:
        (tmp / "spec.json").write_text(json.dumps(spec, indent=2, sort_keys=True, default=str))
        build(tmp)
    return final


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """torch.save through a temp file + rename: a reader sees the old file or the new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    os.close(fd)
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
