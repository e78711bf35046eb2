"""`ready.allocator`: a process keeps its freed memory in the heap, and can hand it back."""

import ctypes
import sys

import pytest
import torch

from ready.allocator import _libc, keep_freed_memory

glibc = pytest.mark.skipif(_libc() is None or not hasattr(_libc(), "mallinfo2"),
                           reason="needs glibc's mallopt and mallinfo2 (Linux, glibc >= 2.33)")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _mallinfo() -> _MallInfo2:
    libc = _libc()
    libc.mallinfo2.restype = _MallInfo2
    return libc.mallinfo2()


@glibc
def test_a_kept_heap_serves_a_large_tensor_from_the_heap_and_keeps_it_after_free():
    size = 48 << 20  # 48 MiB: above glibc's 32 MiB mmap ceiling, so by default it is mmapped
    try:
        assert keep_freed_memory()
        mapped = _mallinfo().hblkhd
        t = torch.empty(size, dtype=torch.uint8)
        assert _mallinfo().hblkhd == mapped, "the block was mmapped, not served from the heap"
        del t
        assert _mallinfo().fordblks >= size, "the freed block left the heap"
    finally:
        assert keep_freed_memory(False)
    mapped = _mallinfo().hblkhd
    t = torch.empty(size, dtype=torch.uint8)
    assert _mallinfo().hblkhd >= mapped + size, "glibc's defaults were not restored: the block came from the heap"
    del t


def test_without_glibc_it_changes_nothing_and_says_so(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert keep_freed_memory() is False
    assert keep_freed_memory(False) is False
