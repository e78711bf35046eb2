"""Several rows of a ragged cache prefilled in one right-padded pass (`ready.target.ragged.prefill_rows`) hold
what one prefill per row (`prefill_row`) leaves there: each row's GDN states and conv windows after its own
last token, its K/V, its length, its last logits and its captured features; other rows are untouched."""

from __future__ import annotations

import pytest
import torch

from ready.target.config import TargetError
from ready.target.ragged import new_ragged_cache, prefill_row, prefill_rows, ragged_commit, ragged_verify

from tiny_models import VOCAB, small_target

torch.set_num_threads(1)
LENGTHS = (70, 1, 9, 33)  # one crosses a 64-token GDN chunk, one is a single token
CAPTURE = [1, 6]


@pytest.fixture(scope="module")
def target():
    return small_target()


def prompts(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g) for n in LENGTHS]


def test_one_padded_pass_leaves_each_row_what_its_own_prefill_leaves(target):
    rows = [4, 0, 2, 5]  # not in order, not contiguous; rows 1 and 3 stay as they were
    ps = prompts()
    one, many = (new_ragged_cache(target, 6, 96) for _ in range(2))
    for c in (one, many):  # an earlier occupant everywhere: the prefill must forget it
        prefill_row(target, c, 1, torch.arange(50) % VOCAB)
        for b in rows:
            prefill_row(target, c, b, torch.arange(80) % VOCAB)
    want = [prefill_row(target, one, b, p, CAPTURE, last_logits_only=True) for b, p in zip(rows, ps)]
    got = prefill_rows(target, many, rows, ps, CAPTURE)
    assert got.logits.shape == (4, 1, VOCAB)
    assert torch.equal(many.lengths_t, one.lengths_t)
    close = dict(rtol=1e-5, atol=1e-5)
    for i, (b, n) in enumerate(zip(rows, LENGTHS)):
        torch.testing.assert_close(got.logits[i], want[i].logits[0, -1:], **close)
        torch.testing.assert_close(got.hidden[i, :n], want[i].hidden[0], **close)
        torch.testing.assert_close(many.ssm[:, b], one.ssm[:, b], **close)
        torch.testing.assert_close(many.conv[:, b], one.conv[:, b], **close)
        torch.testing.assert_close(many.key[:, b, :, :n], one.key[:, b, :, :n], **close)
        torch.testing.assert_close(many.value[:, b, :, :n], one.value[:, b, :, :n], **close)
    for b in (1, 3):
        for name in ("ssm", "conv", "key", "value"):
            assert torch.equal(getattr(many, name)[:, b], getattr(one, name)[:, b])


def test_rows_verify_and_commit_after_the_padded_pass_as_after_their_own_prefills(target):
    # the pad tokens past a short row's end must leave no trace in what the row computes next
    ps = prompts(1)
    one, many = (new_ragged_cache(target, 4, 96, max_verify=3) for _ in range(2))
    for b, p in enumerate(ps):
        prefill_row(target, one, b, p, last_logits_only=True)
    prefill_rows(target, many, list(range(4)), ps)
    block = torch.randint(0, VOCAB, (4, 3), generator=torch.Generator().manual_seed(2))
    kept = torch.tensor([3, 1, 2, 1])
    logits = []
    for c in (one, many):
        logits.append(ragged_verify(target, block, c).logits)
        ragged_commit(target, c, kept)
    torch.testing.assert_close(logits[1], logits[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(many.ssm, one.ssm, rtol=1e-5, atol=1e-5)
    assert torch.equal(many.lengths_t, torch.tensor(LENGTHS) + kept)


def test_bad_rows_are_one_clear_error(target):
    cache = new_ragged_cache(target, 2, 16)
    with pytest.raises(TargetError, match="one prompt per row"):
        prefill_rows(target, cache, [0, 1], [torch.tensor([1, 2])])
    with pytest.raises(TargetError, match="expected 1..16 tokens"):
        prefill_rows(target, cache, [0], [torch.arange(17)])


@pytest.mark.cuda
def test_on_cuda_in_bf16_one_padded_pass_matches_one_prefill_per_row():
    target = small_target().to(device="cuda", dtype=torch.bfloat16)
    ps = [p.cuda() for p in prompts()]
    one, many = (new_ragged_cache(target, 4, 96) for _ in range(2))
    want = [prefill_row(target, one, b, p, last_logits_only=True) for b, p in enumerate(ps)]
    got = prefill_rows(target, many, list(range(4)), ps)
    for i in range(4):
        torch.testing.assert_close(got.logits[i].float(), want[i].logits[0, -1:].float(), rtol=0.05, atol=0.05)
    torch.testing.assert_close(many.ssm, one.ssm, rtol=0.05, atol=0.02)
