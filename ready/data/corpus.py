"""The embedded text corpus: the Python standard library that ships with every Python install.

No machine here reaches a model or dataset hub, so the embedded default target is pretrained on
text every machine has: the standard library of the running interpreter
(`sysconfig.get_paths()["stdlib"]`).

What goes in (walked in sorted order of the path relative to the stdlib root):

- `.py` sources, plus the text files found beside them (`.txt`, `.rst`);
- skipped: `site-packages`/`dist-packages` (installed third-party code, differs per machine),
  `__pycache__`, test folders (`test`, `tests`, `idle_test`: large, repetitive, partly data),
  build data (`config-*`, `lib-dynload`, `ensurepip`), `_sysconfigdata*` (machine-specific),
  files larger than `CorpusConfig.max_file_kb` (generated tables such as `pydoc_data/topics.py`),
  the generated character-map codecs in `encodings/` (tables, not code; their text names
  `gencodec.py`),
  and anything that is not UTF-8 text (a NUL byte or a decode error);
- at most `CorpusConfig.max_files` files (the first ones in sorted order).

Split: a file is held out when `sha256(f"{seed}:{relative_path}")`, read as a fraction in [0, 1),
is below `CorpusConfig.heldout_fraction`. The split depends only on the path and the seed, so it
is the same on every machine that has the file, and adding a file never moves another one.

The corpus differs between Python versions; `Corpus.fingerprint` (a hash of every path and text)
is part of the cache key of everything built from it, so a different interpreter rebuilds.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

TEXT_SUFFIXES = (".py", ".txt", ".rst")
SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test",
                       "lib-dynload", "ensurepip"})


class CorpusError(ValueError):
    """The corpus cannot be built (no stdlib found, empty split); the message says why."""


@dataclass(frozen=True)
class Doc:
    """One corpus file: its path relative to the stdlib root and its text."""

    path: str
    text: str


@dataclass(frozen=True)
class Corpus:
    root: str
    train: tuple[Doc, ...]
    heldout: tuple[Doc, ...]
    fingerprint: str  # sha256 over (split, path, text) of every document

    def split(self, name: str) -> tuple[Doc, ...]:
        """The documents of split `name` ('train' or 'heldout')."""
        if name == "train":
            return self.train
        if name in ("heldout", "held-out", "test"):
            return self.heldout
        raise CorpusError(f"corpus split {name!r} does not exist; expected 'train' or 'heldout'")

    def train_bytes(self) -> int:
        return sum(len(d.text.encode()) for d in self.train)


def stdlib_root() -> Path:
    """The running interpreter's standard library folder."""
    return Path(sysconfig.get_paths()["stdlib"])


def _skipped(rel: Path) -> bool:
    parts = rel.parts
    if any(p in SKIP_DIRS or p.startswith("config-") for p in parts[:-1]):
        return True
    name = parts[-1]
    return name.startswith("_sysconfigdata") or not name.endswith(TEXT_SUFFIXES)


def _walk(base: Path) -> list[Path]:
    """Every file under `base` in sorted relative-path order, without entering skipped folders."""
    found = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith("config-")]
        found.extend(Path(dirpath) / f for f in filenames)
    return sorted(found, key=lambda p: p.relative_to(base).parts)


def _read_text(path: Path, max_bytes: int) -> str | None:
    try:
        if path.stat().st_size > max_bytes:
            return None
        raw = path.read_bytes()
    except OSError:
        return None
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

    `root` defaults to the interpreter's stdlib; that corpus is read once per process and cached.
    """
    args = (float(_field(cfg, "heldout_fraction")), int(_field(cfg, "max_files")),
            int(_field(cfg, "max_file_kb")), int(_field(cfg, "seed")))
    if root is None:
        return _stdlib_corpus(str(stdlib_root()), *args)
    return _build_corpus(str(root), *args)


@lru_cache(maxsize=4)
def _stdlib_corpus(root: str, heldout_fraction: float, max_files: int, max_file_kb: int, seed: int) -> Corpus:
    return _build_corpus(root, heldout_fraction, max_files, max_file_kb, seed)


def _build_corpus(root: str, heldout_fraction: float, max_files: int, max_file_kb: int, seed: int) -> Corpus:
    base = Path(root)
    if not base.is_dir():
        raise CorpusError(f"corpus root {root!r} is not a folder; expected the Python standard library")
    if not 0.0 < heldout_fraction < 1.0:
        raise CorpusError(f"bad value at key 'corpus.heldout_fraction': {heldout_fraction}; expected a number in (0, 1)")
    train: list[Doc] = []
    heldout: list[Doc] = []
    digest = hashlib.sha256()
    for path in _walk(base):
        if len(train) + len(heldout) >= max_files:
            break
        rel = path.relative_to(base)
        if _skipped(rel):
            continue
        text = _read_text(path, max_file_kb * 1024)
        if not text or not text.strip() or (rel.parts[0] == "encodings" and "gencodec.py" in text):
            continue
        rel_s = rel.as_posix()
        held = is_heldout(rel_s, heldout_fraction, seed)
        (heldout if held else train).append(Doc(rel_s, text))
        digest.update(f"{int(held)}\0{rel_s}\0".encode())
        digest.update(text.encode())
        digest.update(b"\0")
    if not train or not heldout:
        raise CorpusError(f"corpus under {root!r} has {len(train)} train and {len(heldout)} held-out files; "
                          "expected both splits non-empty (is this a Python standard library?)")
    return Corpus(root=root, train=tuple(train), heldout=tuple(heldout), fingerprint=digest.hexdigest()[:16])
