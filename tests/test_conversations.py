"""Conversation datasets (every shape and container, bad files and rows) and chat rendering with an
assistant-token mask (checked token by token on the embedded ChatML template)."""

import gzip
import json
from pathlib import Path

import polars as pl
import pytest
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from ready.data.chat import ChatTemplateError, prompt_ids, render, render_text, render_turns
from ready.data.conversations import ConversationError, load_conversations, parse_row
from ready.data.corpus import Doc
from ready.data.tokenizer import (CHAT_TEMPLATE, EOS_TOKEN, IM_END_TOKEN, IM_START_TOKEN, MASK_TOKEN,
                                  build_tokenizer, chat_token_ids, special_token_ids)

# ---------------------------------------------------------------------------------------------- loading

SYS, USER, ASST = ({"role": r} for r in ("system", "user", "assistant"))
SHAREGPT = {"conversations": [{"from": "system", "value": "Be brief"}, {"from": "human", "value": "Hi"},
                              {"from": "gpt", "value": "Hello"}, {"from": "human", "value": "More"},
                              {"from": "gpt", "value": "Sure"}]}
MESSAGES = {"messages": [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "More"},
                         {"role": "assistant", "content": "Sure"}]}
PERFECTBLEND = {**SHAREGPT, "source": "slimorca"}
PROMPT_RESPONSE = {"prompt": "Hi", "response": "Hello"}
NORMALISED = [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "Hi"},
              {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "More"},
              {"role": "assistant", "content": "Sure"}]
SHAPES = {"sharegpt": SHAREGPT, "messages": MESSAGES, "perfectblend": PERFECTBLEND, "prompt_response": PROMPT_RESPONSE}


def write(path: Path, rows: list) -> Path:
    """Rows into `path` in the container its name asks for."""
    if path.name.endswith(".parquet"):
        pl.DataFrame(rows).write_parquet(path)
        return path
    if ".jsonl" in path.name:
        text = "".join(json.dumps(r) + "\n" for r in rows)
    else:
        text = json.dumps(rows, indent=1)
    data = text.encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


