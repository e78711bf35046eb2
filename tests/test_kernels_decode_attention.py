"""decode_attention (the fast path's attention over the static KV cache): the split-key Triton
kernels match the torch reference and masked softmax attention over shapes, dtypes, GQA, ragged
positions and sliding windows, and never read keys no query sees (interpreter on CPU at small
sizes; compiled on CUDA, where the `cuda` tests add the 27B shapes and a call inside torch.compile).
"""

import importlib

import pytest
import torch
import torch.nn.functional as F

from ready_kernels._testing import kernel_test_marks, prepare_interpreter, rel_err  # noqa: E402

RUNNABLE = prepare_interpreter()

da = importlib.import_module("ready_kernels.decode_attention")
from ready_kernels._common import KernelInputError  # noqa: E402

pytestmark = kernel_test_marks(da.HAS_TRITON, RUNNABLE)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make(B, HQ, HKV, T, L, D, dtype, device=DEVICE):
    q = torch.randn(B, HQ, T, D, device=device).to(dtype)
    k = torch.randn(B, HKV, L, D, device=device).to(dtype)
    v = torch.randn(B, HKV, L, D, device=device).to(dtype)
    return q, k, v


def masked_sdpa(q, k, v, pos, window=0):
    """What `Attention.attention` computes on the fast path: SDPA over the buffer with a visibility mask
    (float64 here)."""
    j = torch.arange(k.shape[2], device=q.device)
    pos = pos if pos.dim() == 2 else pos[None].expand(q.shape[0], -1)
    seen = j <= pos[..., None]
    if window:
        seen &= j > pos[..., None] - window
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=seen[:, None],
                                          enable_gqa=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B,HQ,HKV,T,L,D,first", [
    (1, 4, 2, 1, 40, 32, 25),      # one query (the AR step), a buffer that is not a whole number of blocks
    (2, 6, 2, 3, 150, 64, 130),    # GQA 3, three queries, keys over three blocks
    (1, 4, 1, 8, 200, 32, 60),     # the verify block: 4 heads x 8 queries on one KV head
    (1, 2, 2, 2, 64, 48, 0),       # the first positions; a head dim that is not a power of two
])
def test_matches_masked_softmax_attention(B, HQ, HKV, T, L, D, first, dtype):
    q, k, v = make(B, HQ, HKV, T, L, D, dtype)
    pos = torch.arange(first, first + T, device=DEVICE)
    want = masked_sdpa(q, k, v, pos)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for chunk in (None, 256):  # the default chunks, combined; one program over the buffer
        got = da.decode_attention_triton(q, k, v, pos, chunk=chunk)
        assert got.shape == (B, HQ, T, D) and got.dtype == dtype
        assert rel_err(got, want) < tol, chunk
    assert rel_err(da.decode_attention_reference(q, k, v, pos), want) < tol


def test_ragged_rows_and_a_sliding_window():
    q, k, v = make(2, 4, 2, 3, 130, 32, torch.float32)
    pos = torch.tensor([[10, 11, 12], [100, 101, 102]], device=DEVICE)  # each batch row at its own length
    for chunk in (None, 128, 256):
        assert rel_err(da.decode_attention_triton(q, k, v, pos, chunk=chunk), masked_sdpa(q, k, v, pos)) < 1e-5
        for window in (5, 64, 70):  # inside one block, a block exactly, across blocks
            got = da.decode_attention_triton(q, k, v, pos, window=window, chunk=chunk)
            assert rel_err(got, masked_sdpa(q, k, v, pos, window)) < 1e-5, (chunk, window)


