"""The fused GDN verify (conv, SiLU, L2 norms, gates and recurrence in one kernel) computes what the
layer's separate ops compute, writes every state (or each token's replay inputs) and conv window, and
leaves the live cache alone.

The Triton kernel is compared with its torch reference on CPU through Triton's interpreter (small
sizes) and compiled on CUDA (the `cuda` test adds the paper's size); the reference is compared with
the target layer's own verify pass.
"""

import importlib

import pytest
import torch

from ready_kernels._testing import kernel_test_marks, prepare_interpreter, rel_err  # noqa: E402

RUNNABLE = prepare_interpreter()

gf = importlib.import_module("ready_kernels.gdn_fused")
from ready_kernels._common import KernelInputError  # noqa: E402

pytestmark = kernel_test_marks(gf.HAS_TRITON, RUNNABLE)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_inputs(B, T, nk, H, dk, dv, W=3, dtype=torch.float32, device=DEVICE):
    """What a GDN layer holds at verify: raw projection outputs, its live cache and its parameters."""
    C = 2 * nk * dk + H * dv
    proj = torch.randn(B, T, C + 2 * H, device=device).to(dtype)  # one GEMM's output, split as the layer does
    mixed, b, a = proj.split([C, H, H], dim=-1)
    conv_state = torch.randn(B, C, W, device=device).to(dtype)
    conv_weight = (0.5 * torch.randn(C, W + 1, device=device)).to(dtype)
    A_log = torch.empty(H, device=device).uniform_(1.0, 16.0).log()
    dt_bias = torch.randn(H, device=device)
    h0 = torch.randn(B, H, dk, dv, device=device)
    return mixed, b, a, conv_state, conv_weight, A_log, dt_bias, h0


SHAPES = [
    # B, T, nk, H, d_k, d_v, dtype
    (1, 8, 1, 2, 16, 16, torch.float32),
    (2, 4, 2, 4, 32, 32, torch.bfloat16),
    (1, 1, 2, 4, 64, 64, torch.float32),   # an AR step
    (2, 5, 1, 3, 32, 24, torch.float32),   # non-power-of-2 d_v, three value heads per key head
    (1, 3, 2, 6, 16, 32, torch.bfloat16),
]


@pytest.mark.parametrize("B,T,nk,H,dk,dv,dtype", SHAPES)
def test_outputs_states_and_windows_match_the_reference(B, T, nk, H, dk, dv, dtype):
    inputs = make_inputs(B, T, nk, H, dk, dv, dtype=dtype)
    live_state, live_conv = inputs[7].clone(), inputs[3].clone()
    o, states, windows = gf.gdn_fused_verify_triton(*inputs, nk, dk)
    o_ref, states_ref, windows_ref = gf.gdn_fused_verify_reference(*inputs, nk, dk)
    assert o.dtype == torch.float32 and states.shape == (B, T, H, dk, dv)
    assert torch.equal(windows, windows_ref), "conv windows are pure copies"
    # bf16 inputs: an ulp of a rounded conv output moves q/k/v by 2^-8 relative
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert rel_err(states, states_ref) < tol
    assert rel_err(o, o_ref) < tol
    assert torch.equal(inputs[7], live_state) and torch.equal(inputs[3], live_conv), "the live cache must stay untouched"


