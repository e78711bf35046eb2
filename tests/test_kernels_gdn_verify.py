"""GDN verify keeps the state after every token (or none), leaves the live state alone, and commit replays
the accepted tokens onto it.

The Triton kernels are compared with the torch references over shapes and dtypes: on CPU through
Triton's interpreter (small sizes), on CUDA compiled (the `cuda` test adds the paper's size).
"""

import importlib

import pytest
import torch
import torch.nn.functional as F

from ready_kernels._testing import kernel_test_marks, prepare_interpreter, rel_err  # noqa: E402

# On CPU: Triton's interpreter, switched on before the kernel module imports triton. If another
# module imported triton first, these tests skip here and test_kernels_fresh_process runs them.
RUNNABLE = prepare_interpreter()

gv = importlib.import_module("ready_kernels.gdn_verify")
from ready_kernels._common import KernelInputError  # noqa: E402

pytestmark = kernel_test_marks(gv.HAS_TRITON, RUNNABLE)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_inputs(B, T, H, dk, dv, dtype=torch.float32, device=DEVICE):
    q = F.normalize(torch.randn(B, T, H, dk, device=device), dim=-1).to(dtype)
    k = F.normalize(torch.randn(B, T, H, dk, device=device), dim=-1).to(dtype)
    v = torch.randn(B, T, H, dv, device=device).to(dtype)
    g = -F.softplus(torch.randn(B, T, H, device=device))           # log decay < 0
    beta = torch.sigmoid(torch.randn(B, T, H, device=device))
    h0 = torch.randn(B, H, dk, dv, device=device)
    return q, k, v, g, beta, h0


SHAPES = [
    # B, T, H, d_k, d_v, dtype of q/k/v
    (1, 8, 3, 16, 16, torch.float32),
    (2, 4, 4, 32, 32, torch.bfloat16),
    (1, 1, 2, 64, 64, torch.float32),   # a plain decode step
    (2, 5, 3, 32, 24, torch.float32),   # non-power-of-2 d_v
    (1, 3, 2, 64, 128, torch.bfloat16),
    (1, 17, 2, 16, 16, torch.float32),  # a long block
]


@pytest.mark.parametrize("block_v", [None, 32])
@pytest.mark.parametrize("B,T,H,dk,dv,dtype", SHAPES)
def test_outputs_and_every_state_match_reference(B, T, H, dk, dv, dtype, block_v):
    q, k, v, g, beta, h0 = make_inputs(B, T, H, dk, dv, dtype)
    live = h0.clone()
    o, states = gv.gdn_verify_triton(q, k, v, g, beta, h0, 0.3, block_v=block_v)
    o_ref, states_ref = gv.gdn_verify_reference(q, k, v, g, beta, h0, 0.3)
    assert o.dtype == v.dtype and states.dtype == torch.float32
    assert states.shape == (B, T, H, dk, dv)
    assert rel_err(states, states_ref) < 1e-5
    assert rel_err(o, o_ref) < (1e-5 if dtype == torch.float32 else 1e-2)
    assert torch.equal(h0, live), "the live state must stay untouched"


def test_state_after_token_n_is_the_state_of_verifying_only_n_tokens():
    q, k, v, g, beta, h0 = make_inputs(1, 6, 2, 16, 16, device="cpu")
    _, states = gv.gdn_verify_reference(q, k, v, g, beta, h0)
    for n in (1, 3, 6):
        _, prefix = gv.gdn_verify_reference(q[:, :n], k[:, :n], v[:, :n], g[:, :n], beta[:, :n], h0)
        torch.testing.assert_close(states[:, n - 1], prefix[:, -1])


def test_reference_is_the_documented_recurrence():
    """One head, two tokens, written out: S = S e^g; S += k (beta (v - S^T k)); o = S^T (scale q)."""
    q, k, v, g, beta, h0 = make_inputs(1, 2, 1, 8, 4, device="cpu")
    o, states = gv.gdn_verify_reference(q, k, v, g, beta, h0, 0.5)
    S = h0[0, 0]
    for t in range(2):
        S = S * torch.exp(g[0, t, 0])
        S = S + torch.outer(k[0, t, 0], beta[0, t, 0] * (v[0, t, 0] - S.T @ k[0, t, 0]))
        torch.testing.assert_close(states[0, t, 0], S)
        torch.testing.assert_close(o[0, t, 0], S.T @ (0.5 * q[0, t, 0]))


def test_writes_into_the_pending_buffer_of_one_layer():
    B, T, H, dk, dv = 2, 4, 3, 16, 16
    q, k, v, g, beta, h0 = make_inputs(B, T, H, dk, dv)
    pending = torch.full((3, B, T, H, dk, dv), float("nan"), device=DEVICE)
    _, states = gv.gdn_verify_triton(q, k, v, g, beta, h0, out_states=pending[1])
    assert states.data_ptr() == pending[1].data_ptr()
    _, want = gv.gdn_verify_reference(q, k, v, g, beta, h0)
    assert rel_err(pending[1], want) < 1e-5
    assert torch.isnan(pending[0]).all() and torch.isnan(pending[2]).all()


def pack(k, v, g, beta):
    """The replay inputs of a block, [B, T, H, d_k + d_v + 2]: k | v | g | beta in float32."""
    return torch.cat([k.float(), v.float(), g[..., None].float(), beta[..., None].float()], dim=-1)


def layered_block(L, B, T, H, dk, dv, dtype=torch.float32):
    """L layers of verify inputs: (q, k, v, g, beta, h0) per layer."""
    return [make_inputs(B, T, H, dk, dv, dtype) for _ in range(L)]