@pytest.mark.parametrize("container", ["json", "jsonl", "jsonl.gz", "json.gz", "parquet"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_shape_loads_from_every_container(tmp_path: Path, shape: str, container: str) -> None:
    path = write(tmp_path / f"data.{container}", [SHAPES[shape]] * 3)
    convs, report = load_conversations(path)
    assert len(convs) == 3 and [c.row for c in convs] == [1, 2, 3] and convs[0].file == str(path)
    want = NORMALISED if shape != "prompt_response" else NORMALISED[1:3]
    assert all(c.messages == want for c in convs)
    assert [c.source for c in convs] == ["slimorca" if shape == "perfectblend" else None] * 3
    assert (report.rows_read, report.kept, report.skipped, dict(report.formats)) == (3, 3, 0, {shape: 3})


def test_forced_format_reads_only_that_shape(tmp_path: Path) -> None:
    path = write(tmp_path / "m.jsonl", [MESSAGES])
    assert load_conversations(path, format="messages")[0][0].messages == NORMALISED
    with pytest.raises(ConversationError, match=r"row 1 \(line 1\): 'conversations' is missing or null; expected a list"):
        load_conversations(path, format="sharegpt")
    with pytest.raises(ConversationError, match="format='chatml'; expected one of auto, sharegpt"):
        load_conversations(path, format="chatml")
    # Open-PerfectBlend needs its source; plain ShareGPT keeps one when a row has it
    with pytest.raises(ConversationError, match="'source' is missing or null; expected a string"):
        load_conversations(write(tmp_path / "s.jsonl", [SHAREGPT]), format="perfectblend")
    assert load_conversations(write(tmp_path / "p.jsonl", [PERFECTBLEND]), format="sharegpt")[0][0].source == "slimorca"


def test_folder_and_glob_read_their_files_in_sorted_order(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    write(tmp_path / "b.jsonl", [SHAREGPT])
    write(tmp_path / "sub" / "a.parquet", [PERFECTBLEND, PERFECTBLEND])
    write(tmp_path / "c.json", [PROMPT_RESPONSE])
    (tmp_path / "README.md").write_text("not data")
    (tmp_path / ".cache").mkdir()
    write(tmp_path / ".cache" / "x.jsonl", [{"bad": 1}])
    convs, report = load_conversations(tmp_path)
    assert [Path(f).name for f in report.files] == ["b.jsonl", "c.json", "a.parquet"]  # hidden folders skipped
    assert [(Path(c.file).name, c.row) for c in convs] == [("b.jsonl", 1), ("c.json", 1), ("a.parquet", 1),
                                                           ("a.parquet", 2)]
    convs, report = load_conversations(f"{tmp_path}/**/*.parquet")
    assert len(convs) == 2 and report.files == [str(tmp_path / "sub" / "a.parquet")]
    assert len(load_conversations(tmp_path, limit=3)[0]) == 3


BAD_ROW = {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]}


@pytest.mark.parametrize("name, content, expected, reason", [
    ("bad.jsonl", json.dumps(BAD_ROW) + '\n\n{"messages": [\n', r"bad\.jsonl: row 2 \(line 3\): not valid JSON .*expected one JSON "
     "object per line", "bad_json"),
    ("missing.jsonl", [BAD_ROW, {"id": 7}], r"missing\.jsonl: row 2 \(line 2\): fields \[id\] match no conversation "
     "shape; expected 'conversations'", "missing_field"),
    ("role.json", [BAD_ROW, {"conversations": [{"from": "human", "value": "Hi"}, {"from": "tool", "value": "x"}]}],
     r"role\.json: row 2: turn 2 has role 'tool'; expected system, user or assistant", "bad_role"),
    ("end.parquet", [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"},
                                   {"role": "user", "content": "And?"}]}],
     r"end\.parquet: row 1: the conversation ends with a 'user' turn \(turn 3\); expected it to end with an "
     "assistant turn", "no_final_assistant"),
    ("order.jsonl", [{"messages": [{"role": "user", "content": "Hi"}, {"role": "user", "content": "Hi"},
                                   {"role": "assistant", "content": "Yo"}]}],
     r"order\.jsonl: row 1 \(line 1\): turn 2 is 'user' \(after 'user'\); expected 'assistant'", "bad_order"),
    ("content.jsonl", [{"prompt": "Hi", "response": 3}], r"content\.jsonl: row 1 \(line 1\): 'response' is a int; "
     "expected a string", "bad_content"),
    ("list.jsonl", [[1, 2]], r"list\.jsonl: row 1 \(line 1\): a JSON list; expected an object", "not_object"),
])
def test_a_bad_row_is_one_line_naming_file_row_and_expectation_and_skip_counts_it(
        tmp_path: Path, name: str, content, expected: str, reason: str) -> None:
    path = tmp_path / name
    if isinstance(content, str):
        path.write_text(content)
    else:
        write(path, content)
    with pytest.raises(ConversationError, match=expected) as err:
        load_conversations(path)
    assert "\n" not in str(err.value) and err.value.reason == reason
    write(tmp_path / "good.jsonl", [SHAREGPT, SHAREGPT])
    convs, report = load_conversations(tmp_path, on_error="skip")
    assert len(convs) == report.kept == 2 + (name in ("bad.jsonl", "missing.jsonl", "role.json"))
    assert report.skipped == 1 and dict(report.reasons) == {reason: 1}
    assert report.metrics()[f"data/skipped/{reason}"] == 1.0 and report.metrics()["data/kept"] == report.kept
    assert len(report.errors) == 1 and str(path) in report.errors[0]


