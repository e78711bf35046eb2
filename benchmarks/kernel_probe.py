"""One call of each kernel variant between cudaProfilerStart/Stop, for `ncu --profile-from-start off`.

    ncu --profile-from-start off --clock-control none --section SpeedOfLight --section WarpStateStats \
        python -m benchmarks.kernel_probe

Kernel durations without launch overhead and the stall reasons behind them (paper sizes, batch 1).
"""

import argparse
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from ready.config import entry_point
from ready_kernels import gdn_verify as gv
from ready_kernels import state_reader as sr


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)  # no options: --help only
    dev, H, d, r, P, T = "cuda", 48, 128, 8, 7, 8
    ssm = torch.randn(4, 8, H, d, d, device=dev)
    ssm16 = ssm.bfloat16()
    li, sl = torch.tensor([1, 3], device=dev), torch.tensor([5], device=dev)
    z = torch.randn(1, P, 2 * H, r, device=dev)
    U, V = torch.randn(2 * H, r, d, device=dev), torch.randn(2 * H, d, r, device=dev)
    q = F.normalize(torch.randn(1, T, H, d, device=dev), dim=-1).bfloat16()
    k = F.normalize(torch.randn(1, T, H, d, device=dev), dim=-1).bfloat16()
    v = torch.randn(1, T, H, d, device=dev).bfloat16()
    g, beta = -F.softplus(torch.randn(1, T, H, device=dev)), torch.rand(1, T, H, device=dev)
    h0 = torch.randn(1, H, d, d, device=dev)
    calls = [
        lambda: sr.state_reader_triton(ssm, li, sl, z, U, V),
        lambda: sr.state_reader_triton(ssm16, li, sl, z, U, V),
        lambda: gv.gdn_verify_triton(q, k, v, g, beta, h0),
    ]
    for c in calls:  # compile outside the profiled range
        c()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for c in calls:
        c()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
