"""Conversation regeneration in chunks (ready.train.regen_chunks): a build killed after some chunks
resumes from them and gives the same data as an uninterrupted one; a chunk that is half-written, of
another spec or of another shape is regenerated, never trusted; sampled turns do not depend on the
chunking; 2 gloo processes split the chunks and give one process's data."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from omegaconf import OmegaConf

import ready.train.conversations as conversations
from ready.config import schema
from ready.data.chat import prompt_ids
from ready.data.corpus import Doc
from ready.data.tokenizer import build_tokenizer, load_tokenizer
from ready.target import HybridLM, preset_config
from ready.train import distributed
from ready.train.conversations import build_conversation_data, regenerate_turns
from ready.train.regen_chunks import CHUNK_FILE, map_chunks

torch.set_num_threads(1)
DOCS = [Doc(f"m{i}.py", f"def function_{i}(value):\n    return value * {i} + len('text')\n") for i in range(30)]
QUESTIONS = ["def function_1", "len('text')", "class Thing", "return value", "value * 3", "def f(x)", "pass"]
CONVS = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": "x"}]
          + ([{"role": "user", "content": "and then"}, {"role": "assistant", "content": "y"}] if i % 2 else [])}
         for i, q in enumerate(QUESTIONS)]  # 7 conversations, chunks of 2: [0, 2, 4, 6]


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    """A chat tokenizer (ChatML template) and a random tiny target over its vocabulary."""
    folder = tmp_path_factory.mktemp("tok")
    ids = build_tokenizer(DOCS, 300, folder, chat=True)
    torch.manual_seed(0)
    cfg = preset_config("tiny", {"vocab_size": ids["vocab_size"], "hidden_size": 32, "intermediate_size": 64,
                                 "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 1,
                                 "head_dim": 16, "linear_num_key_heads": 1, "linear_num_value_heads": 2,
                                 "linear_key_head_dim": 8, "linear_value_head_dim": 8,
                                 "eos_token_id": ids["eos_token_id"]})
    return load_tokenizer(folder), HybridLM(cfg).eval()


def config(root: Path, data_file: Path):
    # one thread: the gloo test forks its ranks, and a forked child cannot start an OpenMP team once the
    # parent has used one (libgomp is not fork-safe; torchrun starts fresh processes)
    return OmegaConf.merge(schema(), {"artifacts_dir": str(root / "artifacts"), "data": {"path": str(data_file)},
                                      "regen": {"num_samples": 7, "prompt_len": 96, "response_len": 5,
                                                "batch_size": 2}, "threads": {"shared": 1}})


def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "convs.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in CONVS))
    return path


def same(a, b) -> bool:
    return (torch.equal(a.tokens, b.tokens) and torch.equal(a.lengths, b.lengths)
            and torch.equal(a.loss_mask, b.loss_mask))


def test_a_killed_build_resumes_from_its_finished_chunks(chat, tmp_path, monkeypatch):
    tok, target = chat
    path = data_file(tmp_path)
    whole, _, _ = build_conversation_data(config(tmp_path / "whole", path), target, tok, progress=False)

    real, firsts = regenerate_turns, []

    def killed_after_two(*args, **kw):
        if len(firsts) == 2:
            raise KeyboardInterrupt  # the kill, after chunks 0 and 2 were written
        firsts.append(kw["first"])
        return real(*args, **kw)

    cfg = config(tmp_path / "cut", path)
    monkeypatch.setattr(conversations, "regenerate_turns", killed_after_two)
    with pytest.raises(KeyboardInterrupt):
        build_conversation_data(cfg, target, tok, progress=False)
    regen = tmp_path / "cut" / "artifacts" / "regen"
    (work,) = regen.glob("*.work")
    assert sorted(p.name for p in work.iterdir()) == [CHUNK_FILE.format(0), CHUNK_FILE.format(2)]
    assert not list(regen.glob("*/DONE"))  # nothing a later run mistakes for finished data

    resumed: list[int] = []
    monkeypatch.setattr(conversations, "regenerate_turns", lambda *a, **kw: resumed.append(kw["first"]) or real(*a, **kw))
    data, folder, counts = build_conversation_data(cfg, target, tok, progress=False)
    assert resumed == [4, 6] and counts["data/used"] == 7
    assert same(data, whole)
    assert not work.exists() and (folder / "DONE").is_file()


def test_a_chunk_that_is_half_written_of_another_spec_or_shape_is_regenerated(tmp_path):
    convs = [[{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}] for i in range(8)]
    work = tmp_path / "work"
    work.mkdir()

    def answered(chunk, first, tag="new"):
        return [[m, {"role": "assistant", "content": f"{tag}{first + i}"}] for i, (m, _) in enumerate(chunk)]

    def saved(start, chunk, spec="S"):
        return json.dumps({"spec": spec, "start": start, "count": len(chunk), "conversations": chunk})

    (work / CHUNK_FILE.format(0)).write_text(saved(0, answered(convs[0:2], 0, "old"))[:-20])  # cut short
    (work / CHUNK_FILE.format(2)).write_text(saved(2, answered(convs[2:4], 2, "old"), spec="OTHER"))
    (work / CHUNK_FILE.format(4)).write_text(saved(4, answered(convs[4:6], 4, "old")))  # whole and of this spec
    (work / CHUNK_FILE.format(6)).write_text(saved(6, [list(reversed(c)) for c in answered(convs[6:8], 6, "old")]))
    (work / ".chunk-000000006.json.tmp-x").write_text("{")  # a temp file of a killed write: never read
    calls: list[int] = []
    out = map_chunks(convs, 2, lambda chunk, first: calls.append(first) or answered(chunk, first), work, "S",
                     progress=False)
    assert calls == [0, 2, 6]
    assert [c[1]["content"] for c in out] == ["new0", "new1", "new2", "new3", "old4", "old5", "new6", "new7"]
    assert json.loads((work / CHUNK_FILE.format(0)).read_text())["spec"] == "S"  # rewritten whole


def test_sampled_turns_do_not_depend_on_the_chunking(chat):
    tok, target = chat
    convs = [c["messages"] for c in CONVS]

    def regen(chunk, first):
        return regenerate_turns(target, tok, chunk, lambda m: prompt_ids(tok, m, False), 5, 2, temperature=1.0,
                                seed=3, progress=False, first=first)

    assert regen(convs, 0) == regen(convs[:3], 0) + regen(convs[3:], 3)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, root: str, path: str, tok, target) -> None:
    """One of 2 gloo ranks building the conversation data; records the chunks it regenerated."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    distributed.init_from_env("cpu")
    real, firsts = conversations.regenerate_turns, []
    conversations.regenerate_turns = lambda *a, **kw: firsts.append(kw["first"]) or real(*a, **kw)
    try:
        build_conversation_data(config(Path(root), Path(path)), target, tok, progress=False)
    finally:
        conversations.regenerate_turns = real
    (Path(root) / f"rank{rank}.json").write_text(json.dumps(firsts))
    distributed.shutdown()


def test_two_gloo_processes_split_the_chunks_and_give_one_process_data(chat, tmp_path):
    tok, target = chat
    path = data_file(tmp_path)
    one, _, _ = build_conversation_data(config(tmp_path / "one", path), target, tok, progress=False)
    two = tmp_path / "two"
    two.mkdir()
    # fork: the ranks start with this process's imports, tokenizer and target
    ctx = mp.start_processes(_rank, args=(2, _free_port(), str(two), str(path), tok, target), nprocs=2, join=False,
                             start_method="fork")
    deadline = time.monotonic() + 120
    while not ctx.join(timeout=5):  # True once both ranks ended (a rank's error is raised here)
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("the 2 ranks did not end within 120 s")
    assert json.loads((two / "rank0.json").read_text()) == [0, 4]
    assert json.loads((two / "rank1.json").read_text()) == [2, 6]
    (folder,) = [p for p in (two / "artifacts" / "regen").iterdir()]  # the data, no work folder left
    assert same(conversations.RegenData.load(folder), one)
    assert folder.name == next((tmp_path / "one" / "artifacts" / "regen").iterdir()).name  # the key ignores N