@pytest.mark.parametrize("name, content, expected", [
    ("empty.jsonl", "", r"empty\.jsonl: empty file; expected a JSON list of rows or JSON Lines"),
    ("blank.json.gz", gzip.compress(b"\n  \n", mtime=0), r"blank\.json\.gz: empty file"),
    ("broken.json", '[{"messages": []},', r"broken\.json: not valid JSON \(.* at line 1 column \d+\); expected a "
     "JSON list of row objects"),
    ("object.json", '{\n "data": []\n}\n', r"object\.json: one JSON object \(keys \['data'\]\); expected a JSON list"),
    ("nogzip.jsonl.gz", b"plain", r"nogzip\.jsonl\.gz: cannot be read .*; expected a readable gzip file"),
    ("noparquet.parquet", b"PAR1 junk", r"noparquet\.parquet: not a readable parquet file .*; expected a parquet"),
])
def test_a_bad_file_is_one_line_and_skip_mode_skips_the_file(tmp_path: Path, name: str, content, expected: str) -> None:
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ConversationError, match=expected) as err:
        load_conversations(path)
    assert "\n" not in str(err.value)
    write(tmp_path / "good.jsonl", [SHAREGPT])
    convs, report = load_conversations(tmp_path, on_error="skip")
    assert len(convs) == 1 and list(report.skipped_files) == [str(path)]
    assert report.metrics()["data/files_skipped"] == 1.0 and sum(report.reasons.values()) == 1


def test_nothing_to_read_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConversationError, match=r"\*\.jsonl: the glob matches no conversation files; expected files "
                                                r"ending in \.jsonl\.gz"):
        load_conversations(f"{tmp_path}/*.jsonl")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ConversationError, match="the folder holds no conversation files"):
        load_conversations(tmp_path)
    with pytest.raises(ConversationError, match=r"notes\.txt: unknown file type; expected a file ending in"):
        load_conversations(tmp_path / "notes.txt")
    with pytest.raises(ConversationError, match="nowhere: no such file or folder"):
        load_conversations(tmp_path / "nowhere")
    write(tmp_path / "all_bad.jsonl", [{"id": 1}, {"id": 2}])
    with pytest.raises(ConversationError, match=r"no usable conversations \(0 conversations from 2 rows in 1 files "
                                                r"\(2 row\(s\) and 0 file\(s\) skipped\); skipped: missing_field 2\)"):
        load_conversations(tmp_path, on_error="skip")


def test_parse_row_works_on_in_memory_rows() -> None:
    assert parse_row({"conversations": [{"role": "user", "content": "a"}, {"from": "gpt", "value": "b"}]}) == (
        "sharegpt", [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], None)
    with pytest.raises(ConversationError, match="no user or assistant turns") as err:
        parse_row({"messages": [{"role": "system", "content": "s"}]})
    assert err.value.reason == "empty"
    with pytest.raises(ConversationError, match="turn 3 is 'system' .*system turns only at the start"):
        parse_row({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                {"role": "system", "content": "s"}, {"role": "user", "content": "c"}]})


# ---------------------------------------------------------------------------------------------- chat

WORDS = [EOS_TOKEN, MASK_TOKEN, IM_START_TOKEN, IM_END_TOKEN, "[UNK]", "system", "user", "assistant", "\n", " ",
         "<think>", "</think>", "Be", "brief", "Hi", "Hello", "there", "More", "Sure", "hmm"]


def word_tokenizer(template: str = CHAT_TEMPLATE) -> PreTrainedTokenizerFast:
    """One id per word, newline, space and think tag: masks can be written out token by token."""
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"</?think>|\n| |[^\s<]+|<"), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, mask_token=MASK_TOKEN, unk_token="[UNK]",
                                   additional_special_tokens=[IM_START_TOKEN, IM_END_TOKEN], chat_template=template)


def spelled(tok, sample) -> list[tuple[str, bool]]:
    return [(WORDS[i], m) for i, m in zip(sample.ids, sample.mask)]


def turn(role: str, *words: str) -> list[tuple[str, bool]]:
    """A rendered ChatML turn, (token, mask) pairs; `words` of an assistant turn are masked with its <|im_end|>."""
    a = role == "assistant"
    return ([(IM_START_TOKEN, False), (role, False), ("\n", False)] + [(w, a) for w in words]
            + [(IM_END_TOKEN, a), ("\n", False)])


THINK_OFF = ["<think>", "\n", "\n", "</think>", "\n", "\n"]  # the empty think block, template text
CHAT = [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello there"}, {"role": "user", "content": "More"},
        {"role": "assistant", "content": "Sure"}]


