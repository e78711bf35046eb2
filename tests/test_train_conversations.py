"""Training data from a conversation file: the target answers every assistant turn anew (turn by turn,
each answer conditioned on the answers before it), the loss mask holds exactly the assistant tokens,
the dataset's own answers can be kept instead, and a malformed file caches nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from ready.config import schema
from ready.data.chat import prompt_ids, render
from ready.data.conversations import ConversationError
from ready.data.corpus import Doc
from ready.data.tokenizer import build_tokenizer, chat_token_ids, load_tokenizer
from ready.decode import Engine
from ready.target import HybridLM, preset_config
from ready.train.conversations import build_conversation_data
from ready.train.regen import build_regen_data

torch.set_num_threads(1)
DOCS = [Doc(f"m{i}.py", f"def function_{i}(value):\n    return value * {i} + len('text')\n\nclass Thing{i}:\n    pass\n")
        for i in range(40)]
CONVS = [{"messages": [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "def function_1"},
                       {"role": "assistant", "content": "return value"}, {"role": "user", "content": "class Thing"},
                       {"role": "assistant", "content": "pass"}]},
         {"messages": [{"role": "user", "content": "len('text')"}, {"role": "assistant", "content": "value * 3"}]}]


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    """A chat tokenizer (the embedded ChatML template) and a random tiny target over its vocabulary."""
    folder = tmp_path_factory.mktemp("tok")
    ids = build_tokenizer(DOCS, 300, folder, chat=True)
    tok = load_tokenizer(folder)
    torch.manual_seed(0)
    cfg = preset_config("tiny", {"vocab_size": ids["vocab_size"], "hidden_size": 32, "intermediate_size": 64,
                                 "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 1,
                                 "head_dim": 16, "linear_num_key_heads": 1, "linear_num_value_heads": 2,
                                 "linear_key_head_dim": 8, "linear_value_head_dim": 8,
                                 "eos_token_id": ids["eos_token_id"]})
    return tok, HybridLM(cfg).eval()


def config(tmp_path: Path, path: Path, **data) -> object:
    cfg = OmegaConf.merge(schema(), {"artifacts_dir": str(tmp_path / "artifacts"),
                                     "data": {"path": str(path), **data},
                                     "regen": {"num_samples": 10, "prompt_len": 96, "response_len": 6}})
    return cfg


def test_every_assistant_turn_is_the_targets_answer_to_the_turns_before_it(chat, tmp_path):
    tok, target = chat
    path = tmp_path / "convs.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in CONVS))
    data, folder, counts = build_conversation_data(config(tmp_path, path), target, tok, progress=False)
    assert counts["data/rows_read"] == 2 and counts["data/used"] == 2
    stop = chat_token_ids(tok)["im_end_token_id"]
    engine = Engine(target, eos_token_id=stop)

    def answer(messages):  # the target's greedy answer, as text, to the conversation so far
        ids = engine.generate(prompt_ids(tok, messages, False), 6).tokens
        return tok.decode([i for i in ids if i != stop], skip_special_tokens=True)

    for row, conv in enumerate(CONVS):  # the file's order (both are drawn)
        msgs = [dict(m) for m in conv["messages"]]
        for k, m in enumerate(msgs):
            if m["role"] == "assistant":
                msgs[k] = {"role": "assistant", "content": answer(msgs[:k])}  # conditioned on answers before
        want = render(tok, msgs, False, max_len=102, truncate="right")
        n = int(data.lengths[row])
        assert data.tokens[row, :n].tolist() == want.ids
        assert data.loss_mask[row, :n].tolist() == want.mask  # the assistant tokens, nothing else
        assert not data.loss_mask[row, n:].any()


def test_original_responses_keep_the_datasets_answers(chat, tmp_path):
    tok, target = chat
    path = tmp_path / "convs.json"
    path.write_text(json.dumps(CONVS))
    data, _, _ = build_conversation_data(config(tmp_path, path, responses="original"), target, tok, progress=False)
    want = render(tok, CONVS[1]["messages"], False, max_len=102, truncate="right")
    assert data.tokens[1, :int(data.lengths[1])].tolist() == want.ids
    masked = [t for t, m in zip(want.ids, want.mask) if m]
    assert tok.decode(masked).startswith("value * 3")


def test_build_regen_data_reads_the_dataset_when_data_path_is_set(chat, tmp_path):
    tok, target = chat
    path = tmp_path / "convs.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in CONVS))
    data, folder = build_regen_data(config(tmp_path, path), target, tok, progress=False)
    assert data.loss_mask is not None and (folder / "counts.json").is_file()


def test_a_malformed_file_is_one_line_and_caches_nothing(chat, tmp_path):
    tok, target = chat
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(CONVS[0]) + "\n" + '{"messages": [{"role": "wizard", "content": "x"}]}\n')
    with pytest.raises(ConversationError, match=r"bad.jsonl: row 2 .*expected"):
        build_conversation_data(config(tmp_path, path), target, tok, progress=False)
    assert not list((tmp_path / "artifacts").glob("regen/*/DONE"))
    data, _, counts = build_conversation_data(config(tmp_path, path, on_error="skip"), target, tok, progress=False)
    assert len(data) == 1 and counts["data/rows_skipped"] == 1
