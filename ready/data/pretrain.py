"""Pretraining of the embedded default target on the corpus (CPU, minutes).

Next-token cross-entropy on random windows of the concatenated train split (documents separated
by EOS), AdamW (weight decay on matrices only), linear warmup then cosine decay to
`min_lr_ratio * lr`, gradient clipping; a tqdm bar shows the loss. Held-out loss is measured on
fixed, non-overlapping windows of the held-out split.

`chat_fraction` of the windows are cut from a second stream instead: the corpus's
conversations (ready.data.stdlib_chats) rendered with the chat template, so the target learns to
answer a chat prompt, which is how evaluation and the drafter's training data pose their prompts.

`repeat_fraction` > 0 gives that share of the training windows a span of their own text repeated
further on (`insert_repeats`), to push the target towards in-context copying, which large models do
and the tiny target does not (it continues a repeated segment ~5 % of the time: `python -m
benchmarks.diagnostics.copy_probe --built`). At the default budget it does not teach copying either
(the v4 diagnosis: `git show b5af749:docs/findings.md`); with `target.attention_window` small, a copy
from beyond the window would have to go through the GDN states. Held-out loss stays on plain text.
"""

from __future__ import annotations

import math
import time
from typing import Any, Iterable, Optional

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ready.data.corpus import Doc


def token_stream(docs: Iterable[Doc], tokenizer: Any, eos_id: int) -> torch.Tensor:
    """All documents tokenised and concatenated, each followed by EOS (int64, 1-D)."""
    texts = [d.text for d in docs]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:  # batch-encode in Rust: seconds for the whole corpus
        encoded = [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
    else:
        encoded = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    flat: list[int] = []
    for ids in encoded:
        flat.extend(ids)
        flat.append(eos_id)
    return torch.tensor(flat, dtype=torch.long)


def lr_at(step: int, cfg: Any) -> float:
    """Learning rate at optimizer step `step` (0-based): linear warmup, cosine decay."""
    warm = max(1, int(round(cfg.warmup * cfg.steps)))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    frac = min(1.0, (step - warm) / max(1, cfg.steps - warm))
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * frac))


def _optimizer(model: torch.nn.Module, cfg: Any) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)


def _lm_loss(model: torch.nn.Module, window: torch.Tensor) -> torch.Tensor:
    window = window.to(next(model.parameters()).device)
    logits = model(window[:, :-1]).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), window[:, 1:].reshape(-1))


