"""Where the library's ops run a Triton kernel or torch: one decision, said once when it costs speed.

`kernels/` is installed as the import package `ready_kernels` by pyproject.toml
(`[tool.setuptools] package-dir`), in editable and wheel installs alike: nothing here registers
it. The folder has no `__init__.py` on purpose: the PyPI distribution `kernels` (pulled in by
sglang and transformers extras) owns the import name `kernels`, and a folder without one never
shadows a regular package, even when the repository root is the working directory.

The library imports the kernel modules it calls as plain modules (`from ready_kernels import
state_reader`). Each of them imports on any machine: its Triton code sits behind the one guard in
`ready_kernels._common` (`HAS_TRITON`), and its torch reference is the library's torch path. Whether
an op runs its kernel is decided here, by `fused(x)` / `fused_on(device)`: a CUDA device and a
working Triton (`_common.triton_runs_on`, the test every kernel's own dispatch makes). Where CUDA is
present but Triton cannot run, the torch paths run (the state reader reads about 25x slower) and
this module says so once on stderr, naming the fix. An install without `ready_kernels` cannot run
the library at all (the references live there): importing this module then says so in one line
before the ImportError.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, NamedTuple, Optional

import torch

FIX = ("reinstall the project so that kernels/ is installed as `ready_kernels` "
       "(`pip install -e .` in a clone, or `pip install` of a wheel built from this version)")
TRITON_FIX = ("install the project's dependencies, Triton among them "
              "(`pip install -e .` in a clone, or `pip install` of a wheel built from this version)")

_warned = False


def _say_once(line: str) -> None:
    """One line on stderr, the first time only: what failed, what it costs, how to fix it."""
    global _warned
    if _warned:
        return
    _warned = True
    print(line, file=sys.stderr, flush=True)


def _reason(err: BaseException) -> str:
    text = (str(err).splitlines() or [""])[0]
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


try:  # the kernels the library's drafting ops bundle; the others are imported where they are called
    from ready_kernels import _common, add_argmax, rmsnorm, rope, small_m_gemm
except ImportError as _err:
    _say_once(f"ERROR (ready): the kernels package `ready_kernels` cannot be imported ({_reason(_err)}); the library "
              f"needs it (the torch references of its ops live there). Fix: {FIX}.")
    raise


def fused_on(device: torch.device) -> bool:
    """Whether ops on `device` run their Triton kernels: a CUDA device and a working Triton. The library's
    one Triton-or-torch decision; on CUDA without Triton it says once on stderr that torch runs instead."""
    if _common.triton_runs_on(device):
        return True
    if device.type == "cuda":
        _say_once(f"WARNING (ready): CUDA is present, but Triton cannot be used "
                  f"({_common.TRITON_ERROR or 'not installed'}); falling back to the torch paths, which are much "
                  f"slower. Fix: {TRITON_FIX}.")
    return False


def fused(x: torch.Tensor) -> bool:
    """Whether ops on `x` run their Triton kernels (`fused_on` of its device)."""
    return fused_on(x.device)


class DraftingOps(NamedTuple):
    """The kernels package's ops for the drafter's and the reader's no-grad CUDA path (each dispatches to
    its Triton kernel or to torch)."""

    rms_norm: Callable[..., torch.Tensor]
    linear: Callable[..., torch.Tensor]  # the small-M linear
    add_argmax: Callable[..., torch.Tensor]  # the greedy Markov head's float32 add and argmax, one pass
    rope: Callable[..., torch.Tensor]  # the rotary of queries and keys in one launch, torch's roundings
    rope_store: Callable[..., None]  # the keys' rotary and both K and V written into the context buffers, one launch


# False switches them off (tests compare the draft step against the torch ops so)
_DRAFTING: Any = DraftingOps(rmsnorm.rms_norm, small_m_gemm.small_m_linear, add_argmax.add_argmax, rope.rope,
                             rope.rope_store)


def drafting_ops() -> Optional[DraftingOps]:
    """The drafting ops, which callers take where `fused(x)` holds and no autograd runs. In the draft step's
    graph one norm kernel replaces about eight torch kernels, the tuned small-M GEMM serves the block's few
    rows, each rotary is one kernel instead of four (the keys' also writes K and V into the context
    buffers), and the greedy Markov head adds its bias and takes the argmax in one pass over the logits."""
    return _DRAFTING or None
