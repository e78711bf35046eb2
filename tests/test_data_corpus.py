"""The stdlib corpus: which files go in, and a split that depends only on path and seed."""

from pathlib import Path

import pytest

from ready.config import CorpusConfig
from ready.data.corpus import CorpusError, is_heldout, load_corpus, stdlib_root


def _write(root: Path, rel: str, data: str | bytes) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data if isinstance(data, bytes) else data.encode())


@pytest.fixture
def fake_stdlib(tmp_path: Path) -> Path:
    for i in range(30):
        _write(tmp_path, f"mod{i:02d}.py", f"def f{i}(x):\n    return x + {i}\n")
    _write(tmp_path, "pkg/notes.txt", "plain notes\n")
    _write(tmp_path, "pkg/guide.rst", "Guide\n=====\n")
    _write(tmp_path, "pkg/data.json", '{"not": "text we want"}')
    _write(tmp_path, "test/test_mod.py", "assert True\n")
    _write(tmp_path, "site-packages/thirdparty.py", "x = 1\n")
    _write(tmp_path, "__pycache__/mod00.cpython-311.pyc", b"\x00\x01")
    _write(tmp_path, "binary.py", b"x = 1\x00\x00")
    _write(tmp_path, "latin1.py", "caf\xe9 = 1\n".encode("latin-1"))
    _write(tmp_path, "huge.py", "x = 1\n" * 400)  # 2400 bytes > max_file_kb=2
    _write(tmp_path, "encodings/cp999.py", "# generated with gencodec.py\ntable = ()\n")
    _write(tmp_path, "encodings/aliases.py", "aliases = {}\n")
    _write(tmp_path, "_sysconfigdata__linux.py", "build_time_vars = {}\n")
    return tmp_path


def test_corpus_keeps_source_and_text_files_and_skips_the_rest(fake_stdlib: Path) -> None:
    cfg = CorpusConfig(heldout_fraction=0.2, max_file_kb=2)
    corpus = load_corpus(cfg, root=fake_stdlib)
    paths = {d.path for d in corpus.train + corpus.heldout}
    assert paths == {f"mod{i:02d}.py" for i in range(30)} | {"pkg/notes.txt", "pkg/guide.rst", "encodings/aliases.py"}


def test_split_is_disjoint_and_decided_by_path_and_seed(fake_stdlib: Path) -> None:
    cfg = CorpusConfig(heldout_fraction=0.2, max_file_kb=2)
    corpus = load_corpus(cfg, root=fake_stdlib)
    train, held = {d.path for d in corpus.train}, {d.path for d in corpus.heldout}
    assert not train & held
    assert held == {p for p in train | held if is_heldout(p, 0.2, cfg.seed)}
    other_seed = load_corpus(CorpusConfig(heldout_fraction=0.2, max_file_kb=2, seed=1), root=fake_stdlib)
    assert {d.path for d in other_seed.heldout} != held


def test_adding_a_file_never_moves_another_and_changes_the_fingerprint(fake_stdlib: Path) -> None:
    cfg = CorpusConfig(heldout_fraction=0.2, max_file_kb=2, seed=3)
    before = load_corpus(cfg, root=fake_stdlib)
    _write(fake_stdlib, "zz_new.py", "y = 2\n")
    after = load_corpus(CorpusConfig(heldout_fraction=0.2, max_file_kb=2, seed=3), root=fake_stdlib)
    assert {d.path for d in before.heldout} <= {d.path for d in after.heldout} | {"zz_new.py"}
    assert {d.path for d in before.train} <= {d.path for d in after.train}
    assert after.fingerprint != before.fingerprint


def test_a_folder_without_text_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="train and .* held-out files"):
        load_corpus(CorpusConfig(), root=tmp_path)
    with pytest.raises(CorpusError, match="not a folder"):
        load_corpus(CorpusConfig(), root=tmp_path / "missing")


def test_real_stdlib_corpus_is_a_few_megabytes_of_python() -> None:
    corpus = load_corpus(CorpusConfig())
    assert corpus.root == str(stdlib_root())
    assert 1e6 < corpus.train_bytes() < 30e6
    assert len(corpus.heldout) >= 10
    paths = [d.path for d in corpus.train + corpus.heldout]
    assert not any(p.startswith("site-packages/") or "/test/" in f"/{p}" for p in paths)
    assert "json/decoder.py" in paths
