"""Turns files (DeepSpec's eval_datasets/*.jsonl: one `{"turns": [...]}` per line) as benchmark suites:
the first turn (or, with bench.turns=all, every user turn) through the chat template, one line for a bad
record, and a sweep row evaluated end to end on such files with a tiny target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from ready.config import BenchmarkConfig, ConfigError, DrafterConfig, ReaderConfig, validate
from ready.data.benchmarks import BenchmarkError, load_suite
from ready.data.corpus import Doc
from ready.data.tokenizer import build_tokenizer

FIXTURES = Path(__file__).parent / "fixtures" / "benchmarks"
GSM8K = FIXTURES / "deepspec_gsm8k.jsonl"  # DeepSpec's shape: {"turns": [question + its reasoning suffix]}
MTBENCH = FIXTURES / "deepspec_mt-bench.jsonl"  # two turns a record, no question_id (as DeepSpec's mt-bench.jsonl)


def turns_of(path: Path) -> list[list[str]]:
    return [json.loads(line)["turns"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def chat(tmp_path_factory: pytest.TempPathFactory):
    """The embedded default's tokenizer kind: byte-level BPE with its ChatML template (thinking switch)."""
    text = "".join(json.dumps(f.read_text()) for f in sorted(FIXTURES.iterdir()))
    out = tmp_path_factory.mktemp("chat_tok")
    build_tokenizer([Doc("fixtures", text * 3)], 400, out, chat=True)
    return AutoTokenizer.from_pretrained(str(out))


def bench(**kw) -> BenchmarkConfig:
    return OmegaConf.structured(BenchmarkConfig(**kw))


def rendered(tokenizer, turns: list[str], thinking: bool = False) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": t} for t in turns], tokenize=False,
                                         add_generation_prompt=True, enable_thinking=thinking)


def test_a_turns_file_poses_each_first_turn_verbatim_through_the_chat_template(chat) -> None:
    """A DeepSpec gsm8k.jsonl under the gsm8k suite: each prompt is the chat template around the first turn,
    exactly (no stripping, no added newline), so the token ids equal DeepSpec's encoding of the same file."""
    prompts = load_suite("gsm8k", bench(paths={"gsm8k": str(GSM8K)}, max_prompt_tokens=0), chat)
    turns = turns_of(GSM8K)
    assert [p.id for p in prompts] == ["gsm8k/0", "gsm8k/1", "gsm8k/2"]  # no question_id: the record index
    for p, t in zip(prompts, turns):
        assert p.text == rendered(chat, t[:1])
        assert p.ids == chat(rendered(chat, t[:1]), add_special_tokens=False)["input_ids"]
        assert "\\boxed{}." in p.text and p.text.endswith("<think>\n\n</think>\n\n")  # bench.thinking off


def test_mtbench_and_any_other_name_read_turns_files_first_turn_only(chat) -> None:
    first = load_suite("mtbench", bench(paths={"mtbench": str(MTBENCH)}, max_prompt_tokens=0), chat)
    other = load_suite("mt-bench", bench(paths={"mt-bench": str(MTBENCH)}, max_prompt_tokens=0), chat)
    assert [p.ids for p in first] == [p.ids for p in other]
    assert [p.id for p in other] == ["mt-bench/0", "mt-bench/1"]
    assert [p.text for p in first] == [rendered(chat, t[:1]) for t in turns_of(MTBENCH)]
    assert "four-line poem" not in first[0].text
    with pytest.raises(BenchmarkError, match=r"unknown benchmark 'aime25'.*bench.paths.<name>"):
        load_suite("aime25", bench(), chat)  # a name outside the seven needs its file
    with pytest.raises(BenchmarkError, match=r"unknown benchmark 'a/b'"):
        load_suite("a/b", bench(paths={"a/b": str(MTBENCH)}), chat)  # not a metric prefix


def test_bench_turns_all_poses_every_user_turn_with_no_assistant_turn(chat, tmp_path: Path) -> None:
    prompts = load_suite("mtbench", bench(paths={"mtbench": str(MTBENCH)}, max_prompt_tokens=0, turns="all"), chat)
    for p, t in zip(prompts, turns_of(MTBENCH)):
        assert p.text == rendered(chat, t) and p.text.count("<|im_start|>user\n") == 2
        assert p.text.count("<|im_start|>assistant") == 1  # only the generation prompt: no invented answers
        assert p.text.index(t[0]) < p.text.index(t[1])
    # a one-turn file reads the same either way
    one = {"gsm8k": str(GSM8K)}
    assert load_suite("gsm8k", bench(paths=one, turns="all"), chat) == load_suite("gsm8k", bench(paths=one), chat)
    # without a chat template: the turns as plain text, joined by a blank line
    chat.save_pretrained(str(tmp_path))
    plain = AutoTokenizer.from_pretrained(str(tmp_path))
    plain.chat_template = None
    t = turns_of(MTBENCH)[0]
    p = load_suite("mtbench", bench(paths={"mtbench": str(MTBENCH)}, max_prompt_tokens=0, turns="all"), plain)[0]
    assert p.text == f"{t[0]}\n\n{t[1]}\n"


