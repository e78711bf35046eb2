"""Byte-level BPE tokenizer of the embedded default, trained on the corpus's train split.

Saved as a Hugging Face tokenizer folder (`tokenizer.json`, `tokenizer_config.json`,
`special_tokens_map.json`) that `transformers.AutoTokenizer.from_pretrained(dir)` loads. Special
tokens: `<|endoftext|>` (EOS, also used as padding and between documents) and `<|mask|>` (the
drafter's mask token). It has no chat template: prompts of the embedded default are plain text.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

from ready.data.corpus import Doc

EOS_TOKEN = "<|endoftext|>"
MASK_TOKEN = "<|mask|>"
SPECIAL_TOKENS = (EOS_TOKEN, MASK_TOKEN)  # ids 0 and 1, in this order


def train_bpe(docs: Iterable[Doc], vocab_size: int) -> Any:
    """Train a byte-level BPE (`tokenizers.Tokenizer`) on the documents' texts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 256 + len(SPECIAL_TOKENS) + 1:
        raise ValueError(f"bad value at key 'corpus.vocab_size': {vocab_size}; expected at least 259 "
                         "(256 bytes + special tokens + one merge)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((d.text for d in docs), trainer=trainer)
    return tok


def save_hf_tokenizer(tok: Any, out_dir: str | os.PathLike) -> dict[str, int]:
    """Write `tok` as a Hugging Face tokenizer folder; return the special token ids."""
    from transformers import PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN,
                                   mask_token=MASK_TOKEN, clean_up_tokenization_spaces=False)
    fast.model_max_length = 1 << 20
    fast.save_pretrained(str(out))
    ids = special_token_ids(fast)
    special_map = {"eos_token": EOS_TOKEN, "pad_token": EOS_TOKEN, "mask_token": MASK_TOKEN}
    (out / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")
    return ids


def special_token_ids(tokenizer: Any) -> dict[str, int]:
    """Ids of EOS, pad and mask in a loaded Hugging Face tokenizer."""
    return {"eos_token_id": int(tokenizer.convert_tokens_to_ids(EOS_TOKEN)),
            "pad_token_id": int(tokenizer.convert_tokens_to_ids(EOS_TOKEN)),
            "mask_token_id": int(tokenizer.convert_tokens_to_ids(MASK_TOKEN))}


def load_tokenizer(path: str | os.PathLike) -> Any:
    """Load a saved tokenizer folder with `transformers.AutoTokenizer`."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def build_tokenizer(docs: Iterable[Doc], vocab_size: int, out_dir: str | os.PathLike) -> dict[str, int]:
    """Train on `docs` and save to `out_dir` (plus `special_tokens.json` with the ids)."""
    tok = train_bpe(docs, vocab_size)
    ids = save_hf_tokenizer(tok, out_dir)
    ids["vocab_size"] = tok.get_vocab_size()
    (Path(out_dir) / "special_tokens.json").write_text(json.dumps(ids, indent=2) + "\n")
    return ids
