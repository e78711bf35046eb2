"""Benchmarks: each prints JSON and is the source of a figure in docs/figures.md.

    python -m benchmarks.engine         # decoding engine: AR, verify cost, paper-size rounds (forced acceptance)
    python -m benchmarks.target         # the target's decode step against its memory-bandwidth bound
    python -m benchmarks.step_trace     # one graphed AR step (or draft step): kernel time vs gaps, per kernel
    python -m benchmarks.ab             # env switches A/B over fresh engine-benchmark processes
    python -m benchmarks.train          # taus of trained drafters on the embedded default (CPU)
    python -m benchmarks.train_scale    # regeneration, prefill and training rates at paper size; the recipe's wall time
    python -m benchmarks.kernels        # the fused kernels (ready_kernels) vs their torch references vs the bound
    python -m benchmarks.kernel_stages  # where the reader's / verify's microseconds go
    python -m benchmarks.small_m        # the small-M linear against cuBLAS at the 27B projection shapes
    python -m benchmarks.exact          # exact mode on the GPU: row invariance, its cost, tie flips
    python -m benchmarks.kernel_probe   # one call of each kernel variant, for `ncu --profile-from-start off`

They sit above the library (they import `ready` and `ready_kernels`; nothing of the project imports them),
beside `sweeps`; the diagnostics are the subpackage `benchmarks.diagnostics`. The import contract in
pyproject.toml keeps it so.
"""

# device-to-device copy rates (bytes read and written per second) measured on the lent machines: the
# memory bounds' yardsticks. H200: this project's measurement; H100 80GB: the device lender's (KINDS.md, 13 Nov).
COPY_BYTES_PER_S = {"H200": 4.27e12, "H100": 3.0e12}


def copy_rate(device: str) -> float:
    """The bounds' default bytes/s on `device`: the copy rate of its GPU (by name), 0 (no bound) on CPU
    and on a GPU not in COPY_BYTES_PER_S (a wrong yardstick would be worse than none)."""
    if not str(device).startswith("cuda"):
        return 0.0
    import torch

    name = torch.cuda.get_device_name(torch.device(device))
    return next((rate for gpu, rate in COPY_BYTES_PER_S.items() if gpu in name), 0.0)
