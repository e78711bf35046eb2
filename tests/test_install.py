"""The project installs as real packages: kernels/ is `ready_kernels` in a wheel as in a clone.

The wheel test builds a wheel from a copy of the sources, installs it with pip into a fresh venv
outside the repository (torch & co. come from this venv's site-packages through a .pth line, which
does not run our editable finder), and imports every kernel module and `ready` from there. It also
checks that a regular package named `kernels` (what the PyPI distribution `kernels` installs) wins
over our folder when a user runs from the repository root.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest
import torch

import ready.fastops as fastops
import ready.reader as reader
from ready_kernels import _common

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("pyproject.toml", "README.md", "ready", "benchmarks", "sweeps", "reports", "kernels")
KERNEL_MODULES = sorted(p.stem for p in (ROOT / "kernels").glob("*.py"))


def _setuptools_table() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_pyproject_lists_every_package_and_maps_kernels():
    st = _setuptools_table()
    found = sorted(".".join(p.parent.relative_to(ROOT).parts) for top in ("ready", "benchmarks", "sweeps", "reports")
                   for p in (ROOT / top).rglob("__init__.py") if "__pycache__" not in p.parts)
    missing = sorted(set(found) - set(st["packages"]))
    assert not missing, f"add {missing} to [tool.setuptools] packages in pyproject.toml (a wheel would lack them)"
    assert "ready_kernels" in st["packages"] and st["package-dir"] == {"ready_kernels": "kernels"}
    # a regular package here would shadow the PyPI `kernels` whenever the repo root is on sys.path
    assert not (ROOT / "kernels" / "__init__.py").exists()


def test_kernels_import_from_the_install_not_a_registration():
    import ready_kernels.state_reader as sr

    assert Path(sr.__file__).resolve() == ROOT / "kernels" / "state_reader.py"
    assert reader.state_reader is sr and reader.read_states_torch is sr.state_reader_reference
    assert not hasattr(fastops, "register") and not hasattr(fastops, "load_kernel")  # plain imports, no loader


@pytest.fixture
def fresh_warning(monkeypatch):
    monkeypatch.setattr(fastops, "_warned", False)


def _python(code: str, pythonpath: str = "") -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "TRITON_INTERPRET": "1",
           **({"PYTHONPATH": pythonpath} if pythonpath else {})}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


def test_an_install_without_ready_kernels_is_said_in_one_line_naming_the_fix():
    """The kernels' torch references are the library's torch paths, so the library cannot run without
    `ready_kernels` (an editable install from before kernels/ was mapped): one line says why and how to fix
    it before the ImportError."""
    run = _python("import sys; sys.modules['ready_kernels'] = None; import ready.reader")
    assert run.returncode != 0
    said = [line for line in run.stderr.splitlines() if "(ready)" in line]
    assert len(said) == 1, run.stderr  # ... once, in one line naming the package and the fix
    assert "ready_kernels" in said[0] and "pip install -e ." in said[0]
    assert run.stderr.strip().splitlines()[-1].startswith(("ImportError", "ModuleNotFoundError"))


def test_cuda_without_a_working_triton_is_said_once_and_runs_torch(fresh_warning, monkeypatch, capsys):
    monkeypatch.setattr(_common, "HAS_TRITON", False)
    monkeypatch.setattr(_common, "TRITON_ERROR", "RuntimeError: bad triton version")
    cuda = torch.device("cuda")
    assert not fastops.fused_on(cuda) and not fastops.fused_on(cuda)  # the torch paths run ...
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err  # ... and it is said once, in one line naming the cause and the fix
    assert "bad triton version" in lines[0] and "pip install -e ." in lines[0]


def test_cpu_runs_torch_quietly(fresh_warning, monkeypatch, capsys):
    x = torch.zeros(2)
    assert not fastops.fused(x)
    monkeypatch.setattr(_common, "HAS_TRITON", False)
    assert not fastops.fused(x) and not fastops.fused_on(torch.device("cpu"))
    assert capsys.readouterr().err == ""


def test_a_broken_triton_is_caught_by_the_one_guard(tmp_path):
    """A Triton that fails on import (an incompatible build) leaves every kernel module importable with its
    torch reference; `_common.TRITON_ERROR` keeps the cause for the line `fastops` says on CUDA."""
    (tmp_path / "triton").mkdir()
    (tmp_path / "triton" / "__init__.py").write_text("raise RuntimeError('bad triton version')\n")
    mods = ", ".join(f"ready_kernels.{m}" for m in KERNEL_MODULES)
    run = _python(f"import ready.reader, {mods}\nfrom ready_kernels import _common\n"
                  "print(_common.HAS_TRITON, _common.TRITON_ERROR)", pythonpath=str(tmp_path))
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "False RuntimeError: bad triton version"


def _run(cmd: list[str], cwd: Path) -> str:
    run = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300,
                         env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": str(cwd)})
    assert run.returncode == 0, f"{' '.join(cmd)}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return run.stdout


@pytest.mark.slow
def test_wheel_installs_kernels_as_ready_kernels_in_a_fresh_venv(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:  # build from a copy: the build leaves build/ and egg-info behind
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "results"))
        else:
            shutil.copy2(ROOT / name, src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    _run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp_path / "dist"), str(src)],
         tmp_path)
    wheel = next((tmp_path / "dist").glob("ready_ablations-*.whl"))

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path)
    py = venv / "bin" / "python"
    _run([*pip, "--python", str(py), "install", "--no-deps", "--no-index", str(wheel)], tmp_path)
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path).strip())
    # dependencies (torch, ...) from this venv; a .pth line adds the folder without running its .pth files,
    # so our editable finder stays out
    (site / "zz_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    mods = ", ".join(f"ready_kernels.{m}" for m in KERNEL_MODULES)
    check = (f"import ready, ready.reader, ready.target, {mods}\n"
             "from pathlib import Path\n"
             f"site = Path({str(site)!r})\n"
             f"for m in ({mods}, ready):\n"
             "    assert Path(m.__file__).is_relative_to(site), m.__file__\n"
             "assert ready.reader.state_reader is ready_kernels.state_reader\n"
             "import ready.data.corpus as corpus\n"  # the corpus manifest ships as package data
             "assert corpus.MANIFEST.is_relative_to(site) and corpus.read_manifest()['files']\n"
             "print('ok')\n")
    assert _run([str(py), "-c", check], tmp_path).strip().endswith("ok")

    # the console script `ready` ([project.scripts]) runs from the wheel: its help reads the installed sources
    helped = _run([str(venv / "bin" / "ready"), "--help"], tmp_path)
    assert "sweeps.run" in helped and "benchmarks.engine" in helped and "benchmarks.diagnostics.theory" in helped

    # a regular `kernels` package (as the PyPI distribution installs) is not shadowed by kernels/ in the
    # working directory, and ready_kernels still comes from the wheel
    (site / "kernels").mkdir()
    (site / "kernels" / "__init__.py").write_text("PYPI_KERNELS = True\n")
    out = _run([str(py), "-c", "import kernels, ready_kernels.state_reader as s; "
                "print(getattr(kernels, 'PYPI_KERNELS', False), s.__file__)"], src)
    flag, path = out.split()
    assert flag == "True" and Path(path).is_relative_to(site)
