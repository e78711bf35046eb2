"""Benchmark scripts: each prints JSON and is the source of a figure in docs/benchmarks.md.

    python -m ready.bench.engine   # decoding engine: AR, verify cost, paper-size rounds (forced acceptance)
    python -m ready.bench.target   # the target's decode step against its memory-bandwidth bound
    python -m ready.bench.train    # taus of trained drafters on the embedded default (CPU)
    python -m ready.bench.train_scale  # regeneration, prefill and training rates at paper size; the recipe's wall time
    python -m ready.diagnostics.plateau  # held-out loss / teacher-forced tau against each stage's budget

The kernels' own benchmarks stay beside the kernels: `python kernels/bench.py`,
`kernels/bench_stages.py`, `kernels/bench_small_m.py`, `kernels/bench_exact.py`.
"""
