"""Committed measurements live in docs/data/ and each is cited (docs/design.md "Conventions"): every file
there is named by some Markdown file of the repository, by its `docs/data/` path or a glob of it, and
every `docs/data/` or `kernels/results/` path a Markdown file names exists (a glob matches a file)."""

from __future__ import annotations

import fnmatch
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "data"
SKIP = {".git", ".venv", "node_modules", "__pycache__", ".pytest_cache", "artifacts", "mlruns", "runs"}
# a cited path: docs/data/NAME or kernels/results/..., or results/... inside kernels/ (NOTES.md's old form)
CITED = re.compile(r"(?<![\w./-])((?:docs/data|kernels/results)(?:/[\w.*-]*)*)")
KERNELS_RELATIVE = re.compile(r"(?<![\w./-])(results/[\w.*/-]*)")


def markdown_files() -> list[Path]:
    """The repository's Markdown files: tracked or untracked-but-not-ignored (git), else a walk."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", "*.md"],
                             cwd=ROOT, capture_output=True, text=True, timeout=60, check=True).stdout
        files = [ROOT / line for line in out.splitlines() if line]
    except (OSError, subprocess.SubprocessError):
        files = [p for p in ROOT.rglob("*.md") if not SKIP & set(p.relative_to(ROOT).parts)]
    return sorted(p for p in files if p.is_file())


def citations() -> dict[str, list[str]]:
    """Each cited path (relative to the repository root) -> the Markdown files that cite it."""
    found: dict[str, list[str]] = {}
    for md in markdown_files():
        rel = md.relative_to(ROOT).as_posix()
        text = md.read_text(encoding="utf-8", errors="replace")
        paths = [m.rstrip(".,:;") for m in CITED.findall(text)]
        if rel.startswith("kernels/"):
            paths += ["kernels/" + m.rstrip(".,:;") for m in KERNELS_RELATIVE.findall(text)]
        for path in paths:
            found.setdefault(path, []).append(rel)
    return found


def resolves(path: str) -> bool:
    if "*" in path:
        return any(ROOT.glob(path))
    return (ROOT / path).exists()


def test_every_file_under_docs_data_is_cited_by_a_markdown_file():
    patterns = [p[len("docs/data/"):] for p in citations() if p.startswith("docs/data/")]
    files = sorted(p.relative_to(DATA).as_posix() for p in DATA.rglob("*") if p.is_file())
    assert files, "docs/data/ holds no files"
    uncited = [f for f in files if not any(pat and fnmatch.fnmatchcase(f, pat) for pat in patterns)]
    assert not uncited, ("files under docs/data/ that no Markdown file cites (cite each by its docs/data/ "
                         f"path, or git rm it): {uncited}")


def test_every_cited_docs_data_or_kernels_results_path_exists():
    missing = {path: mds for path, mds in citations().items() if not resolves(path)}
    assert not missing, f"cited paths that do not exist (path -> Markdown files): {missing}"