def test_writes_into_one_layers_pending_buffers():
    B, T, nk, H, dk, dv, W = 2, 3, 1, 2, 16, 16, 3
    inputs = make_inputs(B, T, nk, H, dk, dv, W)
    C = inputs[0].shape[-1]
    pending = torch.full((2, B, 4, H, dk, dv), float("nan"), device=DEVICE)
    pending_conv = torch.full((2, B, 4, C, W), float("nan"), device=DEVICE)
    gf.gdn_fused_verify_triton(*inputs, nk, dk, out_states=pending[1, :, :T], out_windows=pending_conv[1, :, :T])
    _, states_ref, windows_ref = gf.gdn_fused_verify_reference(*inputs, nk, dk)
    assert rel_err(pending[1, :, :T], states_ref) < 1e-5
    assert torch.equal(pending_conv[1, :, :T], windows_ref)
    assert torch.isnan(pending[0]).all() and torch.isnan(pending[1, :, T:]).all()
    assert torch.isnan(pending_conv[0]).all() and torch.isnan(pending_conv[1, :, T:]).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_replay_inputs_give_the_states_of_the_chain_bit_for_bit(dtype):
    """The engine's mode: no state is written, each token's k | v | g | beta is; the commit's replay of
    them from the live state then has the bits of the states the kernel would have written."""
    gv = importlib.import_module("ready_kernels.gdn_verify")
    B, T, nk, H, dk, dv = 2, 5, 1, 3, 32, 16
    inputs = make_inputs(B, T, nk, H, dk, dv, dtype=dtype)
    o_kept, states, w_kept = gf.gdn_fused_verify_triton(*inputs, nk, dk)
    pending = torch.full((B, T + 2, H, gv.input_width(dk, dv)), float("nan"), device=DEVICE)
    o, none, windows = gf.gdn_fused_verify_triton(*inputs, nk, dk, out_inputs=pending[:, :T])
    assert none is None and torch.equal(o, o_kept) and torch.equal(windows, w_kept)
    assert torch.isnan(pending[:, T:]).all(), "nothing past the block"
    want = torch.empty_like(pending[:, :T])
    gf.gdn_fused_verify_reference(*inputs, nk, dk, out_inputs=want)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert rel_err(pending[:, :T], want) < tol
    for n in (1, 3, T):
        ssm = inputs[7][None].clone()
        gv.gdn_commit_triton(ssm, pending[None, :, :T], n)
        assert torch.equal(ssm[0], states[:, n - 1]), n


@pytest.mark.parametrize("B,T,nk,H,dk,dv,dtype", SHAPES)
def test_the_two_pass_verify_computes_what_the_fused_kernel_does(B, T, nk, H, dk, dv, dtype):
    """Every token's front in one parallel launch, then the recurrence: the same outputs, windows and
    replay inputs as the fused kernel (float32: to rounding; the windows are copies), nothing written past
    the block, the live cache untouched, and the commit's replay of its inputs gives the reference's
    states."""
    gv = importlib.import_module("ready_kernels.gdn_verify")
    inputs = make_inputs(B, T, nk, H, dk, dv, dtype=dtype)
    live_state, live_conv = inputs[7].clone(), inputs[3].clone()
    pending = torch.full((B, T + 2, H, gv.input_width(dk, dv)), float("nan"), device=DEVICE)
    o, none, windows = gf.gdn_two_pass_verify_triton(*inputs, nk, dk, pending[:, :T])
    fused_inputs = torch.empty_like(pending[:, :T])
    o_fused, _, w_fused = gf.gdn_fused_verify_triton(*inputs, nk, dk, out_inputs=fused_inputs)
    want_inputs = torch.empty_like(fused_inputs)
    o_ref, states_ref, _ = gf.gdn_fused_verify_reference(*inputs, nk, dk)
    gf.gdn_fused_verify_reference(*inputs, nk, dk, out_inputs=want_inputs)
    assert none is None and o.dtype == torch.float32 and torch.equal(windows, w_fused)
    assert torch.isnan(pending[:, T:]).all(), "nothing past the block"
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert rel_err(o, o_fused) < tol and rel_err(o, o_ref) < tol
    assert rel_err(pending[:, :T], fused_inputs) < tol and rel_err(pending[:, :T], want_inputs) < tol
    ssm = inputs[7][None].clone()
    gv.gdn_commit_triton(ssm, pending[None, :, :T], T)
    assert rel_err(ssm[0], states_ref[:, T - 1]) < tol
    assert torch.equal(inputs[7], live_state) and torch.equal(inputs[3], live_conv), "the live cache must stay untouched"


