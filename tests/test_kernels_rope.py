"""rope (the draft layers' rotary): the one-launch kernel gives torch's rotation, bit for bit in float32
here and in bf16 on CUDA (the CPU interpreter rounds bf16 its own way: there, to a bf16 unit), over the
drafter's layouts (heads transposed out of [B, N, H, hd]) and broadcast tables."""

import importlib

import pytest
import torch

from ready_kernels._common import KernelInputError
from ready_kernels._testing import kernel_test_marks, prepare_interpreter

RUNNABLE = prepare_interpreter()

rp = importlib.import_module("ready_kernels.rope")

pytestmark = kernel_test_marks(rp.HAS_TRITON, RUNNABLE)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def tables(B, N, hd, dtype, device=DEVICE):
    """Rotary-like tables: [cos, cos] and [-sin, sin] of some angles, in dtype."""
    ang = torch.rand(B, N, hd // 2, device=device) * 6.3
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    return torch.cat([cos, cos], -1), torch.cat([-sin, sin], -1)


@pytest.mark.parametrize("B,H,N,hd", [(1, 32, 8, 128), (3, 8, 5, 64), (2, 6, 1, 16), (2, 3, 4, 24)])
def test_float32_is_torchs_rotation_bit_for_bit(B, H, N, hd):
    x = torch.randn(B, N, H, hd, device=DEVICE).transpose(1, 2)  # the drafter's layout: heads out of [B, N, H, hd]
    cos, sin = tables(B, N, hd, torch.float32)
    got = rp.rope_triton(x, cos, sin)
    assert got.shape == x.shape and got.stride(-1) == 1
    assert torch.equal(got, rp.rope_reference(x, cos, sin))


def test_bf16_matches_torch_to_its_rounding_and_tables_broadcast_over_the_batch():
    x = torch.randn(4, 7, 8, 128, device=DEVICE).bfloat16().transpose(1, 2)
    cos, sin = tables(1, 7, 128, torch.bfloat16)
    got = rp.rope_triton(x, cos, sin)
    want = rp.rope_reference(x, cos, sin)
    if DEVICE == "cuda":
        assert torch.equal(got, want)
    else:  # the interpreter rounds to bf16 its own way (ties, and truncation in plain casts): a unit or two apart
        torch.testing.assert_close(got.float(), want.float(), rtol=2**-5, atol=2**-6)


def test_dispatch_gives_the_reference_off_cuda_and_bad_tables_are_one_clear_error():
    x = torch.randn(2, 4, 3, 16)
    cos, sin = tables(2, 3, 16, torch.float32, "cpu")
    assert torch.equal(rp.rope(x, cos, sin), rp.rope_reference(x, cos, sin))
    with pytest.raises(KernelInputError, match=r"cos must be \[B, N, head_dim\]"):
        rp.rope(x, cos[:, :2], sin)
    with pytest.raises(KernelInputError, match="must have x's dtype"):
        rp.rope_triton(x, cos.bfloat16(), sin)


@pytest.mark.cuda
@pytest.mark.parametrize("B", [1, 32])
def test_the_draft_steps_shapes_are_torchs_bits_on_cuda(B):
    """The public-DSpark drafter: 32 query and 8 KV heads of 128, a block of 8 and 292 context rows."""
    for H, N in ((32, 8), (8, 8), (8, 292)):
        x = torch.randn(B, N, H, 128, device="cuda").bfloat16().transpose(1, 2)
        cos, sin = tables(B, N, 128, torch.bfloat16)
        assert torch.equal(rp.rope(x, cos, sin), rp.rope_reference(x, cos, sin))


def buffers(B, H, cap, hd, dtype, device=DEVICE):
    """Context buffers [B, H, cap, hd] full of earlier rows (a store must leave every other row alone)."""
    return torch.randn(B, H, cap, hd, device=device).to(dtype), torch.randn(B, H, cap, hd, device=device).to(dtype)


@pytest.mark.parametrize("B,H,N,hd,per_row", [(1, 8, 8, 128, False), (3, 2, 5, 64, True), (2, 3, 4, 24, False)])
def test_the_store_writes_the_rotated_keys_and_the_values_at_their_rows_bit_for_bit(B, H, N, hd, per_row):
    """Block rows after each batch row's own context ([B, N] rows) or the re-projected context rows shared by
    the batch ([1, N]), in float32: the buffers equal the torch scatter's, every other row untouched."""
    k = torch.randn(B, N, H, hd, device=DEVICE).transpose(1, 2)
    v = torch.randn(B, N, H, hd, device=DEVICE).transpose(1, 2)
    cos, sin = tables(B, N, hd, torch.float32)
    start = torch.tensor([3, 9, 0][:B] if per_row else [6], device=DEVICE)
    rows = start[:, None] + torch.arange(N, device=DEVICE)
    got = buffers(B, H, 20, hd, torch.float32)
    want = tuple(t.clone() for t in got)
    rp.rope_store_triton(k, v, cos, sin, *got, rows)
    rp.rope_store_reference(k, v, cos, sin, *want, rows)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    b = B - 1
    assert torch.equal(got[0][b, :, rows[-1]], rp.rope_reference(k, cos, sin)[b]) and torch.equal(got[1][b, :, rows[-1]], v[b])


def test_the_store_in_bf16_matches_torch_to_its_rounding_and_refuses_bad_rows():
    k = torch.randn(4, 7, 8, 128, device=DEVICE).bfloat16().transpose(1, 2)
    v = torch.randn(4, 7, 8, 128, device=DEVICE).bfloat16().transpose(1, 2)
    cos, sin = tables(1, 7, 128, torch.bfloat16)
    rows = torch.arange(2, 9, device=DEVICE)[None]
    got = buffers(4, 8, 16, 128, torch.bfloat16)
    want = tuple(t.clone() for t in got)
    rp.rope_store(k, v, cos, sin, *got, rows)
    rp.rope_store_reference(k, v, cos, sin, *want, rows)
    assert torch.equal(got[1], want[1])  # the values are copies
    if DEVICE == "cuda":
        assert torch.equal(got[0], want[0])
    else:  # the interpreter rounds to bf16 its own way, as above
        torch.testing.assert_close(got[0].float(), want[0].float(), rtol=2**-5, atol=2**-6)
    with pytest.raises(KernelInputError, match=r"rows must be int64 \[1 or B, N\]"):
        rp.rope_store(k, v, cos, sin, *got, rows.int())
    with pytest.raises(KernelInputError, match=r"k_buf must be \[B, H, cap, head_dim\]"):
        rp.rope_store(k, v, cos, sin, got[0][:, :4], got[1], rows)


@pytest.mark.cuda
@pytest.mark.parametrize("B", [1, 32])
def test_the_draft_steps_stores_are_torchs_bits_on_cuda(B):
    """The block's 8 rows after a 292-row context, per batch row, and the 292 re-projected context rows."""
    for N, per_row in ((8, True), (292, False)):
        k = torch.randn(B, N, 8, 128, device="cuda").bfloat16().transpose(1, 2)
        v = torch.randn(B, N, 8, 128, device="cuda").bfloat16().transpose(1, 2)
        cos, sin = tables(B, N, 128, torch.bfloat16)
        start = torch.randint(0, 8, (B if per_row else 1, 1), device="cuda") + (292 if per_row else 0)
        rows = start + torch.arange(N, device="cuda")
        got = buffers(B, 8, 308, 128, torch.bfloat16, "cuda")
        want = tuple(t.clone() for t in got)
        rp.rope_store(k, v, cos, sin, *got, rows)
        rp.rope_store_reference(k, v, cos, sin, *want, rows)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
