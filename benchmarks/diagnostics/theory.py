"""Numerical check of Proposition 1: what a new query can learn from a state beyond exposed readouts.

With a state S (d_v x d_k), queries Q (d_k x n, one per column) whose readouts O = S Q are
exposed, and Π_Q = Q Q^† the projector onto span(Q), any new query q* splits as

    S q* = (S Q) Q^† q*  +  S (I - Π_Q) q*.

The first term is fixed by (O, Q) alone; the second needs S itself. It vanishes when Q has full
row rank (Π_Q = I). Outside span(Q) it does not: S' = S + X (I - Π_Q) has the same readouts
(S' Q = S Q) yet answers q* differently. `check` measures all of this on random matrices.

    python -m benchmarks.diagnostics.theory --d-k 16 --d-v 16 --queries 6 --seed 0  # prints JSON
"""

from __future__ import annotations

import argparse
import json
from typing import Optional

import torch

from ready.config import entry_point


def projector(Q: torch.Tensor, rtol: Optional[float] = None) -> torch.Tensor:
    """Π_Q = Q Q^†, the orthogonal projector onto the column span of Q (d_k x d_k; batched over
    leading dimensions). Q^† comes from an SVD: singular values <= rtol * σ_max count as zero, so
    Π_Q projects onto the numerical span (rank = trace Π_Q); rtol None is torch's default,
    max(d_k, n) * machine epsilon of Q's dtype."""
    return Q @ torch.linalg.pinv(Q, rtol=rtol)


def decompose(S: torch.Tensor, Q: torch.Tensor, q: torch.Tensor,
              rtol: Optional[float] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(known, novel): known = (S Q) Q^† q is fixed by the exposed readouts, novel = S (I - Π_Q) q
    (`rtol`: the numerical span's tolerance, as in `projector`)."""
    known = (S @ Q) @ (torch.linalg.pinv(Q, rtol=rtol) @ q)
    novel = S @ (q - projector(Q, rtol) @ q)
    return known, novel


def equal_readout_twin(S: torch.Tensor, Q: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A state S' != S with S' Q = S Q: S plus a random map that only sees directions outside span(Q)."""
    X = torch.randn(S.shape, generator=generator, dtype=S.dtype)
    eye = torch.eye(Q.shape[0], dtype=S.dtype)
    return S + X @ (eye - projector(Q))


def check(d_k: int = 16, d_v: int = 16, queries: int = 6, seed: int = 0) -> dict:
    """Measure Proposition 1 on random float64 matrices; `queries` < d_k gives a rank-deficient Q."""
    if not 1 <= queries < d_k:
        raise ValueError(f"queries = {queries}; expected 1 <= queries < d_k = {d_k} (a Q without full row rank)")
    g = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    S = torch.randn(d_v, d_k, generator=g, dtype=f64)
    q_new = torch.randn(d_k, generator=g, dtype=f64)
    Q_low = torch.randn(d_k, queries, generator=g, dtype=f64)  # rank `queries` < d_k
    Q_full = torch.randn(d_k, d_k + 2, generator=g, dtype=f64)  # full row rank
    scale = float((S @ q_new).norm())

    known_l, novel_l = decompose(S, Q_low, q_new)
    known_f, novel_f = decompose(S, Q_full, q_new)
    twin = equal_readout_twin(S, Q_low, g)
    q_in_span = Q_low @ torch.randn(queries, generator=g, dtype=f64)
    out = {
        "d_k": d_k, "d_v": d_v, "queries": queries, "seed": seed,
        "rank_Q_low": int(torch.linalg.matrix_rank(Q_low)),
        "rank_Q_full": int(torch.linalg.matrix_rank(Q_full)),
        # the identity S q* = known + novel
        "identity_error_low": float((S @ q_new - known_l - novel_l).norm()) / scale,
        "identity_error_full": float((S @ q_new - known_f - novel_f).norm()) / scale,
        # second term: vanishes for full row rank, not otherwise (relative to |S q*|)
        "novel_rel_full_row_rank": float(novel_f.norm()) / scale,
        "novel_rel_rank_deficient": float(novel_l.norm()) / scale,
        "q_new_outside_span_rel": float((q_new - projector(Q_low) @ q_new).norm() / q_new.norm()),
        # two states, same exposed readouts, different answers outside span(Q)
        "twin_readout_gap_rel": float((twin @ Q_low - S @ Q_low).norm() / (S @ Q_low).norm()),
        "twin_answer_gap_rel": float((twin @ q_new - S @ q_new).norm()) / scale,
        "twin_answer_gap_in_span_rel": float((twin @ q_in_span - S @ q_in_span).norm() / (S @ q_in_span).norm()),
    }
    tol = 1e-9
    out["holds"] = bool(
        out["identity_error_low"] < tol and out["identity_error_full"] < tol
        and out["novel_rel_full_row_rank"] < tol and out["novel_rel_rank_deficient"] > 1e-3
        and out["twin_readout_gap_rel"] < tol and out["twin_answer_gap_rel"] > 1e-3
        and out["twin_answer_gap_in_span_rel"] < tol
    )
    return out


@entry_point
def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--d-k", type=int, default=16)
    p.add_argument("--d-v", type=int, default=16)
    p.add_argument("--queries", type=int, default=6, help="exposed queries (< d_k: Q without full row rank)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    try:
        result = check(a.d_k, a.d_v, a.queries, a.seed)
    except ValueError as e:
        p.error(str(e))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
