"""Find conversation files (a file, a folder or a glob) and read their rows, one dict per row.

Containers: JSON (a list of row objects), JSON Lines (one object per line), either gzipped
(`.json.gz`, `.jsonl.gz`), and parquet. `.jsonl` is always JSON Lines; a `.json` file that does not
start with `[` is read as JSON Lines too (many datasets name their JSON Lines `.json`).

Rows are numbered from 1 in the order they appear; in JSON Lines blank lines are not rows, so a row
also names its line. JSON is parsed with the standard library, row by row: polars' JSON readers
coerce a column of mixed types to strings (a list of turns becomes its JSON text), which would turn
one bad row into a wrong value in every row. Parquet, which has a schema, is read with polars, in
slices, so a `limit` does not read a whole large file.

Parsing is bounded: JSON Lines is read a line at a time and a line longer than MAX_ROW_BYTES is a bad
row (its bytes are read past, never kept); a JSON list is parsed whole, up to MAX_DOCUMENT_BYTES; a row
nested deeper than MAX_DEPTH is a bad row (the JSON parser's own limit, the interpreter's recursion
limit, makes a deeper JSON Lines row one bad row too, never a RecursionError). A line that is not
UTF-8, or a row whose text is not (a JSON list's bytes are decoded row by row in effect), is one bad
row: the rows around it are read as usual.

Problems with a whole file raise `ConversationError` (one line: the file and what was expected);
problems with one row come back as a `BadRow` in its place, for the caller to raise or count.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from dataclasses import dataclass
from glob import glob
from pathlib import Path
from typing import Any, BinaryIO, Iterator

SUFFIXES = (".jsonl.gz", ".json.gz", ".jsonl", ".json", ".parquet")
PARQUET_SLICE = 8192  # rows per polars slice
MAX_ROW_BYTES = 64 << 20  # one JSON Lines row (a conversation); a longer line is one bad row, read past unkept
MAX_DOCUMENT_BYTES = 2 << 30  # a JSON list is parsed whole; a larger one is refused (JSON Lines reads a row at a time)
MAX_DEPTH = 32  # how deep a row's values nest (a conversation: row -> turns -> turn -> text, 4)


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
        rows = _parquet_rows(path)
    elif ".jsonl" in path.name or _first_byte(path) != b"[":
        rows = _json_lines(path)
    else:
        rows = _json_list(path)
    for row, where, record in rows:
        yield row, where, record if isinstance(record, BadRow) else _checked(record)


def _open(path: Path) -> BinaryIO:
    return gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")  # type: ignore[return-value]


def _unreadable(path: Path, e: BaseException) -> ConversationError:
    return ConversationError(f"{path}: cannot be read ({e}); expected a readable "
                             f"{'gzip' if path.name.endswith('.gz') else 'JSON'} file")


def _first_byte(path: Path) -> bytes:
    """The first byte that is not whitespace (nor a UTF-8 byte order mark): b"[" for a JSON list."""
    try:
        with _open(path) as f:
            head = f.read(4096).lstrip(b"\xef\xbb\xbf")
            while head and not head.strip():
                head = f.read(4096)
    except (OSError, EOFError, zlib.error) as e:
        raise _unreadable(path, e) from None
    return head.lstrip()[:1]


def _json_lines(path: Path) -> Iterator[tuple[int, str, dict[str, Any] | BadRow]]:
    """JSON Lines, read a line at a time: a line that is not UTF-8, not JSON, nested too deep or longer than
    MAX_ROW_BYTES is one bad row, and the rows after it are read as usual."""
    row = line_no = 0
    try:
        with _open(path) as f:
            while True:
                raw = f.readline(MAX_ROW_BYTES + 1)
                if not raw:
                    break
                line_no += 1
                if line_no == 1:
                    raw = raw.removeprefix(b"\xef\xbb\xbf")
                if len(raw) > MAX_ROW_BYTES and not raw.endswith(b"\n"):  # read the rest of the line past, unkept
                    size = len(raw)
                    while not raw.endswith(b"\n") and raw:
                        raw = f.readline(1 << 20)
                        size += len(raw)
                    row += 1
                    size -= raw.endswith(b"\n")  # the line, less its end
                    yield row, f"row {row} (line {line_no})", BadRow(
                        "too_large", f"a line of {size:,} bytes; expected at most {MAX_ROW_BYTES:,} bytes per row")
                    continue
                if not raw.strip():
                    continue
                row += 1
                yield row, f"row {row} (line {line_no})", _line_record(path, raw, row)
    except (OSError, EOFError, zlib.error) as e:
        raise _unreadable(path, e) from None
    if row == 0:
        raise ConversationError(f"{path}: empty file; expected a JSON list of rows or JSON Lines (one row per line)",
                                "empty_file")


def _line_record(path: Path, raw: bytes, row: int) -> dict[str, Any] | BadRow:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return BadRow("not_utf8", f"not UTF-8 text (byte {e.start + 1} of the line is {raw[e.start]:#04x}); expected "
                                  "UTF-8 JSON")
    try:
        return _object(json.loads(text))
    except json.JSONDecodeError as e:
        if row == 1:
            _refuse_one_object(path)
        return BadRow("bad_json", f"not valid JSON ({e.msg} at column {e.colno}); expected one JSON object per line")
    except RecursionError:
        return _too_deep()


def _json_list(path: Path) -> Iterator[tuple[int, str, dict[str, Any] | BadRow]]:
    """A JSON list, parsed whole (at most MAX_DOCUMENT_BYTES): bytes that are not UTF-8 make their row a bad
    row, not the file; a syntax error or nesting beyond the parser's depth is the file's (a list has no line
    ends to find the next row by)."""
    try:
        with _open(path) as f:
            data = f.read(MAX_DOCUMENT_BYTES + 1)
    except (OSError, EOFError, zlib.error) as e:
        raise _unreadable(path, e) from None
    if len(data) > MAX_DOCUMENT_BYTES:
        raise ConversationError(f"{path}: a JSON list of more than {MAX_DOCUMENT_BYTES:,} bytes; expected JSON Lines "
                                "(one row per line, read a row at a time) or parquet for a file this large", "too_large")
    text = data.decode("utf-8-sig", errors="surrogateescape")  # a bad byte stays in its row, found by _checked
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConversationError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); "
                                "expected a JSON list of row objects") from None
    except RecursionError:
        raise ConversationError(f"{path}: nested deeper than the JSON parser goes; expected a JSON list of row objects "
                                f"(a row nests at most {MAX_DEPTH} deep)", "too_deep") from None
    if not isinstance(rows, list) or not rows:
        raise ConversationError(f"{path}: an empty JSON list; expected a JSON list of row objects", "empty_file")
    for row, value in enumerate(rows, 1):
        yield row, f"row {row}", _object(value)


def _refuse_one_object(path: Path) -> None:
    """A file whose first line is not JSON but which is one JSON object as a whole: say so."""
    try:
        with _open(path) as f:
            data = f.read(MAX_DOCUMENT_BYTES + 1)
        whole = json.loads(data.decode("utf-8-sig")) if len(data) <= MAX_DOCUMENT_BYTES else None
    except (OSError, EOFError, zlib.error, ValueError, RecursionError):
        return
    if isinstance(whole, dict):
        raise ConversationError(f"{path}: one JSON object (keys {sorted(whole)[:5]}); expected a JSON list of "
                                "rows or JSON Lines (one row object per line)")


def _object(value: Any) -> dict[str, Any] | BadRow:
    if isinstance(value, dict):
        return value
    return BadRow("not_object", f"a JSON {type(value).__name__}; expected an object (one conversation row)")


NOT_UNICODE = re.compile("[\ud800-\udfff]")  # a byte that was not UTF-8 (surrogateescape), or a lone surrogate


def _too_deep() -> BadRow:
    return BadRow("too_deep", f"values nested more than {MAX_DEPTH} deep; expected a conversation row (an object of "
                              "turns, a few levels deep)")


def _checked(record: dict[str, Any]) -> dict[str, Any] | BadRow:
    """The row, or a BadRow when it nests deeper than MAX_DEPTH or holds text that is not valid Unicode (a
    byte that was not UTF-8, or a lone surrogate escape: no tokenizer encodes it). Walks the row without
    recursion, so no row can exhaust the interpreter's stack."""
    stack: list[tuple[Any, int]] = [(record, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            bad = NOT_UNICODE.search(value)
            if bad:
                return BadRow("not_utf8", f"text that is not UTF-8 (at character {bad.start() + 1} of "
                                          f"{_show(value)}: a byte that is not UTF-8, or a lone surrogate); "
                                          "expected UTF-8 text")
        elif isinstance(value, (dict, list)):
            if depth > MAX_DEPTH:
                return _too_deep()
            items = value.items() if isinstance(value, dict) else enumerate(value)
            stack.extend(x for k, v in items for x in ((k, depth + 1), (v, depth + 1)))
    return record


def _show(text: str) -> str:
    return repr(text if len(text) <= 24 else text[:21] + "...")


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
