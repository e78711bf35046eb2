"""The copy probe measures what it says: fidelity of a model that copies is 1, of one that does not
is ~0, and the command runs end to end on a small corpus (train, then --built)."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.diagnostics.copy_probe import copy_fidelity, copy_prompts, fidelity, main
from ready.data.pretrain import insert_repeats


class Copier(torch.nn.Module):
    """A 'model' whose greedy next token is the token that followed the last earlier occurrence of
    the current one: perfect induction."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab, self.w = vocab, torch.nn.Parameter(torch.zeros(1))

    def forward(self, ids):
        B, T = ids.shape
        logits = torch.zeros(B, T, self.vocab)
        for b in range(B):
            for t in range(T):
                prev = (ids[b, :t] == ids[b, t]).nonzero().flatten()
                nxt = int(ids[b, prev[-1] + 1]) if prev.numel() else 0
                logits[b, t, nxt] = 1.0
        return type("Out", (), {"logits": logits})()


def test_fill_puts_random_ids_in_the_source_and_repeats_them():
    w = torch.zeros(3, 200, dtype=torch.long)
    out = insert_repeats(w, 1.0, torch.Generator().manual_seed(0), fill=(3, 50))
    for row in out:
        filled = (row != 0).nonzero().flatten()  # the source span, then its copy
        assert filled.numel() >= 16 and int(row.max()) < 50


def test_fidelity_is_one_for_a_perfect_copier(monkeypatch):
    import benchmarks.diagnostics.copy_probe as copy_probe
    import ready.train as train

    def greedy(model, prompts, n, eos_id=None, batch_size=1, progress=False):  # uncached greedy
        ids = prompts.clone()
        for _ in range(n):
            ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], 1)
        return train.RegenData(tokens=ids, prompt_len=prompts.shape[1], lengths=torch.full((len(ids),), ids.shape[1]))

    monkeypatch.setattr(copy_probe, "greedy_responses", greedy)
    segments = torch.stack([torch.randperm(60)[:40] + 3 for _ in range(2)])  # no repeated id within a row
    assert fidelity(Copier(64), segments, 24, 8, new_tokens=8) == 1.0


def test_the_command_trains_then_measures_a_built_target(tmp_path, capsys):
    small = [f"artifacts_dir={tmp_path}", "corpus.max_files=60", "corpus.heldout_fraction=0.2", "corpus.vocab_size=512",
             "pretrain.steps=2", "pretrain.batch_size=2", "pretrain.seq_len=32", "pretrain.heldout_windows=2",
             "pretrain.sample_tokens=4", "--prompts", "4"]
    ckpt = tmp_path / "copier"
    rows = main(["target.device=cpu", "--data", "random", "--symbols", "32", "--batch", "2", "--checks", "1,2",
                 "--save", str(ckpt), *small])
    assert [r["step"] for r in rows] == [1, 2]
    from ready.target import load_target

    assert load_target(ckpt).config.vocab_size == 512 and (ckpt / "tokenizer.json").is_file()
    assert json.loads((ckpt / "probe.json").read_text())["rows"] == rows
    with pytest.raises(SystemExit, match="already exists"):
        main(["target.device=cpu", "--save", str(ckpt), *small])
    assert all(0.0 <= r[k] <= 1.0 for r in rows for k in r if k.startswith(("text_", "random_")))
    built = main(["--built", "target.device=cpu", *small])[0]
    assert built["data"] == "built" and built["step"] == 2
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert len(lines) == 3
    # --init continues the saved target: its first step starts from the saved weights
    more = main(["target.device=cpu", "--data", "random", "--symbols", "32", "--batch", "2", "--checks", "1",
                 "--init", str(ckpt), "--save", str(tmp_path / "copier2"), *small])
    assert len(more) == 1
    before, after = load_target(ckpt).state_dict(), load_target(tmp_path / "copier2").state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # it trained
    (ckpt / "tokenizer.json").write_text("{}")
    with pytest.raises(SystemExit, match="its tokenizer differs"):
        main(["target.device=cpu", "--init", str(ckpt), *small])
    with pytest.raises(SystemExit, match="--span '5'"):
        main(["target.device=cpu", "--span", "5", *small])
    with pytest.raises(SystemExit, match="--symbols 1"):
        main(["target.device=cpu", "--data", "random", "--symbols", "1", *small])


def test_copy_prompts_repeat_each_rows_lead_after_its_source():
    p = torch.arange(20).view(2, 10)
    assert copy_prompts(p, 6, 2).tolist() == [[0, 1, 2, 3, 4, 5, 0, 1], [10, 11, 12, 13, 14, 15, 10, 11]]
    with pytest.raises(ValueError, match="expected 1 <= lead < source <= prompt length"):
        copy_prompts(p, 12, 2)


def test_copy_fidelity_counts_response_tokens_that_continue_the_copy():
    from ready.train.regen import RegenData

    # source 0..5, lead 0 1; a faithful response is 2 3 4 5, this one errs once and stops early
    tokens = torch.tensor([[0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 9, 5],
                           [0, 1, 2, 3, 4, 5, 0, 1, 2, 9, 0, 0]])
    data = RegenData(tokens=tokens, prompt_len=8, lengths=torch.tensor([12, 10]))
    assert copy_fidelity(data, 6, 2) == pytest.approx(4 / 6)  # row 1: 3 of 4; row 2: 1 of its 2 tokens


def test_the_device_is_the_config_s_and_the_old_flag_names_it(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--device", "cpu", "--checks", "1"])
    assert e.value.code == 2 and capsys.readouterr().err == (
        "error: --device cpu: this flag is gone; the config says it: target.device=cpu (a key=value override, as "
        "python -m sweeps.run takes them)\n")
    with pytest.raises(SystemExit) as e:
        main(["--checks", "1", "target.devic=cpu"])
    assert e.value.code == 2 and capsys.readouterr().err == (
        "error: command line: bad value at key 'target.devic': Key 'devic' not in 'TargetConfig'. Did you mean: "
        "'device'?\n")
