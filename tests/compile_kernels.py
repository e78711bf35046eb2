"""Compile Triton kernels for a Hopper GPU (sm_90) on a machine without one.

Run as a script in a fresh process (Triton must not be in interpreter mode): each case calls a kernel's
Triton launcher with CPU tensors of the shapes and dtypes the engine uses on the GPU, while
`JITFunction.run` compiles the launch (triton.compile: Triton's passes, then ptxas) instead of running
it. Catches what the CPU interpreter cannot: code that does not compile. Prints one JSON object:
{"compiled": ["kernel[constexprs]", ...], "failed": {"case": "error"}}.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
OPTIONS = ("num_warps", "num_stages", "num_ctas", "launch_pdl", "enable_fp_fusion")
TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int64: "i64",
         torch.int32: "i32", torch.bool: "i1"}
compiled: list[str] = []


def _arg_type(value):
    if isinstance(value, torch.Tensor):
        return "*" + TYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i64" if not -2**31 <= value < 2**31 else "i32"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no Triton type for {type(value).__name__}")


def compile_only(self, *args, grid, warmup, **kwargs):
    """`JITFunction.run` without a device: compile this launch's specialisation for TARGET."""
    options = {k: kwargs.pop(k) for k in OPTIONS if k in kwargs}
    bound = dict(zip(self.arg_names, args))
    bound.update(kwargs)
    signature, constexprs = {}, {}
    for p in self.params:
        value = bound[p.name] if p.name in bound else p.default
        if p.is_constexpr or value is None:
            signature[p.name], constexprs[p.name] = "constexpr", value
        else:
            signature[p.name] = _arg_type(value)
    triton.compile(ASTSource(fn=self, signature=signature, constexprs=constexprs), target=TARGET, options=options)
    shown = ",".join(f"{k}={v}" for k, v in constexprs.items() if v is not None)
    compiled.append(f"{self.__name__}[{shown}]")


def decode_attention_cases():
    """The 27B target's AR step and verify block (24 query heads, 4 KV heads, head dim 256) over a short
    buffer and a 32k one, and the public-DSpark-shaped drafter's block (32/8 heads, dim 128, 8 queries)."""
    from ready_kernels.decode_attention import decode_attention_triton

    bf = torch.bfloat16
    for hq, hkv, t, length, d in ((24, 4, 1, 600, 256), (24, 4, 8, 600, 256), (24, 4, 1, 33_000, 256),
                                  (24, 4, 8, 33_000, 256), (32, 8, 8, 8_400, 128)):
        q = torch.zeros(1, hq, t, d, dtype=bf)
        k = torch.zeros(1, hkv, length, d, dtype=bf)
        yield f"decode_attention hq={hq} T={t} L={length}", lambda q=q, k=k, t=t: decode_attention_triton(
            q, k, k, torch.arange(t), 0)


def exact_attention_cases():
    """Exact mode's attention: the 27B verify block over a short buffer."""
    from ready_kernels.exact_attention import exact_attention_triton

    q, k = torch.zeros(1, 24, 8, 256, dtype=torch.bfloat16), torch.zeros(1, 4, 600, 256, dtype=torch.bfloat16)
    yield "exact_attention T=8", lambda: exact_attention_triton(q, k, k, torch.arange(301, 309)[None])


def norm_cases():
    """RMSNorm (offset weights; the draft layers' cast-first) and the row norm, with and without a weight, at
    the hidden size."""
    from ready_kernels.rmsnorm import rms_norm_triton
    from ready_kernels.row_norm import row_norm_triton

    x, w = torch.zeros(8, 5120, dtype=torch.bfloat16), torch.zeros(5120, dtype=torch.bfloat16)
    yield "rms_norm", lambda: rms_norm_triton(x, w)
    yield "rms_norm cast_first", lambda: rms_norm_triton(x, w, offset=0.0, cast_first=True)
    yield "row_norm", lambda: row_norm_triton(x, w)
    yield "row_norm without weight", lambda: row_norm_triton(x, None, out_dtype=torch.float32)


