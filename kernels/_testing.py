"""Test support: run the Triton kernels on CPU tensors through Triton's interpreter.

`@triton.jit` (and Triton's own `triton.language` helpers) pick the interpreter when the module
is imported, so `TRITON_INTERPRET=1` must be set before the first `import triton` of the process.
`prepare_interpreter()` does that on machines without CUDA and reports whether it was in time;
when some earlier import (say, the target model pulling in `ready_kernels.gdn_verify` during test
collection) came first, the kernel tests run again in a fresh process instead
(tests/test_kernels_fresh_process.py).
"""

from __future__ import annotations

import os
import sys

import torch

KERNEL_TEST_FILES = ("tests/test_kernels_state_reader.py", "tests/test_kernels_gdn_verify.py",
                     "tests/test_kernels_rmsnorm.py", "tests/test_kernels_small_m_gemm.py",
                     "tests/test_kernels_row_norm.py", "tests/test_kernels_exact_attention.py",
                     "tests/test_kernels_gdn_fused.py", "tests/test_kernels_decode_attention.py",
                     "tests/test_kernels_fused_gemv.py", "tests/test_kernels_add_argmax.py",
                     "tests/test_kernels_rope.py")


def interpreter_active() -> bool:
    """True when Triton was imported with its interpreter switched on (its own jit helpers are interpreted)."""
    import triton.language.standard as std

    kinds = {type(v).__name__ for v in vars(std).values()} & {"JITFunction", "InterpretedFunction"}
    return kinds <= {"InterpretedFunction"}


def prepare_interpreter() -> bool:
    """Switch Triton to its interpreter when there is no CUDA. Returns whether Triton kernels can run
    in this process: on CUDA always; on CPU only if Triton was not imported before the switch."""
    if torch.cuda.is_available():
        return True
    os.environ["TRITON_INTERPRET"] = "1"
    if "triton" not in sys.modules:
        return True
    return interpreter_active()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative error ||a - b|| / ||b|| in float64; fails on non-finite kernel outputs."""
    a, b = a.double(), b.double()
    assert torch.isfinite(a).all(), "non-finite values in the kernel output"
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def kernel_test_marks(has_triton: bool, runnable: bool) -> list:
    """The pytest marks every kernel test module carries: skip without Triton, and skip when Triton
    was imported before its interpreter was switched on (the fresh-process test re-runs them)."""
    import pytest

    return [pytest.mark.skipif(not has_triton, reason="needs triton"),
            pytest.mark.skipif(not runnable, reason="triton was imported before its interpreter was switched on; "
                               "tests/test_kernels_fresh_process.py runs these in a fresh process")]
