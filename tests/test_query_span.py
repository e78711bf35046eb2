"""benchmarks.diagnostics.query_span: the shares are right where the answer is known, the tolerance decides the
numerical span, the queries are the ones the target and the reader use, and a tiny drafter end to end."""

import json
import math
from pathlib import Path

import pytest
import torch

from benchmarks.diagnostics.query_span import (METRICS, RTOL, QuerySpanError, check_drafter, flat_metrics, main, measure,
                                          prefix_projectors, query_shares, rows_table)
from benchmarks.diagnostics.theory import decompose, projector
from ready.reader import StateSource, read_states_torch
from ready.target.gdn_ops import recurrent_gated_delta_rule
from ready.train.regen_data import RegenData
from tests.test_drafter import drafter_for, tiny_target

f64 = torch.float64


def _setup(seed=0, d_k=8, d_v=6, n=3):
    g = torch.Generator().manual_seed(seed)
    return g, torch.randn(d_v, d_k, generator=g, dtype=f64), torch.randn(d_k, n, generator=g, dtype=f64)


def test_queries_inside_the_span_are_neither_outside_nor_novel():
    g, S, Q = _setup()
    P = projector(Q, RTOL)
    q = Q @ torch.randn(3, 5, generator=g, dtype=f64)  # five queries in span(Q)
    got = query_shares(S, P, q)
    assert got["outside"].abs().max() < 1e-12 and got["novel"].abs().max() < 1e-12


def test_a_query_orthogonal_to_the_span_is_all_outside_and_all_novel():
    g, S, Q = _setup(1)
    P = projector(Q, RTOL)
    q = (torch.eye(8, dtype=f64) - P) @ torch.randn(8, 4, generator=g, dtype=f64)
    got = query_shares(S, P, q)
    torch.testing.assert_close(got["outside"], torch.ones(4, dtype=f64))
    torch.testing.assert_close(got["novel"], torch.ones(4, dtype=f64))  # S Π q = 0: the whole readout is new


def test_a_state_blind_outside_the_span_gives_nothing_novel_whatever_the_query():
    g, _, Q = _setup(2)
    P = projector(Q, RTOL)
    S = torch.randn(6, 8, generator=g, dtype=f64) @ P  # S (I - Π_Q) = 0
    q = torch.randn(8, 7, generator=g, dtype=f64)
    got = query_shares(S, P, q)
    assert got["novel"].abs().max() < 1e-12
    assert got["outside"].min() > 0.05  # the queries do leave the span: only the state has nothing there


def test_the_novel_part_is_theory_decompose_s_second_term():
    g, S, Q = _setup(3)
    q = torch.randn(8, 1, generator=g, dtype=f64)
    Vt = torch.randn(2, 6, generator=g, dtype=f64)  # the reader's value compression V^T
    known, novel = decompose(S, Q, q, rtol=RTOL)
    got = query_shares(S, projector(Q, RTOL), q, Vt)
    torch.testing.assert_close(got["novel_num"], novel.pow(2).sum(0))
    torch.testing.assert_close(got["novel"], novel.pow(2).sum(0) / (known + novel).pow(2).sum(0))
    torch.testing.assert_close(got["novel_read"], (Vt @ novel).pow(2).sum(0) / (Vt @ S @ q).pow(2).sum(0))


def test_the_tolerance_drops_directions_below_it_in_a_nearly_rank_deficient_q():
    g = torch.Generator().manual_seed(4)
    basis = torch.linalg.qr(torch.randn(8, 8, generator=g, dtype=f64))[0]
    Q = basis[:, :3] @ torch.randn(3, 20, generator=g, dtype=f64)
    Q = Q + 1e-7 * torch.randn(8, 20, generator=g, dtype=f64)  # rank 3 up to noise far below RTOL
    q = basis[:, 3:] @ torch.randn(5, 4, generator=g, dtype=f64)  # outside the true span
    assert int(projector(Q, RTOL).trace().round()) == 3
    torch.testing.assert_close(query_shares(torch.eye(8, dtype=f64), projector(Q, RTOL), q)["outside"],
                               torch.ones(4, dtype=f64), atol=1e-6, rtol=0)
    # torch's default tolerance (machine precision) counts the noise as span: the share collapses
    assert int(projector(Q).trace().round()) == 8
    assert query_shares(torch.eye(8, dtype=f64), projector(Q), q)["outside"].max() < 1e-6
    P, rank = prefix_projectors(Q.T.unsqueeze(0), [1, 2, 20], RTOL)  # one head, tokens as rows
    assert rank[:, 0].tolist() == [1.0, 2.0, 3.0]
    torch.testing.assert_close(P[2, 0], projector(Q, RTOL))


