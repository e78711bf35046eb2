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


def _fla_stand_in(calls: list):
    """fla's `chunk_gated_delta_rule` as its docstring defines it (q, k [B, T, H, K]; v [B, T, H, V]; g
    log-space and beta [B, T, H]; q/k L2-normalised inside with `use_qk_l2norm_in_kernel`), computed by our
    float32 torch form, recording what it was given: fla itself needs a GPU."""
    from ready.target.gdn_ops import chunk_gated_delta_rule, l2norm

    def fla(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
            use_qk_l2norm_in_kernel=False):
        calls.append({"dtypes": (q.dtype, k.dtype, v.dtype), "l2norm_in_kernel": use_qk_l2norm_in_kernel})
        q, k = q.float(), k.float()
        if use_qk_l2norm_in_kernel:
            q, k = l2norm(q), l2norm(k)
        head_major = lambda t: t.float().transpose(1, 2)  # noqa: E731
        o, final, _ = chunk_gated_delta_rule(head_major(q * scale), head_major(k), head_major(v),
                                             head_major(g), head_major(beta), initial_state)
        return o.transpose(1, 2).to(v.dtype), final

    return fla


def _gdn_layer(dtype: torch.dtype) -> layers.GatedDeltaNet:
    from ready.target.config import HybridConfig

    torch.manual_seed(0)
    cfg = HybridConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=32, linear_num_key_heads=2,
                       linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16)
    return layers.GatedDeltaNet(cfg).to(dtype).eval()


@pytest.mark.parametrize("dtype, uses_fla", [(torch.bfloat16, True), (torch.float32, False)])
def test_a_16_bit_target_prefills_through_fla_with_16_bit_inputs(monkeypatch, dtype, uses_fla):
    # The regression this guards: the layer asked `fla_chunk_for` about its float32 copies of q, so no
    # 16-bit target ever reached fla (5-8 Dec): prefill ran the torch chunked form in float32.
    layer, x = _gdn_layer(dtype), torch.randn(2, 70, 64).to(dtype)  # 70 tokens: a chunk and a part
    with torch.no_grad():
        want, _ = layer(x, mode="full")  # the torch form (CPU: no fla)
        calls: list = []
        monkeypatch.setattr(layers, "FLA_CHUNK", _fla_stand_in(calls))
        monkeypatch.setattr(layers.fastops, "fused", lambda t: True)  # as on a GPU with Triton
        got, _ = layer(x, mode="full")
    assert [c["dtypes"] for c in calls] == ([(dtype,) * 3] if uses_fla else [])
    assert all(c["l2norm_in_kernel"] for c in calls)
    # the same layer output up to the model dtype's rounding (fla reads 16-bit q, k, v; ours float32 copies)
    torch.testing.assert_close(got.float(), want.float(), rtol=0.05, atol=0.02)


@pytest.mark.cuda
def test_on_cuda_fla_prefills_a_bf16_layer_as_the_torch_form_does(monkeypatch):
    pytest.importorskip("fla")
    layer = _gdn_layer(torch.bfloat16).cuda()
    x = torch.randn(2, 200, 64, device="cuda").to(torch.bfloat16)
    calls: list = []
    real = layers.FLA_CHUNK
    monkeypatch.setattr(layers, "FLA_CHUNK", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    with torch.no_grad():
        got, _ = layer(x, mode="full")
        monkeypatch.setattr(layers, "FLA_CHUNK", None)
        want, _ = layer(x, mode="full")
    assert calls == [1]
    torch.testing.assert_close(got.float(), want.float(), rtol=0.05, atol=0.02)


def test_a_right_padded_prefill_through_fla_keeps_each_rows_state_after_its_own_end(monkeypatch):
    # fla gets g = beta = 0 on the pad tokens; the torch form's padded prefill is checked against one
    # prefill per row in tests/test_prefill_rows.py
    from ready.target.cache import GDNSlot

    layer, x = _gdn_layer(torch.bfloat16), torch.randn(3, 70, 64).to(torch.bfloat16)
    ends = torch.tensor([70, 5, 40])

    def slot() -> GDNSlot:
        return GDNSlot(ssm=torch.zeros(3, 4, 16, 16), conv=torch.zeros(3, layer.conv_dim, 3, dtype=torch.bfloat16),
                       pending_inputs=torch.zeros(3, 1, 4, 34), pending_conv=torch.zeros(3, 1, layer.conv_dim, 3),
                       ends=ends)

    want, got = slot(), slot()
    with torch.no_grad():
        layer(x, mode="prefill", cache=want)
        calls: list = []
        monkeypatch.setattr(layers, "FLA_CHUNK", _fla_stand_in(calls))
        monkeypatch.setattr(layers.fastops, "fused", lambda t: True)
        layer(x, mode="prefill", cache=got)
    assert len(calls) == 1
    torch.testing.assert_close(got.ssm, want.ssm, rtol=0.05, atol=0.02)
    assert torch.equal(got.conv, want.conv)