def test_long_buffers_take_bigger_chunks_and_short_ones_keep_the_default():
    assert da.chunk_for(400, 4) == da.chunk_for(2048, 64) == da.CHUNK  # every measured short-context shape
    for keys, heads in ((32_896, 4), (8_320, 4), (32_896, 256), (2_560, 8)):
        chunk = da.chunk_for(keys, heads)
        assert chunk % da.BLOCK_N == 0 and chunk > da.CHUNK
        assert -(-keys // chunk) <= max(da.MAX_CHUNKS, -(-da.PROGRAMS // heads)), (keys, heads)


@pytest.mark.parametrize("HKV,chunk,window", [(2, 64, 0), (2, 64, 300), (8, None, 0)])
def test_many_chunks_combine_to_the_softmax_over_all_keys(HKV, chunk, window):
    """More chunks than one combine step reads (COMBINE_CHUNKS), ragged rows, a window; with eight KV
    heads the default chunk grows (2,560 keys: 20 chunks of 128)."""
    L = 2560
    q, k, v = make(2 if HKV == 2 else 1, 8, HKV, 2, L, 16, torch.float32)
    pos = torch.tensor([[L - 2, L - 1], [500, 501]], device=DEVICE)[: q.shape[0]]
    assert -(-L // (chunk or da.chunk_for(L, q.shape[0] * HKV))) > da.COMBINE_CHUNKS
    got = da.decode_attention_triton(q, k, v, pos, window=window, chunk=chunk)
    assert rel_err(got, masked_sdpa(q, k, v, pos, window)) < 1e-5



@pytest.mark.parametrize("window", [0, 5])
def test_a_draft_block_sees_its_context_and_the_whole_block(window):
    """The drafter's call (ready.drafter.layers.BufferedContext): the block's N keys written after n context
    keys, every query at position n + N - 1 (a stride-0 pos), window W + N for a W-position context window."""
    n, N, L = 70, 5, 128
    q, k, v = make(2, 4, 2, N, L, 32, torch.float32)
    last = torch.tensor(n + N - 1, device=DEVICE).reshape(1).expand(N)
    got = da.decode_attention_triton(q, k, v, last, window=window + N if window else 0)
    j = torch.arange(L, device=DEVICE)
    seen = (j < n + N) & ((j >= n - window) if window else True)
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=seen.expand(N, L),
                                          enable_gqa=True)
    assert rel_err(got, want) < 1e-5

def test_keys_past_every_query_are_never_read():
    """Stale or uninitialised cache rows (NaN, inf) past the last position leave the output finite."""
    q, k, v = make(1, 4, 2, 2, 100, 32, torch.float32)
    pos = torch.tensor([40, 41], device=DEVICE)
    want = [da.decode_attention_triton(q, k, v, pos, chunk=c) for c in (None, 128)]
    k[:, :, 42:], v[:, :, 42:] = float("nan"), float("inf")
    assert [torch.equal(da.decode_attention_triton(q, k, v, pos, chunk=c), w) for c, w in zip((None, 128), want)] == [True] * 2


def test_output_layout_is_the_one_o_proj_reads():
    q, k, v = make(1, 4, 2, 3, 40, 32, torch.float32)
    out = da.decode_attention_triton(q, k, v, torch.arange(5, 8, device=DEVICE))
    assert out.transpose(1, 2).is_contiguous()  # [B, T, H, d] underneath: the gate reshapes without a copy


def test_fits_and_bad_inputs_are_one_clear_error():
    assert da.fits(24, 4, 8) and not da.fits(24, 4, 16) and not da.fits(24, 5, 1)
    q, k, v = make(1, 4, 2, 2, 40, 32, torch.float32)
    pos = torch.arange(2, device=DEVICE)
    with pytest.raises(KernelInputError, match="pos must be"):
        da.decode_attention_triton(q, k, v, torch.arange(3, device=DEVICE))
    with pytest.raises(KernelInputError, match="multiple of KV heads"):
        da.decode_attention_triton(q, k[:, :1].expand(1, 3, 40, 32), v[:, :1].expand(1, 3, 40, 32), pos)
    with pytest.raises(KernelInputError, match="integer"):
        da.decode_attention_triton(q, k, v, pos.float())
    with pytest.raises(KernelInputError, match="multiple of block_n"):
        da.decode_attention_triton(q, k, v, pos, chunk=100)
    with pytest.raises(KernelInputError, match="query rows per KV head"):
        big = torch.randn(1, 4, 40, 32, device=DEVICE)
        da.decode_attention_triton(big, k, v, torch.arange(40, device=DEVICE))


@pytest.mark.cuda
@pytest.mark.parametrize("T", [1, 8])
def test_cuda_27b_shapes_match_sdpa(T):
    for L in (600, 3000, 33_000):  # 64-key chunks; 576-key chunks (a 32k context)
        q, k, v = make(1, 24, 4, T, L, 256, torch.bfloat16, device="cuda")
        pos = torch.arange(L // 2, L // 2 + T, device="cuda")
        got = da.decode_attention(q, k, v, pos)
        assert rel_err(got, masked_sdpa(q, k, v, pos)) < 1e-2, L


@pytest.mark.cuda
def test_cuda_compiled_call_matches_eager():
    """The target's layers run it inside torch.compile (a user Triton kernel there)."""
    q, k, v = make(1, 24, 4, 8, 600, 256, torch.bfloat16, device="cuda")
    pos = torch.arange(300, 308, device="cuda")
    compiled = torch.compile(lambda q, k, v, p: da.decode_attention(q, k, v, p).transpose(1, 2).reshape(1, 8, -1) * 2)
    want = da.decode_attention(q, k, v, pos).transpose(1, 2).reshape(1, 8, -1) * 2
    assert rel_err(compiled(q, k, v, pos), want) < 1e-3
