"""The embedded text corpus: the sources of one pinned PyPI package, the same bytes on every install.

No machine here reaches a model or dataset hub, so the embedded default target, its tokenizer, the
drafters' default training prompts and conversations and the `heldout` suite are all made from text
that the install itself brings: the Python sources of `sympy` at the version pyproject pins
(`CORPUS_VERSION`). Until issue 78 it was the running interpreter's standard library, which each Python
version ships differently (3.11.7 and 3.12.1 pretrained different targets from one config).

Why sympy: torch already depends on it (no extra download), it is pure Python (one
`py3-none-any` wheel: the same files on every platform and interpreter), BSD-3-Clause, and its sources
are code with prose docstrings, as the standard library's are.

`corpus_manifest.json` (beside this file) lists the files that may go in, in order, each with its
sha256. They are read where the installed distribution keeps them (`importlib.metadata`) and checked:
another sympy version, a missing file or a changed file is one `CorpusError` line naming the package,
the version expected and the file. The manifest is what `eligible_files` selects from the wheel:

- `.py` sources plus the text files beside them (`.txt`, `.rst`), walked in sorted order of the path
  relative to site-packages (path components compared one by one);
- skipped: test folders (`tests`, `test`, `test-examples`), `benchmarks` (generated tables such as
  `bench_solvers.py`), generated parsers (`_antlr`) and `__pycache__`;

then, as the config says, files larger than `CorpusConfig.max_file_kb`, files that are not UTF-8 text
(a NUL byte, a decode error) or are empty are left out, and at most the first `CorpusConfig.max_files`
files are read (the default, 500, keeps the corpus near the standard library's 9.5 MB).
Regenerate the manifest (only when the pin moves, which changes every embedded figure):

    python -c "from ready.data.corpus import write_manifest; write_manifest()"

Split: a file is held out when `sha256(f"{seed}:{relative_path}")`, read as a fraction in [0, 1),
is below `CorpusConfig.heldout_fraction`. The split depends only on the path and the seed, and adding
a file never moves another one.

`Corpus.fingerprint` (sha256 over every document's split, path and text) is part of the cache key of
everything built from the corpus and of a sweep setting (`ready.loading.inputs_identity`); `describe()`
is the line a sweep prints at its start. Bit-identity of the corpus holds on every install that has the
pinned wheel; what is built from it is bit-identical only as far as docs/design.md "The embedded
corpus" says.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

CORPUS_PACKAGE = "sympy"
CORPUS_VERSION = "1.14.0"  # pyproject pins the same version; a move changes every embedded figure
MANIFEST = Path(__file__).with_name("corpus_manifest.json")
TEXT_SUFFIXES = (".py", ".txt", ".rst")
SKIP_DIRS = frozenset({"__pycache__", "tests", "test", "test-examples", "benchmarks", "_antlr"})


class CorpusError(ValueError):
    """The corpus cannot be built (wrong package version, changed file, empty split); the message says why."""


@dataclass(frozen=True)
class Doc:
    """One corpus file: its path relative to the corpus root (site-packages for the package) and its text."""

    path: str
    text: str


@dataclass(frozen=True)
class Corpus:
    root: str
    train: tuple[Doc, ...]
    heldout: tuple[Doc, ...]
    fingerprint: str  # sha256 over (split, path, text) of every document
    source: str = ""  # what it was read from: "sympy 1.14.0" for the pinned package, else the folder

    def split(self, name: str) -> tuple[Doc, ...]:
        """The documents of split `name` ('train' or 'heldout')."""
        if name == "train":
            return self.train
        if name in ("heldout", "held-out", "test"):
            return self.heldout
        raise CorpusError(f"corpus split {name!r} does not exist; expected 'train' or 'heldout'")

    def train_bytes(self) -> int:
        return sum(len(d.text.encode()) for d in self.train)

    def describe(self) -> str:
        """One line: where the text comes from, how much, and its digest (printed at a sweep's start)."""
        size = sum(len(d.text.encode()) for d in self.train + self.heldout)
        return (f"corpus: {self.source} sources, {len(self.train)} train + {len(self.heldout)} held-out files "
                f"({size / 1e6:.2f} MB), digest {self.fingerprint}")


def _skipped(parts: tuple[str, ...]) -> bool:
    return any(p in SKIP_DIRS for p in parts[:-1]) or not parts[-1].endswith(TEXT_SUFFIXES)


def eligible_files(root: str | os.PathLike) -> list[str]:
    """Relative paths of the files under `root` that may go into a corpus, in corpus order (sorted by
    path components), without entering skipped folders."""
    base = Path(root)
    found = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        for f in filenames:
            rel = (Path(dirpath) / f).relative_to(base)
            if not _skipped(rel.parts):
                found.append(rel)
    return [p.as_posix() for p in sorted(found, key=lambda p: p.parts)]


def _text(raw: bytes) -> Optional[str]:
    """The file's text, or None when it is not UTF-8 text (a NUL byte or a decode error)."""
    if b"\x00" in raw:
        return None
    try:
        return raw.decode("utf-8").replace("\r\n", "\n")
    except UnicodeDecodeError:
        return None


def is_heldout(rel_path: str, heldout_fraction: float, seed: int) -> bool:
    """Deterministic split: hash of (seed, relative path) as a fraction vs `heldout_fraction`."""
    h = hashlib.sha256(f"{seed}:{rel_path}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2.0**64 < heldout_fraction


def _field(cfg: Any, name: str) -> Any:
    return cfg[name] if isinstance(cfg, dict) else getattr(cfg, name)


def load_corpus(cfg: Any, root: str | Path | None = None) -> Corpus:
    """Build the corpus described by `cfg` (a CorpusConfig or the `corpus` section of a Config).

    `root` None: the pinned package's files of the manifest, checked by digest (read once per process
    and cached). A folder: its eligible files as they are (tests build small corpora this way)."""
    args = (float(_field(cfg, "heldout_fraction")), int(_field(cfg, "max_files")),
            int(_field(cfg, "max_file_kb")), int(_field(cfg, "seed")))
    if root is None:
        return _package_corpus(*args)
    base = Path(root)
    if not base.is_dir():
        raise CorpusError(f"corpus root {str(root)!r} is not a folder; expected a folder of Python sources")
    return _build_corpus(str(root), str(root), [(p, base / p, None) for p in eligible_files(base)], *args)


def read_manifest(path: Optional[Path] = None) -> dict:
    """The committed manifest (`MANIFEST`): {"package", "version", "files": [[relative path, sha256], ...]}."""
    path = MANIFEST if path is None else path
    try:
        manifest = json.loads(path.read_text())
        files = [(str(p), str(h)) for p, h in manifest["files"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CorpusError(f"corpus manifest {path}: unreadable ({e}); expected the JSON file the package ships") from None
    return {**manifest, "files": files}


def _distribution(package: str, version: str) -> importlib.metadata.Distribution:
    """The installed distribution of `package`, which must be `version`."""
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise CorpusError(f"corpus: {package} is not installed; expected {package}=={version}, whose sources are the "
                          f"embedded corpus (pyproject pins it: pip install {package}=={version})") from None
    if dist.version != version:
        raise CorpusError(f"corpus: {package} {dist.version} is installed; expected {package}=={version}, whose sources "
                          f"are the embedded corpus (pyproject pins it: pip install {package}=={version})")
    return dist


@lru_cache(maxsize=4)
def _package_corpus(heldout_fraction: float, max_files: int, max_file_kb: int, seed: int) -> Corpus:
    manifest = read_manifest()
    package, version = str(manifest["package"]), str(manifest["version"])
    dist = _distribution(package, version)
    files = [(rel, Path(str(dist.locate_file(rel))), digest) for rel, digest in manifest["files"]]
    return _build_corpus(str(dist.locate_file("")), f"{package} {version}", files, heldout_fraction, max_files,
                         max_file_kb, seed)


def _build_corpus(root: str, source: str, files: list[tuple[str, Path, Optional[str]]], heldout_fraction: float,
                  max_files: int, max_file_kb: int, seed: int) -> Corpus:
    """The corpus of `files` ((relative path, where it is, sha256 expected or None)), in their order."""
    if not 0.0 < heldout_fraction < 1.0:
        raise CorpusError(f"bad value at key 'corpus.heldout_fraction': {heldout_fraction}; expected a number in (0, 1)")
    train: list[Doc] = []
    heldout: list[Doc] = []
    digest = hashlib.sha256()
    for rel, path, want in files:
        if len(train) + len(heldout) >= max_files:
            break
        try:
            if path.stat().st_size > max_file_kb * 1024:
                continue
            raw = path.read_bytes()
        except OSError as e:
            if want is None:
                continue
            raise CorpusError(f"corpus: {source}'s file {rel} cannot be read ({e.strerror or e}); expected the file "
                              f"the wheel ships (pip install --force-reinstall {source.replace(' ', '==')})") from None
        if want is not None and hashlib.sha256(raw).hexdigest() != want:
            raise CorpusError(f"corpus: {source}'s file {rel} differs from the manifest (sha256 "
                              f"{hashlib.sha256(raw).hexdigest()[:12]}, expected {want[:12]}); expected the file the wheel "
                              f"ships (pip install --force-reinstall {source.replace(' ', '==')})")
        text = _text(raw)
        if not text or not text.strip():
            continue
        held = is_heldout(rel, heldout_fraction, seed)
        (heldout if held else train).append(Doc(rel, text))
        digest.update(f"{int(held)}\0{rel}\0".encode())
        digest.update(text.encode())
        digest.update(b"\0")
    if not train or not heldout:
        raise CorpusError(f"corpus from {source} has {len(train)} train and {len(heldout)} held-out files; "
                          "expected both splits non-empty (raise corpus.max_files or corpus.heldout_fraction)")
    return Corpus(root=root, train=tuple(train), heldout=tuple(heldout), fingerprint=digest.hexdigest()[:16],
                  source=source)


def manifest_for(package: str = CORPUS_PACKAGE, version: str = CORPUS_VERSION) -> dict:
    """The manifest of the installed `package` (which must be `version`): the eligible files of the
    distribution's own file list (its RECORD), in corpus order, with their sha256."""
    dist = _distribution(package, version)
    files = sorted((f.parts for f in dist.files or []
                    if f.parts and f.parts[0] != ".." and not f.parts[0].endswith((".dist-info", ".data"))
                    and not _skipped(f.parts)))
    rels = ["/".join(parts) for parts in files]
    return {"about": "the embedded corpus (ready/data/corpus.py): these files of this package, checked by sha256",
            "package": package, "version": version,
            "files": [[rel, hashlib.sha256(Path(str(dist.locate_file(rel))).read_bytes()).hexdigest()] for rel in rels]}


def write_manifest(path: Optional[Path] = None) -> None:
    """Write `manifest_for()` to `path` (default the committed `MANIFEST`), one file per line."""
    from ready.artifacts import atomic_write_text

    path = MANIFEST if path is None else path
    m = manifest_for()
    head = json.dumps({k: v for k, v in m.items() if k != "files"}, indent=1)[:-2]
    rows = ",\n".join("  " + json.dumps(f) for f in m["files"])
    atomic_write_text(path, f"{head},\n \"files\": [\n{rows}\n ]\n}}\n")
