"""The embedded default's conversations from the corpus, and how they reach pretraining and evaluation."""

from __future__ import annotations

import torch
from omegaconf import OmegaConf

from ready.config import schema
from ready.data.chat import prompt_ids, render, template_overhead
from ready.data.corpus import Doc
from ready.data.pretrain import mix_windows
from ready.data.stdlib_chats import complete_conversations, continue_conversations, function_tasks, stdlib_conversations
from ready.data.tokenizer import build_tokenizer, load_tokenizer

SOURCE = '''import os


def add(a, b):
    """Return the sum of a and b."""
    total = a + b
    return total


class Box:
    def size(self):
        """How many items the box holds."""
        n = len(self.items)
        return n

    def empty(self):
        """One-line body: too short to teach."""
        return not self.items


def undocumented(x):
    y = x * 2
    return y
'''


def _tokenizer(tmp_path, docs):
    build_tokenizer(docs, 400, tmp_path / "tok", chat=True)
    return load_tokenizer(tmp_path / "tok")


def test_a_documented_function_becomes_its_header_and_docstring_then_its_body():
    tasks = list(function_tasks(Doc("m.py", SOURCE)))
    heads = [h.splitlines()[0] for h, _ in tasks]
    assert heads == ["def add(a, b):", "def size(self):"]  # no docstring / one-line body: left out
    head, body = tasks[1]
    assert head == 'def size(self):\n    """How many items the box holds."""\n'  # dedented out of the class
    assert body == "    n = len(self.items)\n    return n\n"


def test_a_file_that_does_not_parse_or_is_not_python_gives_no_function_task():
    assert list(function_tasks(Doc("bad.py", "def f(:\n"))) == []
    assert list(function_tasks(Doc("notes.txt", SOURCE))) == []


def test_a_file_is_parsed_once_per_process_however_many_conversation_sets_cut_it(monkeypatch):
    """The target's pretraining conversations and the drafter's training ones are cut from the same files."""
    import ast

    parsed = []
    real = ast.parse
    monkeypatch.setattr(ast, "parse", lambda text, *a, **k: parsed.append(len(text)) or real(text, *a, **k))
    doc = Doc("memo_probe.py", SOURCE + "\n# a text no other test parses\n")
    first, again = list(function_tasks(doc)), list(function_tasks(Doc(doc.path, doc.text)))
    assert first == again and len(first) == 2 and len(parsed) == 1


def test_conversations_hold_their_token_budgets_and_alternate_kinds(tmp_path):
    docs = [Doc("m.py", SOURCE * 3), Doc("n.py", SOURCE.replace("add", "plus") * 2)]
    tok = _tokenizer(tmp_path, docs)
    convs = stdlib_conversations(docs, tok, prompt_tokens=24, response_tokens=10, seed=0)
    n_tok = lambda s: len(tok(s, add_special_tokens=False)["input_ids"])  # noqa: E731
    for user, answer in ((c[0]["content"], c[1]["content"]) for c in convs):
        assert n_tok(user) <= 24 + 1 and n_tok(answer) <= 10 + 1  # a cut may re-merge at its edge
    complete = complete_conversations(docs, tok, 24, 10)
    assert convs[0] in complete and convs[1] not in complete  # complete, continue, complete, ...
    assert stdlib_conversations(docs, tok, 24, 10, seed=0) == convs  # deterministic
    assert stdlib_conversations(docs, tok, 24, 10, seed=0, limit=3) == convs[:3]


def test_a_continuation_answer_is_the_text_that_follows_its_prompt(tmp_path):
    import random

    docs = [Doc("m.py", SOURCE * 4)]
    tok = _tokenizer(tmp_path, docs)
    for conv in continue_conversations(docs, tok, 16, 8, random.Random(0)):
        assert (conv[0]["content"] + conv[1]["content"]) in docs[0].text


def test_a_rendered_conversation_masks_only_its_answer_and_fits_the_regen_budget(tmp_path):
    docs = [Doc("m.py", SOURCE * 3)]
    tok = _tokenizer(tmp_path, docs)
    overhead = template_overhead(tok, thinking=False)
    conv = complete_conversations(docs, tok, 64 - overhead, 12)[0]
    sample = render(tok, conv, thinking=False)
    assert len(sample.ids) <= 64 + 12 + 2
    user_part = prompt_ids(tok, conv[:1], thinking=False)
    assert sample.ids[:len(user_part)] == user_part and not any(sample.mask[:len(user_part)])
    assert tok.decode([t for t, m in zip(sample.ids, sample.mask) if m], skip_special_tokens=True) == conv[1]["content"]


def test_pretraining_cuts_the_chat_share_of_its_windows_from_the_chat_stream():
    windows = torch.zeros(400, 5, dtype=torch.long)
    chats = torch.arange(1, 50)
    gen = torch.Generator().manual_seed(0)
    mixed = mix_windows(windows, chats, 0.5, gen)
    from_chats = (mixed != 0).all(dim=1)
    assert 150 < int(from_chats.sum()) < 250
    assert ((mixed == 0).all(dim=1) | from_chats).all()  # whole windows, never a mix
    assert (mixed[from_chats][:, 1:] - mixed[from_chats][:, :-1] == 1).all()  # consecutive stream tokens
    assert torch.equal(mix_windows(windows, chats, 0.0, gen), windows)


def test_the_heldout_suite_is_posed_as_a_chat_prompt_within_its_token_budget(tmp_path):
    from ready.data.benchmarks import heldout_chat_suite

    cfg = OmegaConf.merge(schema(), {"corpus": {"max_files": 40, "heldout_fraction": 0.3, "vocab_size": 512}})
    from ready.data.corpus import load_corpus

    tok = _tokenizer(tmp_path, load_corpus(cfg.corpus).train)
    prompts = heldout_chat_suite(tok, cfg.corpus, limit=3, max_tokens=48, thinking=False)
    assert len(prompts) == 3
    for p in prompts:
        assert len(p.ids) <= 48
        assert p.text.startswith("<|im_start|>user\n") and p.text.endswith("<think>\n\n</think>\n\n")
