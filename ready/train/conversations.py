"""Training data from a conversation dataset: every assistant turn answered anew by the target.

The paper (and DeepSpec, SpecForge) trains on conversations whose responses the target itself
regenerated, rendered with the target's own chat template, with the loss on assistant tokens only:

1. `ready.data.conversations` reads `data.path` (ShareGPT, OpenAI messages, Open-PerfectBlend rows,
   prompt/response pairs) and `regen.num_samples` conversations are drawn with `regen.seed`;
2. with `data.responses: regenerate`, the assistant turns are answered anew turn by turn, each
   conditioned on the turns before it as regenerated, through the batched engine (`regen.batch_size`
   slots): greedy, or sampled (`regen.temperature`, `regen.top_p`, one seed per turn, so a turn's answer
   does not depend on the batch it was decoded in); a turn stops at the template's end-of-turn token or after
   `regen.response_len` tokens;
3. each conversation is rendered with the tokenizer's chat template (`bench.thinking`, as evaluation
   renders its prompts) into token ids and an assistant-token mask (`ready.data.chat`), truncated to
   `regen.prompt_len + regen.response_len` tokens, and the rows are padded into one `RegenData`
   whose `loss_mask` holds the assistant tokens.

The result is an artifact like the prompt-regenerated data (`<artifacts>/regen/<hash>/`), keyed by the
files' contents, the data and regen settings, the chat template, the thinking switch and the target.

Regeneration is cut into chunks of `regen.batch_size` conversations (ready.train.regen_chunks). Under
data-parallel training (ready.train.distributed) rank r regenerates chunks r, r+N, ... of those not yet
done, and the chunks are gathered to every rank; a chunk holds the same conversations whatever N is, and
a sampled turn's seed depends on its conversation's place in the whole set, so the data equal one
process's. Each finished chunk is written at once (temp file + rename, with the spec hash it belongs to)
to `<artifacts>/regen/<hash>.work/`, so a killed build continues from its finished chunks; a chunk that
is unreadable, of another spec or of another shape is regenerated. Rank 0 writes the artifact and then
removes the work folder.

Regenerated text is re-tokenized by the template: the trained tokens are the target's words as the
template renders them, which may differ from the ids it sampled at a token boundary.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from tqdm.auto import tqdm

from ready.artifacts import artifact_dir, cached, intact, spec_threads
from ready.config import config_hash, to_container
from ready.data.chat import prompt_ids, render
from ready.data.training_chats import conversations_for, source_key
from ready.decode.engine import Engine
from ready.decode.sampling import params_from
from ready.phases import PHASES
from ready.threads import cpu_threads
from ready.train import distributed
from ready.train.regen_chunks import map_chunks, work_folder
from ready.train.regen_data import DATA_FILE, RegenData, RegenError, target_fingerprint

Messages = list[dict[str, str]]
COUNTS_FILE = "counts.json"


def end_of_turn_id(tokenizer: Any) -> int:
    """The token that closes an assistant turn in the chat template (`<|im_end|>`), else EOS."""
    for token in ("<|im_end|>", "<|eot_id|>", "<|end|>"):
        tid = tokenizer.convert_tokens_to_ids(token)
        if isinstance(tid, int) and tid != getattr(tokenizer, "unk_token_id", None) and tid >= 0:
            return tid
    if tokenizer.eos_token_id is None:
        raise RegenError("the tokenizer has neither an end-of-turn token nor an EOS token; expected one to stop "
                         "regenerated turns")
    return int(tokenizer.eos_token_id)


def regenerate_turns(target: Any, tokenizer: Any, conversations: list[Messages], prompt_of: Callable[[Messages], list[int]],
                     max_new_tokens: int, batch_size: int, temperature: float = 0.0, top_p: float = 1.0,
                     seed: int = 0, progress: bool = True, first: int = 0) -> list[Messages]:
    """The conversations with every assistant turn replaced by the target's answer, turn by turn.

    `first`: the place of `conversations[0]` in the whole set; a sampled turn's seed is a function of
    the conversation's place in the whole set and the turn, so a chunk regenerates as the whole would."""
    stop = end_of_turn_id(tokenizer)
    out = [[dict(m) for m in conv] for conv in conversations]
    turns = [[k for k, m in enumerate(conv) if m["role"] == "assistant"] for conv in out]
    bar = tqdm(total=sum(map(len, turns)), desc="regen: assistant turns", unit="turn", disable=not progress)
    for t in range(max(map(len, turns), default=0)):
        todo = [(i, ks[t]) for i, ks in enumerate(turns) if len(ks) > t]
        prompts = [prompt_of(out[i][:k]) for i, k in todo]
        sampling = params_from(temperature, top_p, seed)
        engine = Engine(target, None, batch_size=max(1, min(batch_size, len(prompts))), eos_token_id=stop,
                             sampling=sampling)
        seeds = None if sampling is None else [seed * 1_000_003 + (first + i) * 101 + t for i, _ in todo]
        answers = [g.tokens for g in engine.decode(prompts, max_new_tokens, seeds=seeds).generations]
        for (i, k), ids in zip(todo, answers):
            out[i][k] = {"role": "assistant", "content": tokenizer.decode([x for x in ids if x != stop],
                                                                           skip_special_tokens=True)}
        bar.update(len(todo))
    bar.close()
    return out


