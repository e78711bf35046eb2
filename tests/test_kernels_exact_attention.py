"""exact_attention (the target's exact mode): the fixed-key-order Triton kernel matches its torch
reference and softmax attention over shapes, dtypes and GQA, and both give a query row the same bits
whatever the static buffer's capacity, the number of query rows in the call and the batch (interpreter
on CPU at small sizes; compiled on CUDA, where the `cuda` tests add the 27B shapes and a CUDA graph).
"""

import importlib

import pytest
import torch
import torch.nn.functional as F

from ready_kernels._testing import kernel_test_marks, prepare_interpreter, rel_err  # noqa: E402

RUNNABLE = prepare_interpreter()

ea = importlib.import_module("ready_kernels.exact_attention")
from ready_kernels._common import KernelInputError  # noqa: E402

pytestmark = kernel_test_marks(ea.HAS_TRITON, RUNNABLE)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
IMPLS = {"triton": ea.exact_attention_triton, "reference": ea.exact_attention_reference}


def make(B, HQ, HKV, T, L, D, DV, dtype, device=DEVICE, garbage=None):
    """q, k, v; with `garbage` the buffers hold it from position `garbage` on (never to be read)."""
    q = torch.randn(B, HQ, T, D, device=device).to(dtype)
    k = torch.randn(B, HKV, L, D, device=device).to(dtype)
    v = torch.randn(B, HKV, L, DV, device=device).to(dtype)
    if garbage is not None:
        k[:, :, garbage:] = float("nan")
        v[:, :, garbage:] = float("inf")
    return q, k, v


def sdpa(q, k, v, n_keys, window=0):
    """Softmax attention with a length mask (and a sliding window), float64 (the math both
    implementations must agree with)."""
    B, HQ, T, _ = q.shape
    G = HQ // k.shape[1]
    kk, vv = k.double().repeat_interleave(G, 1), v.double().repeat_interleave(G, 1)
    n = n_keys.expand(B, T) if n_keys.dim() == 1 else n_keys
    j = torch.arange(k.shape[2], device=q.device)[None, None, None, :]
    mask = j < n[:, None, :, None]
    if window:
        mask &= j >= n[:, None, :, None] - window
    return F.scaled_dot_product_attention(q.double(), kk.nan_to_num(0.0), vv.nan_to_num(0.0), attn_mask=mask)


def in_buffer(k, v, capacity, fill=float("nan")):
    """The same keys and values at the front of buffers of another capacity (the rest: `fill`)."""
    B, H, L, _ = k.shape
    kb = torch.full((B, H, capacity, k.shape[3]), fill, device=k.device, dtype=k.dtype)
    vb = torch.full((B, H, capacity, v.shape[3]), fill, device=v.device, dtype=v.dtype)
    n = min(L, capacity)
    kb[:, :, :n], vb[:, :, :n] = k[:, :, :n], v[:, :, :n]
    return kb, vb


