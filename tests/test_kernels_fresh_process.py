"""The interpreted kernel tests still run when Triton was imported before TRITON_INTERPRET was set.

In a full test session another module may import Triton (through the target's kernels) before the
kernel tests switch the interpreter on; those tests then skip in-process, and this test runs them
in a fresh process where the switch comes first.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ready_kernels._testing import KERNEL_TEST_FILES, interpreter_active

ROOT = Path(__file__).resolve().parent.parent


def test_kernel_tests_in_a_fresh_process_when_this_one_cannot_interpret():
    if torch.cuda.is_available():
        pytest.skip("CUDA: the kernel tests run compiled, in this process")
    if "triton" not in sys.modules:
        pytest.importorskip("triton")
    if interpreter_active():
        pytest.skip("the interpreter was switched on in time: the kernel tests ran in this process")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *KERNEL_TEST_FILES],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
