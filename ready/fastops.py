"""Loads the fused kernels for the dispatch points, and says so when they are wanted but missing.

`kernels/` is installed as the import package `ready_kernels` by pyproject.toml
(`[tool.setuptools] package-dir`), in editable and wheel installs alike: nothing here registers
it. The folder has no `__init__.py` on purpose: the PyPI distribution `kernels` (pulled in by
sglang and transformers extras) owns the import name `kernels`, and a folder without one never
shadows a regular package, even when the repository root is the working directory.

A fused op is wanted when CUDA is present and Triton imports. If its module cannot be imported
then, the caller falls back to its torch path (the state reader reads about 25x slower), and
`load_kernel` says so once on stderr, naming the fix, instead of falling back in silence.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType
from typing import Any, Callable, NamedTuple, Optional

import torch

FIX = ("reinstall the project so that kernels/ is installed as `ready_kernels` "
       "(`pip install -e .` in a clone, or `pip install` of a wheel built from this version)")

_warned = False


def fused_wanted() -> bool:
    """True when a dispatch would pick a Triton kernel: CUDA is present and Triton can be imported."""
    return torch.cuda.is_available() and importlib.util.find_spec("triton") is not None


def load_kernel(op: str) -> Optional[ModuleType]:
    """`ready_kernels.<op>`, or None when it cannot be imported (the caller then uses its torch path).

    A missing module is reported when a fused op is wanted; a module that exists but fails with
    another error (a broken file, an incompatible Triton) is reported in any case."""
    name = f"ready_kernels.{op}"
    try:
        return importlib.import_module(name)
    except ImportError as e:
        if fused_wanted():
            _warn_once(name, e)
    except Exception as e:  # noqa: BLE001 - any import failure means "no fused op"; never silent
        _warn_once(name, e)
    return None


def _warn_once(name: str, err: BaseException) -> None:
    """One line on stderr, the first time only: what failed, what it costs, how to fix it."""
    global _warned
    if _warned:
        return
    _warned = True
    reason = str(err).splitlines()[0] if str(err) else type(err).__name__
    where = "CUDA and Triton are present, but " if fused_wanted() else ""
    print(f"WARNING (ready): {where}the fused kernel module `{name}` cannot be imported "
          f"({type(err).__name__}: {reason}); falling back to the torch paths, which are much slower. "
          f"Fix: {FIX}.", file=sys.stderr, flush=True)


class DraftingOps(NamedTuple):
    """The kernels package's ops for the drafter's and the reader's no-grad CUDA path (each dispatches to
    its Triton kernel or to torch)."""

    rms_norm: Callable[..., torch.Tensor]
    linear: Callable[..., torch.Tensor]  # the small-M linear
    add_argmax: Callable[..., torch.Tensor]  # the greedy Markov head's float32 add and argmax, one pass
    rope: Callable[..., torch.Tensor]  # the rotary of queries and keys in one launch, torch's roundings
    rope_store: Callable[..., None]  # the keys' rotary and both K and V written into the context buffers, one launch


_DRAFTING: Any = None


def drafting_ops() -> Optional[DraftingOps]:
    """The drafting ops, or None when the kernels package cannot be imported. In the draft step's graph
    one norm kernel replaces about eight torch kernels, the tuned small-M GEMM serves the block's few
    rows, each rotary is one kernel instead of four (the keys' also writes K and V into the context
    buffers), and the greedy Markov head adds its bias and takes the argmax in one pass over the logits."""
    global _DRAFTING
    if _DRAFTING is None:
        rn, sm, aa, rp = (load_kernel(op) for op in ("rmsnorm", "small_m_gemm", "add_argmax", "rope"))
        loaded = rn is not None and sm is not None and aa is not None and rp is not None
        _DRAFTING = (DraftingOps(rn.rms_norm, sm.small_m_linear, aa.add_argmax, rp.rope, rp.rope_store)
                     if loaded else False)
    return _DRAFTING or None
