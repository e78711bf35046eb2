"""Imports only point down: the import-linter contract in pyproject.toml holds for this checkout, and it
fails when an upward import or an import cycle appears (docs/design.md "The layers")."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("ready", "benchmarks", "sweeps", "reports")

# lint-imports over the packages below argv[1]: `ready_kernels` is argv[2]/ready_kernels (a link to its
# kernels/), and an editable install's path hook, which may map `ready_kernels` to another clone's
# kernels/ (the namespace package would then hold both), is left out, so only this tree is checked.
DRIVER = """
import sys
sys.path[:] = [p for p in sys.path if "__editable__" not in p]
from importlinter.cli import lint_imports
sys.exit(lint_imports(config_filename="pyproject.toml", no_cache=True, no_logo=True))
"""


def lint(root: Path, links: Path) -> subprocess.CompletedProcess:
    """Run the contract of `root`/pyproject.toml on the packages of `root` (and `root`/kernels)."""
    links.mkdir(parents=True, exist_ok=True)
    link = links / "ready_kernels"
    if not link.exists():
        link.symlink_to(root / "kernels", target_is_directory=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(links)])}
    return subprocess.run([sys.executable, "-c", DRIVER], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_layers_contract_holds(tmp_path):
    pytest.importorskip("importlinter")
    out = lint(ROOT, tmp_path / "links")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


def _copy_tree(dest: Path) -> Path:
    """The packages, the kernels (without their results) and pyproject.toml, copied to `dest`."""
    for name in PACKAGES:
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "kernels", dest / "kernels", ignore=shutil.ignore_patterns("__pycache__", "results"))
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


@pytest.mark.parametrize("module, line, broken", [
    ("ready/config.py", "import sweeps.spec", "ready.config -> sweeps.spec"),  # the library imports a runner
    ("kernels/rmsnorm.py", "import ready.config", "ready_kernels.rmsnorm -> ready.config"),  # a kernel imports the library
    ("ready/target/cache.py", "import ready.decode.engine", "ready.target.cache -> ready.decode.engine"),  # a room imports one above it
    ("ready/train/anchors.py", "import ready.train.stages", "No cycles are allowed in ready.train"),  # a cycle
    ("ready/metrics.py", "import reports.stats", "ready.metrics -> reports.stats"),  # the library imports the reports
    ("benchmarks/engine.py", "import sweeps.row", "benchmarks.engine -> sweeps.row"),  # siblings: neither imports the other
])
def test_an_upward_import_or_a_cycle_breaks_the_contract(tmp_path, module, line, broken):
    """The same check on a copy of the tree with one import added fails and names it."""
    pytest.importorskip("importlinter")
    tree = _copy_tree(tmp_path / "tree")
    path = tree / module
    path.write_text(path.read_text() + f"\n{line}  # an import the contract must refuse\n")
    out = lint(tree, tmp_path / "links")
    assert out.returncode != 0 and "BROKEN" in out.stdout, out.stdout[-4000:] + out.stderr[-2000:]
    assert broken in out.stdout