def off(words: list[str]) -> list[str]:
    return THINK_OFF + words


def test_mask_single_turn_with_system_token_by_token() -> None:
    tok = word_tokenizer()
    on = render(tok, CHAT[:3], thinking=True)
    assert spelled(tok, on) == (turn("system", "Be", " ", "brief") + turn("user", "Hi")
                                + turn("assistant", "Hello", " ", "there"))
    no = render(tok, CHAT[:3], thinking=False)
    header = [(IM_START_TOKEN, False), ("assistant", False), ("\n", False)] + [(w, False) for w in THINK_OFF]
    assert spelled(tok, no) == (turn("system", "Be", " ", "brief") + turn("user", "Hi") + header
                                + [("Hello", True), (" ", True), ("there", True), (IM_END_TOKEN, True), ("\n", False)])
    assert not on.truncated and on.n_assistant == 4 and no.n_assistant == 4


@pytest.mark.parametrize("thinking", [True, False])
def test_mask_multi_turn_with_system_token_by_token(thinking: bool) -> None:
    tok = word_tokenizer()
    sample = render(tok, CHAT, thinking=thinking)
    pre = [] if thinking else [(w, False) for w in THINK_OFF]

    def reply(*words: str) -> list[tuple[str, bool]]:
        return ([(IM_START_TOKEN, False), ("assistant", False), ("\n", False)] + pre + [(w, True) for w in words]
                + [(IM_END_TOKEN, True), ("\n", False)])

    assert spelled(tok, sample) == (turn("system", "Be", " ", "brief") + turn("user", "Hi") + reply("Hello", " ", "there")
                                    + turn("user", "More") + reply("Sure"))


@pytest.mark.parametrize("thinking", [True, False])
def test_prompt_ids_end_with_the_generation_prompt_and_start_the_rendered_sample(thinking: bool) -> None:
    tok = word_tokenizer()
    ids = prompt_ids(tok, CHAT[:2], thinking)
    tail = ["<|im_start|>", "assistant", "\n"] + ([] if thinking else THINK_OFF)
    assert [WORDS[i] for i in ids[-len(tail):]] == tail
    sample = render(tok, CHAT[:3], thinking)
    assert sample.ids[:len(ids)] == ids and not any(sample.mask[:len(ids)]) and all(sample.mask[len(ids):-1])
    with pytest.raises(ChatTemplateError, match="ending with an assistant turn; expected the messages before"):
        prompt_ids(tok, CHAT[:3], thinking)