def test_a_zero_readout_is_not_a_share():
    S = torch.zeros(4, 8, dtype=f64)
    q = torch.randn(8, 2, dtype=f64)
    assert torch.isnan(query_shares(S, torch.zeros(8, 8, dtype=f64), q)["novel"]).all()


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def test_the_gdn_queries_are_the_ones_each_state_was_read_with(target):
    lid = target.gdn_layer_ids[1]
    gdn = target.model.layers[lid].linear_attn
    seen = {}
    hook = gdn.register_forward_pre_hook(lambda m, args: seen.__setitem__("x", args[0]))
    ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(0))
    try:
        out = target(ids, state_layers=[lid], state_positions=torch.arange(12)[None])
    finally:
        hook.remove()
    q = gdn.queries(seen["x"])  # [1, H_v, T, d_k]
    assert q.shape == (1, gdn.nv, 12, gdn.dk)
    torch.testing.assert_close(q.norm(dim=-1), torch.ones(1, gdn.nv, 12), atol=1e-2, rtol=0)  # l2norm has an eps
    qkv, _, b, a = torch.nn.functional.linear(seen["x"], gdn.in_proj.weight).split(gdn.split, dim=-1)
    _, k, v, g, beta = gdn._heads(gdn._conv(qkv, None)[0], b, a)
    o = recurrent_gated_delta_rule(q * gdn.dk**-0.5, k, v, g, beta)[0]  # [1, H, T, d_v]
    states = out.states[0, :, 0]  # [T, H, d_k, d_v]: after each token
    torch.testing.assert_close(torch.einsum("thkv,htk->htv", states, q[0]) * gdn.dk**-0.5, o[0], atol=1e-4, rtol=1e-4)


def test_the_reader_queries_are_the_ones_its_read_multiplies_by(target):
    d = drafter_for(target)
    r = next(iter(d.readers.values()))
    h = torch.randn(2, 5, target.config.hidden_size)
    Ls = len(d.state_layers)
    ssm = torch.randn(Ls, 2, target.config.linear_num_value_heads, r.d_k, r.d_v)
    src = StateSource(ssm, torch.arange(Ls), torch.arange(2))
    with torch.no_grad():
        u = read_states_torch(src.ssm, src.layer_idx, src.slots, r._z(h), r.U, r.V)[..., : r.num_pairs * r.rank]
        q = r.queries(h)  # [N, P, M, d_k]
    S = ssm.transpose(0, 1).reshape(2, r.num_pairs, r.d_k, r.d_v)
    S_bar = S / S.pow(2).mean((-2, -1), keepdim=True).add(r.eps).sqrt()
    want = torch.einsum("mvr,nmkv,npmk->npmr", r.V, S_bar, q) / math.sqrt(r.d_k)
    torch.testing.assert_close(u.view_as(want), want, atol=1e-5, rtol=1e-5)


def _data(n=3, T=40, prompt_len=8):
    tokens = torch.randint(0, 64, (n, T), generator=torch.Generator().manual_seed(1))
    lengths = torch.tensor([T, T - 4, T][:n])
    return RegenData(tokens=tokens, prompt_len=prompt_len, lengths=lengths)


def test_a_tiny_drafter_end_to_end(target):
    d = drafter_for(target)
    res = measure(d, target, _data(), positions=4, rtol=RTOL, seed=0)
    assert res["sequences"] == 3 and res["read_positions"] == 12 and res["d_k"] == 8
    assert res["state_layers"] == d.state_layers and set(res["layers"]) == {str(i) for i in d.state_layers}
    heads = target.config.linear_num_value_heads
    n_queries = 12 * (d.proposals + 1)  # read positions x block rows (one reader)
    for summary in [res["overall"], *res["layers"].values(), *(h for L in res["layers"].values() for h in L["heads"].values())]:
        assert set(METRICS) <= set(summary)
        for m in ("outside_share", "random_outside_share"):
            s = summary[m]
            assert all(0.0 <= s[k] <= 1.0 + 1e-9 for k in ("mean", "p10", "p50", "p90")), (m, s)
            assert s["p10"] <= s["p50"] <= s["p90"]
        for m in ("novel_share", "novel_share_read", "random_novel_share"):
            assert math.isfinite(summary[m]["mean"]) and summary[m]["p10"] >= 0.0
        assert 0.0 <= summary["novel_share_pooled"] and 0.0 <= summary["random_expected_outside"] <= 1.0
        assert 1.0 <= summary["prefix_rank"]["mean"] <= 8.0
    assert res["overall"]["outside_share"]["n"] == n_queries * heads * len(d.state_layers)
    assert len(res["layers"][str(d.state_layers[0])]["heads"]) == heads
    json.dumps(res)  # JSON-able
    # the reference is what a random vector does: about 1 - rank / d_k
    o = res["overall"]
    assert abs(o["random_outside_share"]["mean"] - o["random_expected_outside"]) < 0.1
    metrics = flat_metrics(res)
    assert metrics["prop1/outside_share"] == o["outside_share"]["mean"]
    assert all(k.startswith("prop1/") and math.isfinite(v) for k, v in metrics.items())
    assert f"prop1/layer{d.state_layers[0]}/novel_share" in metrics
    table = rows_table([{"name": "r4", "rank": 4, "layers": [30, 62],
                         "metrics": {**metrics, "overall/state_reliance": 0.1, "overall/state_reliance_lo": 0.0,
                                     "overall/state_reliance_hi": 0.2}}])
    assert table.count("\n") == 2 and "0.100 [0.000, 0.200]" in table