def gemm_cases():
    """The small-M linear (the default tile, a split-K tile, the one-row GEMV, a residual add) and the
    fused norm + GEMV, at the 27B projections."""
    from ready_kernels.fused_gemv import fused_gemv_triton
    from ready_kernels.small_m_gemm import CONFIGS, DEFAULT, small_m_linear_triton

    bf = torch.bfloat16
    w = torch.zeros(16480, 5120, dtype=bf)
    split = next(c for c in CONFIGS if c.split > 1 and not c.gemv)
    gemv = next(c for c in CONFIGS if c.gemv)
    yield "small_m_linear M=8", lambda: small_m_linear_triton(torch.zeros(8, 5120, dtype=bf), w, DEFAULT)
    yield "small_m_linear M=8 split-K", lambda: small_m_linear_triton(torch.zeros(8, 5120, dtype=bf), w, split)
    yield "small_m_linear M=1 GEMV", lambda: small_m_linear_triton(torch.zeros(1, 5120, dtype=bf), w, gemv)
    yield "small_m_linear M=8 + residual", lambda: small_m_linear_triton(
        torch.zeros(8, 5120, dtype=bf), w, DEFAULT, residual=torch.zeros(8, 16480, dtype=bf))
    yield "fused_gemv norm", lambda: fused_gemv_triton(torch.zeros(5120, dtype=bf), torch.zeros(34816, 5120, dtype=bf),
                                                       norm_weight=torch.zeros(5120, dtype=bf))
    yield "fused_gemv residual", lambda: fused_gemv_triton(torch.zeros(17408, dtype=bf), torch.zeros(5120, 17408, dtype=bf),
                                                           residual=torch.zeros(5120, dtype=bf))


def gdn_cases():
    """The 27B GDN layer (16 key heads, 48 value heads, d_k = d_v = 128) at verify(8), batch 2: the verify
    recurrence with and without kept states, the fused conv + gates + recurrence, the two-pass verify
    (every token's front, then the recurrence), the commit's replay
    (one count and per-row counts) and its conv-window copy."""
    from ready_kernels.gdn_fused import gdn_fused_verify_triton, gdn_two_pass_verify_triton
    from ready_kernels.gdn_verify import gdn_commit_triton, gdn_verify_triton, input_width

    B, T, nk, H, d, W = 2, 8, 16, 48, 128, 3
    bf, f = torch.bfloat16, torch.float32
    q, v = torch.zeros(B, T, H, d, dtype=bf), torch.zeros(B, T, H, d, dtype=bf)
    g, h0 = torch.zeros(B, T, H, dtype=f), torch.zeros(B, H, d, d, dtype=f)
    yield "gdn_verify kept states", lambda: gdn_verify_triton(q, q, v, g, g, h0)
    yield "gdn_verify no states", lambda: gdn_verify_triton(q, q, v, g, g, h0, keep_states=False)
    C = 2 * nk * d + H * d
    mixed, ab = torch.zeros(B, T, C, dtype=bf), torch.zeros(B, T, H, dtype=bf)
    conv_state, conv_weight = torch.zeros(B, C, W, dtype=bf), torch.zeros(C, W + 1, dtype=bf)
    A_log, dt_bias = torch.zeros(H, dtype=f), torch.zeros(H, dtype=f)
    fused = (mixed, ab, ab, conv_state, conv_weight, A_log, dt_bias, h0, nk, d)
    pending = torch.zeros(B, T, H, input_width(d, d), dtype=f)
    yield "gdn_fused_verify kept states", lambda: gdn_fused_verify_triton(*fused)
    yield "gdn_fused_verify replay inputs", lambda: gdn_fused_verify_triton(*fused, out_inputs=pending)
    yield "gdn_two_pass_verify", lambda: gdn_two_pass_verify_triton(*fused, pending)
    ssm = torch.zeros(3, B, H, d, d, dtype=f)
    pendings = torch.zeros(3, B, T, H, input_width(d, d), dtype=f)
    conv, pending_conv = torch.zeros(3, B, C, W, dtype=bf), torch.zeros(3, B, T, C, W, dtype=bf)
    yield "gdn_commit n=4", lambda: gdn_commit_triton(ssm, pendings, 4, conv, pending_conv)
    yield "gdn_commit per row", lambda: gdn_commit_triton(ssm, pendings, torch.tensor([1, 8]), conv, pending_conv)


