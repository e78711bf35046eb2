"""Shared helpers of the kernel modules: the input-error type, Triton availability, dispatch test.

Every op module in this folder holds `<op>_reference` (plain torch), `<op>_triton` and `<op>`
(dispatch). The dispatch picks Triton when the tensors live on CUDA and Triton imports; the
reference otherwise. Tests run `<op>_triton` on CPU tensors under `TRITON_INTERPRET=1`.

The Triton guard is here and only here: every op module defines its Triton part under `if
HAS_TRITON:`, so each module imports on any machine and keeps its torch reference. Triton is a
dependency in pyproject.toml, but an environment may lack it (a hand-made path, a platform
without wheels) or hold one that fails on import (an incompatible build); `TRITON_ERROR` says
which, and `ready.fastops` reports it once where CUDA is present.
"""

from __future__ import annotations

import os

import torch

try:  # the one Triton guard (module docstring)
    import triton  # noqa: F401
    import triton.language  # noqa: F401

    HAS_TRITON = True
    TRITON_ERROR = ""
except Exception as _err:  # pragma: no cover - depends on the install: absent (ImportError) or broken (any error)
    HAS_TRITON = False
    TRITON_ERROR = f"{type(_err).__name__}: {(str(_err).splitlines() or [''])[0]}".rstrip(": ")


class KernelInputError(ValueError):
    """A kernel was called with inputs of the wrong shape, dtype or device (one clear message)."""


def require(ok: bool, message: str) -> None:
    """Raise KernelInputError(message) unless `ok`."""
    if not ok:
        raise KernelInputError(message)


def triton_runs_on(device: torch.device) -> bool:
    """True when a kernel on `device` runs its Triton code: a CUDA device and an importable Triton. The one
    test of where Triton runs: every op's dispatch asks it (`use_triton`), and so does the library
    (`ready.fastops.fused`)."""
    return HAS_TRITON and device.type == "cuda"


def use_triton(*tensors: torch.Tensor) -> bool:
    """True when every tensor is on a device Triton runs on (`triton_runs_on`)."""
    return all(triton_runs_on(t.device) for t in tensors)


def require_triton() -> None:
    require(HAS_TRITON, "the Triton path needs the `triton` package; install it or call the *_reference op")


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (and >= 1)."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    """`t` itself when its last dimension has unit stride (or size 1), else a contiguous copy."""
    return t if (t.stride(-1) == 1 or t.shape[-1] == 1) else t.contiguous()


_PDL: dict[int, bool] = {}


def pdl_enabled(device: torch.device) -> bool:
    """Whether kernels on `device` launch with programmatic dependent launch (PDL): a Hopper or newer
    GPU and compiled Triton (not the CPU interpreter); decided once per process and device.

    A PDL launch may start while the kernel before it in the stream is still running; such a kernel
    must call `gdc_wait()` before it reads or writes anything an earlier kernel touches (it may
    read constant weights before). Inside a CUDA graph this hides the launch gap between kernels."""
    if device.type != "cuda":
        return False
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _PDL:  # decided once per device: this runs before every small-M launch
        _PDL[idx] = (HAS_TRITON and os.environ.get("TRITON_INTERPRET") != "1"
                     and torch.cuda.get_device_capability(idx)[0] >= 9)
    return _PDL[idx]


def pdl_launch(device: torch.device, early: bool = False) -> dict:
    """Launch arguments of a kernel with a `PDL` constexpr: {} without PDL. `early` (for kernels that
    also take an `EARLY` constexpr, the GEMVs): such a kernel signals `gdc_launch_dependents` right
    after its own wait, so the next kernel's programs can take the SMs its last wave frees (and start
    their weight loads) instead of launching when it has exited. The next kernel's `gdc_wait` still
    waits for this one to finish. Always on (a paired engine A/B on the H200 found the graphed AR step
    shorter with it; docs/kernels.md)."""
    if not pdl_enabled(device):
        return {}
    args = {"launch_pdl": True, "PDL": True}
    if early:
        args["EARLY"] = True
    return args

