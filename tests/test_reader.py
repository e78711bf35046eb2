"""The ReaDy state reader computes exactly the formulas of docs/design.md, reading states in place."""

import math

import pytest
import torch

from ready.reader import ReaderError, StateReader, StateSource, read_states, read_states_torch
from ready_kernels.state_reader import state_reader_reference

D, H, DK, DV = 24, 2, 8, 6


def loop_reference(reader: StateReader, h: torch.Tensor, ssm: torch.Tensor, layer_idx: list[int],
                   slots: list[int]) -> torch.Tensor:
    """h' = h + Δh, one (block, position, layer-head pair) at a time, straight from the formulas."""
    N, P, _ = h.shape
    M, r = reader.num_pairs, reader.rank
    out = torch.empty_like(h)
    for b in range(N):
        for p in range(P):
            x = h[b, p]
            xn = x / torch.sqrt((x * x).mean() + 1e-6) * reader.norm_weight
            z = (reader.query.weight @ xn).view(M, r)  # z_j = W_q RMSNorm(h_j)
            reads, scales = [], []
            for m in range(M):
                S = ssm[layer_idx[m // H], slots[b], m % H]  # [d_k, d_v], HF layout
                rms = math.sqrt(sum(float(s) ** 2 for s in S.flatten()) / S.numel() + reader.eps)
                S_bar = S / rms
                q = reader.U[m].T @ z[m]  # q_j = U^T z_j  (d_k)
                T = reader.V[m].T @ S_bar.T  # T = V^T S̄    (r x d_k)
                reads.append(T @ q / math.sqrt(DK))  # u_j = T q_j / sqrt(d_k)
                scales.append(math.log(rms))
            f = torch.cat(reads + [torch.tensor(scales)])
            dh = reader.fuse_out(torch.nn.functional.silu(reader.fuse_in(f)))
            out[b, p] = x + dh
    return out


def make_reader(rank=4, layers=2, seed=0, trained=True):
    torch.manual_seed(seed)
    reader = StateReader(D, layers, H, DK, DV, rank, mlp_hidden=16)
    if trained:  # a reader that has learned something: non-zero output projection
        torch.nn.init.normal_(reader.fuse_out.weight, std=0.2)
        torch.nn.init.normal_(reader.fuse_out.bias, std=0.2)
    return reader


@pytest.mark.parametrize("rank", [1, 3, DK])
def test_reader_matches_loop_by_loop_formulas_on_the_cache(rank):
    reader = make_reader(rank)
    ssm = torch.randn(5, 4, H, DK, DV) * torch.rand(5, 4, H, 1, 1) * 3  # [L_gdn, slots, H, d_k, d_v]
    layer_idx, slots = [3, 1], [2, 0, 3]
    h = torch.randn(len(slots), 7, D)
    src = StateSource(ssm, torch.tensor(layer_idx), torch.tensor(slots))
    with torch.no_grad():
        got = reader(h, src)
        want = loop_reference(reader, h, ssm, layer_idx, slots)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_training_states_and_cache_give_the_same_reads():
    reader = make_reader()
    B, A, K = 2, 3, 5
    states = torch.randn(B, A, 2, H, DK, DV)
    h = torch.randn(B * A, K, D)
    via_training = reader(h, StateSource.from_training(states))
    # the same states as a cache: GDN index 0/1, one slot per (sample, anchor) block
    cache = states.reshape(B * A, 2, H, DK, DV).transpose(0, 1).contiguous()
    via_cache = reader(h, StateSource.from_cache(cache, [0, 1], B * A))
    torch.testing.assert_close(via_training, via_cache)
    want = loop_reference(reader, h.detach(), cache, [0, 1], list(range(B * A)))
    torch.testing.assert_close(via_training, want, rtol=1e-5, atol=1e-5)


def test_reading_the_cache_does_not_copy_it():
    ssm = torch.randn(4, 3, H, DK, DV)
    src = StateSource.from_cache(ssm, [2, 0], 3)
    assert src.ssm.data_ptr() == ssm.data_ptr() and src.slots.tolist() == [0, 1, 2]
    with pytest.raises(ReaderError, match="cache holds 3 sequences but 5"):
        StateSource.from_cache(ssm, [2], 5)


def test_fresh_reader_is_the_identity_but_can_learn():
    reader = make_reader(trained=False)
    src = StateSource.from_training(torch.randn(1, 2, 2, H, DK, DV))
    h = torch.randn(2, 3, D, requires_grad=True)
    out = reader(h, src)
    assert torch.equal(out, h)
    out.pow(2).sum().backward()
    assert reader.fuse_out.weight.grad.abs().sum() > 0  # the zero projection gets a gradient


def test_reader_gradients_reach_queries_and_low_rank_maps():
    reader = make_reader()
    src = StateSource.from_training(torch.randn(2, 1, 2, H, DK, DV))
    reader(torch.randn(2, 3, D), src).sum().backward()
    for p in (reader.query.weight, reader.U, reader.V, reader.norm_weight, reader.fuse_in.weight):
        assert p.grad is not None and p.grad.abs().sum() > 0


def test_full_rank_reader_has_square_full_rank_maps():
    reader = make_reader(rank=DK, trained=False)
    assert reader.U.shape == (2 * H, DK, DK) and reader.V.shape == (2 * H, DV, DK)
    for m in range(reader.num_pairs):
        assert torch.linalg.matrix_rank(reader.U[m].detach()) == DK
    low = make_reader(rank=3, trained=False)
    for m in range(low.num_pairs):
        assert torch.linalg.matrix_rank(low.U[m].detach()) == 3
        assert torch.linalg.matrix_rank(low.V[m].detach()) == 3


def test_rank_above_d_k_is_one_clear_error():
    with pytest.raises(ReaderError, match=r"reader.rank = 9 .* d_k = 8; expected 1..8"):
        StateReader(D, 1, H, DK, DV, rank=9, mlp_hidden=4)


def test_torch_path_is_the_kernels_reference_itself():
    """The reader's math is written once: the library's torch path is the reference the Triton kernel is
    tested against (tests/test_kernels_state_reader.py), and the library reads through it off CUDA."""
    assert read_states_torch is state_reader_reference
    op = read_states
    g = torch.Generator().manual_seed(0)
    for Ls, r in [(1, 2), (2, DK)]:
        M = Ls * H
        ssm = torch.randn(3, 4, H, DK, DV, generator=g)
        idx, slots = torch.tensor([2, 0][:Ls]), torch.tensor([1, 3])
        z = torch.randn(2, 5, M, r, generator=g)
        U, V = torch.randn(M, r, DK, generator=g), torch.randn(M, DV, r, generator=g)
        assert torch.equal(op(ssm, idx, slots, z, U, V, eps=1e-6), read_states_torch(ssm, idx, slots, z, U, V, 1e-6))


def test_training_states_read_in_place_give_the_numbers_of_a_gathered_copy():
    """Teacher states [B, A, Ls, H, d_k, d_v] are read where they lie (every layer and block in order):
    the same features, bit for bit, as the same states read by index out of a larger cache."""
    g = torch.Generator().manual_seed(2)
    B, A, Ls, P, r = 2, 3, 2, 4, 3
    M = Ls * H
    states = torch.randn(B, A, Ls, H, DK, DV, generator=g)
    src = StateSource.from_training(states)
    cache = torch.randn(Ls + 1, B * A + 2, H, DK, DV, generator=g)
    cache[1:, 2:] = states.flatten(0, 1).transpose(0, 1)
    z = torch.randn(B * A, P, M, r, generator=g)
    U, V = torch.randn(M, r, DK, generator=g), torch.randn(M, DV, r, generator=g)
    in_place = read_states_torch(src.ssm, src.layer_idx, src.slots, z, U, V)
    gathered = read_states_torch(cache, torch.arange(1, Ls + 1), torch.arange(2, B * A + 2), z, U, V)
    assert torch.equal(in_place, gathered)
    # every layer and slot, but out of order: read by index, never in place
    layers, slots = torch.tensor([1, 0]), torch.randperm(B * A, generator=g)
    shuffled = torch.empty_like(src.ssm)
    shuffled[layers[:, None], slots[None, :]] = src.ssm
    assert torch.equal(read_states_torch(shuffled, layers, slots, z, U, V), in_place)
    op = read_states
    assert torch.equal(op(src.ssm, src.layer_idx, src.slots, z, U, V, eps=1e-6), in_place)
    assert torch.equal(op(shuffled, layers, slots, z, U, V, eps=1e-6), in_place)
