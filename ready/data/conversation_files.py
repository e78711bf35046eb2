"""Find conversation files (a file, a folder or a glob) and read their rows, one dict per row.

Containers: JSON (a list of row objects), JSON Lines (one object per line), either gzipped
(`.json.gz`, `.jsonl.gz`), and parquet. `.jsonl` is always JSON Lines; a `.json` file that does not
start with `[` is read as JSON Lines too (many datasets name their JSON Lines `.json`).

Rows are numbered from 1 in the order they appear; in JSON Lines blank lines are not rows, so a row
also names its line. JSON is parsed with the standard library, row by row: polars' JSON readers
coerce a column of mixed types to strings (a list of turns becomes its JSON text), which would turn
one bad row into a wrong value in every row. Parquet, which has a schema, is read with polars, in
slices, so a `limit` does not read a whole large file.

Problems with a whole file raise `ConversationError` (one line: the file and what was expected);
problems with one row come back as a `BadRow` in its place, for the caller to raise or count.
"""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass
from glob import glob
from pathlib import Path
from typing import Any, Iterator

SUFFIXES = (".jsonl.gz", ".json.gz", ".jsonl", ".json", ".parquet")
PARQUET_SLICE = 8192  # rows per polars slice


class ConversationError(ValueError):
    """A conversation file or row is not what was expected; the message is one line naming both.

    `reason` is a short key for counting skips (e.g. "bad_json", "bad_role", "empty_file").
    """

    def __init__(self, message: str, reason: str = "unreadable_file") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class BadRow:
    """A row that cannot be used: `reason` is a short key for counting, `message` the one line."""

    reason: str
    message: str


def _known(path: Path) -> bool:
    return path.name.endswith(SUFFIXES)


def find_files(source: str | Path) -> list[Path]:
    """The conversation files of a file, a folder (searched recursively) or a glob, in sorted order."""
    text = str(source)
    kinds = ", ".join(SUFFIXES)
    if any(c in text for c in "*?["):
        files = sorted(Path(p) for p in glob(text, recursive=True) if Path(p).is_file() and _known(Path(p)))
        if not files:
            raise ConversationError(f"{text}: the glob matches no conversation files; expected files ending in {kinds}")
        return files
    path = Path(text)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and _known(p)
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        if not files:
            raise ConversationError(f"{text}: the folder holds no conversation files; expected files ending in {kinds}")
        return files
    if path.is_file():
        if not _known(path):
            raise ConversationError(f"{text}: unknown file type; expected a file ending in {kinds}")
        return [path]
    raise ConversationError(f"{text}: no such file or folder; expected a conversation file, a folder or a glob")


def read_rows(path: Path) -> Iterator[tuple[int, str, dict[str, Any] | BadRow]]:
    """Yield `(row, where, record)` for each row of one file: `where` names it in messages
    ("row 3" or "row 3 (line 4)"), `record` is the row's dict or a `BadRow`."""
    if path.name.endswith(".parquet"):
        yield from _parquet_rows(path)
    else:
        yield from _json_rows(path, _text(path), lines=".jsonl" in path.name)


def _text(path: Path) -> str:
    try:
        data = path.read_bytes()
        if path.name.endswith(".gz"):
            data = gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as e:
        raise ConversationError(f"{path}: cannot be read ({e}); expected a readable "
                                f"{'gzip' if path.name.endswith('.gz') else 'JSON'} file") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConversationError(f"{path}: not UTF-8 text (byte {e.start}); expected JSON or JSON Lines") from None
    if not text.strip():
        raise ConversationError(f"{path}: empty file; expected a JSON list of rows or JSON Lines (one row per line)",
                                "empty_file")
    return text


def _json_rows(path: Path, text: str, lines: bool) -> Iterator[tuple[int, str, dict[str, Any] | BadRow]]:
    if not lines and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConversationError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); "
                                    "expected a JSON list of row objects") from None
        if not isinstance(rows, list) or not rows:
            raise ConversationError(f"{path}: an empty JSON list; expected a JSON list of row objects", "empty_file")
        for row, value in enumerate(rows, 1):
            yield row, f"row {row}", _object(value)
        return
    row = 0
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        row += 1
        where = f"row {row} (line {line_no})"
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            if row == 1:
                _refuse_one_object(path, text)
            yield row, where, BadRow("bad_json", f"not valid JSON ({e.msg} at column {e.colno}); "
                                                 "expected one JSON object per line")
            continue
        yield row, where, _object(value)


def _refuse_one_object(path: Path, text: str) -> None:
    """A file whose first line is not JSON but which is one JSON object as a whole: say so."""
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        return
    if isinstance(whole, dict):
        raise ConversationError(f"{path}: one JSON object (keys {sorted(whole)[:5]}); expected a JSON list of "
                                "rows or JSON Lines (one row object per line)")


def _object(value: Any) -> dict[str, Any] | BadRow:
    if isinstance(value, dict):
        return value
    return BadRow("not_object", f"a JSON {type(value).__name__}; expected an object (one conversation row)")


def _parquet_rows(path: Path) -> Iterator[tuple[int, str, dict[str, Any] | BadRow]]:
    import polars as pl

    try:
        frame = pl.scan_parquet(path)
        total = int(frame.select(pl.len()).collect().item())
    except Exception as e:  # polars raises several types for a damaged file
        raise ConversationError(f"{path}: not a readable parquet file ({str(e).splitlines()[0]}); "
                                "expected a parquet table of conversation rows") from None
    if total == 0:
        raise ConversationError(f"{path}: a parquet table with no rows; expected conversation rows", "empty_file")
    row = 0
    for offset in range(0, total, PARQUET_SLICE):
        try:
            part = frame.slice(offset, PARQUET_SLICE).collect()
        except Exception as e:
            raise ConversationError(f"{path}: rows {offset + 1}..{offset + PARQUET_SLICE} cannot be read "
                                    f"({str(e).splitlines()[0]}); expected a readable parquet table") from None
        for record in part.iter_rows(named=True):
            row += 1
            yield row, f"row {row}", record
