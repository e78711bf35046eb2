"""Content-addressed artifact cache with atomic writes and verified contents.

An artifact (tokenizer, pretrained target, regenerated data, trained drafter, evaluation) lives
in `<root>/<kind>/<hash>/`, where the hash is that of the config that produced it. A build
writes into a temporary sibling folder and renames it into place only when complete, and
marks completion with a `DONE` file, so a killed build never leaves something a later run
trusts.

The `DONE` marker is a manifest: the size and sha256 of every file in the folder and the hash
of the spec that produced it. An artifact is checked against it before use (each file is hashed
at most once per process, keyed by inode, size and mtime), so a truncated, overwritten or
deleted file is found. The cache's own artifacts are then rebuilt (one line on stderr says so);
a folder the user pointed at (a checkpoint in the config) raises `ArtifactError` instead.
A marker from before manifests (`ok`) is upgraded on first use: its files are hashed and recorded.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch

from ready.config import config_hash
from ready.threads import cpu_threads

DONE = "DONE"
MARKER_FORMAT = "ready-artifact/2"
LEGACY_MARKER = "ok"
_CHUNK = 1 << 20
_digests: dict[tuple[int, int, int, int], str] = {}  # (dev, inode, size, mtime_ns) -> sha256, this process


class ArtifactError(ValueError):
    """A folder the user supplied does not match the manifest it was written with."""


def umask() -> int:
    """The process's umask, read without changing it where /proc tells it (os.umask can only be read by
    setting it, which races with other threads creating files)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _as_umask_says(path: str | os.PathLike, folder: bool = False) -> None:
    """Give a temp file or folder (mkstemp: 0600, mkdtemp: 0700) the mode a plain create would have had,
    so what is renamed into place is readable by the group and others as the umask says."""
    os.chmod(path, (0o777 if folder else 0o666) & ~umask())


def artifact_dir(root: str | os.PathLike, kind: str, spec: Any) -> Path:
    """Where the artifact of `kind` built from `spec` (a JSON-able config) lives."""
    return Path(root) / kind / config_hash(spec)


def is_complete(path: str | os.PathLike) -> bool:
    """A `DONE` marker is present (says nothing about the contents: see `verify`)."""
    return (Path(path) / DONE).is_file()


def file_digest(path: str | os.PathLike) -> str:
    """sha256 of a file, computed once per process for a given inode, size and mtime."""
    st = os.stat(path)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _digests:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        _digests[key] = h.hexdigest()
    return _digests[key]


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p != folder / DONE)


def manifest(folder: str | os.PathLike, spec_hash: Optional[str] = None) -> dict:
    """The marker content for `folder` as it is now: every file's size and sha256, and the spec hash."""
    folder = Path(folder)
    files = {p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": file_digest(p)}
             for p in _files(folder)}
    return {"format": MARKER_FORMAT, "spec": spec_hash, "files": files}


def _write_marker(folder: Path, spec_hash: Optional[str]) -> None:
    atomic_write_text(folder / DONE, json.dumps(manifest(folder, spec_hash), indent=1, sort_keys=True) + "\n")


def _read_marker(folder: Path) -> tuple[Optional[dict], Optional[str]]:
    """(manifest, None); (None, None) for a legacy `ok` marker; (None, reason) when unusable."""
    try:
        text = (folder / DONE).read_text()
    except FileNotFoundError:
        return None, f"no {DONE} marker (never finished)"
    except (OSError, UnicodeDecodeError) as e:
        return None, f"{DONE}: unreadable ({getattr(e, 'strerror', None) or e})"
    if text.strip() == LEGACY_MARKER:
        return None, None
    try:
        meta = json.loads(text)
        if meta.get("format") != MARKER_FORMAT or not isinstance(meta.get("files"), dict):
            raise ValueError
    except (ValueError, AttributeError):
        return None, f"{DONE}: not a manifest written by ready.artifacts"
    return meta, None


def verify(folder: str | os.PathLike, spec_hash: Optional[str] = None,
           patterns: tuple[str, ...] = ("*",)) -> Optional[str]:
    """None when every file the marker lists (those matching `patterns`) is there with its recorded
    size and sha256 (and the marker names `spec_hash`, when given); else what is wrong, in a few words."""
    folder = Path(folder)
    meta, why = _read_marker(folder)
    if why:
        return why
    if meta is None:  # legacy marker: nothing recorded to compare with
        return None
    if spec_hash is not None and meta.get("spec") not in (None, spec_hash):
        return f"built from spec {meta.get('spec')}, expected {spec_hash}"
    for name, rec in sorted(meta["files"].items()):
        if not any(fnmatch.fnmatch(name, p) for p in patterns):
            continue
        path = folder / name
        try:
            size = path.stat().st_size
            if size != rec.get("size"):
                return f"{name}: {size} bytes, the marker recorded {rec.get('size')}"
            if file_digest(path) != rec.get("sha256"):
                return f"{name}: content differs from the sha256 the marker recorded"
        except FileNotFoundError:
            return f"{name}: missing"
        except OSError as e:
            return f"{name}: unreadable ({e.strerror or e})"
    return None


