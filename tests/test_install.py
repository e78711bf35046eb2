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

import ready.fastops as fastops
import ready.reader as reader

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
    assert reader.fused_state_reader() is sr.state_reader
    assert not hasattr(fastops, "register")


@pytest.fixture
def fresh_warning(monkeypatch):
    monkeypatch.setattr(fastops, "_warned", False)
    monkeypatch.setattr(reader, "_FUSED", None)
    monkeypatch.setitem(sys.modules, "ready_kernels.state_reader", None)  # import now raises ImportError


def test_missing_kernels_when_wanted_is_said_once_on_stderr(fresh_warning, monkeypatch, capsys):
    monkeypatch.setattr(fastops, "fused_wanted", lambda: True)
    assert reader.fused_state_reader() is None  # falls back to torch ...
    assert fastops.load_kernel("state_reader") is None
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err  # ... and says so once, in one line naming the module and the fix
    assert "ready_kernels.state_reader" in lines[0] and "pip install -e ." in lines[0]


def test_missing_kernels_on_cpu_falls_back_quietly(fresh_warning, monkeypatch, capsys):
    monkeypatch.setattr(fastops, "fused_wanted", lambda: False)
    assert fastops.load_kernel("state_reader") is None
    assert capsys.readouterr().err == ""


def test_broken_kernel_module_is_said_even_on_cpu(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(fastops, "_warned", False)
    monkeypatch.setattr(fastops, "fused_wanted", lambda: False)
    (tmp_path / "ready_kernels").mkdir()
    (tmp_path / "ready_kernels" / "broken_op.py").write_text("raise RuntimeError('bad triton version')\n")
    import ready_kernels

    monkeypatch.setattr(ready_kernels, "__path__", [*ready_kernels.__path__, str(tmp_path / "ready_kernels")])
    assert fastops.load_kernel("broken_op") is None
    err = capsys.readouterr().err
    assert "ready_kernels.broken_op" in err and "bad triton version" in err


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
             "assert ready.reader.fused_state_reader() is ready_kernels.state_reader.state_reader\n"
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
