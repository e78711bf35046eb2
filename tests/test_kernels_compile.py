"""Every Triton kernel compiles for a Hopper GPU (sm_90) on a machine without one (tests/compile_kernels.py):
CI never runs a GPU, and the CPU interpreter runs code the compiler refuses."""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None
                                or importlib.util.find_spec("triton.backends.nvidia") is None,
                                reason="needs triton with its NVIDIA backend (it ships ptxas)")


def compile_cases(*names: str) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "compile_kernels.py"), *names], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, proc.stderr[-3000:]
    return proc.returncode, json.loads(lines[-1])


def launched_kernels() -> set[str]:
    """The names of kernels/*.py's launched kernels (`name_kernel[grid](...)`)."""
    return {m for f in (ROOT / "kernels").glob("*.py") for m in re.findall(r"(\w+_kernel)\[", f.read_text())}


def test_every_launched_kernel_compiles_at_the_27b_shapes():
    """The 27B target's and the public-DSpark-shaped drafter's launches (decode attention over short and
    32k buffers, exact attention, norms, small-M GEMMs, the GDN verify/fused/commit kernels, the reader)."""
    code, res = compile_cases()
    assert code == 0 and res["failed"] == {}
    compiled = {k.split("[")[0] for k in res["compiled"]}
    assert launched_kernels() <= compiled, sorted(launched_kernels() - compiled)
    assert any(k.startswith("_combine_kernel[") and "CHUNK=576" in k for k in res["compiled"])  # 33,000 keys


def test_a_kernel_the_interpreter_runs_but_the_compiler_refuses_is_reported():
    code, res = compile_cases("canary")
    assert code == 1 and list(res["failed"]) == ["canary: static_range over a runtime bound"]
    assert "not a constexpr" in res["failed"]["canary: static_range over a runtime bound"]