def test_the_two_pass_verify_dispatches_to_the_reference_off_cuda_and_needs_its_inputs_buffer():
    gv = importlib.import_module("ready_kernels.gdn_verify")
    inputs = make_inputs(1, 3, 1, 2, 16, 16, device="cpu")
    got, want = (torch.empty(1, 3, 2, gv.input_width(16, 16)) for _ in range(2))
    o, _, w = gf.gdn_two_pass_verify(*inputs, 1, 16, got)
    o_ref, _, w_ref = gf.gdn_fused_verify_reference(*inputs, 1, 16, out_inputs=want)
    assert torch.equal(o, o_ref) and torch.equal(w, w_ref) and torch.equal(got, want)
    with pytest.raises(KernelInputError, match="out_inputs is required"):
        gf.gdn_two_pass_verify_triton(*inputs, 1, 16, None)


def test_a_token_computes_the_same_whatever_the_block_length():
    """verify(T) then the state after token 1 == verify(1): the AR step and a verify block agree."""
    inputs = make_inputs(1, 4, 1, 2, 16, 16)
    o4, s4, w4 = gf.gdn_fused_verify_triton(*inputs, 1, 16)
    one = [t[:, :1] for t in inputs[:3]] + list(inputs[3:])
    o1, s1, w1 = gf.gdn_fused_verify_triton(*one, 1, 16)
    assert torch.equal(o4[:, :1], o1) and torch.equal(s4[:, :1], s1) and torch.equal(w4[:, :1], w1)


def test_reference_equals_the_target_layers_verify_pass():
    """The reference is the layer's own arithmetic (conv taps, SiLU, norms, gates, recurrence)."""
    from ready.target.cache import HybridCache
    from ready.target.config import HybridConfig
    from ready.target.layers import GatedDeltaNet

    torch.manual_seed(0)
    cfg = HybridConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=16, linear_num_key_heads=1,
                       linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
                       full_attention_interval=4)
    layer = GatedDeltaNet(cfg)
    cache = HybridCache.allocate(cfg, 1, 32, 8, torch.device("cpu"), torch.float32)
    slot = cache.gdn_slots[0]
    slot.ssm.normal_()
    slot.conv.normal_()
    x = torch.randn(1, 5, 32)
    with torch.no_grad():
        out, _ = layer(x, "verify", slot)
        qkv, z, b, a = torch.nn.functional.linear(x, layer.in_proj.weight).split(layer.split, dim=-1)
        replay = torch.empty_like(slot.pending_inputs[:, :5])
        o, _, windows = gf.gdn_fused_verify_reference(qkv, b, a, slot.conv, layer.conv1d.weight[:, 0], layer.A_log,
                                                      layer.dt_bias, slot.ssm, layer.nk, layer.dk, out_inputs=replay)
        want = layer._output(o.transpose(1, 2), z)
    torch.testing.assert_close(slot.pending_inputs[:, :5], replay)
    assert torch.equal(slot.pending_conv[:, :5], windows)
    torch.testing.assert_close(out, want)


@pytest.mark.parametrize("T", [1, 5])
def test_the_layer_runs_one_launch_for_the_ar_step_and_two_passes_for_a_block(monkeypatch, T):
    """`GatedDeltaNet.fused_verify` (the CUDA verify; here the Triton kernels through the interpreter) fills
    the layer's pending buffers as its torch verify pass does, with the fused kernel at T = 1 and the
    two-pass verify for a block."""
    import copy

    import ready.target.layers as layers
    from ready.target.cache import HybridCache
    from ready.target.config import HybridConfig

    torch.manual_seed(0)
    cfg = HybridConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=16, linear_num_key_heads=1,
                       linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
                       full_attention_interval=4)
    layer = layers.GatedDeltaNet(cfg)
    cache = HybridCache.allocate(cfg, 1, 32, 8, torch.device("cpu"), torch.float32, keep_states=False)  # as on CUDA
    slot = cache.gdn_slots[0]
    slot.ssm.normal_()
    slot.conv.normal_()
    torch_slot = copy.deepcopy(slot)
    ran = []
    monkeypatch.setattr(layers, "GDN_FUSED_KERNEL", lambda *a, **k: ran.append("fused") or gf.gdn_fused_verify_triton(*a, **k))
    monkeypatch.setattr(layers, "GDN_TWO_PASS_KERNEL",
                        lambda *a, **k: ran.append("two_pass") or gf.gdn_two_pass_verify_triton(*a, **k))
    x = torch.randn(1, T, 32)
    with torch.no_grad():
        want, _ = layer(x, "verify", torch_slot)  # CPU: the torch ops
        qkv, z, b, a = torch.nn.functional.linear(x, layer.in_proj.weight).split(layer.split, dim=-1)
        got = layer._output(layer.fused_verify(qkv, b, a, slot).transpose(1, 2), z)
    assert ran == ["fused" if T == 1 else "two_pass"]
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(slot.pending_inputs[:, :T], torch_slot.pending_inputs[:, :T])
    assert torch.equal(slot.pending_conv[:, :T], torch_slot.pending_conv[:, :T])