def random_windows(stream: torch.Tensor, batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """`batch` windows of `length` consecutive tokens at random offsets of `stream`."""
    if stream.numel() <= length:
        raise ValueError(f"the train split has {stream.numel()} tokens; expected more than pretrain.seq_len + 1 = {length}")
    starts = torch.randint(0, stream.numel() - length, (batch,), generator=gen)
    return torch.stack([stream[s:s + length] for s in starts.tolist()])


def insert_repeats(windows: torch.Tensor, fraction: float, gen: torch.Generator,
                   span: tuple[int, int] = (8, 48), max_gap: int = 64,
                   fill: Optional[tuple[int, int]] = None) -> torch.Tensor:
    """A copy of `windows` [B, T] where each row, with probability `fraction`, has a span of
    `span` tokens (uniform, inclusive) copied to a place 0..`max_gap` tokens after the span ends.
    With `fill` = (lo, hi) the span is first replaced by random ids in [lo, hi), so only copying
    predicts its repeat (`benchmarks.diagnostics.copy_probe`)."""
    out = windows.clone()
    B, T = out.shape
    for b in range(B):
        if float(torch.rand((), generator=gen)) >= fraction:
            continue
        n = int(torch.randint(span[0], span[1] + 1, (), generator=gen))
        gap = int(torch.randint(0, max_gap + 1, (), generator=gen))
        room = T - (2 * n + gap)
        if room < 1:
            continue
        s = int(torch.randint(0, room, (), generator=gen))
        d = s + n + gap
        if fill is not None:
            out[b, s:s + n] = torch.randint(fill[0], fill[1], (n,), generator=gen)
        out[b, d:d + n] = out[b, s:s + n]
    return out


@torch.no_grad()
def heldout_loss(model: torch.nn.Module, stream: torch.Tensor, seq_len: int, max_windows: int,
                 batch_size: int = 8) -> float:
    """Mean next-token loss over the first `max_windows` non-overlapping windows of `stream`."""
    n = min(max_windows, (stream.numel() - 1) // seq_len)
    if n < 1:
        raise ValueError(f"the held-out split has {stream.numel()} tokens; expected at least {seq_len + 1}")
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, n, batch_size):
        rows = [stream[j * seq_len:j * seq_len + seq_len + 1] for j in range(i, min(n, i + batch_size))]
        win = torch.stack(rows)
        total += _lm_loss(model, win).item() * len(rows)
        count += len(rows)
    model.train(was_training)
    return total / count


def mix_windows(windows: torch.Tensor, chats: torch.Tensor, share: float, gen: torch.Generator) -> torch.Tensor:
    """A copy of `windows` [B, T] where each row, with probability `share`, is replaced by a window of
    the same length from the `chats` stream (rendered conversations)."""
    out = windows.clone()
    picked = torch.rand(out.shape[0], generator=gen) < share
    n = int(picked.sum())
    if n:
        out[picked] = random_windows(chats, n, out.shape[1], gen)
    return out


def pretrain(model: torch.nn.Module, train: torch.Tensor, heldout: torch.Tensor, cfg: Any,
             progress: bool = True, chats: Optional[torch.Tensor] = None) -> dict[str, Any]:
    """Train `model` in place on `train` tokens; return metrics (losses, time, tokens seen).

    `chats`: the stream of rendered conversations (ready.data.stdlib_chats) that `cfg.chat_fraction`
    of the training windows are cut from instead."""
    if cfg.steps < 1 or cfg.batch_size < 1 or cfg.seq_len < 2:
        raise ValueError(f"bad pretrain config: steps={cfg.steps}, batch_size={cfg.batch_size}, "
                         f"seq_len={cfg.seq_len}; expected steps >= 1, batch_size >= 1, seq_len >= 2")
    repeat = float(cfg.repeat_fraction)
    if not 0.0 <= repeat <= 1.0:
        raise ValueError(f"pretrain.repeat_fraction = {repeat}; expected a share in [0, 1]")
    copy_gen = torch.Generator().manual_seed(int(cfg.seed) + 1)  # its own stream: windows stay as at 0
    chat_share = float(cfg.chat_fraction)
    if not 0.0 <= chat_share <= 1.0:
        raise ValueError(f"pretrain.chat_fraction = {chat_share}; expected a share in [0, 1]")
    chat_gen = torch.Generator().manual_seed(int(cfg.seed) + 2)
    gen = torch.Generator().manual_seed(int(cfg.seed))
    torch.manual_seed(int(cfg.seed))
    opt = _optimizer(model, cfg)
    model.train()
    t0 = time.perf_counter()
    ema: Optional[float] = None
    bar = tqdm(range(cfg.steps), desc="pretrain target", disable=not progress, dynamic_ncols=True)
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        window = random_windows(train, cfg.batch_size, cfg.seq_len + 1, gen)
        if repeat > 0:
            window = insert_repeats(window, repeat, copy_gen)
        if chats is not None and chat_share > 0:
            window = mix_windows(window, chats, chat_share, chat_gen)
        loss = _lm_loss(model, window)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"pretraining diverged at step {step} (loss {loss.item()}); lower pretrain.lr")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        bar.set_postfix(loss=f"{ema:.3f}", lr=f"{opt.param_groups[0]['lr']:.2e}")
    train_time = time.perf_counter() - t0
    model.eval()
    held = heldout_loss(model, heldout, cfg.seq_len, cfg.heldout_windows)
    return {
        "heldout_loss": held,
        "heldout_ppl": math.exp(held),
        "train_loss_ema": ema,
        "train_time_s": train_time,
        "eval_time_s": time.perf_counter() - t0 - train_time,
        "steps": int(cfg.steps),
        "tokens_seen": int(cfg.steps * cfg.batch_size * cfg.seq_len),
        "tokens_per_s": cfg.steps * cfg.batch_size * cfg.seq_len / max(train_time, 1e-9),
        "train_tokens": int(train.numel()),
        "heldout_tokens": int(heldout.numel()),
        "chat_tokens": int(chats.numel()) if chats is not None else 0,
        "params": int(sum(p.numel() for p in model.parameters())),
    }


@torch.no_grad()
def greedy_continue(model: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    """`n` greedy tokens after `prompt`, by full forward passes (slow, but needs no cache)."""
    ids = torch.tensor([prompt], dtype=torch.long)
    out: list[int] = []
    for _ in range(n):
        nxt = int(model(ids).logits[0, -1].argmax())
        out.append(nxt)
        ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return out
