"""Conversation datasets -> normalised conversations (roles system / user / assistant) + a load report.

Shapes, detected per row from its non-null fields (in this order) or forced with `format=`:

- `messages`: OpenAI messages, `messages` = [{"role": "system"|"user"|"assistant", "content": str}, ...]
- `sharegpt`: `conversations` = [{"from": "system"|"human"|"gpt", "value": str}, ...]
- `perfectblend`: Open-PerfectBlend (mlabonne/open-perfectblend) rows: ShareGPT `conversations` plus a
  `source` string (auto-detected when a row has both); `source` is kept as metadata
- `prompt_response`: `prompt` and `response` strings -> one user turn, one assistant turn

A turn may use either key pair ({"from", "value"} or {"role", "content"}); roles human/user -> user,
gpt/assistant -> assistant, system -> system. A usable conversation is: optional system turns, then
user and assistant turns alternating, starting with user and ending with assistant.

`on_error="stop"` (default) raises `ConversationError` at the first bad file or row, one line naming the
file, the row and what was expected; `on_error="skip"` skips the row (a bad row never costs its file its
other rows; only a file that cannot be read as a whole is skipped whole) and counts it in the `LoadReport`
(by reason), which the caller logs (`LoadReport.metrics()` for MLflow: `data/rows_skipped`,
`data/files_skipped`). Files come from
`ready.data.conversation_files` (a file, a folder or a glob; JSON, JSON Lines, gzipped, parquet).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ready.data.conversation_files import BadRow, ConversationError, find_files, read_rows

FORMATS = ("auto", "sharegpt", "messages", "perfectblend", "prompt_response")
ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}
MAX_ERRORS_KEPT = 20

__all__ = ["Conversation", "ConversationError", "FORMATS", "LoadReport", "load_conversations", "parse_row"]


@dataclass(frozen=True)
class Conversation:
    """One conversation: `messages` [{"role", "content"}], where it came from (`file`, 1-based `row`)."""

    messages: list[dict[str, str]]
    source: Optional[str]
    row: int
    file: str


@dataclass
class LoadReport:
    """What a load read and what it skipped, with counts per reason (for logs and MLflow)."""

    files: list[str] = field(default_factory=list)
    rows_read: int = 0
    kept: int = 0
    skipped: int = 0  # rows skipped (whole files: skipped_files)
    reasons: Counter = field(default_factory=Counter)  # reason -> rows (or files) skipped
    formats: Counter = field(default_factory=Counter)  # shape -> rows kept
    skipped_files: dict[str, str] = field(default_factory=dict)  # file -> its one-line error
    errors: list[str] = field(default_factory=list)  # the first MAX_ERRORS_KEPT one-line errors

    def metrics(self, prefix: str = "data") -> dict[str, float]:
        """Flat numeric counts, e.g. {"data/rows_read": 10, "data/rows_skipped": 1, "data/skipped/bad_role": 1, ...}
        (`skipped/<reason>` counts rows and whole files, `rows_skipped` and `files_skipped` each)."""
        out = {f"{prefix}/files": float(len(self.files)), f"{prefix}/files_skipped": float(len(self.skipped_files)),
               f"{prefix}/rows_read": float(self.rows_read), f"{prefix}/kept": float(self.kept),
               f"{prefix}/rows_skipped": float(self.skipped)}
        out.update({f"{prefix}/skipped/{k}": float(v) for k, v in sorted(self.reasons.items())})
        out.update({f"{prefix}/format/{k}": float(v) for k, v in sorted(self.formats.items())})
        return out

    def summary(self) -> str:
        """One line: kept / read, and the skips by reason."""
        why = ", ".join(f"{k} {v}" for k, v in self.reasons.most_common()) or "none"
        return (f"{self.kept} conversations from {self.rows_read} rows in {len(self.files)} files "
                f"({self.skipped} row(s) and {len(self.skipped_files)} file(s) skipped); skipped: {why}")

    def _skip(self, reason: str, message: str) -> None:
        self.reasons[reason] += 1
        if len(self.errors) < MAX_ERRORS_KEPT:
            self.errors.append(message)


def load_conversations(source: str | Path, format: str = "auto", on_error: str = "stop",
                       limit: Optional[int] = None) -> tuple[list[Conversation], LoadReport]:
    """Read every conversation of `source` (a file, a folder or a glob), up to `limit` of them.

    Raises `ConversationError` (one line) at the first bad file or row with on_error="stop", or when
    nothing usable was found; with on_error="skip" bad rows and unreadable files are counted instead.
    """
    if format not in FORMATS:
        raise ConversationError(f"format={format!r}; expected one of {', '.join(FORMATS)}")
    if on_error not in ("stop", "skip"):
        raise ConversationError(f"on_error={on_error!r}; expected 'stop' or 'skip'")
    report = LoadReport()
    out: list[Conversation] = []
    for path in find_files(source):
        if limit is not None and len(out) >= limit:
            break
        report.files.append(str(path))
        try:
            _load_file(path, format, on_error, limit, out, report)
        except ConversationError as e:
            if on_error == "stop":
                raise
            report.skipped_files[str(path)] = str(e)
            report._skip(e.reason, str(e))
    if not out:
        raise ConversationError(f"{source}: no usable conversations ({report.summary()})", "empty")
    return out, report


def _load_file(path: Path, format: str, on_error: str, limit: Optional[int], out: list[Conversation],
               report: LoadReport) -> None:
    for row, where, record in read_rows(path):
        report.rows_read += 1
        try:
            if isinstance(record, BadRow):
                raise _bad(record.reason, record.message)
            shape, messages, source = parse_row(record, format)
        except ConversationError as bad:
            line = f"{path}: {where}: {bad}"
            if on_error == "stop":
                raise ConversationError(line, bad.reason) from None
            report.skipped += 1
            report._skip(bad.reason, line)
            continue
        out.append(Conversation(messages, source, row, str(path)))
        report.kept += 1
        report.formats[shape] += 1
        if limit is not None and len(out) >= limit:
            return


def parse_row(record: dict[str, Any], format: str = "auto") -> tuple[str, list[dict[str, str]], Optional[str]]:
    """(shape, normalised messages, source) of one row (a dict); raises `ConversationError` (with a
    `reason`, the message says what was found and expected, without the file) when it is unusable."""
    if format not in FORMATS:
        raise ConversationError(f"format={format!r}; expected one of {', '.join(FORMATS)}")
    shape = _shape(record) if format == "auto" else format
    if shape == "prompt_response":
        prompt, response = record.get("prompt"), record.get("response")
        for name, value in (("prompt", prompt), ("response", response)):
            if not isinstance(value, str):
                reason = "missing_field" if value is None else "bad_content"
                raise _bad(reason, f"'{name}' is {_show(value)}; expected a string")
        messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
        return shape, messages, _source(record, required=False)
    key = "messages" if shape == "messages" else "conversations"
    turns = record.get(key)
    if not isinstance(turns, list):
        reason = "missing_field" if turns is None else "bad_turn"
        raise _bad(reason, f"'{key}' is {_show(turns)}; expected a list of {_turn_keys(shape)} turns")
    messages = [_turn(turn, i, shape) for i, turn in enumerate(turns, 1)]
    _check_order(messages)
    return shape, messages, _source(record, required=shape == "perfectblend")


def _shape(record: dict[str, Any]) -> str:
    present = {k for k, v in record.items() if v is not None}
    if "messages" in present:
        return "messages"
    if "conversations" in present:
        return "perfectblend" if "source" in present else "sharegpt"
    if {"prompt", "response"} & present:
        return "prompt_response"
    keys = ", ".join(sorted(present)[:8]) or "none"
    raise _bad("missing_field", f"fields [{keys}] match no conversation shape; expected 'conversations' "
                                "(ShareGPT / Open-PerfectBlend), 'messages' (OpenAI) or 'prompt' and 'response'")


def _turn_keys(shape: str) -> str:
    return "{'role', 'content'}" if shape == "messages" else "{'from', 'value'}"


def _turn(turn: Any, i: int, shape: str) -> dict[str, str]:
    if not isinstance(turn, dict):
        raise _bad("bad_turn", f"turn {i} is {_show(turn)}; expected a {_turn_keys(shape)} object")
    role = turn.get("from") if turn.get("from") is not None else turn.get("role")
    text = turn.get("value") if turn.get("value") is not None else turn.get("content")
    if role is None:
        raise _bad("bad_turn", f"turn {i} has no role; expected a {_turn_keys(shape)} object")
    if not isinstance(role, str) or role not in ROLES:
        raise _bad("bad_role", f"turn {i} has role {_show(role)}; expected system, user or assistant "
                               "(ShareGPT: system, human, gpt)")
    if not isinstance(text, str):
        raise _bad("bad_content", f"turn {i} ({role}) has content {_show(text)}; expected a string")
    return {"role": ROLES[role], "content": text}


def _check_order(messages: list[dict[str, str]]) -> None:
    """Optional system turns, then user / assistant alternating from user, ending with assistant."""
    start = 0
    while start < len(messages) and messages[start]["role"] == "system":
        start += 1
    if start == len(messages):
        raise _bad("empty", "no user or assistant turns; expected at least one user turn and one assistant turn")
    for i in range(start, len(messages)):
        role, want = messages[i]["role"], ("user", "assistant")[(i - start) % 2]
        if role != want:
            after = f"after '{messages[i - 1]['role']}'" if i > start else "first after the system turns"
            raise _bad("bad_order", f"turn {i + 1} is '{role}' ({after}); expected '{want}': user and assistant "
                                    "turns alternate from user, system turns only at the start")
    if messages[-1]["role"] != "assistant":
        raise _bad("no_final_assistant", f"the conversation ends with a '{messages[-1]['role']}' turn "
                                         f"(turn {len(messages)}); expected it to end with an assistant turn")


def _source(record: dict[str, Any], required: bool) -> Optional[str]:
    value = record.get("source")
    if isinstance(value, str):
        return value
    if required or value is not None:
        raise _bad("missing_field" if value is None else "bad_content",
                   f"'source' is {_show(value)}; expected a string (Open-PerfectBlend's dataset name)")
    return None


def _bad(reason: str, message: str) -> ConversationError:
    return ConversationError(message, reason)


def _show(value: Any) -> str:
    """A short description of a found value for an error line."""
    if value is None:
        return "missing or null"
    if isinstance(value, str):
        return repr(value if len(value) <= 24 else value[:21] + "...")
    return f"a {type(value).__name__}"