def test_mismatched_shapes_are_one_clear_error():
    inputs = list(make_inputs(1, 2, 1, 2, 16, 16, device="cpu"))
    inputs[3] = inputs[3][:, :, :2]  # a conv window one column short
    with pytest.raises(KernelInputError, match=r"conv_state must be \[B, C, W\]"):
        gf.gdn_fused_verify(*inputs, 1, 16)
    with pytest.raises(KernelInputError, match=r"do not split into"):
        gf.gdn_fused_verify(*make_inputs(1, 2, 1, 2, 16, 16, device="cpu"), 1, 33)  # q + k alone would exceed C


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("T", [1, 8])
def test_paper_size_on_cuda(dtype, T):
    """16 key heads, 48 value heads, d_k = d_v = 128: the 27B layer, batch 2."""
    inputs = make_inputs(2, T, 16, 48, 128, 128, dtype=dtype, device="cuda")
    o, states, windows = gf.gdn_fused_verify(*inputs, 16, 128)
    o_ref, states_ref, windows_ref = gf.gdn_fused_verify_reference(*inputs, 16, 128)
    assert torch.equal(windows, windows_ref)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert rel_err(states, states_ref) < tol
    assert rel_err(o, o_ref) < tol


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_paper_size_replay_on_cuda(dtype):
    """Compiled, at the 27B layer's size: the commit's replay of every prefix of an 8-token block has
    the bits of the states the verify kernel steps through."""
    gv = importlib.import_module("ready_kernels.gdn_verify")
    inputs = make_inputs(2, 8, 16, 48, 128, 128, dtype=dtype, device="cuda")
    o_kept, states, _ = gf.gdn_fused_verify(*inputs, 16, 128)
    pending = torch.empty(2, 8, 48, gv.input_width(128, 128), device="cuda")
    o, _, _ = gf.gdn_fused_verify(*inputs, 16, 128, out_inputs=pending)
    assert torch.equal(o, o_kept)
    for n in range(1, 9):
        ssm = inputs[7][None].clone()
        gv.gdn_commit(ssm, pending[None], n)
        assert torch.equal(ssm[0], states[:, n - 1]), n


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_paper_size_two_pass_on_cuda(dtype):
    """Compiled, at the 27B layer's size (batch 2, a block of 8): the two-pass verify's outputs and replay
    inputs against the reference, and the commit's replay of each prefix against the reference's states."""
    gv = importlib.import_module("ready_kernels.gdn_verify")
    inputs = make_inputs(2, 8, 16, 48, 128, 128, dtype=dtype, device="cuda")
    pending, want = (torch.empty(2, 8, 48, gv.input_width(128, 128), device="cuda") for _ in range(2))
    o, _, windows = gf.gdn_two_pass_verify(*inputs, 16, 128, pending)
    o_ref, states_ref, windows_ref = gf.gdn_fused_verify_reference(*inputs, 16, 128)
    gf.gdn_fused_verify_reference(*inputs, 16, 128, out_inputs=want)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.equal(windows, windows_ref) and rel_err(o, o_ref) < tol and rel_err(pending, want) < tol
    for n in (1, 4, 8):
        ssm = inputs[7][None].clone()
        gv.gdn_commit(ssm, pending[None], n)
        assert rel_err(ssm[0], states_ref[:, n - 1]) < tol, n
