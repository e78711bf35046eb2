"""Diagnostics: one-off questions asked of the method, each a command that prints JSON.

    python -m benchmarks.diagnostics.context_ceiling --windows 16  # how much older text the target needs, and where it keeps it
    python -m benchmarks.diagnostics.reader_pilot                  # one-seed pilot: does the reader learn from the states at all?
    python -m benchmarks.diagnostics.copy_probe --built            # can the target copy older text at all?
    python -m benchmarks.diagnostics.induction_toy --layers LALA   # which token mixers learn content-based copying (a toy)
    python -m benchmarks.diagnostics.plateau --only adapt          # held-out loss / tau against the stage budgets
    python -m benchmarks.diagnostics.theory                        # Proposition 1 checked numerically (a state beyond its readouts)

They sit above the library with the benchmarks (they import `ready`; nothing of the project imports
them); the import contract in pyproject.toml keeps it so.
"""
