"""The default tokenizer: byte-level BPE saved in Hugging Face format with EOS/pad and mask."""

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from ready.data.corpus import Doc
from ready.data.tokenizer import EOS_TOKEN, MASK_TOKEN, build_tokenizer, train_bpe

DOCS = [Doc(f"m{i}.py", f"def function_{i}(value):\n    return value * {i} + len('text')\n\n\nclass Thing{i}:\n    pass\n")
        for i in range(40)]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tok")
    build_tokenizer(DOCS, 320, out)
    return out


def test_saved_folder_loads_with_auto_tokenizer_and_knows_its_special_tokens(tok_dir: Path) -> None:
    assert {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} <= {p.name for p in tok_dir.iterdir()}
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    assert tok.eos_token == EOS_TOKEN and tok.pad_token == EOS_TOKEN and tok.mask_token == MASK_TOKEN
    assert (tok.eos_token_id, tok.mask_token_id) == (0, 1)
    assert tok.pad_token_id == tok.eos_token_id
    assert not getattr(tok, "chat_template", None)
    assert len(tok) == 320


def test_any_text_round_trips_through_the_byte_level_bpe(tok_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    text = "def function_3(value):\n\treturn 'héllo ✓ 世界'  # unseen bytes too\r\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text
    assert len(ids) < len(text.encode())  # merges were learned


def test_special_tokens_are_single_ids_in_text(tok_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    ids = tok(f"x = 1{EOS_TOKEN}{MASK_TOKEN}", add_special_tokens=False)["input_ids"]
    assert ids[-2:] == [0, 1]


def test_too_small_a_vocabulary_is_refused() -> None:
    with pytest.raises(ValueError, match="corpus.vocab_size"):
        train_bpe(DOCS, 100)