def _adopt_legacy(folder: Path, spec_hash: Optional[str], label: str) -> None:
    print(f"[ready] artifact {label} predates content digests; recording them now", file=sys.stderr, flush=True)
    try:
        _write_marker(folder, spec_hash)
    except OSError as e:  # a read-only cache still works, unverified
        print(f"[ready] could not record digests for {label}: {e.strerror or e}", file=sys.stderr, flush=True)


def intact(folder: str | os.PathLike, spec: Any = None, label: Optional[str] = None) -> bool:
    """Whether a cache artifact can be used as it is. A finished artifact that fails verification
    gets one line on stderr (the caller rebuilds it); an unfinished one is just False."""
    folder = Path(folder)
    spec_hash = None if spec is None else config_hash(spec)
    label = label or f"{folder.parent.name}/{folder.name}"
    if not (folder / DONE).exists():
        return False
    meta, _ = _read_marker(folder)
    why = verify(folder, spec_hash)
    if why is None and meta is None:
        _adopt_legacy(folder, spec_hash, label)
        return True
    if why is not None:
        said = (str(folder.resolve()), why, _mtime(folder / DONE))
        if said not in _SAID:  # several checks of one folder before its rebuild: one line
            _SAID.add(said)
            print(f"[ready] artifact {label} failed verification ({why}); rebuilding it", file=sys.stderr, flush=True)
        return False
    return True


_SAID: set[tuple[str, str, int]] = set()  # (folder, what is wrong, its marker's mtime) already on stderr


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def check_folder(folder: str | os.PathLike, what: str, patterns: tuple[str, ...] = ("*",)) -> None:
    """For a folder the user supplied: raise ArtifactError when the files matching `patterns` no
    longer match the manifest it was written with (e.g. only "*.safetensors": a hand-edited
    config.json is the user's business, changed weights are not). A folder without a manifest
    (e.g. a Hugging Face download) is not checked here."""
    folder = Path(folder)
    if not (folder / DONE).exists():
        return
    why = verify(folder, patterns=patterns)
    if why is not None:
        raise ArtifactError(f"{folder}: {why}; expected the {what} as it was written (restore it, or delete "
                            f"{folder / DONE} if the change was on purpose)")


def written_from(folder: str | os.PathLike, spec: Any) -> bool:
    """Whether `folder` was written by `atomic_dir(folder, spec=spec)` and holds exactly the files its
    manifest lists (nothing added since): how a tool recognises a folder it may replace."""
    folder = Path(folder)
    meta, _ = _read_marker(folder)
    if meta is None or meta.get("spec") != config_hash(spec):
        return False
    here = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p != folder / DONE}
    return here == set(meta["files"])


def content_id(folder: str | os.PathLike, patterns: tuple[str, ...] = ("*",)) -> str:
    """A short id of the contents of the files in `folder` whose relative path matches one of
    `patterns` (fnmatch; e.g. ("config.json", "*.safetensors") for what decides a model's outputs,
    leaving out build logs with timings). From the manifest's digests when the folder has one,
    else from those files' sizes and mtimes (cheap; changes whenever a file is replaced)."""
    folder = Path(folder)

    def wanted(name: str) -> bool:
        return any(fnmatch.fnmatch(name, p) for p in patterns)

    meta, _ = _read_marker(folder)
    if meta is not None:
        return config_hash({"files": {k: v for k, v in meta["files"].items() if wanted(k)}}, length=16)
    stats = {p.relative_to(folder).as_posix(): [p.stat().st_size, p.stat().st_mtime_ns]
             for p in _files(folder) if wanted(p.relative_to(folder).as_posix())}
    return config_hash({"stat": stats}, length=16)


@contextmanager
def atomic_dir(final: str | os.PathLike, spec: Any = None) -> Iterator[Path]:
    """Yield a temporary folder; on success it gets its manifest marker and becomes `final`
    (replacing an incomplete or corrupt one; kept as is when another process finished it first)."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    spec_hash = None if spec is None else config_hash(spec)
    try:
        _as_umask_says(tmp, folder=True)
        yield tmp
        _write_marker(tmp, spec_hash)
        if final.exists():
            shutil.rmtree(final)
        try:
            os.replace(tmp, final)
        except OSError:  # another process put a folder there between the two calls
            if is_complete(final) and verify(final, spec_hash) is None:
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                shutil.rmtree(final, ignore_errors=True)
                os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def cached(root: str | os.PathLike, kind: str, spec: Any, build: Callable[[Path], None]) -> Path:
    """Return the finished, verified artifact for `spec`, (re)building it with `build(tmp_dir)` if needed.
    A spec's `threads` is the torch CPU thread count the build runs on (`ready.threads`)."""
    final = artifact_dir(root, kind, spec)
    if intact(final, spec, label=f"{kind}/{final.name}"):
        return final
    with atomic_dir(final, spec=spec) as tmp, cpu_threads(spec_threads(spec)):
        (tmp / "spec.json").write_text(json.dumps(spec, indent=2, sort_keys=True, default=str))
        build(tmp)
    return final


def spec_threads(spec: Any) -> Optional[int]:
    """The torch CPU thread count a spec names (`threads`), or None."""
    return int(spec["threads"]) if isinstance(spec, dict) and spec.get("threads") is not None else None


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        _as_umask_says(tmp)
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
        _as_umask_says(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
