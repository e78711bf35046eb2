"""Committed measurements live in docs/data/, and only those behind a figure shown today (docs/design.md
"Conventions"): every file there is cited by the current-figures page, docs/figures.md, by its `docs/data/`
path or a glob of it; every `docs/data/` or `kernels/results/` path that a Markdown file, a module or a
config names exists (a glob matches a file); and every doc a Markdown file, module or config names by its
path (`docs/NAME.md`, `kernels/NAME.md`) exists. A path after a colon (`git show COMMIT:docs/...`) names
git history and is not checked."""

from __future__ import annotations

import fnmatch
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "data"
FIGURES = ROOT / "docs" / "figures.md"
SKIP = {".git", ".venv", "node_modules", "__pycache__", ".pytest_cache", "artifacts", "mlruns", "runs"}
# a cited path: docs/data/NAME or kernels/results/..., or results/... inside kernels/ (an old form)
CITED = re.compile(r"(?<![\w./:-])((?:docs/data|kernels/results)(?:/[\w.*-]*)*)")
KERNELS_RELATIVE = re.compile(r"(?<![\w./:-])(results/[\w.*/-]*)")
# a doc named by its path from the repository root
DOC = re.compile(r"(?<![\w./:-])((?:docs|kernels)/[\w-]+\.md)\b")
# the project's own modules and configs, whose docstrings, comments and YAML comments cite docs and data
SOURCE_DIRS = ("ready", "kernels", "benchmarks", "sweeps", "reports", "experiments")
SOURCE_SUFFIXES = {".py", ".yaml", ".yml", ".json", ".toml"}


def tracked(patterns: list[str]) -> list[Path] | None:
    """Files git tracks or would track (untracked but not ignored) matching the pathspecs, else None."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *patterns],
                             cwd=ROOT, capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return sorted({ROOT / line for line in out.splitlines() if line})


def markdown_files() -> list[Path]:
    """The repository's Markdown files: tracked or untracked-but-not-ignored (git), else a walk."""
    files = tracked(["*.md"])
    if files is None:
        files = [p for p in ROOT.rglob("*.md") if not SKIP & set(p.relative_to(ROOT).parts)]
    return sorted(p for p in files if p.is_file())


def source_files() -> list[Path]:
    """The modules and configs of SOURCE_DIRS and pyproject.toml (git's view, else a walk)."""
    files = tracked([*SOURCE_DIRS, "pyproject.toml"])
    if files is None:
        files = [p for d in SOURCE_DIRS for p in (ROOT / d).rglob("*")] + [ROOT / "pyproject.toml"]
        files = [p for p in files if not SKIP & set(p.relative_to(ROOT).parts)]
    return sorted(p for p in files if p.is_file() and p.suffix in SOURCE_SUFFIXES)


def paths_in(text: str, rel: str) -> list[str]:
    paths = [m.rstrip(".,:;") for m in CITED.findall(text)]
    if rel.startswith("kernels/") and rel.endswith(".md"):
        paths += ["kernels/" + m.rstrip(".,:;") for m in KERNELS_RELATIVE.findall(text)]
    return paths


def citations(files: list[Path]) -> dict[str, list[str]]:
    """Each cited data path (relative to the repository root) -> the files that cite it."""
    found: dict[str, list[str]] = {}
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        for cited in paths_in(path.read_text(encoding="utf-8", errors="replace"), rel):
            found.setdefault(cited, []).append(rel)
    return found


def resolves(path: str) -> bool:
    if "*" in path:
        return any(ROOT.glob(path))
    return (ROOT / path).exists()


def test_every_file_under_docs_data_is_cited_by_the_figures_page():
    assert FIGURES.is_file(), "docs/figures.md, the current-figures page, is missing"
    patterns = [p[len("docs/data/"):] for p in citations([FIGURES]) if p.startswith("docs/data/")]
    files = sorted(p.relative_to(DATA).as_posix() for p in DATA.rglob("*") if p.is_file())
    assert files, "docs/data/ holds no files"
    uncited = [f for f in files if not any(pat and fnmatch.fnmatchcase(f, pat) for pat in patterns)]
    assert not uncited, ("files under docs/data/ that docs/figures.md does not cite (cite each beside the figure "
                         f"it is behind, by its docs/data/ path, or git rm it: superseded data stays in git): {uncited}")


def test_every_cited_docs_data_or_kernels_results_path_exists():
    missing = {path: files for path, files in citations(markdown_files() + source_files()).items()
               if not resolves(path)}
    assert not missing, f"cited paths that do not exist (path -> files that cite it): {missing}"


def test_every_doc_named_by_its_path_exists():
    """A doc that was folded into another or deleted leaves no reference behind (the frozen records under
    docs/data/ are not checked: they quote what the docs were called when they were written)."""
    named: dict[str, list[str]] = {}
    for path in markdown_files() + source_files():
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("docs/data/"):
            continue
        for doc in DOC.findall(path.read_text(encoding="utf-8", errors="replace")):
            named.setdefault(doc, []).append(rel)
    missing = {doc: files for doc, files in named.items() if not (ROOT / doc).is_file()}
    assert not missing, f"docs named by a path that does not exist (doc -> files that name it): {missing}"
