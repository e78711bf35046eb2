"""Files and folders written atomically (temp + rename) get the mode a plain create would have: readable by
the group and others as the umask says, never the temp file's 0600 / the temp folder's 0700."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch

from ready.artifacts import atomic_torch_save, atomic_write_bytes, atomic_write_text, cached, umask


@pytest.fixture(params=[0o022, 0o027, 0o077])
def mask(request):
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_umask_is_read_as_it_is(mask) -> None:
    assert umask() == mask
    assert umask() == mask  # reading it left it as it was


def test_atomic_files_follow_the_umask(tmp_path: Path, mask) -> None:
    atomic_write_text(tmp_path / "report.md", "| a |\n")
    atomic_write_bytes(tmp_path / "table.tex", b"x")
    atomic_torch_save({"w": torch.zeros(2)}, tmp_path / "state.pt")
    plain = tmp_path / "plain.txt"
    plain.write_text("made by open()")
    for name in ("report.md", "table.tex", "state.pt"):
        assert mode(tmp_path / name) == 0o666 & ~mask == mode(plain), name


def test_a_cached_artifact_folder_follows_the_umask(tmp_path: Path, mask) -> None:
    folder = cached(tmp_path, "toy", {"n": 1}, lambda tmp: (tmp / "weights.bin").write_bytes(b"w"))
    assert mode(folder) == 0o777 & ~mask
    assert mode(folder / "weights.bin") == 0o666 & ~mask
