"""Proposition 1: exposed readouts fix a new query's answer only inside span(Q)."""

import json
import subprocess
import sys

import pytest
import torch

from benchmarks.diagnostics.theory import check, decompose, equal_readout_twin, projector


def test_decomposition_is_exact_and_second_term_vanishes_for_full_row_rank():
    g = torch.Generator().manual_seed(1)
    S = torch.randn(5, 8, generator=g, dtype=torch.float64)
    q = torch.randn(8, generator=g, dtype=torch.float64)
    Q = torch.randn(8, 11, generator=g, dtype=torch.float64)  # rank 8 = d_k: full row rank
    known, novel = decompose(S, Q, q)
    torch.testing.assert_close(known + novel, S @ q)
    assert novel.norm() < 1e-12 * (S @ q).norm()
    torch.testing.assert_close(projector(Q), torch.eye(8, dtype=torch.float64))


def test_rank_deficient_queries_leave_a_part_only_the_state_knows():
    g = torch.Generator().manual_seed(2)
    S = torch.randn(6, 8, generator=g, dtype=torch.float64)
    Q = torch.randn(8, 3, generator=g, dtype=torch.float64)
    q = torch.randn(8, generator=g, dtype=torch.float64)
    known, novel = decompose(S, Q, q)
    torch.testing.assert_close(known + novel, S @ q)
    assert novel.norm() > 0.1 * (S @ q).norm()
    twin = equal_readout_twin(S, Q, g)
    torch.testing.assert_close(twin @ Q, S @ Q)  # same exposed readouts ...
    assert (twin @ q - S @ q).norm() > 0.1 * (S @ q).norm()  # ... different answer outside span(Q)
    q_in = Q @ torch.randn(3, generator=g, dtype=torch.float64)
    torch.testing.assert_close(twin @ q_in, S @ q_in)  # inside span(Q) the readouts decide


@pytest.mark.parametrize("seed", [0, 3])
def test_check_reports_that_the_proposition_holds(seed):
    out = check(d_k=12, d_v=10, queries=5, seed=seed)
    assert out["holds"] and out["rank_Q_low"] == 5 and out["rank_Q_full"] == 12
    assert out["novel_rel_full_row_rank"] < 1e-9 < out["novel_rel_rank_deficient"]


def test_check_rejects_a_query_count_that_is_not_rank_deficient():
    with pytest.raises(ValueError, match="queries = 16"):
        check(d_k=16, queries=16)


def test_cli_prints_json():
    r = subprocess.run([sys.executable, "-m", "benchmarks.diagnostics.theory", "--d-k", "8", "--d-v", "6", "--queries", "3"],
                       capture_output=True, text=True, check=True)
    out = json.loads(r.stdout)
    assert out["holds"] is True and out["d_k"] == 8