@pytest.mark.parametrize("per_row,count", [(False, 4), (False, 1), (True, None)])  # n = 1: an AR step
def test_commit_replays_the_accepted_tokens_onto_the_live_state(per_row, count):
    L, B, T, H, dk, dv, C, W = 2, 3, 5, 2, 16, 8, 6, 3
    layers = layered_block(L, B, T, H, dk, dv)
    want = torch.stack([gv.gdn_verify_reference(*x)[1] for x in layers])  # [L, B, T, H, dk, dv]
    inputs = torch.stack([pack(k, v, g, beta) for _, k, v, g, beta, _ in layers])
    live = torch.stack([x[5] for x in layers])
    pending_conv = torch.randn(L, B, T, C, W, device=DEVICE)
    n = torch.tensor([1, 5, 3], device=DEVICE) if per_row else count
    rows = [1, 5, 3] if per_row else [count] * 3
    for commit in (gv.gdn_commit_triton, gv.gdn_commit_reference):
        ssm, conv = live.clone(), torch.zeros(L, B, C, W, device=DEVICE)
        commit(ssm, inputs, n, conv, pending_conv)
        for b, nb in enumerate(rows):
            assert rel_err(ssm[:, b], want[:, b, nb - 1]) < 1e-5, commit.__name__
            assert torch.equal(conv[:, b], pending_conv[:, b, nb - 1]), commit.__name__


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_replayed_state_has_the_bits_of_the_verify_chain(dtype):
    """What keeps verify(K+1) and K+1 AR steps identical: the state the commit replays is the one the
    verify kernel stepped through, bit for bit, so the next verify starts where the chain was."""
    B, T, H, dk, dv = 2, 6, 3, 32, 32
    q, k, v, g, beta, h0 = make_inputs(B, T, H, dk, dv, dtype)
    _, chain = gv.gdn_verify_triton(q, k, v, g, beta, h0)
    inputs = pack(k, v, g, beta)[None]
    for n in (1, 4, T):
        ssm = h0[None].clone()
        gv.gdn_commit_triton(ssm, inputs, n)
        assert torch.equal(ssm[0], chain[:, n - 1]), n


def test_verify_without_states_gives_the_same_outputs():
    q, k, v, g, beta, h0 = make_inputs(2, 5, 3, 16, 16)
    o_kept, _ = gv.gdn_verify_triton(q, k, v, g, beta, h0)
    o, states = gv.gdn_verify_triton(q, k, v, g, beta, h0, keep_states=False)
    assert states is None and torch.equal(o, o_kept)


def test_commit_rejects_a_count_outside_the_block():
    ssm, inputs = torch.zeros(1, 1, 2, 4, 4), torch.zeros(1, 1, 3, 2, 10)
    with pytest.raises(KernelInputError, match=r"n must be in 1\.\.3"):
        gv.gdn_commit(ssm, inputs, 4)


def test_commit_names_the_expected_input_layout():
    ssm, states = torch.zeros(1, 1, 2, 4, 4), torch.zeros(1, 1, 3, 2, 4, 4)  # per-token states: the old layout
    with pytest.raises(KernelInputError, match=r"pending_inputs must be float32 \[L=1, B=1, T, H=2, d_k \+ d_v \+ 2=10\]"):
        gv.gdn_commit(ssm, states, 1)


def test_conv_windows_follow_a_token_by_token_shift_register():
    B, T, C, W = 2, 5, 3, 3
    conv_state, x = torch.randn(B, C, W), torch.randn(B, T, C)
    windows = gv.conv_windows(conv_state, x)
    state = conv_state.clone()
    for t in range(T):
        state = torch.cat([state[:, :, 1:], x[:, t, :, None]], dim=-1)
        torch.testing.assert_close(windows[:, t], state)
    out = torch.empty(B, T, C, W)
    assert gv.conv_windows(conv_state, x, out=out) is out and torch.equal(out, windows)


def test_mismatched_shapes_are_one_clear_error():
    q, k, v, g, beta, h0 = make_inputs(1, 2, 2, 16, 16, device="cpu")
    with pytest.raises(KernelInputError, match=r"initial_state must be \[B, H, d_k, d_v\]"):
        gv.gdn_verify(q, k, v, g, beta, h0[:, :1])


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_paper_size_on_cuda(dtype):
    """48 value heads, d_k = d_v = 128, K+1 = 8 tokens, batch 2."""
    q, k, v, g, beta, h0 = make_inputs(2, 8, 48, 128, 128, dtype, device="cuda")
    o, states = gv.gdn_verify(q, k, v, g, beta, h0)
    o_ref, states_ref = gv.gdn_verify_reference(q, k, v, g, beta, h0)
    assert rel_err(states, states_ref) < 1e-5
    assert rel_err(o, o_ref) < (1e-5 if dtype == torch.float32 else 1e-2)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_paper_size_replay_has_the_chains_bits_on_cuda(dtype):
    """Compiled: exact mode's verify on CUDA is this kernel, and its commit the replay."""
    q, k, v, g, beta, h0 = make_inputs(2, 8, 48, 128, 128, dtype, device="cuda")
    _, chain = gv.gdn_verify(q, k, v, g, beta, h0)
    inputs = pack(k, v, g, beta)[None]
    for n in range(1, 9):
        ssm = h0[None].clone()
        gv.gdn_commit(ssm, inputs, n)
        assert torch.equal(ssm[0], chain[:, n - 1]), n