# A Qwen3-like template: an assistant turn that is not the last message loses its think block.
STRIPPING = (
    "{%- for m in messages %}{%- set c = m['content'] %}"
    "{%- if m['role'] == 'assistant' and not loop.last %}{%- set c = c.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + c + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def test_a_template_that_re_renders_earlier_turns_is_refused_and_render_turns_handles_it() -> None:
    tok = word_tokenizer(STRIPPING)
    chat = [CHAT[1], {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello"}, CHAT[3], CHAT[4]]
    with pytest.raises(ChatTemplateError, match=r"the render of messages\[:2\] .* is not a prefix of the longer render: "
                                                r"they part at character \d+ .*use render_turns") as err:
        render(tok, chat, thinking=True)
    assert "\n" not in str(err.value)
    first, second = render_turns(tok, chat, thinking=True)
    assert spelled(tok, first) == turn("user", "Hi") + turn("assistant", "<think>", "\n", "hmm", "\n", "</think>",
                                                            "\n", "\n", "Hello")
    assert spelled(tok, second) == (turn("user", "Hi") + [(t, False) for t, _ in turn("assistant", "Hello")]
                                    + turn("user", "More") + turn("assistant", "Sure"))
    # a single turn has nothing earlier to re-render: render works and equals render_turns
    assert render(tok, chat[:2], thinking=True) == first


def test_a_generation_prompt_that_does_not_start_the_assistant_turn_is_one_line() -> None:
    tok = word_tokenizer(CHAT_TEMPLATE.replace("{{- '<|im_start|>assistant\\n' }}", "{{- '<|im_start|>user\\n' }}"))
    with pytest.raises(ChatTemplateError, match=r"the generation prompt after messages\[:2\] is not a prefix .*"
                                                r"expected the template to start an assistant turn"):
        render(tok, CHAT[:3], thinking=True)


def test_truncation_policies() -> None:
    tok = word_tokenizer()
    whole = render(tok, CHAT, thinking=True)
    n = len(whole.ids)
    right = render(tok, CHAT, thinking=True, max_len=10, truncate="right")
    assert (right.ids, right.mask, right.truncated) == (whole.ids[:10], whole.mask[:10], True)
    left = render(tok, CHAT, thinking=True, max_len=6, truncate="left")
    assert (left.ids, left.mask, left.truncated) == (whole.ids[-6:], whole.mask[-6:], True)
    assert spelled(tok, left)[-3:] == [("Sure", True), (IM_END_TOKEN, True), ("\n", False)]
    assert right.n_assistant == 0  # the system and user turns only: nothing to train
    assert render(tok, CHAT, thinking=True, max_len=n - 1, truncate="drop") is None
    assert render(tok, CHAT, thinking=True, max_len=n, truncate="drop") == whole
    assert [s is None for s in render_turns(tok, CHAT, True, max_len=n - 1, truncate="drop")] == [False, True]
    with pytest.raises(ChatTemplateError, match="truncate='middle'; expected one of right, left, drop"):
        render(tok, CHAT, thinking=True, max_len=4, truncate="middle")


def test_bad_messages_and_missing_template_are_one_line() -> None:
    with pytest.raises(ChatTemplateError, match="has no chat template; expected a tokenizer whose tokenizer_config"):
        render(word_tokenizer(template=None), CHAT, thinking=True)
    with pytest.raises(ChatTemplateError, match="no assistant turn"):
        render(word_tokenizer(), CHAT[:2], thinking=True)
    with pytest.raises(ChatTemplateError, match=r"message 2 is .*; expected \{'role': str, 'content': str\}"):
        render_text(word_tokenizer(), [CHAT[0], {"role": "user", "content": None}], thinking=True)


# ---------------------------------------------------------------------------------------------- default tokenizer

DOCS = [Doc(f"m{i}.py", f"def function_{i}(value):\n\n    return value * {i} + len('text')\n\n\nclass Thing{i}:\n    pass\n")
        for i in range(40)]


def test_the_chat_variant_of_the_default_tokenizer_keeps_its_ids_and_carries_the_template(tmp_path: Path) -> None:
    ids = build_tokenizer(DOCS, 320, tmp_path, chat=True)
    assert ids == {"eos_token_id": 0, "pad_token_id": 0, "mask_token_id": 1, "im_start_token_id": 2,
                   "im_end_token_id": 3, "vocab_size": 320}
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["chat_template"] == CHAT_TEMPLATE
    assert not (tmp_path / "chat_template.jinja").exists()  # the template travels in the copied config files
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    assert len(tok) == 320 and special_token_ids(tok) == {"eos_token_id": 0, "pad_token_id": 0, "mask_token_id": 1}
    assert chat_token_ids(tok) == {"im_start_token_id": 2, "im_end_token_id": 3}
    for thinking in (True, False):
        sample = render(tok, CHAT, thinking)
        said = [tok.decode([i]) for i, m in zip(sample.ids, sample.mask) if m]
        assert "".join(said) == "Hello there<|im_end|>Sure<|im_end|>"
        assert tok.decode(sample.ids) == render_text(tok, CHAT, thinking)
        assert sample.ids[:len(prompt_ids(tok, CHAT[:2], thinking))] == prompt_ids(tok, CHAT[:2], thinking)
    build_tokenizer(DOCS, 320, tmp_path / "plain")
    plain = AutoTokenizer.from_pretrained(str(tmp_path / "plain"))
    with pytest.raises(ValueError, match="has no <\\|im_start\\|> / <\\|im_end\\|> tokens"):
        chat_token_ids(plain)
