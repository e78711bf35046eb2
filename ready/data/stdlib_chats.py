"""Conversations built from the embedded corpus (ready.data.corpus; the module keeps the name it had when the
corpus was the standard library): the embedded default's chat training data.

No machine here reaches a dataset hub, so the embedded default trains its drafters on conversations
made offline from the corpus (ready.data.corpus), in the two tasks its evaluation suites pose:

- **complete**: the user turn is a Python function's header and docstring, as HumanEval states a
  task (the function's source up to the end of its docstring, dedented); the answer is the
  function's body.
- **continue**: the user turn is a stretch of a corpus file starting at a line start, as the
  `heldout` suite cuts its prompts; the answer is the text that follows it.

Both come from the files of one split (`train`, `validation`, `heldout`: `ready.data.default.prompt_docs`),
so the drafter's training conversations never contain the evaluation prompts. The answers written
here are the corpus's own text: the target pretrains on them (rendered with the chat template, so it
learns the format) and `data.responses: original` trains on them; with `regenerate` (the default) the
target answers every user turn anew, as the paper's recipe does.

Lengths are in tokens of the target's tokenizer: a user turn holds at most `prompt_tokens` (a
function whose header and docstring are longer is left out; a stretch is cut there), an answer at
most `response_tokens`. The set is deterministic in (corpus, split, tokenizer, lengths, seed).
"""

from __future__ import annotations

import ast
import random
import textwrap
from functools import lru_cache
from typing import Any, Iterator, Optional

from ready.data.corpus import Doc

Messages = list[dict[str, str]]
KINDS = ("complete", "continue")
MIN_BODY_LINES = 2  # a function body shorter than this teaches nothing beyond `return x`
CONTINUE_PER_FILE = 2  # stretches cut from each file (different line starts)


def function_tasks(doc: Doc) -> Iterator[tuple[str, str]]:
    """(header + docstring, body) of every function in a Python file that has a docstring and a body
    of at least MIN_BODY_LINES lines, in source order; a file that does not parse gives none."""
    yield from _function_tasks(doc)


@lru_cache(maxsize=None)
def _function_tasks(doc: Doc) -> tuple[tuple[str, str], ...]:
    """`function_tasks` of `doc`, parsed once per process: the target's pretraining conversations and the
    drafter's training and validation conversations are cut from the same files, in the same process of a
    cold sweep (which parsed each file twice; parsing is ~60 % of the conversations' CPU time)."""
    return tuple(_parse_tasks(doc))


def _parse_tasks(doc: Doc) -> Iterator[tuple[str, str]]:
    if not doc.path.endswith(".py"):
        return
    try:
        tree = ast.parse(doc.text)
    except (SyntaxError, ValueError):
        return
    lines = doc.text.splitlines(keepends=True)
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.body:
            continue
        first = node.body[0]
        if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)) or first.end_lineno is None or node.end_lineno is None:
            continue
        start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
        source = textwrap.dedent("".join(lines[start:node.end_lineno]))
        head_lines = first.end_lineno - start
        split = source.splitlines(keepends=True)
        head, body = "".join(split[:head_lines]), "".join(split[head_lines:])
        if len(body.strip().splitlines()) >= MIN_BODY_LINES:
            yield head, body


def _cut(tokenizer: Any, text: str, n: int) -> tuple[str, str]:
    """(the text of the first `n` tokens of `text`, the text after them)."""
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if len(ids) <= n:
        return text, ""
    head = tokenizer.decode(ids[:n])
    return head, text[len(head):] if text.startswith(head) else tokenizer.decode(ids[n:])


def _tokens(tokenizer: Any, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def complete_conversations(docs: list[Doc], tokenizer: Any, prompt_tokens: int, response_tokens: int) -> list[Messages]:
    """One conversation per documented function of `docs` whose header + docstring fit `prompt_tokens`."""
    out = []
    for doc in docs:
        for head, body in function_tasks(doc):
            if _tokens(tokenizer, head) > prompt_tokens:
                continue
            answer = _cut(tokenizer, body, response_tokens)[0]
            out.append([{"role": "user", "content": head}, {"role": "assistant", "content": answer}])
    return out


def continue_conversations(docs: list[Doc], tokenizer: Any, prompt_tokens: int, response_tokens: int,
                           rng: random.Random) -> list[Messages]:
    """CONTINUE_PER_FILE conversations per file: a stretch from a line start and the text after it."""
    out = []
    for doc in docs:
        for _ in range(CONTINUE_PER_FILE):
            hi = max(0, len(doc.text) - prompt_tokens * 6)
            pos = rng.randint(0, hi) if hi else 0
            start = doc.text.rfind("\n", 0, pos) + 1
            window = doc.text[start:start + (prompt_tokens + response_tokens) * 16]
            prompt, rest = _cut(tokenizer, window, prompt_tokens)
            answer = _cut(tokenizer, rest, response_tokens)[0]
            if prompt.strip() and answer.strip():
                out.append([{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}])
    return out


def stdlib_conversations(docs: list[Doc], tokenizer: Any, prompt_tokens: int, response_tokens: int, seed: int,
                         limit: Optional[int] = None) -> list[Messages]:
    """The two kinds from `docs`, alternating (complete, continue, ...) in a seeded order while both
    last, then the rest of the longer list; the first `limit` of them (all: None)."""
    if prompt_tokens < 1 or response_tokens < 1:
        raise ValueError(f"prompt_tokens={prompt_tokens}, response_tokens={response_tokens}; expected both >= 1")
    rng = random.Random(f"stdlib-chats:{seed}")
    complete = complete_conversations(docs, tokenizer, prompt_tokens, response_tokens)
    cont = continue_conversations(docs, tokenizer, prompt_tokens, response_tokens, rng)
    rng.shuffle(complete)
    rng.shuffle(cont)
    mixed: list[Messages] = []
    for a, b in zip(complete, cont):
        mixed += [a, b]
    n = min(len(complete), len(cont))
    mixed += complete[n:] + cont[n:]
    return mixed if limit is None else mixed[:limit]


__all__ = ["KINDS", "complete_conversations", "continue_conversations", "function_tasks", "stdlib_conversations"]