def test_a_template_that_refuses_consecutive_user_turns_is_one_line(chat, tmp_path: Path) -> None:
    chat.save_pretrained(str(tmp_path))
    strict = AutoTokenizer.from_pretrained(str(tmp_path))
    strict.chat_template = ("{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
                            "{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}"
                            "<|{{ m.role }}|>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<|assistant|>"
                            "{% endif %}")
    assert load_suite("mtbench", bench(paths={"mtbench": str(MTBENCH)}), strict)  # first turn: fine
    with pytest.raises(BenchmarkError) as err:
        load_suite("mtbench", bench(paths={"mtbench": str(MTBENCH)}, turns="all"), strict)
    msg = str(err.value)
    assert "\n" not in msg and str(MTBENCH) in msg and "record 0" in msg and "must alternate" in msg
    assert "bench.turns=first" in msg


@pytest.mark.parametrize("row, problem", [
    ({"question_id": 7, "category": "math"}, "record 1 lacks field 'turns'"),
    ({"turns": []}, "record 1: field 'turns' holds [] (list), not a non-empty list of strings"),
    ({"turns": "one string"}, "record 1: field 'turns' holds \"one string\" (str), not a non-empty list"),
    ({"turns": ["fine", 5]}, "record 1: turns[1] holds 5 (int), not a non-empty string"),
    ({"turns": ["  "]}, "record 1: turns[0] holds \"  \" (str), not a non-empty string"),
])
def test_a_bad_record_of_a_turns_file_is_one_line_naming_file_record_and_shape(chat, tmp_path: Path, row: dict,
                                                                              problem: str) -> None:
    path = tmp_path / "gsm8k.jsonl"
    path.write_text(json.dumps({"turns": ["a good question"]}) + "\n" + json.dumps(row) + "\n")
    for name in ("gsm8k", "mtbench", "aime25"):  # a public suite's file, mtbench's, a DeepSpec-only name
        with pytest.raises(BenchmarkError) as err:
            load_suite(name, bench(paths={name: str(path)}), chat)
        msg = str(err.value)
        assert "\n" not in msg and f"benchmark '{name}': file {str(path)!r} is malformed" in msg
        assert problem in msg and "expected" in msg and "'turns', a non-empty list of non-empty strings" in msg


def test_a_public_file_without_turns_still_reads_and_names_the_turns_alternative(chat, tmp_path: Path) -> None:
    assert len(load_suite("gsm8k", bench(paths={"gsm8k": str(FIXTURES / "gsm8k_test.jsonl")}), chat)) == 3
    wrong = tmp_path / "test.jsonl"
    wrong.write_text('{"prompt": "a question under another name"}\n')
    with pytest.raises(BenchmarkError, match=r"record 0 lacks field 'question'.*or a turns file"):
        load_suite("gsm8k", bench(paths={"gsm8k": str(wrong)}), chat)


def test_bench_turns_is_a_validated_config_key() -> None:
    from sweeps.spec import load_sweep

    cfg = load_sweep("rank", ["bench.turns=all"]).common
    assert cfg.bench.turns == "all"
    cfg.bench.turns = "both"
    with pytest.raises(ConfigError, match=r"bench.turns.*expected first or all"):
        validate(cfg)


def test_a_sweep_row_evaluates_deepspec_files_end_to_end(chat) -> None:
    """A DSpark row of the rank sweep (smoke profile) on two DeepSpec-shaped suites, through sweeps.row's
    loading and evaluation, on a tiny random target of the tokenizer's vocabulary: lossless, every prompt
    decoded, the metrics under each DeepSpec name."""
    from ready.decode import run_ar
    from ready.drafter import DSparkDrafter
    from ready.loading import LoadedTarget
    from ready.target import HybridConfig, HybridLM
    from sweeps.row import _evaluate, _suites
    from sweeps.spec import load_sweep

    budget = 8
    cfg = load_sweep("rank", ["profile=smoke", "eval.heldout_tf_samples=0", f"eval.max_new_tokens={budget}",
                              "eval.warmup_rounds=0", "bench.limit=4", "bench.suites=[gsm8k,mt-bench]",
                              f"bench.paths.gsm8k={GSM8K}", f"bench.paths.mt-bench={MTBENCH}"]).common
    suites = _suites(cfg, chat)
    assert list(suites) == ["gsm8k", "mt-bench"] and [len(v) for v in suites.values()] == [3, 2]
    assert suites["mt-bench"][0] == chat(rendered(chat, turns_of(MTBENCH)[0][:1]),
                                         add_special_tokens=False)["input_ids"][-int(cfg.bench.max_prompt_tokens):]
    torch.manual_seed(5)
    target = HybridLM(HybridConfig(vocab_size=len(chat), hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                   num_attention_heads=2, num_key_value_heads=1, head_dim=16, linear_num_key_heads=1,
                                   linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
                                   max_position_embeddings=256)).eval()
    torch.manual_seed(6)
    drafter = DSparkDrafter(DrafterConfig(proposals=3, num_layers=1, head_rank=8), ReaderConfig(enabled=False),
                            target).eval()
    loaded = LoadedTarget(target=target, tokenizer=chat, eos=None, target_path="tiny (test)", device="cpu")
    ar = {name: run_ar(target, prompts, budget, warmup=0, progress=False) for name, prompts in suites.items()}
    record = _evaluate(cfg, "dspark", loaded, drafter, suites, ar, progress=False)
    assert set(record["benchmarks"]) == {"gsm8k", "mt-bench"}
    for name, prompts in suites.items():
        b = record["benchmarks"][name]
        assert b["lossless"] == 1 and len(b["prompts"]) == len(prompts)
        assert b["metrics"]["new_tokens"] == budget * len(prompts) and b["metrics"]["tau"] >= 1