SHAPES = [
    # B, H_q, H_kv, T, L, d, d_v, n_keys per (batch row, query row)
    (1, 2, 1, 1, 20, 32, 32, [[20]]),                         # an AR step, one partial block
    (1, 4, 2, 3, 70, 32, 32, [[31, 32, 33]]),                 # rows around a block edge, GQA 2
    (2, 6, 2, 4, 100, 64, 64, [[1, 45, 99, 100], [64, 65, 2, 77]]),  # GQA 3, per-batch lengths
    (1, 3, 3, 2, 37, 16, 48, [[37, 36]]),                     # no GQA, d != d_v, odd L
    (1, 2, 1, 2, 41, 40, 40, [[41, 13]]),                     # head dim not a power of two
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("B,HQ,HKV,T,L,D,DV,n", SHAPES)
def test_kernel_matches_reference_and_softmax_attention(B, HQ, HKV, T, L, D, DV, n, dtype):
    q, k, v = make(B, HQ, HKV, T, L, D, DV, dtype)
    n_keys = torch.tensor(n, device=DEVICE)
    got = ea.exact_attention_triton(q, k, v, n_keys)
    ref = ea.exact_attention_reference(q, k, v, n_keys)
    want = sdpa(q, k, v, n_keys)
    assert got.dtype == dtype == ref.dtype and got.shape == (B, HQ, T, DV) == ref.shape
    tight = dtype == torch.float32
    assert rel_err(got, ref) < (2e-6 if tight else 1e-2)
    assert rel_err(ref, want) < (2e-6 if tight else 1e-2)


def test_scale_and_shared_lengths_and_zero_keys():
    q, k, v = make(2, 4, 2, 3, 50, 32, 32, torch.float32)
    shared = torch.tensor([5, 50, 17], device=DEVICE)
    got = ea.exact_attention_triton(q, k, v, shared, scale=0.3)
    assert torch.equal(got, ea.exact_attention_triton(q, k, v, shared.expand(2, 3).contiguous(), scale=0.3))
    assert rel_err(got, ea.exact_attention_reference(q, k, v, shared, scale=0.3)) < 2e-6
    ref = ea.exact_attention_reference(q, k, v, shared, scale=0.3)
    assert rel_err(ref, sdpa(q * (0.3 * 32**0.5), k, v, shared)) < 2e-6  # sdpa's scale is 32**-0.5
    # a row with no keys reads nothing and gives zeros (never NaN); n past the buffer is clamped to it
    odd = torch.tensor([0, 500, 1], device=DEVICE)
    for fn in IMPLS.values():
        out = fn(q, k, v, odd)
        assert torch.equal(out[:, :, 0], torch.zeros_like(out[:, :, 0]))
        assert torch.equal(out[:, :, 1], fn(q, k, v, torch.tensor([1, 50, 1], device=DEVICE))[:, :, 1])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_row_has_the_same_bits_in_any_buffer_capacity(impl, dtype):
    """The fix: the AR engine's and the speculative engine's static caches differ in capacity; a query
    row over the same keys 0..pos must not notice (nor read what lies past them: NaN here)."""
    fn = IMPLS[impl]
    q, k, v = make(1, 2, 1, 4, 264, 32, 32, dtype)
    n_keys = torch.tensor([1, 100, 223, 264], device=DEVICE)
    base = fn(q, k, v, n_keys)
    assert torch.isfinite(base.float()).all()
    for capacity in (279, 512):
        kb, vb = in_buffer(k, v, capacity)
        assert torch.equal(fn(q, kb, vb, n_keys), base), f"capacity {capacity} changed the result"
    # and a longer buffer's extra keys (garbage) beyond each row's count are never read
    _, kg, vg = make(1, 2, 1, 4, 279, 32, 32, dtype, garbage=264)
    kg[:, :, :264], vg[:, :, :264] = k, v
    assert torch.equal(fn(q, kg, vg, n_keys), base)


@pytest.mark.parametrize("window", [1, 5, 32, 40])  # one key; inside a block; a whole block; across blocks
def test_a_sliding_window_sees_only_the_last_window_keys(window):
    """A windowed target (`HybridConfig.sliding_window`): row t attends over keys n - window .. n - 1;
    what lies before them (NaN here) is never read, and a row's bits still ignore the capacity."""
    q, k, v = make(1, 4, 2, 4, 100, 32, 32, torch.float32)
    n_keys = torch.tensor([3, 37, 64, 100], device=DEVICE)
    got = ea.exact_attention_triton(q, k, v, n_keys, window=window)
    ref = ea.exact_attention_reference(q, k, v, n_keys, window=window)
    assert rel_err(got, ref) < 2e-6 and rel_err(ref, sdpa(q, k, v, n_keys, window)) < 2e-6
    assert rel_err(ref, sdpa(q, k, v, n_keys)) > 1e-3 or window >= 100  # the window did cut something
    for fn, base in ((ea.exact_attention_triton, got), (ea.exact_attention_reference, ref)):
        early = k.clone(), v.clone()
        early[0][:, :, :36], early[1][:, :, :36] = float("nan"), float("inf")  # before every row's window...
        rows = slice(1, 4) if window <= 1 else slice(3, 4)  # ...of the rows that start after key 36
        assert torch.equal(fn(q[:, :, rows], *early, n_keys[rows], window=window), base[:, :, rows])
        kb, vb = in_buffer(k, v, 279)
        assert torch.equal(fn(q, kb, vb, n_keys, window=window), base)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_row_i_of_a_T_row_call_equals_the_one_row_call(impl, dtype):
    """verify(K+1) vs the AR step: row i of a T-row call, a 1-row call of row i, and batch row b alone
    against the whole batch give the same bits."""
    fn = IMPLS[impl]
    T = 5
    q, k, v = make(2, 2, 1, T, 80, 32, 32, dtype)
    pos = 40 + torch.arange(T, device=DEVICE)  # row t sits at position 40 + t: keys 0..40+t
    n_keys = torch.stack([pos + 1, pos + 31])  # the second batch row further along
    full = fn(q, k, v, n_keys)
    for i in range(T):
        one = fn(q[:, :, i:i + 1], k, v, n_keys[:, i:i + 1])
        assert torch.equal(full[:, :, i:i + 1], one), f"row {i}"
    assert torch.equal(fn(q[:, :, :3], k, v, n_keys[:, :3]), full[:, :, :3])
    for b in range(2):
        assert torch.equal(fn(q[b:b + 1], k[b:b + 1], v[b:b + 1], n_keys[b:b + 1]), full[b:b + 1])


def test_strided_inputs_are_taken_as_they_come():
    """The model passes the cache slot views and q as a transposed view; odd strides are copied."""
    q, k, v = make(1, 4, 2, 3, 40, 32, 32, torch.float32)
    n_keys = torch.tensor([3, 39, 40], device=DEVICE)
    want = ea.exact_attention_triton(q, k, v, n_keys)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # [B, T, H, d] memory, as in the model
    pad = torch.zeros(1, 2, 40, 48, device=DEVICE)
    pad[..., :32] = k  # rows of 48 elements: not whole-row strides, copied
    assert torch.equal(ea.exact_attention_triton(qt, pad[..., :32], v, n_keys), want)
    assert torch.equal(ea.exact_attention_reference(qt, pad[..., :32], v, n_keys),
                       ea.exact_attention_reference(q, k, v, n_keys))


def test_dispatch_and_custom_op_give_the_reference_off_cuda():
    q, k, v = make(1, 2, 1, 2, 24, 16, 16, torch.float32, device="cpu")
    n_keys = torch.tensor([10, 24])
    assert torch.equal(ea.exact_attention(q, k, v, n_keys), ea.exact_attention_reference(q, k, v, n_keys))
    torch.library.opcheck(torch.ops.ready_kernels.exact_attention, (q, k, v, n_keys, 0.25))


@pytest.mark.parametrize("bad,match", [
    (lambda q, k, v, n: (q, torch.randn(1, 3, 16, 16), torch.randn(1, 3, 16, 16), n), "multiple of KV heads"),
    (lambda q, k, v, n: (q, k, v[:, :, :5], n), "v must be"),
    (lambda q, k, v, n: (q, k, v, n.float()), "integer tensor"),
    (lambda q, k, v, n: (q, k, v, n[:1]), "n_keys must be"),
    (lambda q, k, v, n: (q.double(), k, v, n), "float32, bfloat16 or float16"),
])
def test_bad_inputs_are_one_clear_error(bad, match):
    q, k, v = make(1, 4, 2, 2, 16, 16, 16, torch.float32, device="cpu")
    with pytest.raises(KernelInputError, match=match):
        ea.exact_attention_reference(*bad(q, k, v, torch.tensor([3, 4])))
    with pytest.raises(KernelInputError, match="head dims"):
        ea.exact_attention_reference(torch.randn(1, 1, 1, 300), torch.randn(1, 1, 4, 300), torch.randn(1, 1, 4, 8),
                                     torch.tensor([4]))


# --- on the GPU: the 27B preset's shapes, compiled, and inside a CUDA graph ----------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_27b_shapes_match_reference_and_ignore_capacity(dtype):
    torch.manual_seed(0)
    T, n0 = 8, 264
    q, k, v = make(1, 24, 4, T, n0, 256, 256, dtype, device="cuda")
    pos = torch.arange(n0 - T, n0, device="cuda")
    n_keys = pos + 1
    got = ea.exact_attention_triton(q, k, v, n_keys)
    assert rel_err(got, ea.exact_attention_reference(q, k, v, n_keys)) < (2e-6 if dtype == torch.float32 else 1e-2)
    assert rel_err(got, sdpa(q, k, v, n_keys)) < (2e-6 if dtype == torch.float32 else 1e-2)
    for capacity in (271, 279, 512, 4096):
        kb, vb = in_buffer(k, v, capacity)
        assert torch.equal(ea.exact_attention_triton(q, kb, vb, n_keys), got), f"capacity {capacity}"
    for i in range(T):
        assert torch.equal(ea.exact_attention_triton(q[:, :, i:i + 1], k, v, n_keys[i:i + 1]), got[:, :, i:i + 1])
    # long contexts too (many blocks): 1 row vs 8 rows, 3000 keys in buffers of 3000 and 8192
    q2, k2, v2 = make(1, 24, 4, T, 3000, 256, 256, dtype, device="cuda")
    n2 = torch.arange(3000 - T + 1, 3001, device="cuda")
    full = ea.exact_attention_triton(q2, k2, v2, n2)
    kb, vb = in_buffer(k2, v2, 8192)
    assert torch.equal(ea.exact_attention_triton(q2, kb, vb, n2), full)
    assert torch.equal(ea.exact_attention_triton(q2[:, :, -1:], k2, v2, n2[-1:]), full[:, :, -1:])


@pytest.mark.cuda
def test_cuda_graph_replay_reads_lengths_from_the_device():
    """Captured once, replayed at other lengths (the engine's static cache): the same as eager calls."""
    torch.manual_seed(0)
    q, k, v = make(1, 24, 4, 8, 512, 256, 256, torch.bfloat16, device="cuda")
    n_keys = torch.arange(1, 9, device="cuda")
    ea.exact_attention(q, k, v, n_keys)  # compile off the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ea.exact_attention(q, k, v, n_keys)
    for start in (0, 100, 263, 504):
        n_keys.copy_(torch.arange(start + 1, start + 9, device="cuda"))
        graph.replay()
        assert torch.equal(out, ea.exact_attention(q, k, v, n_keys.clone())), f"start {start}"