def regenerate_in_chunks(target: Any, tokenizer: Any, conversations: list[Messages],
                         prompt_of: Callable[[Messages], list[int]], max_new_tokens: int, batch_size: int,
                         work: Path, spec_hash: str, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
                         progress: bool = True) -> list[Messages]:
    """`regenerate_turns` over chunks of `batch_size` conversations, sharded over the data-parallel ranks
    and resumable (module doc): every rank returns the whole regenerated set, in the input's order."""
    size = max(1, int(batch_size))

    def answer(chunk: list[Messages], first: int) -> list[Messages]:
        return regenerate_turns(target, tokenizer, chunk, prompt_of, max_new_tokens, size, temperature, top_p, seed,
                                progress=False, first=first)

    return map_chunks(conversations, size, answer, Path(work), spec_hash, progress)


def conversation_spec(cfg: Any, target: Any, tokenizer: Any, split: str = "train", n: Optional[int] = None) -> dict:
    """What the training (or validation) conversation data depend on (the artifact's key)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    regen = to_container(cfg.regen)
    if n is not None:
        regen["num_samples"] = int(n)
    return {
        "kind": "conversations",
        "source": source_key(cfg, tokenizer, split),
        "data": {k: v for k, v in to_container(cfg.data).items() if k != "path"},
        "regen": regen,
        "thinking": bool(cfg.bench.thinking),
        "template": hashlib.sha256(template.encode()).hexdigest()[:16],
        "target": target_fingerprint(target) if cfg.data.responses == "regenerate" else None,
        "threads": int(cfg.threads.shared),
    }


def build_conversation_data(cfg: Any, target: Any, tokenizer: Any, progress: bool = True, split: str = "train",
                            n: Optional[int] = None) -> tuple[RegenData, Path, dict]:
    """The cached data of `split` (ready.data.training_chats: `data.path`'s conversations or the standard
    library's; `n` of them, default `regen.num_samples`), built on first use: (data, its folder, load counts).

    Data-parallel: every rank regenerates its share of the conversations (`regenerate_in_chunks`), rank 0
    writes the artifact, the others wait and read it."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise RegenError(f"{type(tokenizer).__name__} has no chat template; expected the target's tokenizer to render "
                         "the training conversations with apply_chat_template")
    n = int(cfg.regen.num_samples) if n is None else int(n)
    spec = conversation_spec(cfg, target, tokenizer, split, n)
    thinking = bool(cfg.bench.thinking)
    max_len = int(cfg.regen.prompt_len) + int(cfg.regen.response_len)
    folder = artifact_dir(cfg.artifacts_dir, "regen", spec)
    if not distributed.main_decides(lambda: intact(folder, spec, label=f"regen/{folder.name}")):
        messages, loaded = conversations_for(cfg, tokenizer, split, n)
        work = work_folder(folder)
        if cfg.data.responses == "regenerate":
            with cpu_threads(spec_threads(spec)), PHASES.phase("regen" if split == "train" else f"regen_{split}"):
                messages = regenerate_in_chunks(target, tokenizer, messages, lambda m: prompt_ids(tokenizer, m, thinking),
                                                int(cfg.regen.response_len), int(cfg.regen.batch_size), work,
                                                config_hash(spec), float(cfg.regen.temperature), float(cfg.regen.top_p),
                                                int(cfg.regen.seed), progress)
        rows, truncated = [], 0
        for m in messages:
            sample = render(tokenizer, m, thinking, max_len=max_len, truncate="right")
            truncated += int(sample.truncated)
            if sample.n_assistant:
                rows.append((sample.ids, sample.mask))
        if not rows:
            raise RegenError(f"data.path = {cfg.data.path!r} ({split}): no conversation keeps an assistant token within "
                             f"{max_len} tokens; expected conversations (or raise regen.prompt_len + regen.response_len)")
        counts = {**loaded, "data/used": len(rows), "data/truncated": truncated}

        def build(tmp: Path) -> None:
            pack(rows, pad_id=int(tokenizer.eos_token_id or 0)).save(tmp / DATA_FILE)
            (tmp / COUNTS_FILE).write_text(json.dumps(counts, indent=1))

        if distributed.world().main:
            cached(cfg.artifacts_dir, "regen", spec, build)
            shutil.rmtree(work, ignore_errors=True)  # the chunks are in the artifact now
        distributed.barrier()  # the others read what rank 0 wrote
    return RegenData.load(folder / DATA_FILE), folder, load_counts(folder)


def pack(rows: list[tuple[list[int], list[bool]]], pad_id: int) -> RegenData:
    """Variable-length rows (ids, assistant mask) padded into one RegenData (pad: `pad_id`, never trained)."""
    T = max(len(ids) for ids, _ in rows)
    tokens = torch.full((len(rows), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.bool)
    for r, (ids, m) in enumerate(rows):
        tokens[r, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        mask[r, :len(m)] = torch.tensor(m, dtype=torch.bool)
    lengths = torch.tensor([len(ids) for ids, _ in rows], dtype=torch.long)
    return RegenData(tokens=tokens, prompt_len=1, lengths=lengths, loss_mask=mask)


def load_counts(folder: Path) -> dict:
    """Rows read, skipped (by reason), used and truncated, as recorded beside conversation data ({} for
    prompt-regenerated data)."""
    f = folder / COUNTS_FILE
    return json.loads(f.read_text()) if f.is_file() else {}
