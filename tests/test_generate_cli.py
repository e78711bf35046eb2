"""`python -m sweeps.commands.generate`: generates, reports per-prompt metrics as JSON, and turns bad input
into one clear line on stderr."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ready.decode import Engine
from ready.metrics import survival
from ready.target import HybridConfig, HybridLM, save_target
from sweeps.commands.generate import main

torch.set_num_threads(1)  # tiny models: one thread beats two on a shared machine
WORDS = ["<eos>", "the", "cat", "sat", "on", "mat", "a", "dog", "ran", "to"]


def word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> tuple[Path, HybridLM]:
    torch.manual_seed(3)
    cfg = HybridConfig(
        vocab_size=len(WORDS), hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, linear_num_key_heads=1, linear_num_value_heads=2,
        linear_key_head_dim=8, linear_value_head_dim=8, max_position_embeddings=64,
    )
    model = HybridLM(cfg).eval()
    path = save_target(model, tmp_path_factory.mktemp("cli") / "target", tokenizer=word_tokenizer())
    return path, model


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args) + ["target.device=cpu"])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_ar_json_reports_the_greedy_tokens(ckpt, capsys):
    path, model = ckpt
    code, out, err = run_cli(capsys, "--target", str(path), "--method", "ar", "--prompt-ids", "1,2,3",
                             "--max-new-tokens", "10", "--json")
    assert code == 0, err
    report = json.loads(out)
    (r,) = report["results"]
    assert r["token_ids"] == Engine(model).generate([1, 2, 3], 10).tokens
    assert r["new_tokens"] == len(r["token_ids"]) and r["tau"] == 1.0 and r["tps"] > 0
    assert r["text"] == " ".join(WORDS[t] for t in r["token_ids"])


def test_ngram_with_lossless_check_over_a_prompts_file(ckpt, capsys, tmp_path):
    path, model = ckpt
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt_ids": [1, 2, 3, 1, 2]}\n{"prompt": "the cat sat on the"}\n[4, 5]\n\n"a dog ran"\n')
    code, out, err = run_cli(capsys, "--target", str(path), "--method", "ngram", "drafter.proposals=3", "--prompts", str(prompts),
                             "--max-new-tokens", "12", "--json", "--check-lossless")
    assert code == 0, err
    report = json.loads(out)
    assert report["lossless"] == 1 and report["mismatch"] is None and report["proposals"] == 3
    assert [r["prompt_len"] for r in report["results"]] == [5, 5, 2, 3]
    for r, prompt in zip(report["results"], [[1, 2, 3, 1, 2], [1, 2, 3, 4, 1], [4, 5], [6, 7, 8]]):
        assert r["token_ids"] == Engine(model).generate(prompt, 12).tokens
        assert len(r["accepted"]) == len(r["horizons"]) >= 1
        assert r["tau"] == pytest.approx(1 + sum(survival(r["accepted"], r["horizons"], 3)))  # ready.metrics.tau
    assert report["summary"]["new_tokens"] == sum(r["new_tokens"] for r in report["results"])


def test_text_output_names_method_and_throughput(ckpt, capsys):
    path, _ = ckpt
    code, out, _ = run_cli(capsys, "--target", str(path), "--method", "ngram", "--prompt", "the cat",
                           "--max-new-tokens", "6")
    assert code == 0
    assert "prompt 0 (2 tokens) -> 6 new tokens" in out and "=== ngram: 6 tokens" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--method", "ar", "--prompt-ids", ""], "prompt 0: prompt is empty"),
        (["--method", "ar", "--prompt-ids", "1,x"], "expected comma-separated integers"),
        (["--method", "ar", "--prompt-ids", ",".join(["1"] * 60)], "exceeds the model's context of 64 tokens"),
        (["--method", "ngram", "drafter.proposals=0", "--prompt-ids", "1"],
         "command line: bad value at key 'drafter.proposals': 0; expected an integer >= 1"),
        (["--method", "dspark", "--prompt-ids", "1"], "--method dspark needs a drafter checkpoint (--drafter PATH)"),
        (["--method", "ready", "--drafter", "/nonexistent", "--prompt-ids", "1"], "no drafter checkpoint here"),
        (["--method", "ar", "--prompts", "/nonexistent.jsonl"], "no such file"),
    ],
)
def test_bad_input_ends_in_one_clear_line(ckpt, capsys, args, message):
    path, _ = ckpt
    code, out, err = run_cli(capsys, "--target", str(path), "--max-new-tokens", "8", *args)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_bad_jsonl_line_is_named(ckpt, capsys, tmp_path):
    path, _ = ckpt
    bad = tmp_path / "bad.jsonl"
    bad.write_text('[1, 2]\n{"prompt_ids": "oops"}\n')
    code, _, err = run_cli(capsys, "--target", str(path), "--method", "ar", "--prompts", str(bad), "--max-new-tokens", "4")
    assert code == 2 and "line 2" in err


def test_text_prompt_without_tokenizer_is_refused(capsys):
    code, _, err = run_cli(capsys, "--target", "tiny", "--method", "ar", "--prompt", "hello", "--max-new-tokens", "4")
    assert code == 2 and "needs a tokenizer" in err


def test_module_entry_point(ckpt):
    path, _ = ckpt
    proc = subprocess.run(
        [sys.executable, "-m", "sweeps.commands.generate", "--target", str(path), "--method", "ngram",
         "--prompt-ids", "1,2", "--max-new-tokens", "5", "target.device=cpu", "--threads", "1", "--json"],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parent.parent,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["results"][0]["new_tokens"] == 5


# --- the typed config is the command line: `a.b=v` overrides, parsed and checked as `sweeps.run` does them ---

def confident_drafter(model: HybridLM, folder: Path) -> Path:
    """A DSpark drafter with a confidence head for the word-level target, saved as a checkpoint."""
    from ready.config import DrafterConfig, ReaderConfig
    from ready.drafter import DSparkDrafter, save_drafter

    torch.manual_seed(0)
    drafter = DSparkDrafter(DrafterConfig(proposals=3, num_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                          head_dim=16, intermediate_size=32, mask_token_id=1, context_layers=[0, 2],
                                          layer_space="model", head="vanilla", head_rank=4, confidence_head=True),
                            ReaderConfig(enabled=False), model)
    save_drafter(drafter, folder)
    return folder


def test_a_verify_schedule_override_reaches_the_engine(ckpt, capsys, tmp_path, monkeypatch):
    import sweeps.commands.generate as generate

    path, model = ckpt
    drafter = confident_drafter(model, tmp_path / "dspark")
    seen = []

    class Spy(Engine):
        def __init__(self, *args, **kwargs):
            seen.append(kwargs["verify_schedule"])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(generate, "Engine", Spy)
    code, out, err = run_cli(capsys, "--target", str(path), "--drafter", str(drafter), "--method", "dspark",
                             "--prompt-ids", "1,2,3", "--max-new-tokens", "8", "--json",
                             "eval.verify_schedule=confidence", "eval.confidence_threshold=0.25")
    assert code == 0, err
    (schedule,) = seen
    assert (schedule.kind, schedule.threshold, schedule.budget) == ("confidence", 0.25, 0.0)
    report = json.loads(out)
    assert report["verify_schedule"] == "confidence" and report["confidence_threshold"] == 0.25
    assert report["results"][0]["token_ids"] == Engine(model).generate([1, 2, 3], 8).tokens  # still greedy


def test_overrides_set_the_budget_the_warm_up_and_the_ngram_proposals(ckpt, capsys):
    path, model = ckpt
    code, out, err = run_cli(capsys, "--target", str(path), "--method", "ngram", "--prompt-ids", "1,2,3", "--json",
                             "eval.max_new_tokens=7", "eval.warmup_rounds=0", "drafter.proposals=2")
    assert code == 0, err
    report = json.loads(out)
    assert report["max_new_tokens"] == 7 and report["proposals"] == 2
    assert report["results"][0]["token_ids"] == Engine(model).generate([1, 2, 3], 7).tokens


@pytest.mark.parametrize("args, message", [
    (["drafter.proposal=3"], "error: command line: bad value at key 'drafter.proposal': Key 'proposal' not in "
                             "'DrafterConfig'. Did you mean one of: 'proposals', 'rope_scaling'?"),
    (["eval.warmup_rounds=-3"], "error: command line: bad value at key 'eval.warmup_rounds': -3; expected an "
                                "integer >= 0 (untimed warm-up generations)"),
    (["target.dtype=float8"], "error: command line: bad value at key 'target.dtype': 'float8'; expected float32, "
                              "bfloat16 or float16"),
    (["reader.rank"], "error: override 'reader.rank': expected KEY=VALUE (e.g. reader.rank=16)"),
    (["--max-new-tokens", "4", "eval.max_new_tokens=5"],
     "error: --max-new-tokens 4 and eval.max_new_tokens=5: the flag sets that key; give one of the two"),
])
def test_a_bad_override_is_one_line_naming_the_key(ckpt, capsys, args, message):
    path, _ = ckpt
    code, out, err = run_cli(capsys, "--target", str(path), "--method", "ar", "--prompt-ids", "1,2", *args)
    assert code == 2 and out == "" and err == message + "\n"


@pytest.mark.parametrize("flag, override", [
    (["-k", "6"], "drafter.proposals=6"), (["--proposals", "6"], "drafter.proposals=6"),
    (["--device", "cuda"], "target.device=cuda"), (["--dtype", "bfloat16"], "target.dtype=bfloat16"),
    (["--exact"], "eval.exact=on"), (["--no-exact"], "eval.exact=off"), (["--warmup", "2"], "eval.warmup_rounds=2"),
])
def test_a_removed_flag_names_the_override_that_replaces_it(ckpt, capsys, flag, override):
    path, _ = ckpt
    code, out, err = run_cli(capsys, "--target", str(path), "--method", "ngram", "--prompt-ids", "1,2", *flag)
    assert code == 2 and out == ""
    assert err == f"error: {' '.join(flag)}: this flag is gone; the config says it: {override} (a key=value " \
                  "override, as python -m sweeps.run takes them)\n"