def state_reader_cases():
    """The ReaDy reader (rank 8, layers 30 and 62 of a 48-GDN-layer cache, 48 heads, d = 128, a block of 8)
    over fp32 states, at the default precision and the others."""
    from ready_kernels.state_reader import PRECISIONS, state_reader_triton

    L, S, H, d, r, B, P = 48, 1, 48, 128, 8, 1, 8
    ssm = torch.zeros(L, S, H, d, d)
    M = 2 * H
    z, U, V = torch.zeros(B, P, M, r), torch.zeros(M, r, d), torch.zeros(M, d, r)
    args = (ssm, torch.tensor([22, 46]), torch.tensor([0]), z, U, V)
    for precision in sorted(PRECISIONS):
        yield f"state_reader {precision}", lambda p=precision: state_reader_triton(*args, precision=p)


def add_argmax_cases():
    """The public-DSpark drafter's greedy Markov step: bf16 logits of a [B, 7, 248,320] block, one position."""
    from ready_kernels.add_argmax import add_argmax_triton

    for rows in (1, 32):
        base, bias = torch.zeros(rows, 7, 248_320, dtype=torch.bfloat16), torch.zeros(rows, 248_320, dtype=torch.bfloat16)
        out = torch.zeros(rows, 7, 248_320)
        yield f"add_argmax B={rows}", lambda b=base, c=bias, o=out: add_argmax_triton(b[:, 3], c, o[:, 3])


def rope_cases():
    """The public-DSpark drafter's rotations: 32 query and 8 KV heads of 128 over a block of 8, and the
    context keys of a short prompt, heads transposed out of [B, N, H, hd]; and the keys' rotation with K
    and V stored into context buffers of 308 rows, at the block's rows per batch row and at shared rows."""
    from ready_kernels.rope import rope_store_triton, rope_triton

    for heads, rows in ((32, 8), (8, 8), (8, 292)):
        x = torch.zeros(1, rows, heads, 128, dtype=torch.bfloat16).transpose(1, 2)
        table = torch.zeros(1, rows, 128, dtype=torch.bfloat16)
        yield f"rope H={heads} N={rows}", lambda x=x, t=table: rope_triton(x, t, t)
    for B, rows in ((2, 8), (1, 292)):
        x = torch.zeros(B, rows, 8, 128, dtype=torch.bfloat16).transpose(1, 2)
        table = torch.zeros(B, rows, 128, dtype=torch.bfloat16)
        buf = torch.zeros(B, 8, 308, 128, dtype=torch.bfloat16)
        at = torch.arange(rows)[None].expand(B, rows).contiguous()
        yield (f"rope_store B={B} N={rows}",
               lambda x=x, t=table, buf=buf, at=at: rope_store_triton(x, x, t, t, buf, buf, at))


def canary_cases():
    """A kernel the CPU interpreter runs but the compiler refuses (a static_range over a runtime bound):
    the check of the check (not in the default list)."""
    import triton.language as tl

    @triton.jit
    def unrolled_over_a_runtime_bound(x_ptr, n):
        for i in tl.static_range(n):
            tl.store(x_ptr + i, i)

    x = torch.zeros(8)
    yield "canary: static_range over a runtime bound", lambda: unrolled_over_a_runtime_bound[(1,)](x, 8)


CASES = {"decode_attention": decode_attention_cases, "exact_attention": exact_attention_cases, "norms": norm_cases,
         "gemm": gemm_cases, "gdn": gdn_cases, "state_reader": state_reader_cases, "add_argmax": add_argmax_cases,
         "rope": rope_cases}
CHECKS = {"canary": canary_cases}


def main(names: list[str]) -> int:
    JITFunction.run = compile_only
    failed: dict[str, str] = {}
    for name in names or list(CASES):
        for case, call in {**CASES, **CHECKS}[name]():
            try:
                call()
            except Exception as e:  # noqa: BLE001 - every case reports, one failure does not hide the others
                failed[case] = f"{type(e).__name__}: {e}"[:2000]
                traceback.print_exc(file=sys.stderr)
    print(json.dumps({"compiled": compiled, "failed": failed}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
