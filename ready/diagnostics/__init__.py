"""Diagnostics: one-off questions asked of the method, each a command that prints JSON.

    python -m ready.diagnostics.context_ceiling --windows 16  # how much older text the target needs, and where it keeps it
    python -m ready.diagnostics.reader_pilot                  # one-seed pilot: does the reader learn from the states at all?
    python -m ready.diagnostics.copy_probe --built            # can the target copy older text at all?
    python -m ready.diagnostics.induction_toy --layers LALA   # which token mixers learn content-based copying (a toy)
    python -m ready.diagnostics.plateau --only adapt          # held-out loss / tau against the stage budgets
    python -m ready.diagnostics.theory                        # Proposition 1 checked numerically (a state beyond its readouts)

They sit above the library (they import `ready`, nothing in `ready` imports them) beside the
benchmarks (`ready.bench`); the import contract in pyproject.toml keeps it so.
"""
