"""Conversation regeneration in chunks: sharded over data-parallel ranks, resumable after a kill.

Regenerating a paper-scale conversation set (tens of thousands of conversations, every assistant turn
answered anew by the target) takes hours, so it is cut into chunks of `regen.batch_size` conversations:

- Sharded: rank r of N regenerates the chunks r, r+N, r+2N, ... of those not yet done, and the chunks
  are gathered to every rank once (ready.train.distributed). A chunk holds the same conversations
  whatever N is (greedy turns go through one batched engine per chunk and turn), and a sampled turn's
  seed is a function of its conversation's place in the whole set (`regenerate_turns(first=...)`), so
  the result equals one process's.
- Resumable: each finished chunk is written at once to the work folder beside the artifact
  (`<artifacts>/regen/<hash>.work/chunk-<first index>.json`, temp file + rename) with the hash of the
  spec it belongs to. A later build reads the chunks that are whole, of this spec and of the expected
  shape (the same conversations' roles, turn for turn) and regenerates the others; rank 0 decides which
  are done, so every rank takes the same branch. Nothing half-written is ever read: a chunk file is
  complete or absent, and one that fails any check is regenerated. The artifact's builder removes the
  work folder once the data are in place (ready.train.conversations).

`map_chunks` does the chunking; `ready.train.conversations.regenerate_in_chunks` runs `regenerate_turns` through it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional

from tqdm.auto import tqdm

from ready.artifacts import atomic_write_text
from ready.train import distributed
from ready.train.regen_data import RegenError

Messages = list[dict[str, str]]
CHUNK_FILE = "chunk-{:09d}.json"  # the regenerated conversations from this index of the whole set on


def work_folder(folder: Path) -> Path:
    """Where the chunks of the artifact `folder` are kept while it is built: `<folder>.work` beside it."""
    folder = Path(folder)
    return folder.parent / f"{folder.name}.work"


def map_chunks(conversations: list[Messages], size: int, fn: Callable[[list[Messages], int], list[Messages]],
               work: Path, spec_hash: str, progress: bool = True) -> list[Messages]:
    """`fn(chunk, first index)` over consecutive chunks of `size` conversations, each result kept in `work`
    (resumable) and the chunks not yet done split over the ranks (sharded); the results in order."""
    if int(size) < 1:
        raise RegenError(f"chunks of {size} conversations; expected regen.batch_size >= 1")
    starts = list(range(0, len(conversations), int(size)))
    w = distributed.world()

    def whole(s: int) -> bool:
        return _read_chunk(work, s, conversations[s:s + size], spec_hash) is not None

    done = set(distributed.main_decides(lambda: [s for s in starts if whole(s)]))
    mine = [s for s in starts if s not in done][w.rank :: w.size]
    bar = tqdm(total=sum(len(conversations[s:s + size]) for s in mine), desc="regen: conversations", unit="conv",
               disable=not (progress and w.main))
    ours: dict[int, list[Messages]] = {}
    for s in mine:
        ours[s] = fn(conversations[s:s + size], s)
        _write_chunk(work, s, ours[s], spec_hash)
        bar.update(len(ours[s]))
    bar.close()
    out: dict[int, list[Messages]] = {}
    for part in distributed.gather_objects(ours):  # once: every rank's chunks to every rank
        out.update(part)
    for s in sorted(done):
        chunk = _read_chunk(work, s, conversations[s:s + size], spec_hash)
        if chunk is None:
            raise RegenError(f"rank {w.rank} cannot read {work / CHUNK_FILE.format(s)}, which rank 0 found finished; "
                             "expected artifacts_dir on a filesystem every data-parallel rank shares")
        out[s] = chunk
    return [m for s in starts for m in out[s]]


def _write_chunk(work: Path, start: int, conversations: list[Messages], spec_hash: str) -> None:
    atomic_write_text(work / CHUNK_FILE.format(start), json.dumps(
        {"spec": spec_hash, "start": start, "count": len(conversations), "conversations": conversations}))


def _read_chunk(work: Path, start: int, sources: list[Messages], spec_hash: str) -> Optional[list[Messages]]:
    """The saved chunk from `start` when it is whole, of this spec, and answers `sources` turn for turn
    (same count, same roles); else None (it is then regenerated)."""
    try:
        raw = json.loads((work / CHUNK_FILE.format(start)).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict) or raw.get("spec") != spec_hash or raw.get("start") != start:
        return None
    convs = raw.get("conversations")
    if not isinstance(convs, list) or raw.get("count") != len(sources) or len(convs) != len(sources):
        return None
    for got, src in zip(convs, sources):
        if not isinstance(got, list) or len(got) != len(src):
            return None
        for m, s in zip(got, src):
            if not isinstance(m, dict) or m.get("role") != s["role"] or not isinstance(m.get("content"), str):
                return None
    return convs


__all__ = ["CHUNK_FILE", "map_chunks", "work_folder"]
