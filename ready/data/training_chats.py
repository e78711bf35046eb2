"""Which conversations a row's drafter trains on (and is validated on): `data.path`'s or the corpus's.

- `data.path` set: the dataset's conversations (ready.data.conversations). `regen.num_samples` of them
  are drawn with `regen.seed` for training; the validation conversations (the teacher-forced metric,
  `eval.heldout_tf_samples`) are drawn from the rows not drawn for training.
- `data.path` null (the embedded default): the corpus's conversations
  (ready.data.stdlib_chats), training from the drafter's training files and validation from the
  validation files (`ready.data.default.prompt_docs`), each drawn with `regen.seed`.

A user turn holds at most `regen.prompt_len` tokens minus what the chat template adds, so a rendered
conversation with an answer of `regen.response_len` tokens fits `regen.prompt_len + regen.response_len`.
`source_key` names what the conversations are made from (file digests, or the corpus fingerprint and
lengths) without reading a dataset's rows: the data artifact's key.
"""

from __future__ import annotations

import random
import sys
from typing import Any

from ready.artifacts import file_digest
from ready.config import to_container
from ready.data.chat import template_overhead
from ready.data.conversation_files import find_files
from ready.data.conversations import load_conversations
from ready.data.corpus import load_corpus
from ready.data.default import prompt_docs
from ready.data.stdlib_chats import stdlib_conversations

Messages = list[dict[str, str]]
SPLITS = ("train", "validation")
STDLIB_CHATS_VERSION = 1  # bump when ready.data.stdlib_chats changes what it makes


class TrainingChatsError(ValueError):
    """The configuration asks for conversations that cannot be had; the message says which key to change."""


def _user_tokens(cfg: Any, tokenizer: Any) -> int:
    n = int(cfg.regen.prompt_len) - template_overhead(tokenizer, bool(cfg.bench.thinking))
    if n < 8:
        raise TrainingChatsError(f"regen.prompt_len={cfg.regen.prompt_len} leaves {n} tokens for a user turn inside "
                                 "the chat template; expected at least 8 (raise regen.prompt_len)")
    return n


def source_key(cfg: Any, tokenizer: Any, split: str) -> dict:
    """What the conversations of `split` are made from, for the data artifact's key."""
    _check_split(split)
    if cfg.data.path:
        return {"files": [[p.name, file_digest(p)] for p in find_files(str(cfg.data.path))], "split": split}

    return {"stdlib_chats": STDLIB_CHATS_VERSION, "corpus": to_container(cfg.corpus),
            "corpus_fingerprint": load_corpus(cfg.corpus).fingerprint, "split": split,
            "user_tokens": _user_tokens(cfg, tokenizer)}


def conversations_for(cfg: Any, tokenizer: Any, split: str, n: int) -> tuple[list[Messages], dict[str, float]]:
    """(up to `n` conversations of `split` with their original answers, the dataset's load counts ({} for
    the corpus's)), drawn with `regen.seed`, in a fixed order."""
    _check_split(split)
    rng = random.Random(int(cfg.regen.seed))
    if cfg.data.path:
        convs, report = load_conversations(str(cfg.data.path), format=str(cfg.data.format),
                                           on_error=str(cfg.data.on_error))
        if report.skipped or report.skipped_files:
            print(f"[ready] data.path = {cfg.data.path}: {report.summary()} (data.on_error=skip); the first: "
                  f"{report.errors[0]}", file=sys.stderr, flush=True)
        order = rng.sample(range(len(convs)), len(convs))
        n_train = min(int(cfg.regen.num_samples), len(convs))
        picked = order[:n_train] if split == "train" else order[n_train:n_train + n]
        if not picked:
            raise TrainingChatsError(f"data.path = {cfg.data.path!r}: all {len(convs)} conversations train the drafter "
                                     f"(regen.num_samples={cfg.regen.num_samples}), none is left to validate on; "
                                     "expected fewer training samples or eval.heldout_tf_samples=0")
        return [convs[i].messages for i in sorted(picked[:n])], report.metrics(prefix="data")

    corpus = load_corpus(cfg.corpus)
    docs = prompt_docs(corpus, split, int(cfg.corpus.seed))
    convs = stdlib_conversations(docs, tokenizer, _user_tokens(cfg, tokenizer), int(cfg.regen.response_len),
                                 int(cfg.corpus.seed))
    if not convs:
        raise TrainingChatsError(f"the corpus's {split} files give no conversation; expected some "
                                 "(raise corpus.max_files or regen.prompt_len)")
    picked = sorted(rng.sample(range(len(convs)), min(n, len(convs))))
    return [convs[i] for i in picked], {}


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise TrainingChatsError(f"split={split!r}; expected one of {', '.join(SPLITS)}")


__all__ = ["SPLITS", "TrainingChatsError", "conversations_for", "source_key"]
