"""fla's chunked GDN backward is not trusted where it is known to give wrong gradients (Hopper with
Triton 3.4.0 to 3.7.0, fla-org/flash-linear-attention#640): training takes the torch path there."""

from __future__ import annotations

import sys
import types

import pytest
import torch

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
