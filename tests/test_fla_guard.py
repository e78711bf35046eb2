"""fla's chunked GDN runs only where it is a faithful fast path: 16-bit CUDA tensors, and not where its
backward is known to give wrong gradients (Hopper with Triton 3.4.0 to 3.7.0, fla-org/flash-linear-attention#640)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from ready.target import layers
from ready.target.layers import fla_backward_trusted


@pytest.mark.parametrize("capability, triton_version, trusted", [
    ((9, 0), "3.6.0", False),   # H100/H200 with the miscompiling Triton
    ((9, 0), "3.4.0", False),
    ((9, 0), "3.7.0+git1234", False),
    ((9, 0), "3.7.1", True),    # fixed upstream
    ((9, 0), "3.3.1", True),    # before the regression
    ((8, 0), "3.6.0", True),    # A100: unaffected
    ((10, 0), "3.6.0", True),   # Blackwell: not this bug
])
def test_hopper_with_a_miscompiling_triton_is_not_trusted(monkeypatch, capability, triton_version, trusted):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setitem(sys.modules, "triton", types.SimpleNamespace(__version__=triton_version))
    fla_backward_trusted.cache_clear()
    try:
        assert fla_backward_trusted(torch.device("cuda")) is trusted
    finally:
        fla_backward_trusted.cache_clear()


def test_cpu_is_always_trusted():
    assert fla_backward_trusted(torch.device("cpu"))


def _q(dtype, cuda=True, grad=False):
    """The attributes `fla_chunk_for` reads, without a GPU."""
    return types.SimpleNamespace(is_cuda=cuda, dtype=dtype, requires_grad=grad,
                                 device=torch.device("cuda" if cuda else "cpu"))


@pytest.mark.parametrize("q, state_positions, uses_fla", [
    (_q(torch.bfloat16), None, True),                    # the fast path a user's bf16 target takes
    (_q(torch.float16), None, True),
    (_q(torch.float32), None, False),                    # fla's dots run float32 in TF32: not float32
    (_q(torch.bfloat16, cuda=False), None, False),       # CPU: our torch form
    (_q(torch.bfloat16), torch.tensor([3]), False),      # per-position states: fla returns only the last
    (_q(torch.bfloat16, grad=True), None, False),        # training on Hopper with Triton 3.6: untrusted backward
])
def test_fla_runs_only_where_it_is_a_faithful_fast_path(monkeypatch, q, state_positions, uses_fla):
    sentinel = object()
    monkeypatch.setattr(layers, "FLA_CHUNK", sentinel)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setitem(sys.modules, "triton", types.SimpleNamespace(__version__="3.6.0"))
    fla_backward_trusted.cache_clear()
    try:
        assert (layers.fla_chunk_for(q, state_positions) is sentinel) is uses_fla
    finally:
        fla_backward_trusted.cache_clear()