def test_only_a_drafter_reading_its_own_states_is_measured(target):
    with pytest.raises(QuerySpanError, match="no reader"):
        check_drafter(drafter_for(target, reader=False))
    with pytest.raises(QuerySpanError, match="placebo"):
        check_drafter(drafter_for(target, states="shuffled"))


def test_logging_needs_a_run(tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["--source", str(tmp_path), "--log-mlflow"])
    assert e.value.code == 2


def test_a_sweep_row_s_run_is_measured_logged_and_tabled(target, tmp_path, monkeypatch, capsys):
    from omegaconf import OmegaConf

    from reports import mlflow_store
    from ready.config import schema
    from benchmarks.diagnostics import query_span
    from ready.drafter import save_drafter
    from ready.loading import LoadedTarget

    folder = save_drafter(drafter_for(target), tmp_path / "drafter")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = mlflow_store.client(uri)
    run_id = c.create_run(mlflow_store.ensure_experiment(c, "t"), run_name="rank4").info.run_id
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(schema()))
    (tmp_path / "evaluation.json").write_text(json.dumps({"method": "ready", "resolved": {"drafter_dir": str(folder)}}))
    for name in ("config.yaml", "evaluation.json"):
        c.log_artifact(run_id, str(tmp_path / name))
    c.log_metric(run_id, "overall/state_reliance", 0.05)
    c.log_metric(run_id, "heldout_tf/tau", 2.5)
    # the run's config names the embedded default; the tiny target and data stand in for it
    monkeypatch.setattr(query_span, "load_configured_target", lambda cfg, progress=True: LoadedTarget(target, None, None, "tiny", "cpu"))
    monkeypatch.setattr(query_span, "build_validation_data", lambda cfg, t, tok, progress=True: _data())

    out = tmp_path / "prop1.json"
    assert main(["--source", run_id, "--tracking-uri", uri, "--positions", "2", "--log-mlflow", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["run_id"] == run_id and res["drafter_dir"] == str(folder) and res["read_positions"] == 6
    logged = c.get_run(run_id).data.metrics
    assert logged["prop1/outside_share"] == pytest.approx(res["overall"]["outside_share"]["mean"])
    assert [a.path for a in c.list_artifacts(run_id, "prop1")] == ["prop1/query_span.json"]

    assert main(["--rows", run_id, "--tracking-uri", uri, "--reuse-logged"]) == 0
    table = capsys.readouterr().out
    assert "| rank4 | 8 | [30, 62] |" in table and "| 0.050 | 2.500 |" in table and "/ 8 |" in table
    assert main(["--rows", "nosuchrun0", "--tracking-uri", uri]) == 2


def test_a_rows_relative_drafter_path_is_found_under_the_artifacts_dir_given_on_the_command_line(tmp_path):
    from benchmarks.diagnostics.query_span import moved_artifact

    (tmp_path / "elsewhere/stages/s2/drafter").mkdir(parents=True)
    recorded = Path("artifacts/stages/s2/drafter")  # as the sweep recorded it, relative to where it ran
    assert moved_artifact(recorded, "artifacts", str(tmp_path / "elsewhere")) == tmp_path / "elsewhere/stages/s2/drafter"
    assert moved_artifact(tmp_path, "artifacts", "x") == tmp_path  # an existing path stays as recorded
    assert moved_artifact(Path("other/d"), "artifacts", "x") == Path("other/d")  # not under the run's artifacts_dir
